"""The values the index's commands offer and default to, defined once and free of torch and numpy: the modules that
use them and the command line's parser (index/cli.py, which builds ``jointspace --help`` without importing the
model code) both import them from here, as they do the test-time augmentations' names from index/tta.py.

* media: :data:`VIDEO_SUFFIXES` — the files a folder scan takes for videos (index/scan.py);
* videos: :data:`DEFAULT_RATE` and :data:`DEFAULT_MAX_FRAMES` — how frames are sampled (index/video_decode.py),
  :data:`DEFAULT_WINDOW` — the seconds a moment spans (index/moments.py);
* search: :data:`MODES` and :data:`DEFAULT_MODE` — a text query's modes (index/hybrid.py), :data:`MAX_OFFSET` —
  the deepest page (index/query.py), :data:`SORTS` and :data:`SORT_DEPTH` — the orders and how deep a sorted
  search looks (index/order.py);
* near-duplicates: :data:`DEFAULT_THRESHOLD` (index/duplicates.py).
"""
from __future__ import annotations

VIDEO_SUFFIXES = frozenset({".mp4", ".mov", ".m4v", ".webm", ".mkv", ".avi"})

DEFAULT_RATE = 1.0              # sampled frames a second
DEFAULT_MAX_FRAMES = 3600       # per video
DEFAULT_WINDOW = 5.0            # seconds a moment spans (fixed windows)

MODES = ("vector", "keyword", "hybrid")
DEFAULT_MODE = "vector"
MAX_OFFSET = 10_000          # the deepest page a search may ask for (results skipped before the first one returned)
SORTS = ("relevance", "newest", "oldest")
SORT_DEPTH = MAX_OFFSET        # the best results a sorted search orders by time (pages beyond it are empty)

DEFAULT_THRESHOLD = 0.85     # cosine; measured on the shipped model: benchmarks/results/duplicates.json
