"""benchmarks/open_vocab.py's bookkeeping: a row's settings in words, and how a run's rows enter the results file."""
import json
import types

import torch

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


class _Concepts:
    def __init__(self, discount: float):
        self.person_discount = discount


class _Model:
    """What lever_metrics reads of a model: its head's person discount, a(x) and the embedding (the unit features)."""

    def __init__(self, discount: float, unlike: dict):
        self.cfg = types.SimpleNamespace(concepts=_Concepts(discount))
        self.concepts = object() if discount else None
        self.unlike = unlike

    def embed_features(self, x):
        return torch.nn.functional.normalize(x, dim=-1)

    def unfamiliarity(self, x):
        return torch.tensor([self.unlike.get(tuple(row.tolist()), 0.0) for row in x])


def test_the_levers_rank_people_queries_with_the_person_discount_as_the_index_does():
    """A gravel photo unlike every training photo outscores the astronaut for every people query on raw scores; the
    person discount (λ · a(x) off a query that names a person) puts the astronaut first, and a query that names
    no person keeps its ranking."""
    gravel, astronaut = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]
    demo = torch.tensor([astronaut, gravel])
    people = torch.nn.functional.normalize(torch.tensor([[0.7, 0.6, 0.1, 0.0]] * len(open_vocab.PEOPLE_QUERIES)),
                                           dim=-1)
    other = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0, 0.2, 0.0]]), dim=-1)   # the texture's caption
    arrays = types.SimpleNamespace(
        features={"train": torch.eye(4), "dev": torch.eye(4)[:2], "imagenet": torch.eye(4)[:2], "demo": demo},
        bank_images=torch.tensor([2, 3]),
        text={"dev": torch.eye(4)[:2], "bank": torch.eye(4)[2:], "classes": torch.eye(4)[:2],
              "bank_classes": torch.eye(4)[2:], "demo": torch.cat([people[:1], other]), "people": people},
        names_person={"dev": torch.zeros(2), "classes": torch.zeros(2), "demo": torch.tensor([1.0, 0.0]),
                      "people": torch.ones(len(open_vocab.PEOPLE_QUERIES))},
        dev_owner=torch.tensor([0, 1]), demo_owner=torch.tensor([0, 1]), demo_captions=["a person", "a texture"],
        demo_photos=["astronaut.jpg", "gravel.jpg"])
    plain = open_vocab.lever_metrics(_Model(0.0, {}), arrays, "none")
    assert plain["people_found"] == 0 and plain["demo_missed"] == ["a person"]
    discounted = open_vocab.lever_metrics(_Model(0.5, {tuple(gravel): 1.0}), arrays, "none")
    assert discounted["people_found"] == len(open_vocab.PEOPLE_QUERIES) and discounted["demo_missed"] == []
    assert discounted["imagenet_t2i_r1"] == plain["imagenet_t2i_r1"]
