"""The text tower a text search runs on (training/inference/text_tower.py): converted once per model file, it
embeds a query as the whole model does, and `index search --text` then loads neither torch nor the image side."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from training.inference import pretrained, text_tower
from training.inference.embedding import embed_texts
from training.models.checkpoint import load_model

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
    """The first text search with the shipped model prepares its tower; the next imports no torch at all, and both
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
    runs = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", script, "index", "search", "--index", str(demo / "index"),
                              "--text", "a cat", "--k", "3", "--json"], env=env, capture_output=True, text=True)
        runs.append((json.loads(run.stdout)["results"], run.stderr))
    (first, first_err), (second, second_err) = runs
    assert "preparing this model's text encoder" in first_err and "preparing" not in second_err
    assert '"torch": false' in second_err.splitlines()[-1]
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
