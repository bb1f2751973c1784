"""The ``jointspace`` command line as a user meets it: help without the model code, a readable search table (and
its JSON), ``index remove`` by path, no new generation for a change that changes nothing, folder names of files
from outside the gallery, and plain errors — a missing model or index, a file that is not a photo or video, a
closed pipe, a busy port."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from index.gallery import EmbedOptions, Gallery, add
from index.generations import current_generation
from index.query import ImageFilter
from service.cli import main as cli_main
from training.models.checkpoint import load_model

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


@pytest.fixture(scope="module")
def media(tiny_model_path, synth_small, tmp_path_factory):
    """A gallery folder — two photos at its top, two in trip/, a 6-second clip (three 2-second moments) — and its
    index, built by the CLI."""
    from index.video_writer import write_video

    root = tmp_path_factory.mktemp("cli_gallery")
    photos = root / "photos"
    (photos / "trip").mkdir(parents=True)
    for i, src in enumerate(sorted((synth_small / "images").glob("*.jpg"))[:4]):
        shutil.copy(src, photos / ("trip" if i % 2 else "") / src.name)
    frames = []
    for i in range(24):
        a = np.full((64, 64, 3), 200, np.uint8)
        a[24:40, 2 * i:2 * i + 16] = (215, 35, 35)
        frames.append(a)
    write_video(photos / "clip.webm", frames, fps=4)
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out",
                     str(root / "index"), "--quiet", "--workers", "0", "--video-window", "2", "--tta", "none"]) == 0
    return photos, root / "index"


@pytest.fixture
def index(media, tmp_path):
    """A copy of the module's index (its rows name the module's photo files)."""
    return Path(shutil.copytree(media[1], tmp_path / "index"))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300)


def test_help_imports_none_of_the_model_code():
    # not numpy either: the values the parser offers come from modules that import neither (index/choices.py)
    shown = subprocess.run([sys.executable, "-c", "import sys; from service.cli import build_parser; "
                                                  "build_parser().format_help(); "
                                                  "print(sorted(m for m in ('torch', 'faiss', 'torchvision', 'timm', "
                                                  "'numpy') if m in sys.modules))"],
                           cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.strip() == "[]", shown.stderr
    helped = _run("--help")
    assert helped.returncode == 0 and "index" in helped.stdout and "serve" in helped.stdout
    # the gallery's commands first, then training and research
    commands = [line.split()[0] for line in helped.stdout.split("COMMAND\n", 1)[1].splitlines()
                if line.startswith("    ") and not line.startswith("     ")]
    assert commands[:3] == ["index", "serve", "synth"], commands


def test_a_mistyped_command_gets_the_closest_one(capsys):
    for argv, want in ((["index", "serch", "--index", "x"], "did you mean: search?"),
                       (["indx"], "did you mean: index?"), (["index", "search", "--mode", "hybird"],
                                                            "did you mean: hybrid?")):
        with pytest.raises(SystemExit) as exit_:
            cli_main(argv)
        assert exit_.value.code == 2 and want in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        cli_main(["index", "zzzzzz"])
    assert "did you mean" not in capsys.readouterr().err               # nothing close: no guess


def test_search_prints_a_table_and_today_s_json_with_json(media, tiny_model_path, capsys):
    photos, index = media
    args = ["index", "search", "--index", str(index), "--model", str(tiny_model_path), "--text", "a red square",
            "--k", "7", "--device", "cpu"]
    assert cli_main([*args, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    results = answer["results"]
    assert len(results) == 7 and {r["media"] for r in results} == {"photo", "video"}
    assert all(Path(r["path"]).is_absolute() for r in results)
    # built with the bank the model carries: each hit has its relevance (index/relevance.py)
    assert all(0 <= r["relevance"] <= 1 for r in results) and isinstance(answer["strong_match"], bool)
    assert cli_main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["score", "relevance", "media", "path", "moment"]
    clock = lambda s: f"{int(s) // 60}:{int(s) % 60:02d}"      # noqa: E731
    want = [[f"{r['score']:.3f}", f"{r['relevance']:.3f}", r["media"], os.path.relpath(r["path"], photos),
             *([f"{clock(r['start'])}–{clock(r['end'])}"] if r["media"] == "video" else [])] for r in results]
    assert [line.split() for line in lines[1:8]] == want
    assert lines[8:] == ([] if answer["strong_match"] else ["no strong match: these are the closest"])
    assert "trip/" in "".join(lines) and "clip.webm" in "".join(lines) and str(photos) not in "".join(lines)
    assert cli_main([*args, "--folder", "nowhere"]) == 2                     # an unknown folder: an error
    assert cli_main([*args, "--min-score", "0.999"]) == 0
    assert capsys.readouterr().out.strip().endswith("no results")


def test_remove_by_path_and_a_change_of_nothing_writes_no_generation(media, index, tmp_path, capsys, monkeypatch):
    photos, _ = media
    gen = current_generation(index)
    assert cli_main(["index", "remove", "--index", str(index), "--ids", "9999"]) == 1
    err = capsys.readouterr().err
    assert "not in the index: id 9999" in err and "nothing removed" in err and current_generation(index) == gen
    nowhere = tmp_path / "nope.jpg"
    assert cli_main(["index", "remove", "--index", str(index), str(nowhere)]) == 1
    assert f"not in the index: path {nowhere}" in capsys.readouterr().err and current_generation(index) == gen

    gallery = Gallery.load(index)
    rows = gallery.meta.all_images()
    gallery.close()
    trip = sorted(r.path for r in rows if r.video_id is None and Path(r.path).parent.name == "trip")
    monkeypatch.chdir(photos)                                                  # a path as the user types it
    assert cli_main(["index", "remove", "--index", str(index), os.path.relpath(trip[0], photos), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["removed_images"], report["removed_videos"]) == (1, 0) and report["generation"] != gen
    # a video: its moments and itself; a folder: what is under it; one unknown among them: said, exit 1
    assert cli_main(["index", "remove", "--index", str(index), "clip.webm", "trip", "gone.jpg"]) == 1
    captured = capsys.readouterr()
    # said as a sentence, as build says what it did (--json: the counts)
    assert captured.out.startswith(f"removed 4 images (1 video with their moments) from {index} (gen-")
    assert "not in the index: path gone.jpg" in captured.err
    gallery = Gallery.load(index)
    left = gallery.meta.all_images()
    assert [Path(r.path).parent for r in left] == [photos, photos] and gallery.meta.all_videos() == []
    assert gallery.images.ntotal == 2
    gallery.close()


def test_add_refuses_files_that_are_not_photos_or_videos(index, tiny_model_path, tmp_path, capsys):
    gen = current_generation(index)
    notes = tmp_path / "notes.txt"
    notes.write_text("a shopping list")
    rc = cli_main(["index", "add", "--index", str(index), "--model", str(tiny_model_path), str(notes), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "nothing added: not a photo or video file" in err and str(notes) in err, err
    assert current_generation(index) == gen
    # a photo's name on something that is no picture: read, skipped and said; nothing added, nothing written
    fake = tmp_path / "holiday.jpg"
    fake.write_text("not a picture")
    rc = cli_main(["index", "add", "--index", str(index), "--model", str(tiny_model_path), str(fake), "--quiet",
                   "--workers", "0"])
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == "" and current_generation(index) == gen
    assert f"skipped unreadable image {fake}" in captured.err and "nothing added" in captured.err
    assert "object at 0x" not in captured.err                               # no Python repr
    report = add(index, load_model(tiny_model_path), [fake], embedding=EmbedOptions(progress=False, workers=0))
    assert report.image_ids == [] and report.generation == gen


def test_a_file_from_outside_the_gallery_keeps_its_own_folder_name(index, tiny_model_path, synth_small, tmp_path,
                                                                   capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    photo = shutil.copy(sorted((synth_small / "images").glob("*.jpg"))[5], elsewhere / "found.jpg")
    assert cli_main(["index", "add", "--index", str(index), "--model", str(tiny_model_path), str(photo), "--quiet",
                     "--workers", "0", "--json"]) == 0
    new = json.loads(capsys.readouterr().out)["image_ids"]
    gallery = Gallery.load(index)
    folders = dict(gallery.photos.folder_counts())
    assert folders[str(elsewhere)] == 1 and not any(f.startswith("..") for f in folders)   # not ../../…/elsewhere
    assert gallery.allowed_ids(ImageFilter(folder=str(elsewhere))).tolist() == new
    gallery.close()
    assert cli_main(["index", "search", "--index", str(index), "--model", str(tiny_model_path), "--text", "a square",
                     "--k", "20", "--folder", str(elsewhere)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[3] == str(photo)          # score, relevance, media, path


def test_a_missing_model_or_index_is_said_plainly(index, tmp_path, capsys):
    missing = tmp_path / "nope.pt"
    assert cli_main(["index", "search", "--index", str(index), "--model", str(missing), "--text", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jointspace index search: error: no model file at {missing}") and "Errno" not in err
    assert cli_main(["serve", "--index", str(index), "--model", str(missing)]) == 2
    assert f"no model file at {missing}" in capsys.readouterr().err
    assert cli_main(["index", "search", "--index", str(tmp_path / "none"), "--text", "x"]) == 2
    assert f"no jointspace index at {tmp_path / 'none'}" in capsys.readouterr().err
    assert cli_main(["index", "add", "--index", str(index), str(tmp_path / "gone.jpg")]) == 2
    assert f"no such file or folder: {tmp_path / 'gone.jpg'}" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly(index):
    """``jointspace index info | head -1``: the reader has gone before the command writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "service.cli", "index", "info", "--index", str(index)], cwd=REPO,
                              env=ENV, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 1 and done.stderr == ""


def test_a_busy_port_is_refused_before_the_model_loads(index, tmp_path, capsys):
    not_a_model = tmp_path / "model.pt"
    not_a_model.write_bytes(b"loading this would fail with another message")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_main(["serve", "--index", str(index), "--model", str(not_a_model), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err and "PORT=" in err, err
