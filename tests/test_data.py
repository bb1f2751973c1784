"""Tests for training.data.datasets: the Karpathy, Flickr8k and COCO readers, format detection, splits and pairs.

Every fixture is built in tmp_path with tiny Pillow images; nothing depends on a real data set.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from training.data.datasets import CaptionDataset, DatasetWarning, ImageRecord, load_dataset


def make_image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (200, 30, 30)).save(path)


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def sentences(*raws: str) -> list[dict]:
    return [{"raw": raw, "tokens": raw.lower().split()} for raw in raws]


# ---------------------------------------------------------------------------------------------------------
# Karpathy JSON

@pytest.fixture
def karpathy_flat(tmp_path: Path) -> Path:
    """Flickr-style Karpathy file: no "filepath", images in images/ or beside the JSON."""
    make_image(tmp_path / "images" / "a.jpg")
    make_image(tmp_path / "b.jpg")
    make_image(tmp_path / "images" / "c.jpg")
    return write_json(tmp_path / "dataset_flickr8k.json", {"dataset": "flickr8k", "images": [
        {"filename": "a.jpg", "split": "test", "imgid": 0, "sentences": sentences("A dog.", "A brown dog.")},
        {"filename": "b.jpg", "split": "restval", "imgid": 1, "sentences": sentences(" A cat ")},
        {"filename": "c.jpg", "split": "train", "imgid": 2, "minimal_pair": 12, "scene": ["cat", "mat"],
         "sentences": sentences("A cat on a mat.")},
        {"filename": "d.jpg", "split": "val", "imgid": 3, "sentences": sentences("Nowhere to be found.")},
    ]})


def test_karpathy_flat_layout(karpathy_flat: Path) -> None:
    with pytest.warns(DatasetWarning, match=r"skipped 1 .*'d\.jpg'"):
        ds = load_dataset(karpathy_flat)
    assert ds.name == "flickr8k"
    assert [r.path.name for r in ds.images] == ["b.jpg", "c.jpg", "a.jpg"]       # train (file order), then test
    assert [r.image_id for r in ds.images] == [0, 1, 2]
    assert [r.split for r in ds.images] == ["train", "train", "test"]
    b, c, a = ds.images
    assert b.path == karpathy_flat.parent / "b.jpg" and b.path.is_absolute()
    assert a.path == karpathy_flat.parent / "images" / "a.jpg"
    assert a.captions == ["A dog.", "A brown dog."]
    assert b.captions == ["A cat"]
    assert b.extra == {"imgid": 1, "orig_split": "restval"}
    assert c.extra == {"imgid": 2, "minimal_pair": 12, "scene": ["cat", "mat"]}
    assert ds.n_images == 3 and ds.n_captions == 4


def test_karpathy_with_filepath_coco_layout(tmp_path: Path) -> None:
    make_image(tmp_path / "train2014" / "COCO_train2014_1.jpg")
    make_image(tmp_path / "images" / "val2014" / "COCO_val2014_2.jpg")
    path = write_json(tmp_path / "dataset_coco.json", {"dataset": "coco", "images": [
        {"filepath": "val2014", "filename": "COCO_val2014_2.jpg", "split": "val", "cocoid": 2,
         "sentences": sentences("Two.")},
        {"filepath": "train2014", "filename": "COCO_train2014_1.jpg", "split": "train", "cocoid": 1,
         "sentences": sentences("One.", "Uno.")},
    ]})
    ds = load_dataset(path)
    assert [(r.path, r.split, r.extra["cocoid"]) for r in ds.images] == [
        (tmp_path / "train2014" / "COCO_train2014_1.jpg", "train", 1),
        (tmp_path / "images" / "val2014" / "COCO_val2014_2.jpg", "val", 2),
    ]


def test_karpathy_directory_and_split_filter(karpathy_flat: Path) -> None:
    with pytest.warns(DatasetWarning):
        train = load_dataset(karpathy_flat.parent, split="train")
    assert train.name == "flickr8k:train"
    assert [r.path.name for r in train.images] == ["b.jpg", "c.jpg"]
    assert [r.image_id for r in train.images] == [0, 1]
    assert [r.extra["orig_image_id"] for r in train.images] == [0, 1]
    with pytest.warns(DatasetWarning):
        test = load_dataset(karpathy_flat.parent, split="test")
    assert [(r.image_id, r.extra["orig_image_id"], r.path.name) for r in test.images] == [(0, 2, "a.jpg")]


def test_karpathy_unknown_split_is_an_error(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    path = write_json(tmp_path / "dataset.json", {"images": [
        {"filename": "a.jpg", "split": "holdout", "sentences": sentences("x")}]})
    with pytest.raises(ValueError, match="holdout"):
        load_dataset(path)


def test_several_karpathy_files_are_ambiguous(karpathy_flat: Path) -> None:
    write_json(karpathy_flat.parent / "dataset_coco.json", {"images": []})
    with pytest.raises(ValueError, match="several Karpathy files"):
        load_dataset(karpathy_flat.parent)


# ---------------------------------------------------------------------------------------------------------
# Flickr8k text layout

def make_flickr8k(root: Path, image_dir: str = "images", with_test_list: bool = False) -> Path:
    """train: t1 t2, dev: d1, test: x1 (list optional); n1 captioned but in no list; a bad key foo.jpg.1."""
    for name in ("t1.jpg", "t2.jpg", "d1.jpg", "x1.jpg", "n1.jpg"):
        make_image(root / image_dir / name)
    tokens = []
    for name in ("d1.jpg", "t2.jpg", "n1.jpg", "t1.jpg", "x1.jpg"):
        tokens += [f"{name}#{i}\t{name[:2].upper()} caption {i} ." for i in range(5)]
    tokens.insert(7, "foo.jpg.1#0\tA caption whose image does not exist .")
    (root / "Flickr8k.token.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    (root / "Flickr_8k.trainImages.txt").write_text("t2.jpg\nt1.jpg\n", encoding="utf-8")
    (root / "Flickr_8k.devImages.txt").write_text("d1.jpg\n\n", encoding="utf-8")
    if with_test_list:
        (root / "Flickr_8k.testImages.txt").write_text("x1.jpg\n", encoding="utf-8")
    return root


@pytest.mark.parametrize("image_dir", ["images", "Flicker8k_Dataset"])
def test_flickr8k_layout(tmp_path: Path, image_dir: str) -> None:
    root = make_flickr8k(tmp_path, image_dir)
    with pytest.warns(DatasetWarning, match=r"skipped 1 caption key.*'foo\.jpg\.1'") as record:
        ds = load_dataset(root)
    assert len(record) == 1
    assert ds.name == "flickr8k"
    assert [(r.image_id, r.path.name, r.split) for r in ds.images] == [
        (0, "t2.jpg", "train"), (1, "t1.jpg", "train"), (2, "d1.jpg", "val")]   # n1, x1: in no list
    assert all(r.path == root / image_dir / r.path.name for r in ds.images)
    assert ds.images[0].captions == [f"T2 caption {i} ." for i in range(5)]
    assert ds.n_captions == 15 and all(r.extra == {} for r in ds.images)


def test_flickr8k_with_test_list_and_split_filter(tmp_path: Path) -> None:
    root = make_flickr8k(tmp_path, with_test_list=True)
    with pytest.warns(DatasetWarning):
        ds = load_dataset(root)
    assert [r.split for r in ds.images] == ["train", "train", "val", "test"]
    with pytest.warns(DatasetWarning):
        val = load_dataset(root, split="val")
    assert [(r.image_id, r.path.name, r.extra["orig_image_id"]) for r in val.images] == [(0, "d1.jpg", 2)]


def test_flickr8k_listed_image_without_captions_is_skipped(tmp_path: Path) -> None:
    root = make_flickr8k(tmp_path)
    (root / "Flickr_8k.devImages.txt").write_text("d1.jpg\nghost.jpg\n", encoding="utf-8")
    with pytest.warns(DatasetWarning) as record:
        ds = load_dataset(root)
    messages = sorted(str(w.message) for w in record)
    assert len(messages) == 2 and "'ghost.jpg'" in messages[1] and "'foo.jpg.1'" in messages[0]
    assert ds.n_images == 3


def test_flickr8k_without_split_lists_is_an_error(tmp_path: Path) -> None:
    root = make_flickr8k(tmp_path)
    (root / "Flickr_8k.trainImages.txt").unlink()
    (root / "Flickr_8k.devImages.txt").unlink()
    with pytest.raises(ValueError, match="no split list"):
        load_dataset(root)


def test_flickr8k_malformed_token_line(tmp_path: Path) -> None:
    root = make_flickr8k(tmp_path)
    (root / "Flickr8k.token.txt").write_text("t1.jpg#0 no tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"Flickr8k\.token\.txt:1"):
        load_dataset(root)


# ---------------------------------------------------------------------------------------------------------
# COCO captions JSON

def coco_json(path: Path, images: list[tuple[int, str]], annotations: list[tuple[int, str]]) -> Path:
    return write_json(path, {
        "info": {}, "licenses": [],
        "images": [{"id": i, "file_name": f, "width": 4, "height": 4} for i, f in images],
        "annotations": [{"id": 100 + n, "image_id": i, "caption": c} for n, (i, c) in enumerate(annotations)],
    })


def test_coco_single_file(tmp_path: Path) -> None:
    make_image(tmp_path / "val2014" / "v1.jpg")
    make_image(tmp_path / "images" / "v2.jpg")
    path = coco_json(tmp_path / "captions_val2014.json", [(7, "v1.jpg"), (3, "v2.jpg")],
                     [(3, "Second image."), (7, "First image. "), (99, "Orphan."), (7, "First again.")])
    with pytest.warns(DatasetWarning, match=r"skipped 1 COCO caption annotation.*image_id 99") as record:
        ds = load_dataset(path)
    assert len(record) == 1
    assert ds.name == "coco"
    assert [(r.image_id, r.path, r.split) for r in ds.images] == [
        (0, tmp_path / "val2014" / "v1.jpg", "val"), (1, tmp_path / "images" / "v2.jpg", "val")]
    assert ds.images[0].captions == ["First image.", "First again."]
    assert ds.images[0].extra == {"cocoid": 7, "width": 4, "height": 4}


def test_coco_directory_with_train_and_val(tmp_path: Path) -> None:
    make_image(tmp_path / "train2014" / "t1.jpg")
    make_image(tmp_path / "val2014" / "v1.jpg")
    coco_json(tmp_path / "annotations" / "captions_val2014.json", [(2, "v1.jpg")], [(2, "Val caption.")])
    coco_json(tmp_path / "annotations" / "captions_train2014.json", [(1, "t1.jpg"), (5, "gone.jpg")],
              [(1, "Train caption."), (5, "Missing image.")])
    with pytest.warns(DatasetWarning, match=r"skipped 1 COCO image.*'gone\.jpg'"):
        ds = load_dataset(tmp_path)
    assert [(r.path.name, r.split, r.captions) for r in ds.images] == [
        ("t1.jpg", "train", ["Train caption."]), ("v1.jpg", "val", ["Val caption."])]
    with pytest.warns(DatasetWarning):
        assert load_dataset(tmp_path, split="val").images[0].extra["orig_image_id"] == 1


def test_coco_split_must_be_in_file_name(tmp_path: Path) -> None:
    make_image(tmp_path / "a.jpg")
    path = coco_json(tmp_path / "captions_misc.json", [(1, "a.jpg")], [(1, "x")])
    with pytest.raises(ValueError, match="cannot tell the split"):
        load_dataset(path)


# ---------------------------------------------------------------------------------------------------------
# detection, errors, CaptionDataset

def test_detection_prefers_karpathy_over_flickr_text(tmp_path: Path) -> None:
    make_flickr8k(tmp_path)
    write_json(tmp_path / "dataset.json", {"dataset": "karpathy-copy", "images": [
        {"filename": "t1.jpg", "split": "train", "sentences": sentences("From the JSON.")}]})
    ds = load_dataset(tmp_path)
    assert ds.name == "karpathy-copy" and ds.images[0].captions == ["From the JSON."]


@pytest.mark.parametrize("content", [None, "notes.txt", "other.json"])
def test_unrecognised_input_is_a_value_error(tmp_path: Path, content: str | None) -> None:
    (tmp_path / "readme.txt").write_text("nothing here", encoding="utf-8")
    write_json(tmp_path / "other.json", {"rows": [1, 2, 3]})
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    target = tmp_path if content is None else tmp_path / content
    with pytest.raises(ValueError, match="Looked for: a Karpathy JSON file"):
        load_dataset(target)


def test_missing_path_and_bad_split_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "absent")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        load_dataset(tmp_path, split="dev")


def test_split_renumbers_and_pairs() -> None:
    images = [ImageRecord(i, Path(f"/x/{i}.jpg"), s, [f"c{i}a", f"c{i}b"], {"k": i})
              for i, s in enumerate(["train", "val", "train", "val"])]
    ds = CaptionDataset("toy", images)
    val = ds.split("val")
    assert [(r.image_id, r.extra) for r in val.images] == [(0, {"k": 1, "orig_image_id": 1}),
                                                           (1, {"k": 3, "orig_image_id": 3})]
    assert val.pairs() == [(0, "c1a"), (0, "c1b"), (1, "c3a"), (1, "c3b")]
    assert val.split("val").images[1].extra["orig_image_id"] == 3      # still the loaded data set's id
    assert ds.images[1].image_id == 1 and "orig_image_id" not in ds.images[1].extra   # original untouched
    assert ds.split("test").n_images == 0
    assert ds.n_captions == 8 and len(ds.pairs()) == 8
    assert "train=2, val=2" in repr(ds)
    with pytest.raises(ValueError):
        ds.split("restval")
