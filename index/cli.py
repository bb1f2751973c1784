"""``jointspace index build | add | sync | remove | compact | search | duplicates | info`` — the index package's
commands (assembled in service/cli.py)."""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.models.protocol import EmbeddingModel

from training.inference.names import BACKENDS, DECODES

from .tta import DEFAULT_TTA, TTA

# The parser is built without torch (`jointspace --help` imports none of the model code: tests/test_cli.py), so the
# video values copy those of the modules that use them, which import torch (index/scan.py, index/video_decode.py,
# index/moments.py); tests/test_cli.py keeps them equal. The inference settings' names come from their own
# torch-free module.
VIDEO_SUFFIXES = (".avi", ".m4v", ".mkv", ".mov", ".mp4", ".webm")    # index.scan.VIDEO_SUFFIXES
NO_STRONG_MATCH = "no strong match: these are the closest"      # under a search table (index/relevance.py)
VIDEO_RATE, VIDEO_MAX_FRAMES, VIDEO_WINDOW = 1.0, 3600, 5.0   # index.video_decode.DEFAULT_RATE, …; index.moments
SEARCH_MODES = ("vector", "keyword", "hybrid")    # index.hybrid.MODES
SORTS, SORT_DEPTH = ("relevance", "newest", "oldest"), 10_000     # index.order.SORTS, SORT_DEPTH
DUPLICATE_THRESHOLD = 0.85       # index.duplicates.DEFAULT_THRESHOLD
BACKEND_HELP = ("what runs the image backbones: auto (OpenVINO, else ONNX Runtime, on a CPU; cuda on a CUDA device), "
                "eager, openvino, openvino-bf16, onnxruntime or cuda (float16, BatchNorm folded, CUDA graphs); a "
                "backend that fails to load falls back to eager (env JOINTSPACE_BACKEND; docs/index.md)")
DECODE_HELP = ("where photos are decoded and cut into views: auto (torch on a CUDA device, else pil), pil (Pillow in "
               "the decoding workers) or torch (plain JPEGs on the model's device; other files by Pillow) "
               "(env JOINTSPACE_DECODE; docs/index.md)")


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build and update a FAISS index of a photo gallery and a caption corpus")
    isub = p.add_subparsers(dest="index_command", required=True, metavar="ACTION")

    b = isub.add_parser("build", help="embed a gallery (and a caption corpus) and write a new index")
    b.add_argument("--model", help="model.pt (default: the shipped real-photo model, docs/model-card.md)")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="a directory of images (searched recursively), or a text file listing image "
                                      "files, one a line (relative to the file's folder)")
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
    qb = b.add_mutually_exclusive_group()
    qb.add_argument("--querybank", metavar="PATH",
                    help="normalise scores against this bank of typical queries (QB-Norm hubness correction, "
                         "docs/index.md) instead of the model's own: a text file of captions (corrects text→image "
                         "search), or a captioned data set whose --querybank-split captions and images are the "
                         "banks (corrects both directions). Default: the bank the model carries, if any (the "
                         "shipped model's: Flickr8k training captions and images)")
    qb.add_argument("--no-querybank", action="store_true",
                    help="no hubness correction, not even with the bank the model carries (raw cosine scores)")
    b.add_argument("--querybank-split", choices=["train", "val", "test"], default="train",
                   help="the split of a --querybank data set (default: train)")
    b.add_argument("--qb-beta", type=float,
                   help="inverse temperature of the inverted softmax (default: the model bank's, else 20)")
    b.add_argument("--tta", choices=list(TTA),
                   help="gallery-side test-time augmentation: flip embeds each image and its mirror image and "
                        "averages them (twice the embedding time), flip-crop also a closer centre crop and its "
                        "mirror image (four times); queries and search cost are unchanged; "
                        f"default {DEFAULT_TTA} (none with --engine ray; docs/index.md)")
    _ocr_options(b)
    b.add_argument("--max-index-memory", metavar="SIZE",
                   help="memory the image index may take, e.g. 4GB or 512MiB: without --factory, the largest index "
                        "type up to the default that fits (IVF-Flat, IVF-SQ8, IVF-PQ; index/faiss_index.py)")
    _embedding_options(b, cmd_build)
    _video_options(b)
    _engine(b)

    a = isub.add_parser("add", help="add images and/or captions to an index without rebuilding it")
    a.add_argument("--index", required=True, help="index directory")
    a.add_argument("--model", help="model.pt, the one the index was built with (default: the shipped model)")
    a.add_argument("paths", nargs="*", help="image or video files, or directories, to add")
    a.add_argument("--captions", help="a text file of captions to add, one a line")
    a.add_argument("--json", action="store_true", help="print what was added as JSON instead of a sentence")
    _embedding_options(a, cmd_add)
    _video_options(a)

    y = isub.add_parser("sync", help="make the index match a folder: add new files, re-embed changed ones, remove "
                                     "deleted ones")
    y.add_argument("--images", required=True, help="the folder of images (searched recursively)")
    y.add_argument("--index", required=True, help="index directory (built with `index build`)")
    y.add_argument("--model", help="model.pt, the one the index was built with (default: the shipped model)")
    y.add_argument("--json", action="store_true", help="print the counts as JSON instead of a sentence")
    _embedding_options(y, cmd_sync)
    _video_options(y)

    r = isub.add_parser("remove", help="remove photos and videos by path or id, and captions by id",
                        description="Removes what is given from the index (a new generation); exits 1, naming "
                                    "them, when some of the paths or ids are not in it (nothing given is in it: "
                                    "the index is left as it is).")
    r.add_argument("--index", required=True, help="index directory")
    r.add_argument("paths", nargs="*", help="indexed photo or video files, or folders (everything indexed under "
                                            "them); the files need not exist any more")
    r.add_argument("--ids", type=int, nargs="*", default=[], help="image ids (from index search --json)")
    r.add_argument("--caption-ids", type=int, nargs="*", default=[], help="caption ids")
    r.add_argument("--json", action="store_true", help="print the counts as JSON instead of a sentence")
    r.set_defaults(func=cmd_remove)

    c = isub.add_parser("compact", help="merge the index's segments into one and drop deleted vectors")
    c.add_argument("--index", required=True, help="index directory")
    c.set_defaults(func=cmd_compact)

    s = isub.add_parser("search", help="search the gallery with a sentence or an example photo; print a table "
                                       "(or JSON)")
    s.add_argument("--index", required=True, help="index directory")
    s.add_argument("--model", help="model.pt, the one the index was built with (default: the shipped model)")
    q = s.add_mutually_exclusive_group(required=True)
    q.add_argument("--text", help="a sentence describing the images to find")
    q.add_argument("--image", help="an example photo: find gallery images like it")
    s.add_argument("--subtract", action="append", default=[], metavar="WORDS",
                   help="words or phrases whose meaning to take away from the query (repeatable)")
    s.add_argument("--mode", choices=SEARCH_MODES, default="vector",
                   help="with --text: vector (the embedding ranking, the default), keyword (file and folder names, "
                        "text read in the photos, captions: BM25) or hybrid (both, fused by reciprocal rank; "
                        "docs/search.md)")
    s.add_argument("--k", type=int, default=10, help="number of results (default 10)")
    s.add_argument("--offset", type=int, default=0, help="skip this many results first (pagination)")
    s.add_argument("--min-score", type=float, help="hide results scoring below this (cosine: -1 to 1)")
    s.add_argument("--folder", help="only images in this folder or below (relative to the gallery's root folder, "
                                    "or absolute)")
    s.add_argument("--taken-after", metavar="DATE", help="only photos taken at or after this ISO 8601 date or "
                                                         "date-time (UTC unless an offset is given)")
    s.add_argument("--taken-before", metavar="DATE", help="only photos taken before this date or date-time")
    s.add_argument("--media", choices=["photo", "video"],
                   help="only photos, or only video moments (default: both, in one ranking)")
    s.add_argument("--sort", choices=list(SORTS), default="relevance",
                   help="order: relevance (default, best first), or newest/oldest by capture time after a "
                        f"relevance cut: --min-score, or without it the strong matches (of the best {SORT_DEPTH:,} "
                        f"results; --min-score -1 sorts them all; images without a capture time last)")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the model and the search run (default auto). A --text query outside cuda is "
                        "embedded by the model's text encoder alone, converted once per model file for ONNX "
                        "Runtime (no image backbone, no PyTorch; docs/search.md), and the index searched on the CPU")
    s.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    s.add_argument("--json", action="store_true",
                   help="print the results as JSON (ids, scores, relevance, absolute paths, capture times, "
                        "folders, moments; whether one is a strong match) instead of a table")
    s.set_defaults(func=cmd_search)

    d = isub.add_parser("duplicates", help="group near-duplicate photos (re-saved, resized, cropped copies, "
                                           "bursts); print a table (or JSON)",
                        description="Groups the index's photos whose embeddings' cosine similarity is at least "
                                    "--threshold, each photo paired with its nearest (k-nearest-neighbour search, "
                                    "never all pairs; connected components), each labelled identical (the same bytes), "
                                    "re-encode (the same picture re-saved, resized or recoloured: perceptual hashes "
                                    "within a few bits) or near (crops, edits, bursts). docs/index.md")
    d.add_argument("--index", required=True, help="index directory")
    d.add_argument("--threshold", type=float, default=DUPLICATE_THRESHOLD,
                   help=f"cosine similarity from which two photos are near-duplicates, from 0.5 to 1 "
                        f"(default {DUPLICATE_THRESHOLD:g}, measured for the shipped model: docs/index.md)")
    d.add_argument("--json", action="store_true", help="print the groups as JSON (ids, absolute paths, kinds)")
    d.set_defaults(func=cmd_duplicates)

    i = isub.add_parser("info", help="print an index's manifest and counts as JSON")
    i.add_argument("--index", required=True, help="index directory")
    i.set_defaults(func=cmd_info)

    m = isub.add_parser("samples", help="write a sample gallery of real photos (public domain / CC0 / CC BY, from "
                                        "installed packages) and a caption corpus, for a first try")
    m.add_argument("--out", required=True, help="folder: photos/, captions.txt and ATTRIBUTION.md are written there")
    m.add_argument("--no-duplicate", dest="near_duplicate", action="store_false",
                   help="leave out the resized, recompressed copy of one photo (the demo's near-duplicate pair)")
    m.set_defaults(func=cmd_samples)


def _embedding_options(p: argparse.ArgumentParser, func) -> None:
    """The options of the commands that find and embed images (build, add, sync), which run ``func``."""
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="leave out files whose path (relative to the folder) or any of whose folder or file names "
                        "match GLOB (repeatable); .thumbnails, @eaDir and hidden files and folders are always left "
                        "out unless --no-default-excludes")
    p.add_argument("--no-default-excludes", action="store_true",
                   help="also index .thumbnails, @eaDir and hidden files and folders")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    p.add_argument("--decode", choices=DECODES, help=DECODE_HELP)
    p.add_argument("--batch-size", type=int,
                   help="image views per forward pass (default: 64 on CUDA, 16 photos under --tta flip-crop; on a "
                        "CPU 8 a core, at most 64: 16 on 2 cores, 4 photos under flip-crop)")
    p.add_argument("--workers", type=int, default=None,
                   help="image decoding processes (default: by the usable cores; on CUDA all but one)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=func)


def _ocr_options(p: argparse.ArgumentParser) -> None:
    """``index build``'s OCR options (index/ocr.py, docs/search.md)."""
    g = p.add_argument_group("text in photos", "read the text in photos that likely hold some (Tesseract), for "
                                               "keyword and hybrid search; `index add` and `index sync` follow the "
                                               "build's choice")
    o = g.add_mutually_exclusive_group()
    o.add_argument("--ocr", dest="ocr", action="store_const", const=True,
                   help="read text in photos; an error when Tesseract is not installed (default: on when it is)")
    o.add_argument("--no-ocr", dest="ocr", action="store_const", const=False, help="do not read text in photos")
    g.add_argument("--ocr-lang", default="eng", metavar="LANGS",
                   help="Tesseract language(s), joined by '+' (default eng; each needs its tesseract-ocr-LANG package)")


def _ocr_config(args):
    """The build's OCR configuration: None with --no-ocr, or by default when Tesseract is missing (said on stderr)."""
    from .ocr import OcrConfig, OcrUnavailableError, check_engine

    if args.ocr is False:
        return None
    try:
        check_engine(args.ocr_lang)
    except OcrUnavailableError as err:
        if args.ocr:
            raise
        print(f"jointspace index build: not reading text in photos (--no-ocr to silence this): {err}",
              file=sys.stderr)
        return None
    return OcrConfig(lang=args.ocr_lang)


def _video_options(p: argparse.ArgumentParser) -> None:
    """How the commands that find media read videos (docs/video.md)."""
    g = p.add_argument_group("videos", f"video files ({', '.join(VIDEO_SUFFIXES)}) found beside the "
                                       "photos are indexed as moments: sampled frames, grouped into windows")
    g.add_argument("--no-videos", action="store_true", help="index photos only; leave video files out")
    g.add_argument("--video-rate", type=float, default=VIDEO_RATE,
                   help=f"frames sampled a second (default {VIDEO_RATE:g})")
    g.add_argument("--video-max-frames", type=int, default=VIDEO_MAX_FRAMES,
                   help=f"at most this many frames a video (default {VIDEO_MAX_FRAMES})")
    g.add_argument("--video-window", type=float, default=VIDEO_WINDOW,
                   help=f"seconds a moment spans (default {VIDEO_WINDOW:g})")
    g.add_argument("--video-cut", type=float,
                   help="also start a moment where adjacent frames' embeddings differ by more than this cosine "
                        "distance (0 to 2; default: fixed windows only)")


def _sampling(args):
    from .moments import Sampling

    return Sampling(args.video_rate, args.video_max_frames, args.video_window, args.video_cut)


def _split_media(paths, args) -> tuple[list, list]:
    """Paths → (photos, videos) by content (index.scan.is_video); videos empty with --no-videos."""
    from .scan import is_video

    photos = [p for p in paths if not is_video(p)]
    videos = [] if args.no_videos else [p for p in paths if is_video(p)]
    return photos, videos


def _engine(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine", "where the images are embedded (docs/scale.md): in this process, or on Ray "
                                       "actors writing resumable embedding shards (needs the ray extra)")
    g.add_argument("--engine", default="in-process", choices=["in-process", "ray"],
                   help="in-process (default) or ray")
    g.add_argument("--ray-address", help="an existing Ray cluster (host:port of its head, ray://host:port, or "
                                         "auto); default: start a local Ray on this machine")
    g.add_argument("--ray-workers", type=int, help="embedding actors, one model each (default 2)")
    g.add_argument("--ray-cpus-per-worker", type=float, help="CPUs (torch threads) per actor (default 1)")
    g.add_argument("--ray-gpus-per-worker", type=float,
                   help="GPUs per actor (default 0: actors embed on the CPU; 0.5: two actors share a GPU)")
    g.add_argument("--shard-dir", help="embedding shards, kept for a re-run to resume (default: OUT.shards)")
    g.add_argument("--shard-size", type=int, help="images per shard (default 256)")


_RAY_OPTIONS = ("ray_address", "ray_workers", "ray_cpus_per_worker", "ray_gpus_per_worker", "shard_dir",
                "shard_size")


def _read_lines(path: str | Path) -> list[str]:
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line]


def _report_skipped(skipped) -> None:
    from .scan import is_video

    for path, reason in skipped:
        reason = _OBJECT_REPR.sub("", reason)       # "cannot identify image file <_io.BytesIO object at 0x…>"
        print(f"skipped unreadable {'video' if is_video(path) else 'image'} {path}: {reason}", file=sys.stderr)
    videos = sum(1 for path, _ in skipped if is_video(path))
    if len(skipped) > videos:
        print(f"{len(skipped) - videos} unreadable image(s) skipped", file=sys.stderr)
    if videos:
        print(f"{videos} unreadable video(s) skipped", file=sys.stderr)


_OBJECT_REPR = re.compile(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>")


def _report_outside(outside) -> None:
    """The symbolic links that were not followed because their target leaves the folder (docs/index.md)."""
    for link, reason in outside:
        print(f"skipped {link}: {reason}", file=sys.stderr)
    if outside:
        print(f"{len(outside)} symbolic link(s) leaving the folder skipped", file=sys.stderr)


def model_file(given: str | None) -> Path:
    """The model.pt a command loads: ``given``, else the shipped model. FileNotFoundError saying so when there is
    no such file."""
    from training.inference.pretrained import resolve

    path = resolve(given)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}" + (" (--model: a model.pt written by `jointspace "
                                                               "train`, or leave it out for the shipped model)"
                                                               if given else ""))
    return path


def read_index(root: str | Path) -> dict:
    """The manifest of the index at ``root``: checked before a command loads its model, so a wrong --index is
    said at once."""
    from .generations import read_manifest

    return read_manifest(root)


def _load(args, payload: dict | None = None):
    """The model of ``--model`` on ``--device``, its image tower on ``--backend`` (training/inference/backend.py),
    prepared for bulk embedding in the commands that embed a gallery (those with ``--batch-size``) and for one
    query at a time in the others; an unset ``--batch-size`` sized for the device (``embed.default_batch_size``).
    ``payload``: the model file, when already read (:func:`_decode_early`)."""
    from training.models.checkpoint import load_model
    from training.inference.backend import backend_choice, use_backend
    from training.inference.device import resolve_device

    path = model_file(args.model)
    device = resolve_device(args.device)
    backend = backend_choice(getattr(args, "backend", None))      # an unknown JOINTSPACE_BACKEND: before the load
    model = load_model(path, device, payload)
    bulk = hasattr(args, "batch_size")
    use_backend(model, backend, prepare="throughput" if bulk else "latency")
    _batch_size(args, device)
    return model, device


def _batch_size(args, device) -> None:
    """An unset ``--batch-size`` of the commands that embed, sized for the device."""
    from training.inference.embedding import default_batch_size

    if getattr(args, "batch_size", 0) is None:
        args.batch_size = default_batch_size(device)


def _decode_early(args, paths: list, payload: dict):
    """``index build``'s photos, decoding from before the model (whose file's ``payload`` is read) loads
    (``embed.decode_photos``, well ahead): the workers decode on the cores that building the model and loading its
    backend leave idle. None: in-process decoding as usual — no photos, the Ray engine, or an ensemble, whose
    preprocessing is known once it is built."""
    from training.inference.device import resolve_device
    from training.models.checkpoint import stored_preprocess

    from .embed import PhotoDecoding, decode_photos

    preprocess = stored_preprocess(payload)
    if args.engine == "ray" or not paths or preprocess is None:
        return None
    device = resolve_device(args.device)
    _batch_size(args, device)
    return decode_photos(preprocess, paths, args.batch_size, args.workers, device, tta=args.tta,
                         how=PhotoDecoding(ahead=True, decode=args.decode))


def cmd_build(args) -> int:
    started = time.perf_counter()
    from training.data.datasets import load_dataset
    from training.inference.backend import backend_choice
    from training.models.checkpoint import load_checkpoint

    from .changes import BuildOptions
    from .gallery import EmbedOptions, build
    from .scan import scan_media

    max_memory = _memory_budget(args.max_index_memory, args.factory)
    if args.engine != "ray":
        given = [f"--{o.replace('_', '-')}" for o in _RAY_OPTIONS if getattr(args, o) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} need(s) --engine ray")
    else:
        if args.tta not in (None, "none"):
            raise ValueError(f"--tta {args.tta} needs --engine in-process (the Ray engine's shards embed one view "
                             f"per image)")
        for option in ("ray_workers", "shard_size"):
            if getattr(args, option) is not None and getattr(args, option) < 1:
                raise ValueError(f"--{option.replace('_', '-')} must be at least 1")
        if args.ray_address:
            from .ray_embed import check_address

            check_address(args.ray_address)      # before the model loads: an unreachable cluster fails at once
    ocr = _ocr_config(args)                  # before the model loads: a missing engine or language fails at once
    backend_choice(getattr(args, "backend", None))         # an unknown JOINTSPACE_BACKEND, too
    payload = load_checkpoint(model_file(args.model))      # and a missing or refused model file, before the scan
    image_root = args.images
    outside: list[tuple[str, str]] = []
    sampling = _sampling(args)
    video_paths: list = []
    if args.data:
        if not args.split:
            raise ValueError("--data needs --split (the split whose images are indexed)")
        dataset = load_dataset(args.data)
        records = dataset.split(args.split).images
        paths = [r.path for r in records]
        captions: list[tuple[str, int | None]]
        if args.captions:
            captions = [(t, None) for t in _read_lines(args.captions)]
        elif args.caption_split and args.caption_split != args.split:
            captions = [(c, None) for r in dataset.split(args.caption_split).images for c in r.captions]
        else:
            captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
    else:
        if args.caption_split:
            raise ValueError("--caption-split needs --data")
        listing = Path(args.images)
        if listing.is_file():
            paths = [p if p.is_absolute() else listing.parent / p for p in map(Path, _read_lines(args.images))]
            paths, video_paths = _split_media(paths, args)
            image_root = None
        else:
            scan = scan_media(args.images, args.exclude, not args.no_default_excludes, photos=True,
                              videos=not args.no_videos)
            paths, video_paths = scan.by_kind()
            outside = scan.outside
        captions = [(t, None) for t in _read_lines(args.captions)] if args.captions else []
    _report_outside(outside)
    if not paths and not video_paths:
        raise ValueError("no images or videos to index")
    if video_paths and args.engine == "ray":
        raise ValueError("--engine ray embeds photos only: index videos in-process (or give --no-videos)")
    args.tta = args.tta or ("none" if args.engine == "ray" else DEFAULT_TTA)
    if not args.quiet:                 # something at once: the model takes seconds to load before the bar shows
        videos_found = f" and {_count(len(video_paths), 'video')}" if video_paths else ""
        print(f"indexing {_count(len(paths), 'photo')}{videos_found}; loading the model…", file=sys.stderr)
    decoding = _decode_early(args, paths, payload)
    try:
        model, _ = _load(args, payload)
        bank = _querybank(args, model)
        options = BuildOptions(factory=args.factory, caption_factory=args.caption_factory, image_root=image_root,
                               max_memory=max_memory, querybank=bank, tta=args.tta, ocr=ocr)
        if args.engine == "ray":
            report = _build_on_ray(args, model, paths, captions, options)
        else:
            report = build(args.out, model, paths, captions, video_paths, options,
                           EmbedOptions(args.batch_size, args.workers, not args.quiet, sampling, args.decode), decoding)
    finally:
        if decoding is not None:
            decoding.close()
    _report_skipped(report.skipped)
    videos = f", {len(report.video_ids)} videos ({report.moments} moments)" if video_paths else ""
    print(f"indexed {len(report.image_ids) - report.moments} images{videos} and {len(report.caption_ids)} captions "
          f"into {args.out} ({report.generation}); {_correction_line(bank)}")
    print(timing_line(report.timeline, started, time.perf_counter()))
    _prepare_text_search(args, model)
    return 0


def timing_line(timeline, started: float, ended: float) -> str:
    """``index build``'s speed, its start-up (the model, its backend and the first batch) apart from its steady
    rate (the photos after the first batch, over the time they took): what a bigger build's time follows."""
    total = f"{ended - started:.1f} s in all"
    startup = timeline.startup(started) if timeline is not None else None
    if startup is None:
        return f"timing: {total} (no photo embedded in-process)"
    steady = timeline.steady()
    rate = (f"then {steady:.1f} photos/s steady over {timeline.marks[-1][1] - timeline.marks[0][1]} photos"
            if steady is not None else "one batch, no steady rate")
    return f"timing: start-up {startup:.1f} s to the first batch of {timeline.marks[0][1]} photos, {rate}; {total}"


def _correction_line(bank) -> str:
    if bank is None:
        return "no hubness correction"
    sides = [name for name, n in (("text→image", bank.captions), ("image→text", bank.images)) if n is not None]
    counts = ", ".join(f"{len(n)} {what}" for what, n in (("captions", bank.captions), ("images", bank.images))
                       if n is not None)
    return f"hubness-corrected ({' and '.join(sides)}; {bank.origin} query bank: {counts}; beta {bank.beta:g})"


def _querybank(args, model: EmbeddingModel):
    """The query bank of ``index build``: none with ``--no-querybank``; with ``--querybank``, embedded captions
    (a text file) or captions + images (the chosen split of a captioned data set); else the bank the model
    carries (training/inference/querybank.py), if any."""
    from dataclasses import replace

    from training.data.datasets import load_dataset
    from training.inference.embedding import device_of, embed_split

    from .embed import embed_texts
    from .querybank import DEFAULT_BETA, QueryBank, model_bank

    if args.no_querybank:
        return None
    if not args.querybank:
        bank = model_bank(model, progress=not args.quiet)
        return replace(bank, beta=args.qb_beta) if bank is not None and args.qb_beta is not None else bank
    beta = DEFAULT_BETA if args.qb_beta is None else args.qb_beta
    source = Path(args.querybank)
    if source.is_file():
        texts = _read_lines(source)
        if not texts:
            raise ValueError(f"--querybank: {source} holds no captions")
        return QueryBank(captions=embed_texts(model, texts, progress=not args.quiet), beta=beta, origin=str(source))
    if not source.is_dir():
        raise FileNotFoundError(f"--querybank: no such file or data set: {source}")
    split = load_dataset(source).split(args.querybank_split)
    if not any(r.captions for r in split.images):
        raise ValueError(f"--querybank: {source} holds no captions")
    # as evaluation embeds a split: a frozen backbone's features come from (and go to) the feature cache, so
    # rebuilding with the same bank does not run the CNN over the training images again
    images, captions, _ = embed_split(model, split, device=device_of(model), workers=args.workers,
                                      progress=not args.quiet)
    return QueryBank(captions=captions.numpy(), images=images.numpy(), beta=beta,
                     origin=f"{source} ({args.querybank_split})")


def _memory_budget(text: str | None, factory: str | None) -> int | None:
    from .faiss_index import parse_bytes

    if text is None:
        return None
    if factory:
        raise ValueError("--max-index-memory chooses the index type: give it or --factory, not both")
    try:
        return parse_bytes(text)
    except ValueError as err:
        raise ValueError(f"--max-index-memory: {err}") from None


def _build_on_ray(args, model: EmbeddingModel, paths, captions, options):
    from training.inference.pretrained import resolve

    from .gallery import build_from_embeddings
    from .ray_embed import DEFAULT_SHARD_SIZE, RayOptions, embed_with_ray

    shard_dir = args.shard_dir or str(Path(args.out)) + ".shards"
    log = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr))
    ray = RayOptions(shard_size=args.shard_size or DEFAULT_SHARD_SIZE, address=args.ray_address,
                     workers=2 if args.ray_workers is None else args.ray_workers,
                     cpus_per_worker=args.ray_cpus_per_worker or 1, gpus_per_worker=args.ray_gpus_per_worker or 0,
                     batch_size=args.batch_size, progress=not args.quiet, decode=args.decode)
    run = embed_with_ray(model, resolve(args.model).read_bytes(), paths, shard_dir, ray, log=log)
    print(f"ray: {len(run.embedded)} shard(s) embedded, {len(run.reused)} reused from {run.shard_dir}",
          file=sys.stderr)
    return build_from_embeddings(args.out, model, paths, run.embeddings, captions, options, progress=not args.quiet)


def cmd_add(args) -> int:
    from .gallery import EmbedOptions, add
    from .scan import IMAGE_SUFFIXES, scan_media

    paths, outside, missing, not_media = [], [], [], []
    for p in args.paths:
        if Path(p).is_dir():
            scan = scan_media(p, args.exclude, not args.no_default_excludes, photos=True, videos=True)
            paths += scan.found
            outside += scan.outside
        elif not Path(p).exists():
            missing.append(p)
        elif Path(p).suffix.lower() not in IMAGE_SUFFIXES | set(VIDEO_SUFFIXES):
            not_media.append(p)
        else:
            paths.append(Path(p))
    if missing:
        raise FileNotFoundError(f"nothing added: no such file or folder: {', '.join(missing)}")
    if not_media:
        raise ValueError(f"nothing added: not a photo or video file (by its name's suffix): {', '.join(not_media)}. "
                         f"Photos: {', '.join(sorted(IMAGE_SUFFIXES))}; videos: {', '.join(VIDEO_SUFFIXES)}")
    captions = _read_lines(args.captions) if args.captions else []
    _report_outside(outside)
    unique: dict[Path, Path] = {}           # a file given alone and inside a given folder: added once
    for path in paths:
        unique.setdefault(Path(path).resolve(), Path(path))
    paths, video_paths = _split_media(list(unique.values()), args)
    sampling = _sampling(args)
    if not paths and not video_paths and not captions:
        raise ValueError("nothing to add: give image or video paths and/or --captions")
    read_index(args.index)
    model, _ = _load(args)
    report = add(args.index, model, paths, captions, video_paths,
                 EmbedOptions(args.batch_size, args.workers, not args.quiet, sampling, args.decode))
    _prepare_text_search(args, model)
    _report_skipped(report.skipped)
    for already in report.already:
        print(f"already in the index, unchanged: {already}", file=sys.stderr)
    if not report.image_ids and not report.caption_ids:
        if report.already and not report.skipped:
            print(f"nothing added: {_count(len(report.already), 'file')} given {'is' if len(report.already) == 1 else 'are'} "
                  f"in the index already, as {'it is' if len(report.already) == 1 else 'they are'}; {args.index} is "
                  f"unchanged")
            return 0
        print(f"jointspace index add: nothing added (no file could be read); {args.index} is unchanged",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"image_ids": report.image_ids, "caption_ids": report.caption_ids,
                          "video_ids": report.video_ids, "moments": report.moments,
                          "replaced": report.removed_images + report.removed_videos, "already": report.already,
                          "generation": report.generation}))
        return 0
    photos = len(report.image_ids) - report.moments
    parts = [_count(photos, "photo")] if photos or not report.video_ids else []
    parts += [f"{_count(len(report.video_ids), 'video')} ({_count(report.moments, 'moment')})"] \
        if report.video_ids else []
    parts += [_count(len(report.caption_ids), "caption")] if report.caption_ids else []
    notes = [f"{_count(report.removed_images + report.removed_videos, 'file')} changed since "
             f"{'it was' if report.removed_images + report.removed_videos == 1 else 'they were'} indexed: "
             f"embedded again"] if report.removed_images or report.removed_videos else []
    notes += [f"{_count(len(report.already), 'file')} already in the index"] if report.already else []
    print(f"added {_and(parts)} to {args.index} ({report.generation})" + "".join(f"; {n}" for n in notes))
    return 0


def _prepare_text_search(args, model: EmbeddingModel) -> None:
    """The model's text tower for ``index search --text``, prepared while the model is loaded (once per model
    file; training/inference/text_tower.py ``ensure``: never fails the command)."""
    from training.inference.text_tower import ensure

    ensure(model, model_file(args.model), progress=not args.quiet)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def cmd_sync(args) -> int:
    from .gallery import EmbedOptions, sync

    sampling = _sampling(args)
    if not Path(args.images).is_dir():                # said before the model loads, as a missing index is
        raise FileNotFoundError(f"no image directory at {args.images}")
    read_index(args.index)
    model, _ = _load(args)
    report = sync(args.index, model, args.images, args.exclude, not args.no_default_excludes, not args.no_videos,
                  EmbedOptions(args.batch_size, args.workers, not args.quiet, sampling, args.decode))
    _prepare_text_search(args, model)
    _report_skipped(report.skipped)
    _report_outside(report.outside)
    videos = {"videos_added": len(report.video_ids), "videos_removed": report.removed_videos} \
        if report.videos_seen else {}
    if args.json:
        print(json.dumps({"added": len(report.image_ids), "changed": len(report.changed),
                          "removed": report.removed_images, **videos,
                          **({"doubles_removed": report.doubles} if report.doubles else {}), "unchanged": report.unchanged, "skipped": len(report.skipped),
                          "links_outside": len(report.outside), "generation": report.generation}))
        return 0
    done = [f"{n} {what}" for n, what in ((len(report.image_ids), "added"), (len(report.changed), "changed"),
                                          (report.removed_images, "removed")) if n]
    done += [f"{_count(n, 'video')} {what}" for n, what in ((len(report.video_ids), "added"),
                                                            (report.removed_videos, "removed")) if n]
    done += [f"{_count(report.doubles, 'double entry')} of one file removed"] if report.doubles else []
    rest = f"{report.unchanged} unchanged" + (f", {len(report.skipped)} unreadable skipped" if report.skipped
                                              else "")
    if done:
        print(f"synced {args.index} with {args.images}: {_and(done)}, {rest} ({report.generation})")
    else:
        print(f"{args.index} already matches {args.images}: {rest}; nothing to change")
    return 0


def cmd_search(args) -> int:
    manifest = read_index(args.index)        # a wrong --index is said before anything heavy is imported
    from .gallery import Gallery
    from .hits import image_hits
    from .hybrid import Paging, search_text
    from .query import MAX_OFFSET, ImageFilter, check_min_score
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
    query = _text_query(args, manifest) if args.text is not None and args.device != "cuda" else None
    if query is not None:
        gallery = Gallery.load(args.index)
    else:
        model, device = _load(args)
        gallery = Gallery.load(args.index, model=model, device=device)
    try:
        min_score = check_min_score(gallery.manifest["similarity"], args.min_score)
        ranking: Ranking
        if args.text is not None:
            if query is None:
                from training.inference.embedding import embed_texts

                query = embed_texts(model.eval(), [args.text], [args.subtract]).cpu().numpy()
            ranking = search_text(gallery, query, args.text, args.mode,
                                  Paging(args.k, args.offset, min_score, args.sort), gallery.allowed_ids(flt))
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


def _text_query(args, manifest: dict):
    """A text query's vector: from the model's text tower alone (ONNX Runtime, training/inference/text_tower.py),
    prepared from the whole model the first time a model file is used; from the whole model in PyTorch (its
    image tower left as it is) when its text side runs in PyTorch only. Refuses an index built with another
    model, as loading the model does."""
    from training.inference import text_tower

    from .gallery import check_fingerprint

    path = model_file(args.model)
    tower = text_tower.load(path)
    if tower is None:
        from training.inference.embedding import embed_texts
        from training.models.checkpoint import load_model

        model = load_model(path)
        check_fingerprint(manifest, model.fingerprint, args.index)
        if not text_tower.prepared(path):
            if text_tower.unsupported_reason(model) is None:
                print("jointspace index search: preparing this model's text encoder for quick searches (once per "
                      "model file)", file=sys.stderr)
            tower = text_tower.prepare(model, path)
        if tower is None:
            return embed_texts(model.eval(), [args.text], [args.subtract]).cpu().numpy()
    check_fingerprint(manifest, tower.fingerprint, args.index)
    return tower.embed([args.text], [args.subtract])


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


def cmd_remove(args) -> int:
    from .gallery import remove

    if not args.paths and not args.ids and not args.caption_ids:
        raise ValueError("nothing to remove: give paths, --ids and/or --caption-ids")
    report = remove(args.index, args.ids, args.caption_ids, args.paths)
    for what, given in (("id", report.missing), ("path", report.missing_paths)):
        if given:
            print(f"jointspace index remove: not in the index: {what} {', '.join(map(str, given))}", file=sys.stderr)
    removed = report.removed_images + report.removed_captions
    if removed and args.json:
        print(json.dumps({"removed_images": report.removed_images, "removed_videos": report.removed_videos,
                          "removed_captions": report.removed_captions, "generation": report.generation}))
    elif removed:
        parts = [_count(report.removed_images, "image") + (f" ({_count(report.removed_videos, 'video')} with their "
                                                             f"moments)" if report.removed_videos else "")]
        parts += [_count(report.removed_captions, "caption")] if report.removed_captions else []
        print(f"removed {_and(parts)} from {args.index} ({report.generation})")
    else:
        print(f"jointspace index remove: nothing removed; {args.index} is unchanged", file=sys.stderr)
    return 0 if removed and not report.missing and not report.missing_paths else 1


def cmd_compact(args) -> int:
    from .gallery import compact

    print(json.dumps(compact(args.index)))
    return 0


def cmd_duplicates(args) -> int:
    read_index(args.index)                   # a wrong --index is said before anything heavy is imported
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
    read_index(args.index)                   # a wrong --index is said before anything heavy is imported
    from .gallery import Gallery

    gallery = Gallery.load(args.index)
    print(json.dumps(gallery.info(), indent=2))
    gallery.close()
    return 0


def cmd_samples(args) -> int:
    from .samples import write_samples

    photos = write_samples(args.out, near_duplicate=args.near_duplicate)
    print(json.dumps({"photos": str(photos), "captions": str(Path(args.out) / "captions.txt"),
                      "images": sum(p.is_file() for p in photos.iterdir()),
                      "videos": len(list((photos / "videos").glob("*.mp4")))}))
    return 0
