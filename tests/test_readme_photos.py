"""The README's "Search your own photos" section, run as written on a fresh folder of photos (a few of the demo's
samples, no captions file): every command of its steps 1 and 2 — `~/photos` is the folder, `.venv/bin/jointspace`
this checkout's command; `serve` is started and asked for its page and a search."""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from index.samples import write_samples
from server_process import spawn

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[list[str]]:
    """The jointspace commands of the own-photos section's steps 1 and 2, comments dropped, as argv lists."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Search your own photos", 1)[1].split("\n## ", 1)[0]
    steps = section.split("\n3. ", 1)[0]                                  # 3 trains a model: not a first try
    blocks = re.findall(r"```bash\n(.*?)```", steps, re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(".venv/bin/jointspace")]


def test_the_readme_own_photos_commands_run_as_written(tmp_path):
    commands = readme_commands()
    assert [c[1:3] for c in commands] == [["index", "build"], ["index", "sync"], ["index", "search"],
                                          ["serve", "--index"]], commands
    samples = write_samples(tmp_path / "samples")
    home = tmp_path / "home"
    photos = home / "photos"
    photos.mkdir(parents=True)
    for name in ("cat.jpg", "coffee.jpg", "rocket.jpg"):                    # a fresh folder: photos only
        shutil.copy(samples / name, photos / name)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    for argv in commands:
        argv = [str(photos) if a == "~/photos" else a for a in argv[1:]]
        if argv[0] == "serve":                  # on a free port (spawn's), from the folder the commands ran in
            at = argv.index("--port")
            args = [str(home / a) if a == "gallery" else a for a in argv[1:at] + argv[at + 2:]]
            server, port = spawn(args, env=env)
            try:
                import httpx

                assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
                found = httpx.post(f"http://127.0.0.1:{port}/v1/search/images", json={"text": "a cat", "k": 1})
                assert found.status_code == 200 and found.json()["results"][0]["name"] == "cat.jpg"
            finally:
                server.terminate()
                server.wait(timeout=30)
            continue
        run = subprocess.run([sys.executable, "-m", "service.cli", *argv], cwd=home, env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, (argv, run.stderr[-2000:])
    assert (home / "gallery" / "CURRENT").is_file()
