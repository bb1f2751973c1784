"""Tests for training.data.synth: files, captions, splits, determinism, minimal pairs, geometry and pixels."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.data.synth import COLOURS, generate, minimal_pairs, tokenize

IMAGE_SIZE = 128


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("synth"), n_images=120, seed=0, image_size=IMAGE_SIZE,
                    progress=False)


@pytest.fixture(scope="module")
def dataset(dataset_path: Path) -> dict:
    return json.loads(dataset_path.read_text())


@pytest.fixture(scope="module")
def by_id(dataset: dict) -> dict[int, dict]:
    return {record["imgid"]: record for record in dataset["images"]}


def load_pixels(dataset_path: Path, record: dict) -> np.ndarray:
    path = dataset_path.parent / record["filepath"] / record["filename"]
    return np.asarray(Image.open(path), dtype=np.float32)


def test_files_exist_as_rgb_images_of_the_requested_size(dataset_path: Path, dataset: dict) -> None:
    assert dataset_path.name == "dataset.json" and dataset["dataset"] == "synthetic"
    assert [r["imgid"] for r in dataset["images"]] == list(range(120))
    for record in dataset["images"]:
        with Image.open(dataset_path.parent / record["filepath"] / record["filename"]) as image:
            assert image.mode == "RGB" and image.size == (IMAGE_SIZE, IMAGE_SIZE)
    assert not list(dataset_path.parent.rglob("*.tmp"))


def test_five_distinct_captions_in_karpathy_form(dataset: dict) -> None:
    all_sentids = []
    for record in dataset["images"]:
        raws = [s["raw"] for s in record["sentences"]]
        assert len(raws) == 5 and len(set(raws)) == 5
        assert record["sentids"] == [s["sentid"] for s in record["sentences"]]
        for sentence in record["sentences"]:
            assert sentence["imgid"] == record["imgid"]
            assert sentence["tokens"] == tokenize(sentence["raw"]) == sentence["raw"].split()
        all_sentids += record["sentids"]
    assert len(set(all_sentids)) == len(all_sentids)


def test_vocabulary_is_modest(dataset: dict) -> None:
    words = {t for r in dataset["images"] for s in r["sentences"] for t in s["tokens"]}
    assert set(COLOURS) <= words and len(words) < 100


def test_scene_mix_and_objects(dataset: dict) -> None:
    counts = Counter(len(r["scene"]) for r in dataset["images"])
    assert counts == {1: 24, 2: 78, 3: 18}     # 20 / 65 / 15 %
    for record in dataset["images"]:
        scene = record["scene"]
        assert len({o["colour"] for o in scene}) == len({o["shape"] for o in scene}) == len(scene)
        assert all(o["size"] in ("small", "big") and 0 < o["x"] < 1 and 0 < o["y"] < 1 for o in scene)


def test_splits(dataset: dict, tmp_path: Path) -> None:
    assert Counter(r["split"] for r in dataset["images"]) == {"train": 96, "val": 12, "test": 12}
    small = json.loads(generate(tmp_path, n_images=30, seed=3, image_size=32, progress=False).read_text())
    assert {r["split"] for r in small["images"]} == {"train", "val", "test"}
    tiny = json.loads(generate(tmp_path / "tiny", n_images=3, image_size=32, progress=False).read_text())
    assert sorted(r["split"] for r in tiny["images"]) == ["test", "train", "val"]
    with pytest.raises(ValueError):
        generate(tmp_path / "none", n_images=2, progress=False)


def _snapshot(out_dir: Path) -> tuple[bytes, dict[str, bytes]]:
    return ((out_dir / "dataset.json").read_bytes(),
            {p.name: p.read_bytes() for p in sorted((out_dir / "images").iterdir())})


def test_deterministic_per_seed(tmp_path: Path) -> None:
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        generate(tmp_path / name, n_images=40, seed=seed, image_size=64, progress=False)
    first, again, other = (_snapshot(tmp_path / name) for name in "abc")
    assert first == again
    assert first[0] != other[0]
    assert first[1] != other[1]


def test_minimal_pairs_are_mutual_same_split_and_bag_of_words_equivalent(dataset_path: Path, dataset: dict,
                                                                         by_id: dict[int, dict]) -> None:
    pairs = minimal_pairs(dataset)
    paired = [r for r in dataset["images"] if r["minimal_pair"] is not None]
    assert len(pairs) * 2 == len(paired) and all(a < b for a, b in pairs)
    assert {by_id[a]["minimal_pair_kind"] for a, _ in pairs} == {"colour_swap", "position_swap"}
    assert 0.3 <= len(paired) / sum(len(r["scene"]) == 2 for r in dataset["images"]) <= 0.5
    for a, b in pairs:
        ra, rb = by_id[a], by_id[b]
        assert ra["minimal_pair"] == b and rb["minimal_pair"] == a
        assert ra["split"] == rb["split"] and ra["minimal_pair_kind"] == rb["minimal_pair_kind"]
        # caption k of A and caption k of B: different sentences, same multiset of words
        for sa, sb in zip(ra["sentences"], rb["sentences"]):
            assert sa["raw"] != sb["raw"] and Counter(sa["tokens"]) == Counter(sb["tokens"])
        assert not {s["raw"] for s in ra["sentences"]} & {s["raw"] for s in rb["sentences"]}
        assert not np.array_equal(load_pixels(dataset_path, ra), load_pixels(dataset_path, rb))


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_pair_fraction_sets_the_share_of_paired_two_object_images(tmp_path: Path, fraction: float) -> None:
    data = json.loads(generate(tmp_path, n_images=200, seed=2, image_size=32, pair_fraction=fraction,
                               progress=False).read_text())
    two = [r for r in data["images"] if len(r["scene"]) == 2]
    paired = [r for r in two if r["minimal_pair"] is not None]
    assert len(paired) == round(len(two) * fraction / 2) * 2


def test_pair_fraction_out_of_range_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pair_fraction"):
        generate(tmp_path, n_images=20, pair_fraction=1.5, progress=False)


def test_minimal_pair_scenes_differ_only_by_the_swap(dataset: dict, by_id: dict[int, dict]) -> None:
    for a, b in minimal_pairs(dataset):
        (a0, a1), (b0, b1) = by_id[a]["scene"], by_id[b]["scene"]
        (ra,), (rb,) = by_id[a]["relations"], by_id[b]["relations"]
        if by_id[a]["minimal_pair_kind"] == "colour_swap":
            assert (b0["colour"], b1["colour"]) == (a1["colour"], a0["colour"])
            assert [{**o, "colour": None} for o in (a0, a1)] == [{**o, "colour": None} for o in (b0, b1)]
            assert ra == rb
        else:
            assert ((b0["x"], b0["y"]), (b1["x"], b1["y"])) == ((a1["x"], a1["y"]), (a0["x"], a0["y"]))
            assert [{**o, "x": 0, "y": 0} for o in (a0, a1)] == [{**o, "x": 0, "y": 0} for o in (b0, b1)]
            assert rb == {"subject": ra["object"], "relation": ra["relation"], "object": ra["subject"]}


def _holds(subject: dict, relation: str, obj: dict) -> bool:
    """Unambiguous: clearly apart along the relation's axis, close across it."""
    dx, dy = obj["x"] - subject["x"], obj["y"] - subject["y"]
    along, across = {"left": (dx, dy), "right": (-dx, dy), "above": (dy, dx), "below": (-dy, dx)}[relation]
    return along > 0.25 and abs(across) < 0.1


def test_relations_field_matches_geometry(dataset: dict) -> None:
    for record in dataset["images"]:
        scene = record["scene"]
        assert len(record["relations"]) == len(scene) - 1
        for r in record["relations"]:
            relation = r["relation"].removesuffix(" of")
            assert _holds(scene[r["subject"]], relation, scene[r["object"]])


_COLOUR = "(" + "|".join(COLOURS) + ")"
_NOUN = rf"an? (?:\w+ )?{_COLOUR} \w+"
_RELATION = r"(?:to the |on the )?(left|right) of|(above|over|below|under|beneath)"
_DIRECT = re.compile(rf"^(?:there is |an image of |a picture of )?{_NOUN} (?:is )?(?:{_RELATION}) {_NOUN}$")
_WITH = re.compile(rf"^(?:there is |an image of |a picture of )?{_NOUN} with {_NOUN} "
                   r"(?:(?:to|on) its (left|right)|(above|over|below|under) it)$")
_VERTICAL = {"above": "above", "over": "above", "below": "below", "under": "below", "beneath": "below"}


def test_captions_match_geometry(dataset: dict) -> None:
    checked = 0
    for record in dataset["images"]:
        if len(record["scene"]) != 2:
            continue
        colour = {o["colour"]: o for o in record["scene"]}
        for sentence in record["sentences"]:
            if m := _DIRECT.match(sentence["raw"]):        # "<X> <relation> <Y>"
                x, horizontal, vertical, y = m.groups()
            elif m := _WITH.match(sentence["raw"]):        # "<Y> with <X> to its left"
                y, x, horizontal, vertical = m.groups()
            else:
                continue
            assert _holds(colour[x], horizontal or _VERTICAL[vertical], colour[y]), sentence["raw"]
            checked += 1
    assert checked > 100


def test_one_object_captions_match_location(dataset: dict) -> None:
    regions = {"left": lambda x, y: x < 0.35, "right": lambda x, y: x > 0.65,
               "top": lambda x, y: y < 0.35, "upper": lambda x, y: y < 0.35,
               "bottom": lambda x, y: y > 0.65, "lower": lambda x, y: y > 0.65,
               "middle": lambda x, y: 0.4 < x < 0.6 and 0.4 < y < 0.6,
               "centre": lambda x, y: 0.4 < x < 0.6 and 0.4 < y < 0.6}
    for record in dataset["images"]:
        if len(record["scene"]) == 1:
            (o,) = record["scene"]
            for sentence in record["sentences"]:
                words = [w for w in sentence["tokens"] if w in regions]
                assert len(words) == 1 and regions[words[0]](o["x"], o["y"]), sentence["raw"]


def test_pixels_show_object_colours_on_a_neutral_background(dataset_path: Path, dataset: dict) -> None:
    for record in dataset["images"]:
        pixels = load_pixels(dataset_path, record)
        for o in record["scene"]:
            cx, cy = int(o["x"] * IMAGE_SIZE), int(o["y"] * IMAGE_SIZE)
            centre = pixels[cy - 1:cy + 2, cx - 1:cx + 2].reshape(-1, 3).mean(axis=0)
            assert np.abs(centre - COLOURS[o["colour"]]).max() < 30, (record["imgid"], o)
        corners = pixels[[0, 0, -1, -1], [0, -1, 0, -1]]     # objects never reach the corners
        assert (corners.max(axis=1) - corners.min(axis=1)).max() < 45   # grey-ish, unlike any object colour
