"""Ensembles that serve as one model: build → save → load → evaluate → index → serve, ranking by the weighted
concatenation of the members' normalised embeddings."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient

from conftest import build_index, tiny_config
from server_process import wait_ready
from index.embed import embed_sentences
from index.gallery import Gallery
from service.app import create_app
from service.cli import main as cli_main
from service.settings import Settings
from training.data.datasets import load_dataset
from training.data.preprocess import Preprocess, StackedPreprocess, open_image
from training.inference.embedding import FileReading
from training.inference.embedding import embed_image_files as embed_decoded
from training.evaluate import evaluate_model
from training.models.ensemble import EnsembleEmbedding
from training.models.checkpoint import load_model
from training.train import train

QUERIES = ["a red circle above a blue square", "a small green triangle", "two yellow stars"]


@pytest.fixture(scope="module")
def members(synth_small, tiny_model_path, tmp_path_factory):
    """The shared tiny model (32 px) and a second one (other seed, a bag-of-words text side, 40 px images: the
    members read different pixels)."""
    out = tmp_path_factory.mktemp("second")
    train(tiny_config(train={"epochs": 1, "seed": 3}, text={"encoder": "bow", "hidden": 32},
                      image={"image_size": 40, "resize": 40}), synth_small, out, progress=False, log=lambda *_: None)
    return [tiny_model_path, out / "model.pt"]


@pytest.fixture(scope="module")
def ensemble_path(members, tmp_path_factory):
    out = tmp_path_factory.mktemp("ensemble") / "ensemble.pt"
    rc = cli_main(["ensemble", "--models", *map(str, members), "--weights", "1", "0.5", "--out", str(out)])
    assert rc == 0
    return out


def _vectors(model, images, min_side):
    """A member's image embeddings of the images decoded as the ensemble decodes them: shrunk while decoding down to
    the ensemble's ``min_side`` (the largest of its members'), not the member's own."""
    read = lambda path, _: (open_image(path, min_side), None)     # noqa: E731 - workers=0: no pickling
    return torch.from_numpy(embed_decoded(model, images, FileReading(workers=0, read=read), progress=False).vectors)


def _expected(models, weights, images, texts, min_side):
    """The members' normalised embeddings, weighted, concatenated, normalised: (image, text) scores."""
    img = [_vectors(m, images, min_side) for m in models]
    txt = [torch.from_numpy(embed_sentences(m, texts, progress=False)) for m in models]
    def cat(parts):
        return F.normalize(torch.cat([w * F.normalize(p, dim=-1) for w, p in zip(weights, parts)], 1), dim=-1)

    return cat(img) @ cat(txt).t()


def test_ensemble_round_trip_ranks_by_the_members_concatenation(members, ensemble_path, synth_small, tmp_path):
    loaded = load_model(ensemble_path)
    assert isinstance(loaded, EnsembleEmbedding) and loaded.weights == [1.0, 0.5]
    assert loaded.cfg.model.embed_dim == 64 and loaded.fingerprint
    models = [load_model(p) for p in members]
    data = load_dataset(synth_small)
    records = data.split("val").images + data.split("test").images
    paths = [r.path for r in records]
    side = loaded.preprocess.min_side
    assert side == 40 and [m.preprocess.min_side for m in models] == [32, 40]
    expected = _expected(models, [1.0, 0.5], paths, QUERIES, side)                  # (images, queries)
    # Σ w_i² cos_i / Σ w_i²: the weighted mean of the members' cosines
    cosines = [(_vectors(m, paths, side) @ torch.from_numpy(embed_sentences(m, QUERIES, progress=False)).t())
               for m in models]
    torch.testing.assert_close(expected, (cosines[0] + 0.25 * cosines[1]) / 1.25, atol=1e-5, rtol=0)

    index_dir = build_index(ensemble_path, synth_small, tmp_path / "index")
    gallery = Gallery.load(index_dir, model=loaded)
    q = embed_sentences(loaded, QUERIES, progress=False)
    for row, hits in zip(expected.t(), gallery.search_images(q, 5)):
        assert [i for i, _ in hits] == torch.argsort(-row)[:5].tolist()
        assert np.allclose([s for _, s in hits], [row[i].item() for i, _ in hits], atol=1e-5)
    gallery.close()

    app = create_app(Settings(model=str(ensemble_path), index=str(index_dir), reload_interval_s=0))
    with TestClient(app) as client:
        wait_ready(client, timeout=120, poll=0.1)
        r = client.post("/v1/search/images", json={"text": QUERIES[0], "k": 5})
        assert r.status_code == 200
        assert [x["id"] for x in r.json()["results"]] == torch.argsort(-expected[:, 0])[:5].tolist()


def test_members_with_other_preprocessing_read_their_own_pixels(members, synth_small):
    models = [load_model(p) for p in members]
    ensemble = EnsembleEmbedding(models, [1.0, 1.0], ["a", "b"])
    pre = ensemble.preprocess
    assert isinstance(pre, StackedPreprocess) and pre.image_size == 40 and pre.channels == 6
    picture = open_image(load_dataset(synth_small).split("test").images[0].path)
    stacked = pre.pixels(picture)
    assert stacked.shape == (1, 6, 40, 40)
    for m, part in zip(models, pre.split(stacked)):                  # bit-identical to each member's own
        assert torch.equal(part, m.preprocess.pixels(picture))
    for m, part in zip(models, pre.split(pre.normalize(stacked))):
        torch.testing.assert_close(part, m.preprocess(picture), atol=0, rtol=0)
    same = EnsembleEmbedding([models[0], load_model(members[0])], [1.0, 1.0], ["a", "a2"])
    assert isinstance(same.preprocess, Preprocess)                   # equal preprocessing: the member's own
    with pytest.raises(ValueError, match="same number of crops"):
        StackedPreprocess((Preprocess(image_size=32, crops=1), Preprocess(image_size=40, crops=5)))


def test_ensemble_evaluates_as_one_model(members, ensemble_path, synth_small):
    data = load_dataset(synth_small).split("test")
    result = evaluate_model(load_model(ensemble_path), data, progress=False, workers=0)
    assert result["n_images"] == data.n_images and 0 <= result["rsum"] <= 600


def test_ensemble_command_rejects_bad_input(members, tmp_path, capsys):
    out = tmp_path / "e.pt"
    assert cli_main(["ensemble", "--models", str(members[0]), "--out", str(out)]) == 2
    assert "at least two" in capsys.readouterr().err
    assert cli_main(["ensemble", "--models", *map(str, members), "--weights", "1", "--out", str(out)]) == 2
    assert "one weight per model" in capsys.readouterr().err
    assert cli_main(["ensemble", "--models", *map(str, members), "--weights", "1", "-1", "--out", str(out)]) == 2
    assert "positive weight" in capsys.readouterr().err
    assert cli_main(["ensemble", "--models", str(members[0]), str(tmp_path / "nope.pt"), "--out", str(out)]) == 2
    assert "no model file" in capsys.readouterr().err
    assert not out.exists()
    assert cli_main(["ensemble", "--models", *map(str, members), "--querybank", str(tmp_path), "--out", str(out)]) == 2
    assert "no recognised captioned-image data set" in capsys.readouterr().err
    assert not out.exists()


def test_an_ensemble_carries_a_query_bank(members, ensemble_path, synth_small, tmp_path):
    """Without --querybank: the first member's bank captions (text), no images (those were the member's own
    vectors); with --querybank DATA: the train split sampled as `jointspace train` samples it, the images embedded
    by the ensemble — and `index build` uses it by default."""
    from training.inference.querybank import carried, image_vectors
    from training.inference.querybank import sample

    first = load_model(members[0])
    own = carried(first)
    assert own and own["captions"] and own["images"] is not None
    plain = carried(load_model(ensemble_path))
    assert plain["captions"] == own["captions"] and plain["images"] is None and plain["beta"] == own["beta"]

    out = tmp_path / "banked.pt"
    assert cli_main(["ensemble", "--models", *map(str, members), "--weights", "1", "0.5", "--querybank",
                     str(synth_small), "--out", str(out)]) == 0
    ensemble = load_model(out)
    bank = carried(ensemble)
    section = first.cfg.querybank
    texts, records = sample(load_dataset(synth_small).split("train"), section.captions, section.images,
                            first.cfg.train.seed)
    assert bank["captions"] == texts and bank["images"].shape == (len(records), 64)
    want = embed_decoded(ensemble, [r.path for r in records], FileReading(workers=0), progress=False).vectors
    np.testing.assert_allclose(image_vectors(bank), want, atol=bank["image_scales"].max().item() / 2 + 1e-6)
    assert ensemble.fingerprint == load_model(ensemble_path).fingerprint      # the bank is not part of the weights

    from index.generations import read_manifest

    index_dir = tmp_path / "index"
    assert cli_main(["index", "build", "--model", str(out), "--data", str(synth_small), "--split", "val", "--out",
                     str(index_dir), "--workers", "0", "--quiet"]) == 0
    entry = read_manifest(index_dir)["querybank"]
    assert (entry["origin"], entry["captions"], entry["images"]) == ("model", len(texts), len(records))


def test_an_ensemble_answers_the_config_keys_a_model_is_asked_for_typed(members, ensemble_path):
    """An ensemble's cfg is its own small typed config: width, similarity, the first member's image section, the
    text length it reads, no decoder or attention; model.pt stores it as a plain dict, members' configs whole."""
    from training.models.config_schema import EnsembleConfig, RunConfig

    first, second = (load_model(p) for p in members)
    loaded = load_model(ensemble_path)
    cfg = loaded.cfg
    assert isinstance(cfg, EnsembleConfig) and all(isinstance(m.cfg, RunConfig) for m in loaded.models)
    assert cfg.model.embed_dim == first.cfg.model.embed_dim + second.cfg.model.embed_dim
    assert cfg.model.similarity == "cosine" and cfg.image == first.cfg.image
    assert cfg.data.max_caption_len == 2048 and not cfg.decoder.enabled and not cfg.attention.enabled
    assert cfg.ensemble.weights == [1.0, 0.5] and cfg.name == f"ensemble({first.cfg.name}+{second.cfg.name})"
    with pytest.raises(AttributeError):
        _ = cfg.train
    payload = torch.load(ensemble_path, weights_only=True)
    assert type(payload["config"]) is dict and payload["config"] == cfg.model_dump()
    assert payload["members"][0]["config"] == first.cfg.model_dump()

