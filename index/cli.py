"""``jointspace index build | add | remove | info`` — the index package's commands (assembled in service/cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build and update a FAISS index of a photo gallery and a caption corpus")
    isub = p.add_subparsers(dest="index_command", required=True, metavar="ACTION")

    b = isub.add_parser("build", help="embed a gallery (and a caption corpus) and write a new index")
    b.add_argument("--model", required=True, help="model.pt")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="a directory of images (searched recursively)")
    src.add_argument("--data", help="a captioned data set (Karpathy JSON / Flickr8k / COCO); needs --split")
    b.add_argument("--split", choices=["train", "val", "test"], help="the split of --data to index")
    b.add_argument("--out", required=True, help="index directory (an existing index there is replaced atomically)")
    caps = b.add_mutually_exclusive_group()
    caps.add_argument("--captions", help="caption corpus: a text file, one caption a line")
    caps.add_argument("--caption-split", choices=["train", "val", "test"],
                      help="caption corpus: this split of --data (default: the captions of the indexed split)")
    b.add_argument("--factory", help="FAISS factory string for the images (default: by gallery size, "
                                     "see index/faiss_index.py)")
    b.add_argument("--caption-factory", help="FAISS factory string for the captions (default: by corpus size)")
    _common(b)
    b.set_defaults(func=cmd_build)

    a = isub.add_parser("add", help="add images and/or captions to an index without rebuilding it")
    a.add_argument("--index", required=True, help="index directory")
    a.add_argument("--model", required=True, help="model.pt (must be the one the index was built with)")
    a.add_argument("paths", nargs="*", help="image files or directories to add")
    a.add_argument("--captions", help="a text file of captions to add, one a line")
    _common(a)
    a.set_defaults(func=cmd_add)

    r = isub.add_parser("remove", help="remove images and/or captions by id")
    r.add_argument("--index", required=True, help="index directory")
    r.add_argument("--ids", type=int, nargs="*", default=[], help="image ids")
    r.add_argument("--caption-ids", type=int, nargs="*", default=[], help="caption ids")
    r.set_defaults(func=cmd_remove)

    i = isub.add_parser("info", help="print an index's manifest and counts as JSON")
    i.add_argument("--index", required=True, help="index directory")
    i.set_defaults(func=cmd_info)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="image decoding processes")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _read_lines(path: str) -> list[str]:
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line]


def _report_skipped(skipped) -> None:
    for path, reason in skipped:
        print(f"skipped unreadable image {path}: {reason}", file=sys.stderr)
    if skipped:
        print(f"{len(skipped)} unreadable image(s) skipped", file=sys.stderr)


def _load(args):
    from training.model import load_model
    from training.train import resolve_device

    device = resolve_device(args.device)
    return load_model(args.model, device), device


def cmd_build(args) -> int:
    from training.data import load_dataset

    from .embed import find_images
    from .gallery import build

    model, device = _load(args)
    if args.data:
        if not args.split:
            raise ValueError("--data needs --split (the split whose images are indexed)")
        dataset = load_dataset(args.data)
        records = dataset.split(args.split).images
        paths = [r.path for r in records]
        if args.captions:
            captions = [(t, None) for t in _read_lines(args.captions)]
        elif args.caption_split and args.caption_split != args.split:
            captions = [(c, None) for r in dataset.split(args.caption_split).images for c in r.captions]
        else:
            captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
    else:
        if args.caption_split:
            raise ValueError("--caption-split needs --data")
        paths = find_images(args.images)
        captions = [(t, None) for t in _read_lines(args.captions)] if args.captions else []
    if not paths:
        raise ValueError("no images to index")
    report = build(args.out, model, paths, captions, factory=args.factory, caption_factory=args.caption_factory,
                   device=device, batch_size=args.batch_size, workers=args.workers, progress=not args.quiet)
    _report_skipped(report.skipped)
    print(f"indexed {len(report.image_ids)} images and {len(report.caption_ids)} captions into {args.out} "
          f"({report.generation})")
    return 0


def cmd_add(args) -> int:
    from .embed import find_images
    from .gallery import add

    paths = []
    for p in args.paths:
        paths += find_images(p) if Path(p).is_dir() else [Path(p)]
    captions = _read_lines(args.captions) if args.captions else []
    if not paths and not captions:
        raise ValueError("nothing to add: give image paths and/or --captions")
    model, device = _load(args)
    report = add(args.index, model, paths, captions, device=device, batch_size=args.batch_size,
                 workers=args.workers, progress=not args.quiet)
    _report_skipped(report.skipped)
    print(json.dumps({"image_ids": report.image_ids, "caption_ids": report.caption_ids,
                      "generation": report.generation}))
    return 0


def cmd_remove(args) -> int:
    from .gallery import remove

    if not args.ids and not args.caption_ids:
        raise ValueError("nothing to remove: give --ids and/or --caption-ids")
    report = remove(args.index, args.ids, args.caption_ids)
    if report.missing:
        print(f"not in the index (ignored): {report.missing}", file=sys.stderr)
    print(json.dumps({"removed_images": report.removed_images, "removed_captions": report.removed_captions,
                      "generation": report.generation}))
    return 0


def cmd_info(args) -> int:
    from .gallery import Gallery

    gallery = Gallery.load(args.index)
    print(json.dumps(gallery.info(), indent=2))
    gallery.close()
    return 0
