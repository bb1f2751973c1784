"""benchmarks/open_vocab.py's bookkeeping: a row's settings in words, and how a run's rows enter the results file."""
import json

from benchmarks import open_vocab
from training.config import load_config


def test_the_shipped_head_is_described_from_its_config_and_a_change_shows():
    shipped = load_config(open_vocab.REPO / "configs" / "flickr8k.yaml")
    c = shipped.concepts
    words = open_vocab.own_settings(shipped)
    assert f"ConSE top {c.top_k} at class temperature {c.class_temperature:g}" in words
    assert f"COSMO term (f {c.confidence_floor:g}" in words
    assert f"typicality gate at w {c.familiar_weight:g}" in words
    plain = load_config(open_vocab.REPO / "configs" / "flickr8k.yaml",
                        ["concepts.confidence_floor=1.0", "concepts.familiar_weight=null", "concepts.top_k=3"])
    words = open_vocab.own_settings(plain)
    assert words.startswith("ConSE top 3 ") and "COSMO" not in words and "typicality gate at" not in words


def test_rows_of_a_name_are_replaced_and_a_full_run_replaces_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr(open_vocab, "RESULTS", tmp_path / "open_vocab.json")
    open_vocab.save_rows("levers", [{"name": "a", "v": 1}, {"name": "b", "v": 1}])
    open_vocab.save_rows("served", [{"name": "s", "v": 1}])
    open_vocab.save_rows("levers", [{"name": "b", "v": 2}])                  # --only b
    data = json.loads((tmp_path / "open_vocab.json").read_text())
    assert data["levers"] == [{"name": "a", "v": 1}, {"name": "b", "v": 2}]
    open_vocab.save_rows("levers", [{"name": "c", "v": 3}], replace=True)     # a full run
    data = json.loads((tmp_path / "open_vocab.json").read_text())
    assert data["levers"] == [{"name": "c", "v": 3}] and data["served"] == [{"name": "s", "v": 1}]
