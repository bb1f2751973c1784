"""``jointspace index build | add | sync | remove | compact | search | duplicates | info | samples`` — the index
package's command line (assembled in service/cli.py): the parser here, the commands by family in cli_build.py
(build, samples), cli_update.py (add, sync, remove, compact) and cli_search.py (search, duplicates, info).

The parser is built without torch or numpy (`jointspace --help` imports none of the model code: tests/test_cli.py):
the values it offers come from torch-free modules that the code using them imports too (index/choices.py,
index/tta.py, training/inference/names.py), and the command modules import the model code only when a command
runs."""
from __future__ import annotations

import argparse

from training.inference.names import BACKEND_HELP, BACKENDS, DECODE_HELP, DECODES

from .choices import (DEFAULT_MAX_FRAMES, DEFAULT_MODE, DEFAULT_RATE, DEFAULT_THRESHOLD, DEFAULT_WINDOW, MODES,
                      SORT_DEPTH, SORTS, VIDEO_SUFFIXES)
from .cli_build import cmd_build, cmd_samples
from .cli_search import cmd_duplicates, cmd_info, cmd_search
from .cli_update import cmd_add, cmd_compact, cmd_remove, cmd_sync
from .tta import DEFAULT_TTA, TTA


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build and update a FAISS index of a photo gallery and a caption corpus")
    isub = p.add_subparsers(dest="index_command", required=True, metavar="ACTION")

    b = isub.add_parser("build", help="embed a gallery (and a caption corpus) and write a new index")
    b.add_argument("--model", help="model.pt (default: the shipped real-photo model, docs/model-card.md)")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="a directory of images (searched recursively), one photo or video, or a text "
                                      "file listing image files, one a line (relative to the file's folder)")
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
    s.add_argument("--mode", choices=MODES, default=DEFAULT_MODE,
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
    d.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"cosine similarity from which two photos are near-duplicates, from 0.5 to 1 "
                        f"(default {DEFAULT_THRESHOLD:g}, measured for the shipped model: docs/index.md)")
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


def _video_options(p: argparse.ArgumentParser) -> None:
    """How the commands that find media read videos (docs/video.md)."""
    g = p.add_argument_group("videos", f"video files ({', '.join(sorted(VIDEO_SUFFIXES))}) found beside the "
                                       "photos are indexed as moments: sampled frames, grouped into windows")
    g.add_argument("--no-videos", action="store_true", help="index photos only; leave video files out")
    g.add_argument("--video-rate", type=float, default=DEFAULT_RATE,
                   help=f"frames sampled a second (default {DEFAULT_RATE:g})")
    g.add_argument("--video-max-frames", type=int, default=DEFAULT_MAX_FRAMES,
                   help=f"at most this many frames a video (default {DEFAULT_MAX_FRAMES})")
    g.add_argument("--video-window", type=float, default=DEFAULT_WINDOW,
                   help=f"seconds a moment spans (default {DEFAULT_WINDOW:g})")
    g.add_argument("--video-cut", type=float,
                   help="also start a moment where adjacent frames' embeddings differ by more than this cosine "
                        "distance (0 to 2; default: fixed windows only)")


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
