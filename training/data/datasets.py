"""Captioned image data sets: three on-disk formats, one in-memory form, the format found automatically.

``load_dataset(path)`` reads any of:

(a) **Karpathy JSON** — a ``.json`` file whose top-level ``"images"`` records carry ``"sentences"``, or a
    directory holding ``dataset.json`` or one ``dataset_*.json``. An image lives at
    ``<json dir>/<filepath>/<filename>`` (or ``<json dir>/images/<filepath>/<filename>``) when the record
    has ``"filepath"`` (COCO: ``train2014``/``val2014``), else at ``<json dir>/images/<filename>`` or
    ``<json dir>/<filename>``. Captions are ``sentences[i]["raw"]``; the split ``restval`` counts as
    ``train`` (``extra["orig_split"] == "restval"`` keeps the distinction).
(b) **Flickr8k text layout** — a directory with ``Flickr8k.token.txt`` (``<image>.jpg#<n>\\t<caption>``),
    the split lists ``Flickr_8k.{train,dev,test}Images.txt`` (any may be missing; ``dev`` is ``val``) and the
    images in ``images/`` or ``Flicker8k_Dataset/``. Images in no split list are left out.
(c) **COCO captions** — a ``captions_*.json`` file (``{"images": [...], "annotations": [...]}``) whose name
    gives its split (``train``/``val``/``test``), or a directory holding several of them (directly or in
    ``annotations/``). Images are looked for in ``<dir>/<subset>/`` (``captions_train2014.json`` →
    ``train2014/``), ``<dir>/images/`` and ``<dir>/``.

Records that cannot be used — an image file missing on disk, a caption for an unknown image, an image with
no caption — are skipped, and each kind of skip is reported by ONE summarising ``DatasetWarning``.
Image order is deterministic: the source's own order, splits in the order train, val, test.
"""
from __future__ import annotations

import json
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

SPLITS = ("train", "val", "test")
_SPLIT_ALIASES = {"restval": "train", "dev": "val"}

_FLICKR_TOKENS = "Flickr8k.token.txt"
_FLICKR_SPLIT_LISTS = (
    ("train", "Flickr_8k.trainImages.txt"),
    ("val", "Flickr_8k.devImages.txt"),
    ("test", "Flickr_8k.testImages.txt"),
)
_FLICKR_IMAGE_DIRS = ("images", "Flicker8k_Dataset", "Flickr8k_Dataset")


class DatasetWarning(UserWarning):
    """Something in a data set was skipped while loading it."""


@dataclass
class ImageRecord:
    """One image and its captions."""

    image_id: int          # position in CaptionDataset.images (0..n-1)
    path: Path             # absolute path of the image file
    split: str             # "train" | "val" | "test"
    captions: list[str]    # raw caption strings
    extra: dict[str, Any] = field(default_factory=dict)   # everything else the source record had


@dataclass(repr=False)
class CaptionDataset:
    """A named list of captioned images; ``images[i].image_id == i``."""

    name: str
    images: list[ImageRecord]

    @property
    def n_images(self) -> int:
        return len(self.images)

    @property
    def n_captions(self) -> int:
        return sum(len(record.captions) for record in self.images)

    def split(self, name: str) -> CaptionDataset:
        """The images of one split, ``image_id`` renumbered 0..m-1.

        The id an image had before is kept in ``extra["orig_image_id"]``; splitting an already split data set
        keeps the id from the first data set (the one that was loaded).
        """
        return self.splits((name,))

    def splits(self, names: Sequence[str]) -> CaptionDataset:
        """The images of several splits as one (``split`` of each, in this data set's order, which is the order
        train, val, test): ``("train", "val")`` is what a final fit trains on (``train.fit_on``)."""
        for name in names:
            _check_split(name)
        chosen = [record for record in self.images if record.split in names]
        images = [
            replace(record, image_id=new_id, captions=list(record.captions),
                    extra={**record.extra, "orig_image_id": record.extra.get("orig_image_id", record.image_id)})
            for new_id, record in enumerate(chosen)
        ]
        return CaptionDataset(name=f"{self.name}:{'+'.join(names)}", images=images)

    def pairs(self) -> list[tuple[int, str]]:
        """Every (image_id, caption), images in order, each image's captions in order."""
        return [(record.image_id, caption) for record in self.images for caption in record.captions]

    def __repr__(self) -> str:
        counts = {s: sum(r.split == s for r in self.images) for s in SPLITS}
        per_split = ", ".join(f"{s}={n}" for s, n in counts.items() if n)
        return (f"CaptionDataset(name={self.name!r}, n_images={self.n_images}, "
                f"n_captions={self.n_captions}, splits: {per_split or 'none'})")


def load_dataset(path: str | Path, split: str | None = None) -> CaptionDataset:
    """Read the data set at ``path`` (format found automatically, see the module docstring).

    ``split`` keeps one split, as ``CaptionDataset.split`` does. Raises ``FileNotFoundError`` when ``path``
    does not exist and ``ValueError`` when nothing there is a recognised data set.
    """
    if split is not None:
        _check_split(split)
    root = Path(path).expanduser().resolve()
    if not root.exists():
        raise FileNotFoundError(f"no data set at {root}: the path does not exist")
    dataset = _read_file(root) if root.is_file() else _read_directory(root)
    return dataset if split is None else dataset.split(split)


# ---------------------------------------------------------------------------------------------------------
# format detection

def _unrecognised(path: Path, detail: str) -> ValueError:
    return ValueError(
        f"no recognised captioned-image data set at {path} ({detail}). Looked for: "
        "a Karpathy JSON file (top-level 'images' whose records have 'sentences'); "
        "a directory with dataset.json or dataset_*.json; "
        f"a Flickr8k directory with {_FLICKR_TOKENS}; "
        "a COCO captions JSON file (top-level 'images' and 'annotations'); "
        "a directory with captions_*.json (directly or in annotations/)."
    )


def _read_file(path: Path) -> CaptionDataset:
    if path.suffix.lower() != ".json":
        raise _unrecognised(path, "a file that is not .json")
    data = _load_json(path)
    if _is_karpathy(data):
        return _read_karpathy(path, data)
    if _is_coco(data):
        return _read_coco([(path, data)])
    raise _unrecognised(path, "JSON in neither Karpathy nor COCO captions form")


def _read_directory(root: Path) -> CaptionDataset:
    karpathy = sorted(root.glob("dataset.json")) + sorted(root.glob("dataset_*.json"))
    if len(karpathy) > 1:
        names = ", ".join(p.name for p in karpathy)
        raise ValueError(f"{root} holds several Karpathy files ({names}); pass the one to load")
    if karpathy:
        data = _load_json(karpathy[0])
        if not _is_karpathy(data):
            raise _unrecognised(karpathy[0], "not in Karpathy form")
        return _read_karpathy(karpathy[0], data)
    if (root / _FLICKR_TOKENS).is_file():
        return _read_flickr8k(root)
    coco = sorted(root.glob("captions_*.json")) or sorted(root.glob("annotations/captions_*.json"))
    if coco:
        files = [(p, _load_json(p)) for p in coco]
        for p, data in files:
            if not _is_coco(data):
                raise _unrecognised(p, "not in COCO captions form")
        return _read_coco(files)
    raise _unrecognised(root, "a directory with none of these")


def _load_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def _is_karpathy(data: Any) -> bool:
    images = data.get("images") if isinstance(data, dict) else None
    return bool(images) and isinstance(images, list) and isinstance(images[0], dict) and "sentences" in images[0]


def _is_coco(data: Any) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("images"), list)
            and isinstance(data.get("annotations"), list))


# ---------------------------------------------------------------------------------------------------------
# shared helpers

def _check_split(name: str) -> None:
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; choose one of: {', '.join(SPLITS)}")


def _canonical_split(raw: str, where: str) -> str:
    split = _SPLIT_ALIASES.get(raw, raw)
    if split not in SPLITS:
        raise ValueError(f"{where}: unknown split {raw!r} (expected one of "
                         f"{', '.join(SPLITS + tuple(_SPLIT_ALIASES))})")
    return split


def _warn_skipped(skipped: list[str], what: str) -> None:
    """One warning for a whole kind of skip; silent when nothing was skipped."""
    if skipped:
        # stacklevel 5 points at the caller of load_dataset: → _read_file/_read_directory → _read_<format> → here
        warnings.warn(f"skipped {len(skipped)} {what} (e.g. {skipped[0]!r})", DatasetWarning, stacklevel=5)


class _FileIndex:
    """Answers "which of these files exists?" from one cached listing per directory (fast on big folders)."""

    def __init__(self) -> None:
        self._listings: dict[Path, frozenset[str]] = {}

    def first_existing(self, candidates: Iterable[Path]) -> Path | None:
        for candidate in candidates:
            if candidate.name in self._listing(candidate.parent):
                return candidate
        return None

    def _listing(self, directory: Path) -> frozenset[str]:
        if directory not in self._listings:
            try:
                self._listings[directory] = frozenset(os.listdir(directory))
            except (FileNotFoundError, NotADirectoryError):
                self._listings[directory] = frozenset()
        return self._listings[directory]


# ---------------------------------------------------------------------------------------------------------
# (a) Karpathy JSON

_KARPATHY_USED_KEYS = {"filename", "filepath", "split", "sentences"}


def _read_karpathy(json_path: Path, data: dict[str, Any]) -> CaptionDataset:
    root = json_path.parent
    files = _FileIndex()
    by_split: dict[str, list[ImageRecord]] = {s: [] for s in SPLITS}
    missing: list[str] = []
    for n, source in enumerate(data["images"]):
        split = _canonical_split(source["split"], f"{json_path.name}, images[{n}]")
        filename = source["filename"]
        if "filepath" in source:
            candidates = [root / source["filepath"] / filename, root / "images" / source["filepath"] / filename]
        else:
            candidates = [root / "images" / filename, root / filename]
        image_path = files.first_existing(candidates)
        if image_path is None:
            missing.append(str(Path(source.get("filepath", "")) / filename))
            continue
        extra = {k: v for k, v in source.items() if k not in _KARPATHY_USED_KEYS}
        if split != source["split"]:
            extra["orig_split"] = source["split"]
        captions = [sentence["raw"].strip() for sentence in source["sentences"]]
        by_split[split].append(ImageRecord(-1, image_path, split, captions, extra))
    _warn_skipped(missing, f"image record(s) of {json_path.name} whose image file is not under {root}")
    return _numbered(data.get("dataset") or json_path.stem, by_split)


def _numbered(name: str, by_split: dict[str, list[ImageRecord]]) -> CaptionDataset:
    """Concatenate the splits in the order train, val, test and number the images 0..n-1."""
    images = [record for split in SPLITS for record in by_split[split]]
    for image_id, record in enumerate(images):
        record.image_id = image_id
    return CaptionDataset(name=name, images=images)


# ---------------------------------------------------------------------------------------------------------
# (b) Flickr8k text layout

def _read_flickr8k(root: Path) -> CaptionDataset:
    image_dir = next((root / d for d in _FLICKR_IMAGE_DIRS if (root / d).is_dir()), None)
    if image_dir is None:
        raise ValueError(f"Flickr8k data set at {root} has no image folder (looked for "
                         f"{', '.join(d + '/' for d in _FLICKR_IMAGE_DIRS)})")
    captions = _read_flickr_tokens(root / _FLICKR_TOKENS)

    split_of: dict[str, str] = {}       # image file name → split; insertion order is the load order
    lists_found = []
    for split, list_name in _FLICKR_SPLIT_LISTS:
        list_path = root / list_name
        if list_path.is_file():
            lists_found.append(list_name)
            for line in list_path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    split_of.setdefault(line.strip(), split)
    if not lists_found:
        raise ValueError(f"Flickr8k data set at {root} has no split list (looked for "
                         f"{', '.join(name for _, name in _FLICKR_SPLIT_LISTS)})")

    files = _FileIndex()
    no_file = [name for name in captions if files.first_existing([image_dir / name]) is None]
    no_captions = [name for name in split_of if name not in captions]
    _warn_skipped(no_file, f"caption key(s) of {_FLICKR_TOKENS} whose image file is not in {image_dir}")
    _warn_skipped(no_captions, f"image(s) of the split lists with no caption in {_FLICKR_TOKENS}")

    unusable = set(no_file) | set(no_captions)
    usable = [(name, split) for name, split in split_of.items() if name not in unusable]
    images = [ImageRecord(image_id, image_dir / name, split, captions[name], {})
              for image_id, (name, split) in enumerate(usable)]
    return CaptionDataset(name="flickr8k", images=images)


def _read_flickr_tokens(path: Path) -> dict[str, list[str]]:
    """``<image>#<n>\\t<caption>`` lines → image file name → captions in file order."""
    captions: dict[str, list[str]] = defaultdict(list)
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        key, tab, caption = line.partition("\t")
        if not tab:
            raise ValueError(f"{path}:{lineno}: expected '<image>#<n><TAB><caption>', got {line!r}")
        captions[key.rsplit("#", 1)[0].strip()].append(caption.strip())
    return dict(captions)


# ---------------------------------------------------------------------------------------------------------
# (c) COCO captions JSON

def _read_coco(files: list[tuple[Path, dict[str, Any]]]) -> CaptionDataset:
    index = _FileIndex()
    by_split: dict[str, list[ImageRecord]] = {s: [] for s in SPLITS}
    missing: list[str] = []
    unknown: list[str] = []
    uncaptioned: list[str] = []
    for json_path, data in sorted(files, key=lambda f: (SPLITS.index(_coco_split(f[0])), f[0].name)):
        split = _coco_split(json_path)
        captions: dict[Any, list[str]] = defaultdict(list)
        known_ids = {image["id"] for image in data["images"]}
        for annotation in data["annotations"]:
            if annotation["image_id"] in known_ids:
                captions[annotation["image_id"]].append(annotation["caption"].strip())
            else:
                unknown.append(f"{json_path.name}: annotation {annotation.get('id')} "
                               f"→ image_id {annotation['image_id']}")
        dirs = _coco_image_dirs(json_path)
        for source in data["images"]:
            file_name = source["file_name"]
            if not captions.get(source["id"]):
                uncaptioned.append(file_name)
                continue
            image_path = index.first_existing(d / file_name for d in dirs)
            if image_path is None:
                missing.append(file_name)
                continue
            extra = {"cocoid": source["id"], **{k: v for k, v in source.items() if k not in ("id", "file_name")}}
            by_split[split].append(ImageRecord(-1, image_path, split, captions[source["id"]], extra))
    _warn_skipped(unknown, "COCO caption annotation(s) whose image_id is not in the file's images")
    _warn_skipped(uncaptioned, "COCO image(s) with no caption")
    _warn_skipped(missing, "COCO image(s) whose image file was not found")
    return _numbered("coco", by_split)


def _coco_split(json_path: Path) -> str:
    stem = json_path.stem.lower()
    for split in SPLITS:
        if split in stem:
            return split
    raise ValueError(f"cannot tell the split of COCO file {json_path.name}: its name contains none of "
                     f"{', '.join(SPLITS)}")


def _coco_image_dirs(json_path: Path) -> list[Path]:
    """Where the images of a COCO captions file may be, most specific first."""
    bases = [json_path.parent]
    if json_path.parent.name == "annotations":
        bases.insert(0, json_path.parent.parent)
    subset = json_path.stem.removeprefix("captions_")    # captions_train2014 → train2014
    return [d for base in bases for d in (base / subset, base / "images" / subset, base / "images", base)]
