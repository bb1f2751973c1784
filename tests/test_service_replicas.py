"""Replica-safe files: models, index generations and manifests are written with the modes the umask gives any new
file (0644 / 0755 under 022, not mkstemp's 0600 or mkdtemp's 0700), so a second service replica running as
another user reads them, and picks up a new generation while the first replica keeps serving."""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from index.gallery import EmbedOptions, add, build
from server_process import poll_readyz, wait_ready
from service.app import create_app
from service.settings import Settings
from training.data.datasets import load_dataset
from training.data.fileio import atomic_path, created_mode, write_json
from training.models.checkpoint import load_model, save_model

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750),
                                                     (0o002, 0o664, 0o775)])
def test_atomic_writes_get_the_umasks_mode(tmp_path, mask, file_mode, dir_mode):
    with umask(mask):
        assert created_mode() == file_mode and created_mode(directory=True) == dir_mode
        write_json(tmp_path / "a.json", {"x": 1})
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"data")
        (tmp_path / "plain").write_text("")                         # what open() makes, for comparison
    assert _mode(tmp_path / "a.json") == _mode(tmp_path / "b.bin") == _mode(tmp_path / "plain") == file_mode
    assert not list(tmp_path.glob(".*.tmp"))


def _enterable(path: Path) -> bool:
    """Whether any user can reach ``path``: it and every folder above it have the x bit for others."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


def _shared_dir() -> Path:
    """A new directory any user can enter (pytest's own tmp dirs are 0700, and so may be $TMPDIR's parents)."""
    for parent in dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]):
        if Path(parent).is_dir() and _enterable(Path(parent)) and os.access(parent, os.W_OK):
            path = Path(tempfile.mkdtemp(prefix="jointspace-replicas-", dir=parent))
            os.chmod(path, 0o755)
            return path
    pytest.skip(f"no temporary directory that another user can enter ({tempfile.gettempdir()}, /tmp, /var/tmp, "
                f"/dev/shm): the second replica, run as another user, could not read the shared index")


def _readable_code(shared: Path) -> Path:
    """A copy of the checkout's packages that any user can read, under ``shared``: the checkout itself may sit
    under a private folder (a clone in ``mktemp -d``, a 0700 home directory), which the second replica, running as
    another user, cannot enter. Python code and package data (the web page's static files); no model files."""
    code = shared / "code"
    for package in ("training", "index", "service"):
        shutil.copytree(REPO / package, code / package, copy_function=shutil.copyfile,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pt"))
    shutil.copyfile(REPO / "tests" / "server_process.py", code / "server_process.py")     # its wait for /readyz
    for path in [code, *code.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return code


def _all_modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")]}


# The second replica: its own process and — when the tests run as root — its own user (nobody), dropped to after
# the imports. It runs the checkout's code from a world-readable copy (_readable_code). The interpreter and its
# packages may live where nobody can read (under /root, or a .venv inside a 0700 clone), so everything it will
# import is imported first, as the starting user, by loading the model and the index once; as nobody, the app then
# reads them again. It serves the app on the shared index over an in-process ASGI transport and answers the
# test's commands, one JSON line each.
REPLICA = r"""
import asyncio, json, os, sys
import httpx, faiss, torch, sqlite3, uvicorn
import fastapi_offline, av, pillow_heif   # found again after the user changes: /docs's Swagger UI folder, PyAV
import service.app, service.state, index.gallery, training.models.checkpoint
from server_process import poll_readyz_async
from service.app import create_app
from service.settings import Settings

model, index_dir, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
warm = training.models.checkpoint.load_model(model)
index.gallery.Gallery.load(index_dir, model=warm).close()
del warm
if uid != os.getuid():
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
app = create_app(Settings(model=model, index=index_dir, reload_interval_s=0.1))

async def main():
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as c:
            r = await poll_readyz_async(c, until=lambda r: r.status_code == 200 or "error" in r.json()["status"])
            print(json.dumps({"uid": os.getuid(), "ready": r.json()}), flush=True)
            loop = asyncio.get_running_loop()
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                command = json.loads(line)
                ready = (await poll_readyz_async(       # wait for the generation asked for
                    c, until=lambda r: r.json().get("index_generation") == command["generation"], timeout=20)).json()
                r = await c.post("/v1/search/captions", json={"image_id": command["image_id"], "k": 2})
                print(json.dumps({"ready": ready, "status": r.status_code, "body": r.json()}), flush=True)

asyncio.run(main())
"""


def test_a_second_replica_as_another_user_reads_a_new_generation_while_the_first_serves(
        tiny_model_path, synth_small):
    shared = _shared_dir()
    try:
        with umask(0o022):
            model = load_model(tiny_model_path)
            save_model(model, shared / "model.pt")
            data = load_dataset(synth_small)
            records = data.split("test").images
            build(shared / "index", model, [r.path for r in records],
                  [(c, i) for i, r in enumerate(records) for c in r.captions],
                  embedding=EmbedOptions(progress=False, workers=0))
        modes = _all_modes(shared)
        assert modes["model.pt"] == 0o644
        assert {m for p, m in modes.items() if (shared / p).is_dir()} == {0o755}, modes
        assert {m for p, m in modes.items() if (shared / p).is_file()} == {0o644}, modes   # manifest, CURRENT, …

        uid = NOBODY if os.geteuid() == 0 else os.geteuid()
        code = _readable_code(shared)
        replica = subprocess.Popen([sys.executable, "-c", REPLICA, str(shared / "model.pt"), str(shared / "index"),
                                    str(uid)], cwd=code,
                                   env={**os.environ, "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1"},
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            hello = json.loads(replica.stdout.readline() or json.dumps({"error": replica.stderr.read()}))
            assert hello.get("ready", {}).get("status") == "ready", hello
            if os.geteuid() == 0:
                assert hello["uid"] == NOBODY            # it really is another user
            else:
                print(f"NOTE: not root, so the second replica runs as the same user (uid {uid}); the modes above "
                      f"are what lets another user read the files")

            app = create_app(Settings(model=str(shared / "model.pt"), index=str(shared / "index"),
                                      reload_interval_s=0.1))
            with TestClient(app) as first:
                gen = wait_ready(first).get("/readyz").json()["index_generation"]
                assert hello["ready"]["index_generation"] == gen
                statuses, stop = [], threading.Event()

                def keep_querying():
                    while not stop.is_set():
                        statuses.append(first.post("/v1/search/images", json={"text": "a red circle"}).status_code)

                worker = threading.Thread(target=keep_querying)
                worker.start()
                with umask(0o022):
                    report = add(shared / "index", model, [data.split("train").images[0].path],
                                 embedding=EmbedOptions(progress=False, workers=0))
                new_id, new_gen = report.image_ids[0], report.generation
                assert new_gen != gen and _mode(shared / "index" / new_gen) == 0o755
                assert _mode(shared / "index" / new_gen / "manifest.json") == 0o644
                poll_readyz(first, until=lambda r: r.json()["index_generation"] == new_gen, timeout=20)
                stop.set()
                worker.join()
                assert first.get("/readyz").json()["index_generation"] == new_gen
                assert statuses and set(statuses) == {200}, statuses       # served throughout the swap
                assert first.post("/v1/search/captions", json={"image_id": new_id}).status_code == 200

                replica.stdin.write(json.dumps({"generation": new_gen, "image_id": new_id}) + "\n")
                replica.stdin.flush()
                answer = json.loads(replica.stdout.readline() or json.dumps({"error": replica.stderr.read()}))
                assert answer.get("ready", {}).get("index_generation") == new_gen, answer
                assert answer["status"] == 200 and len(answer["body"]["results"]) == 2, answer
        finally:
            replica.stdin.close()
            replica.terminate()
            replica.wait(timeout=30)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
