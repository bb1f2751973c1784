"""``jointspace index search | duplicates | info``: reading an index — a search's table or JSON, the near-duplicate
groups, the manifest (the parser: index/cli.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from training.inference.pretrained import model_file

from .choices import MAX_OFFSET
from .cli_common import ModelChoice, load_chosen_model
from .generations import read_manifest

if TYPE_CHECKING:
    from training.models.protocol import EmbeddingModel

NO_STRONG_MATCH = "no strong match: these are the closest"      # under a search table (index/relevance.py)


def cmd_search(args) -> int:
    manifest = read_manifest(args.index)        # a wrong --index is said before anything heavy is imported
    from .gallery import Gallery
    from .hits import image_hits
    from .hybrid import TextPaging, search_text
    from .query import ImageFilter, check_min_score
    from .relevance import Ranking

    if args.k < 1:
        raise ValueError("--k must be at least 1")
    if not 0 <= args.offset <= MAX_OFFSET:
        raise ValueError(f"--offset must be from 0 to {MAX_OFFSET}")
    if args.image is not None and args.mode != "vector":
        raise ValueError(f"--mode {args.mode} needs --text (an example photo has no words to match)")
    flt = ImageFilter.parse(args.folder, args.taken_after, args.taken_before, args.media)
    if args.text is not None and (not args.text.strip() or any(not w.strip() for w in args.subtract)):
        raise ValueError("the query text and the words to subtract must not be empty")
    # a text query on the CPU: the model's text side alone, the index searched on the CPU (--device cuda: the
    # whole model and the index on the GPU, as a photo query)
    query = _text_query(model_file(args.model), args.text, args.subtract, manifest, args.index) \
        if args.text is not None and args.device != "cuda" else None
    if query is not None:
        gallery = Gallery.load(args.index)
    else:
        model, device = load_chosen_model(ModelChoice(args.model, args.device, args.backend))
        gallery = Gallery.load(args.index, model=model, device=device)
    try:
        min_score = check_min_score(gallery.manifest["similarity"], args.min_score)
        ranking: Ranking
        if args.text is not None:
            if query is None:
                from training.inference.embedding import embed_texts

                query = embed_texts(model.eval(), [args.text], [args.subtract]).cpu().numpy()
            ranking = search_text(gallery, query, args.text, args.mode,
                                  TextPaging(args.k, args.offset, min_score, args.sort), gallery.allowed_ids(flt))
        else:
            query = _example_query(model, args.image, args.subtract)
            ranking = gallery.ranked("images", query,
                                     gallery.search_images(query, args.k, flt, args.offset, min_score,
                                                           sort=args.sort))[0]
        results = [{"id": h.id, "score": round(h.score, 6), "relevance": h.relevance, "media": h.media,
                    "path": h.path, "taken": h.taken, "folder": h.folder, **h.moment(frame=False),
                    **({"matched": h.matched} if h.matched is not None else {})}
                   for h in image_hits(gallery, ranking) if h.path is not None]
        print(json.dumps({"results": results, "strong_match": ranking.strong_match}, indent=1) if args.json
              else _table(results, gallery.photos.root, ranking.strong_match))
    finally:
        gallery.close()
    return 0


def _text_query(path: Path, text: str, subtract: list[str], manifest: dict, index: str):
    """The vector of the sentence ``text`` less the words of ``subtract`` by the model of ``path``: from its text
    tower alone (ONNX Runtime, training/inference/text_tower.py), prepared from the whole model the first time a
    model file is used; from the whole model in PyTorch (its image tower left as it is) when its text side runs in
    PyTorch only. Refuses an index (``manifest``, at ``index``) built with another model, as loading the model
    does."""
    from training.inference import text_tower

    from .gallery import check_fingerprint

    tower = text_tower.load(path)
    if tower is None:
        from training.inference.embedding import embed_texts
        from training.models.checkpoint import load_model

        model = load_model(path)
        check_fingerprint(manifest, model.fingerprint, index)
        if not text_tower.prepared(path):
            if text_tower.unsupported_reason(model) is None:
                print("jointspace index search: preparing this model's text encoder for quick searches (once per "
                      "model file)", file=sys.stderr)
            tower = text_tower.prepare(model, path)
        if tower is None:
            return embed_texts(model.eval(), [text], [subtract]).cpu().numpy()
    check_fingerprint(manifest, tower.fingerprint, index)
    return tower.embed([text], [subtract])


def _table(results: list[dict], root: str, strong: bool | None = None) -> str:
    """Search results as a table: score, relevance (when the index has a reference set), media, the file's path
    relative to the gallery's root folder (absolute when outside it) and a video moment's span; under it, when no
    result is a strong match (``strong`` False), a line that says so."""
    from .query import inside

    if not results:
        return "no results"
    ranked = strong is not None
    rows = [(f"{r['score']:.3f}", *([f"{r['relevance']:.3f}"] if ranked else []), r["media"], inside(r["path"], root),
             f"{_clock(r['start'])}–{_clock(r['end'])}" if r["media"] == "video" else "") for r in results]
    header = ("score", *(["relevance"] if ranked else []), "media", "path", "moment")
    numbers = 2 if ranked else 1                      # right-aligned columns
    widths = [max(len(row[c]) for row in (header, *rows)) for c in range(len(header))]
    lines = ["  ".join([*(v.rjust(w) for v, w in zip(row[:numbers], widths)),
                        *(v.ljust(w) for v, w in zip(row[numbers:], widths[numbers:]))]).rstrip()
             for row in (header, *rows)]
    if strong is False:
        lines.append(NO_STRONG_MATCH)
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss from an hour on), as the search page writes a moment."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _example_query(model: EmbeddingModel, image: str, subtract):
    from training.data.preprocess import UnsupportedImageError, embed_side, open_image
    from training.inference.compose import example_queries

    from .scan import IMAGE_SUFFIXES

    path = Path(image)
    if not path.is_file():
        raise FileNotFoundError(f"no image file at {image}")
    pixels = _torch_query_pixels(model, path)
    if pixels is not None:
        return example_queries(model.eval(), pixels.unsqueeze(0), [((), tuple(subtract))]).cpu().numpy()
    try:
        picture = open_image(path, embed_side(model.preprocess))
    except UnsupportedImageError as err:
        raise ValueError(f"{image}: {err}") from None
    except Exception as err:  # noqa: BLE001 - any decoding failure: say what and why
        hint = "" if path.suffix.lower() in IMAGE_SUFFIXES else f" (formats read: {', '.join(sorted(IMAGE_SUFFIXES))})"
        raise ValueError(f"cannot read {image} as an image: {type(err).__name__}: {err}{hint}") from None
    pixels = model.preprocess.pixels(picture).unsqueeze(0)
    return example_queries(model.eval(), pixels, [((), tuple(subtract))]).cpu().numpy()


def _torch_query_pixels(model: EmbeddingModel, path: Path):
    """A query image that is a plain JPEG, decoded and cut into views on the model's device when the decode setting
    says so (``tensor_views.torch_pixels``: on CUDA by default); None: Pillow's to decode."""
    from training.inference.embedding import device_of
    from training.inference.tensor_views import decode_choice, torch_pixels

    device = device_of(model)
    if decode_choice(device) != "torch":
        return None
    return torch_pixels(model.preprocess, path.read_bytes(), device, decode="torch")


def cmd_duplicates(args) -> int:
    read_manifest(args.index)                   # a wrong --index is said before anything heavy is imported
    from .duplicates import check_threshold, gallery_groups
    from .gallery import Gallery
    from .query import format_time, inside

    threshold = check_threshold(args.threshold)
    gallery = Gallery.load(args.index)
    try:
        found = gallery_groups(gallery, threshold)
        rows = gallery.meta.images([i for g in found.groups for i in g.ids])
        root = gallery.photos.root
    finally:
        gallery.close()
    if found.hashed:
        print(f"{found.hashed} photo(s) indexed before perceptual hashes were kept: hashed from their files",
              file=sys.stderr)
    groups: list[dict] = [{"kind": g.kind, "min_score": g.min_score,
                           "images": [{"id": i, "path": rows[i].path, "taken": format_time(rows[i].taken),
                                       "width": rows[i].width, "height": rows[i].height, "size": rows[i].size}
                                      for i in g.ids if i in rows]} for g in found.groups]
    if args.json:
        print(json.dumps({"threshold": found.threshold, "photos": found.photos, "groups": groups}, indent=1))
        return 0
    lines = []
    for n, group in enumerate(groups, 1):
        lines.append(f"group {n}: {group['kind']}, {len(group['images'])} photos, lowest similarity "
                     f"{group['min_score']:.3f}")
        width = max(len(str(image["id"])) for image in group["images"])
        lines += [f"  {str(image['id']).rjust(width)}  {inside(image['path'], root)}" for image in group["images"]]
    grouped = sum(len(g["images"]) for g in groups)
    lines.append(f"{len(groups)} group(s) of near-duplicates ({grouped} of {found.photos} photos) at threshold "
                 f"{found.threshold:g}" if groups else f"no near-duplicates among {found.photos} photos at "
                                                      f"threshold {found.threshold:g}")
    print("\n".join(lines))
    return 0


def cmd_info(args) -> int:
    read_manifest(args.index)                   # a wrong --index is said before anything heavy is imported
    from .gallery import Gallery

    gallery = Gallery.load(args.index)
    print(json.dumps(gallery.info(), indent=2))
    gallery.close()
    return 0
