"""Text encoders, model save/load round trip (model.pt holds only tensors and plain values, and loads with
torch.load(weights_only=True)), and the training loop's bookkeeping on a tiny run."""
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from training.data.datasets import load_dataset
from training.data.vocab import pad_batch
from training.inference.embedding import embed_split, embed_texts
from training.models.ensemble import EnsembleEmbedding
from training.models.factory import TEXT_ENCODERS, build_text_encoder
from service.cli import main as cli_main
from training.models.model import build_model
from training.models.checkpoint import fingerprint, load_checkpoint, load_model, save_model, save_slim
from training.train import train

ROOT = Path(__file__).resolve().parents[1]


def test_gru_ignores_padding_and_bow_ignores_order():
    cfg = tiny_config()
    torch.manual_seed(0)
    gru = build_text_encoder(cfg.text, 20).eval()
    ids, lengths = pad_batch([[5, 6, 7], [5, 6, 7, 8, 9]])      # row 0 is padded to length 5
    a = gru(ids[:1], lengths[:1])
    b = gru(torch.tensor([[5, 6, 7]]), torch.tensor([3]))
    assert torch.allclose(a, b, atol=1e-6)                       # padding does not change the sentence
    swapped = gru(torch.tensor([[7, 6, 5]]), torch.tensor([3]))
    assert not torch.allclose(a, swapped)                        # order matters to a GRU
    bow = build_text_encoder(tiny_config(text={"encoder": "bow"}).text, 20).eval()
    assert torch.allclose(bow(torch.tensor([[5, 6, 7]]), torch.tensor([3])),
                          bow(torch.tensor([[7, 6, 5]]), torch.tensor([3])))  # ...and not to a bag of words
    assert {"gru", "bow"} <= set(TEXT_ENCODERS.names())


def test_binary_bow_counts_each_word_once():
    cfg = tiny_config(text={"encoder": "bow", "options": {"binary": True}})
    bow = build_text_encoder(cfg.text, 20).eval()
    assert torch.allclose(bow(torch.tensor([[5, 5, 6]]), torch.tensor([3])),
                          bow(torch.tensor([[5, 6, 0]]), torch.tensor([2])))


def test_train_saves_loadable_self_contained_model(synth_small, tmp_path):
    cfg = tiny_config(train={"epochs": 2})
    summary = train(cfg, synth_small, tmp_path / "run", progress=False, log=lambda *_: None)
    run = tmp_path / "run"
    assert (run / "model.pt").exists() and (run / "config.yaml").exists()
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2] and all("rsum" in r["val"] for r in log)
    assert summary["best_val_rsum"] == max(r["val"]["rsum"] for r in log)

    payload = load_checkpoint(run / "model.pt")
    assert payload["config"].text.encoder == "gru" and payload["vocab"]["idx2word"][:4] == [
        "<pad>", "<start>", "<end>", "<unk>"]
    assert payload["backbone"]["preprocess"]["image_size"] == 32

    # round trip: identical embeddings from the reloaded model
    model = load_model(run / "model.pt")
    again = load_model(run / "model.pt")
    test = load_dataset(synth_small).split("test")
    a = embed_split(model, test, progress=False, workers=0)
    b = embed_split(again, test, progress=False, workers=0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert model.fingerprint == payload["fingerprint"] == fingerprint(again)
    sent = embed_texts(model, ["a red circle left of a blue square", "an unknownword"])
    assert sent.shape == (2, 32) and torch.allclose(sent.norm(dim=1), torch.ones(2), atol=1e-5)


def test_training_is_deterministic(synth_small, tmp_path):
    cfg = tiny_config(train={"epochs": 1})
    for name in ("a", "b"):
        train(cfg, synth_small, tmp_path / name, progress=False, log=lambda *_: None)
    sa = load_checkpoint(tmp_path / "a" / "model.pt")["state_dict"]
    sb = load_checkpoint(tmp_path / "b" / "model.pt")["state_dict"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_not_a_model_file_is_refused(tmp_path):
    bad = tmp_path / "x.pt"
    torch.save({"hello": 1}, bad)
    with pytest.raises(ValueError, match="not a jointspace model"):
        load_model(bad)


@pytest.mark.parametrize("similarity,projection", [("order", "linear"), ("cosine", "two_branch")])
def test_variants_build_and_embed(similarity, projection):
    from training.data.vocab import Vocabulary
    cfg = tiny_config(model={"similarity": similarity, "projection": projection, "projection_hidden": 16})
    model = build_model(cfg, Vocabulary.build(["a red circle"])).eval()
    emb = embed_texts(model, ["a red circle", "a"])
    img = model.embed_images(torch.randn(2, 3, 32, 32))
    assert model.score(img, emb).shape == (2, 2)
    if similarity == "order":
        assert (emb >= 0).all() and (img >= 0).all()


# --- model.pt: tensors and plain values only, read with torch.load(weights_only=True) ----------------------------

def _plain_load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_old_and_new_model_files_load_with_weights_only(tiny_model_path, tiny_stt_model_path, tmp_path):
    shipped = sorted((ROOT / "training" / "pretrained").glob("*.pt"))
    assert shipped
    model = load_model(tiny_model_path)                               # a trained model (trainer's extra)
    save_slim(model, tmp_path / "slim.pt", half=True)
    save_model(EnsembleEmbedding([model, load_model(tiny_model_path)], [0.5, 0.5], ["a", "b"]),
               tmp_path / "ensemble.pt")
    for path in (*shipped, tiny_model_path, tiny_stt_model_path, tmp_path / "slim.pt", tmp_path / "ensemble.pt"):
        payload = _plain_load(path)                                   # torch's own allow-list, nothing added
        assert payload["format"] == "jointspace-model/1", path
        assert load_checkpoint(path)["fingerprint"] == payload["fingerprint"]
        if path not in shipped:                # rebuilding the shipped model is tests/test_pretrained.py's
            assert load_model(path).fingerprint == payload["fingerprint"], path


def test_a_model_file_that_would_run_code_is_refused(tiny_model_path, tmp_path, capsys):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    payload = torch.load(tiny_model_path, map_location="cpu", weights_only=True)
    payload["extra"] = {"note": Payload()}
    torch.save(payload, tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"is refused: it holds a Python object \((posix|os|nt)\.system\).*could "
                                         r"run code"):
        load_model(tmp_path / "model.pt")
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):                      # what weights_only=False would have run
        _plain_load(tmp_path / "model.pt")
    rc = cli_main(["index", "build", "--model", str(tmp_path / "model.pt"), "--images", str(tmp_path),
                   "--out", str(tmp_path / "index"), "--quiet", "--workers", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "is refused" in err and "could run code" in err and "Traceback" not in err
    assert not marker.exists()
    (tmp_path / "junk.pt").write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="not a jointspace model"):
        load_model(tmp_path / "junk.pt")


def test_a_stored_config_older_than_some_keys_is_completed_from_the_schema_on_load(tmp_path):
    """A model.pt written before a key existed (here: loss.memory, image.feature_dropout, text.options.pooling)
    loads with that key's one default (config_schema.py) and embeds as before; a stored key this version does not
    know is refused, naming it."""
    from training.data.vocab import Vocabulary
    from training.models.config_schema import defaults

    cfg = tiny_config(text={"options": {"pooling": "mean"}})
    model = build_model(cfg, Vocabulary.build(["a red circle", "a blue square"]))
    save_model(model, tmp_path / "model.pt")
    payload = torch.load(tmp_path / "model.pt", weights_only=True)
    del payload["config"]["loss"]["memory"], payload["config"]["image"]["feature_dropout"]
    payload["config"]["text"]["options"] = {}                 # before text.options.pooling existed: GRU's last state
    torch.save(payload, tmp_path / "old.pt")
    old = load_model(tmp_path / "old.pt")
    assert old.cfg.loss.memory == defaults()["loss"]["memory"] == 0
    assert old.cfg.image.feature_dropout == 0.0 and old.cfg.text.options.pooling == "last"
    assert old.fingerprint == payload["fingerprint"]           # the file's identity is kept
    assert old.text_encoder.pooling == "last"                # the default of GRUOptions, not restated elsewhere
    with torch.no_grad():
        assert old.embed_texts(*pad_batch([[4, 5, 6]])).shape == (1, 32)

    payload["config"]["loss"]["memroy"] = 8
    torch.save(payload, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="future.pt: its stored config .*unknown config key 'loss.memroy'"):
        load_model(tmp_path / "future.pt")


def test_a_loaded_model_holds_a_typed_config_and_model_pt_stores_it_as_a_plain_dict(tmp_path):
    """build_model and load_model hand the code a RunConfig; model.pt keeps the config as the plain dict it
    always held (cfg.model_dump()), so a file's fingerprint and format do not depend on the classes."""
    from training.data.vocab import Vocabulary
    from training.models.config_schema import RunConfig

    cfg = tiny_config(text={"encoder": "rcn", "options": {"capsules": 2, "lambda": 0.1}})
    model = build_model(cfg, Vocabulary.build(["a red circle"]))
    assert model.cfg is cfg
    fp = save_model(model, tmp_path / "model.pt")
    stored = torch.load(tmp_path / "model.pt", weights_only=True)["config"]
    assert type(stored) is dict and stored == cfg.model_dump()
    assert stored["text"]["options"] == {"word_vectors": None, "word_vector_epochs": 5, "capsules": 2,
                                         "recursions": 4, "lambda": 0.1}
    assert json.loads(json.dumps(stored)) == stored                      # plain values only
    loaded = load_model(tmp_path / "model.pt")
    assert isinstance(loaded.cfg, RunConfig) and loaded.cfg == cfg and loaded.cfg.text.options.capsules == 2
    assert isinstance(load_checkpoint(tmp_path / "model.pt")["config"], RunConfig)
    assert fingerprint(loaded) == fp == loaded.fingerprint
    with pytest.raises(AttributeError):
        _ = loaded.cfg.model.embed_dims

