"""The text tower a text search runs on (training/inference/text_tower.py): converted once per model file, it
embeds a query as the whole model does, and `index search --text` then loads neither torch nor the image side."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from training.inference import pretrained, text_tower
from training.inference.embedding import embed_texts
from training.models.checkpoint import load_model
from server_process import alive, wait_ready

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shipped():
    return load_model(pretrained.model_path())


def test_the_shipped_models_text_tower_embeds_as_pytorch_does(shipped, tmp_path):
    path = pretrained.model_path()
    assert text_tower.load(path, root=tmp_path) is None and not text_tower.prepared(path, root=tmp_path)
    tower = text_tower.prepare(shipped, path, root=tmp_path)
    assert tower is not None and tower.fingerprint == shipped.fingerprint
    texts = ["a cat on a sofa", "people", "a red bus in the rain at night, seen from the pavement " * 3]
    words = [["sofa"], [], ["rain", "night"]]
    with torch.no_grad():
        expected = embed_texts(shipped, texts, words).numpy()
    got = text_tower.load(path, root=tmp_path).embed(texts, words)        # read back from its folder
    assert got.shape == expected.shape
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert float((got * expected).sum(1).min()) > 0.9999
    # another model file has another folder (the key is the file's bytes)
    other = tmp_path / "copy.pt"
    other.write_bytes(path.read_bytes() + b"")
    assert text_tower.folder_for(other, tmp_path) == text_tower.folder_for(path, tmp_path)
    other.write_bytes(path.read_bytes()[:-1])
    assert text_tower.folder_for(other, tmp_path) != text_tower.folder_for(path, tmp_path)


def test_a_model_whose_text_encoder_reads_the_vocabulary_says_why_and_is_not_converted(tiny_model_path, tmp_path):
    model = load_model(tiny_model_path)
    assert "vocabulary" in text_tower.unsupported_reason(model)
    assert text_tower.prepare(model, tiny_model_path, root=tmp_path) is None
    assert text_tower.prepared(tiny_model_path, root=tmp_path)       # not tried again
    facts = json.loads((text_tower.folder_for(tiny_model_path, tmp_path) / "tower.json").read_text())
    assert "vocabulary" in facts["unsupported"]
    assert text_tower.load(tiny_model_path, root=tmp_path) is None


def test_text_search_runs_without_torch_once_prepared(tiny_index_dir, tiny_model_path, tmp_path):
    """`index build` prepares the shipped model's tower, so the first text search afterwards converts nothing and
    imports no torch; a search whose model has no prepared tower (an index built before) prepares it, and both
    print the same results. A model whose tower cannot be converted still searches (in PyTorch)."""
    demo = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOINTSPACE_CACHE": str(tmp_path / "cache")}
    script = ("import sys, json; from service.cli import main; code = main(sys.argv[1:]); "
              "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}), file=sys.stderr)")
    from index.samples import write_samples

    photos = write_samples(demo)
    build = subprocess.run([sys.executable, "-m", "service.cli", "index", "build", "--images", str(photos), "--out",
                            str(demo / "index"), "--quiet", "--workers", "0", "--no-videos", "--no-ocr"],
                           env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    folder = text_tower.folder_for(pretrained.model_path(), tmp_path / "cache" / "text")
    facts = json.loads((folder / "tower.json").read_text())          # the build prepared it
    assert "unsupported" not in facts and (folder / "text.onnx").is_file()
    prepared_at = (folder / "tower.json").stat().st_mtime_ns

    def search() -> tuple[list, str]:
        run = subprocess.run([sys.executable, "-c", script, "index", "search", "--index", str(demo / "index"),
                              "--text", "a cat", "--k", "3", "--json"], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)["results"], run.stderr

    after_build, after_build_err = search()             # the first search: nothing converted, no torch
    assert "preparing" not in after_build_err and '"torch": false' in after_build_err.splitlines()[-1]
    assert (folder / "tower.json").stat().st_mtime_ns == prepared_at
    shutil.rmtree(folder)                               # as after an index built before the build prepared it
    (first, first_err), (second, second_err) = search(), search()
    assert "preparing this model's text encoder" in first_err and "preparing" not in second_err
    assert '"torch": false' in second_err.splitlines()[-1]
    assert [r["path"] for r in after_build] == [r["path"] for r in first]
    assert [r["path"] for r in first] == [r["path"] for r in second]
    assert Path(first[0]["path"]).name == "cat.jpg"
    assert [r["score"] for r in first] == pytest.approx([r["score"] for r in second], abs=1e-4)
    # a model with a vocabulary-reading text encoder: searched in PyTorch, the same way every time
    index, model = tiny_index_dir, tiny_model_path
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", script, "index", "search", "--index", str(index), "--model",
                              str(model), "--text", "a red circle", "--k", "2", "--json"], env=env,
                             capture_output=True, text=True)
        assert run.returncode == 0 and len(json.loads(run.stdout)["results"]) == 2, run.stderr
        assert "preparing" not in run.stderr


def _build_tiny(synth_small, model_path, out) -> int:
    """`index build` of the tiny data set's test split in this process (so that it can be patched)."""
    from service.cli import main

    return main(["index", "build", "--data", str(synth_small), "--split", "test", "--model", str(model_path),
                 "--out", str(out), "--workers", "0", "--no-ocr"])


def test_a_conversion_that_fails_does_not_fail_the_build_and_says_why(synth_small, tiny_model_path, tmp_path,
                                                                      monkeypatch, capsys):
    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(text_tower, "unsupported_reason", lambda model: None)      # taken for a convertible one

    def broken(model, scratch, facts):
        raise RuntimeError("the exporter gave up")
    monkeypatch.setattr(text_tower, "_convert", broken)
    assert _build_tiny(synth_small, tiny_model_path, tmp_path / "index") == 0
    assert (tmp_path / "index" / "CURRENT").is_file()
    err = capsys.readouterr().err
    assert "preparing the model's text encoder" in err
    assert "text encoder for terminal searches: not prepared: the conversion failed: RuntimeError: the exporter " \
           "gave up" in err
    facts = json.loads((text_tower.folder_for(tiny_model_path) / "tower.json").read_text())
    assert facts["unsupported"] == "the conversion failed: RuntimeError: the exporter gave up"
    assert text_tower.load(tiny_model_path) is None          # a search embeds in PyTorch, and does not try again
    # a failure that may pass (out of memory, a disk error): nothing kept, the build still done, tried next time
    shutil.rmtree(text_tower.folder_for(tiny_model_path))

    def out_of_memory(model, scratch, facts):
        raise MemoryError()
    monkeypatch.setattr(text_tower, "_convert", out_of_memory)
    assert _build_tiny(synth_small, tiny_model_path, tmp_path / "index2") == 0
    assert "not prepared: MemoryError" in capsys.readouterr().err
    assert not text_tower.prepared(tiny_model_path)
    assert not [p for p in (tmp_path / "cache" / "text").iterdir()]          # no half-written folder left


def test_index_add_prepares_what_the_build_could_not(synth_small, tiny_model_path, tmp_path, monkeypatch, capsys):
    """`index add` (and `sync`) prepare the tower too: a build whose preparation failed for a passing reason
    leaves it to them."""
    from service.cli import main

    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path / "cache"))
    calls = []
    real = text_tower._prepare_in
    monkeypatch.setattr(text_tower, "_prepare_in", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    folder = text_tower.folder_for(tiny_model_path)
    assert _build_tiny(synth_small, tiny_model_path, tmp_path / "index") == 0
    assert calls == [folder] and text_tower.prepared(tiny_model_path)      # its folder: why not
    shutil.rmtree(text_tower.folder_for(tiny_model_path))
    photo = next((synth_small / "images").glob("*.jpg"))
    capsys.readouterr()
    assert main(["index", "add", "--index", str(tmp_path / "index"), "--model", str(tiny_model_path), str(photo),
                 "--workers", "0"]) == 0
    assert calls == [folder] * 2 and text_tower.prepared(tiny_model_path)
    assert main(["index", "add", "--index", str(tmp_path / "index"), "--model", str(tiny_model_path), str(photo),
                 "--workers", "0", "--quiet"]) == 0
    assert len(calls) == 2                                  # prepared already: not again


def _ready_service(settings, timeout=60.0):
    from fastapi.testclient import TestClient

    from service.app import create_app

    client = TestClient(create_app(settings))
    client.__enter__()
    wait_ready(client, timeout)
    return client


def test_serve_prepares_the_text_tower_in_the_background_without_delaying_readiness(
        tiny_model_path, tiny_index_dir, tmp_path, monkeypatch):
    """Once ready, serve starts the preparation in a process of its own: /readyz does not wait for it, the
    requests are answered meanwhile, and stopping the service stops it."""
    import service.state
    from service.settings import Settings

    monkeypatch.setattr(text_tower, "unsupported_reason", lambda model: None)
    started = tmp_path / "started"
    # a preparation that takes a minute: it writes its pid, then sleeps
    slow = [sys.executable, "-c", f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); "
                                  f"time.sleep(60)"]
    seen = []
    monkeypatch.setattr(text_tower, "command", lambda path, fp=None: seen.append((path, fp)) or slow)
    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path / "cache"))
    client = _ready_service(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))
    try:
        deadline = time.monotonic() + 30
        while not started.exists() or not started.read_text():
            assert time.monotonic() < deadline, "the background preparation never started"
            time.sleep(0.05)
        pid = int(started.read_text())
        os.kill(pid, 0)                                      # still preparing…
        assert client.get("/readyz").status_code == 200      # …and ready all the same
        assert client.post("/v1/search/images", json={"text": "a red circle", "k": 2}).status_code == 200
        assert seen == [(str(tiny_model_path), load_model(tiny_model_path).fingerprint)]
    finally:
        client.__exit__(None, None, None)
    deadline = time.monotonic() + 10
    while alive(pid):                                       # stopped with the service
        assert time.monotonic() < deadline, "the background preparation outlived the service"
        time.sleep(0.05)


def test_serve_runs_the_real_preparation_and_leaves_the_cache_prepared(tiny_model_path, tiny_index_dir, tmp_path,
                                                                        monkeypatch):
    """The process serve starts (python -m training.inference.text_tower) prepares the served model file's folder
    (for the tiny model: one that says why its searches run in PyTorch); a second start finds it prepared."""
    from service.settings import Settings

    real = text_tower.unsupported_reason
    monkeypatch.setattr(text_tower, "unsupported_reason", lambda model: None)   # in this process: it is started
    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    client = _ready_service(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))
    try:
        deadline = time.monotonic() + 90
        while not text_tower.prepared(tiny_model_path):
            assert time.monotonic() < deadline, "serve did not prepare the text tower"
            time.sleep(0.1)
    finally:
        client.__exit__(None, None, None)
    facts = json.loads((text_tower.folder_for(tiny_model_path) / "tower.json").read_text())
    assert facts["unsupported"] == real(load_model(tiny_model_path))


def test_serve_prepares_nothing_when_told_not_to(tiny_model_path, tiny_index_dir, tmp_path, monkeypatch):
    """JOINTSPACE_PREPARE_TEXT_TOWER=false: no background process is started, however long the service runs."""
    import service.state
    from service.settings import Settings

    monkeypatch.setattr(text_tower, "unsupported_reason", lambda model: None)
    seen = []
    monkeypatch.setattr(text_tower, "command", lambda path, fp=None: seen.append(path) or [sys.executable, "-c", "pass"])
    monkeypatch.setenv("JOINTSPACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("JOINTSPACE_PREPARE_TEXT_TOWER", "false")
    settings = Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0)
    assert settings.prepare_text_tower is False
    client = _ready_service(settings)
    try:
        assert client.post("/v1/search/images", json={"text": "a red circle", "k": 2}).status_code == 200
        assert not any(task.get_name() == "jointspace-text-tower" for task in client.app.state.service._tasks)
    finally:
        client.__exit__(None, None, None)
    assert seen == []
