"""Decode + preprocessing throughput per core: the path before decoding shrank images against today's, in one run.

    flock -x /tmp/jointspace-cpu.lock python benchmarks/decode_throughput.py   # → results/decode_throughput_cpu.json

Photo-like JPEGs (smooth random shapes plus sensor-like noise, quality 90: about 3 MB at 12 MP, as a camera
photo) are generated at 12 MP (4000 × 3000) and 1 MP (1152 × 864) into a temporary folder, deleted afterwards. Each
file goes through what an index worker does per photo — read the bytes, hash them (sha256), decode, turn upright,
read the capture time, preprocess into the model's stacked pixels — in one process with one thread, three ways:

* ``before``: the code as it was (a copy of it below): a full-size decode, and each member of the stacked
  preprocessing converting and resizing the full image;
* ``once``: one full-size decode: ``index.embed.read_photo`` at full size and ``StackedPreprocess.pixels`` (one
  RGB image, each member resizing it) — what runs with shrinking off (``SHRINK_TO_EMBED``);
* ``now`` (shrunk): ``read_photo`` with the preprocessing's ``min_side`` (a JPEG decoded at the smallest DCT scale
  that keeps twice it), then the same — what runs as shipped (``SHRINK_TO_EMBED`` on; its ranking check:
  benchmarks/decode_ranking.py).

The preprocessing is the shipped model's, read from ``--model`` (its stored ``backbone.preprocess``; no weights are
used). The paths alternate, file by file, ``--rounds`` times; img/s per core is images over the process's
CPU seconds (wall-clock img/s is recorded too: other jobs share the cores). The pixels of the two paths are
compared (mean absolute difference, 0-255).
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.tables import current_commit  # noqa: E402
from index.embed import exif_time, read_photo  # noqa: E402
from training.data.fileio import write_json  # noqa: E402
from training.data.preprocess import SHRINK_TO_EMBED, StackedPreprocess, dct_scale, preprocess_from_dict  # noqa: E402
from training.models.factory import build_backbone  # noqa: E402
from training.models.checkpoint import load_checkpoint  # noqa: E402

MODEL = ROOT / "training" / "pretrained" / "flickr8k.pt"
SIZES = {"12 MP": (4000, 3000), "1 MP": (1152, 864)}


def shipped_preprocess(path: Path):
    payload = load_checkpoint(path)
    stored = payload.get("backbone", {}).get("preprocess")
    if stored:
        return preprocess_from_dict(stored)
    cfg = payload["members"][0]["config"] if "members" in payload else payload["config"]  # an ensemble: its first
    return build_backbone(cfg.image, load_weights=False).preprocess                        # member's image section


def photo(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (height // 60, width // 60, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    return Image.fromarray(np.clip(smooth + rng.integers(-10, 11, smooth.shape, dtype=np.int16), 0, 255).astype(np.uint8))


# --- the path before (index.embed.read_photo, preprocess.load_image and StackedPreprocess.pixels as they were) ---

def read_photo_before(path: Path) -> Image.Image:
    data = path.read_bytes()
    path.stat()
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        exif = im.getexif()
        image = ImageOps.exif_transpose(im).convert("RGB")
    exif_time(exif)
    hashlib.sha256(data).hexdigest()
    return image


def pixels_before(pre, image: Image.Image) -> torch.Tensor:
    members = pre.members if isinstance(pre, StackedPreprocess) else (pre,)
    side = max(m.image_size for m in members)
    out = torch.zeros(pre.crops, 3 * len(members), side, side, dtype=torch.uint8)
    for i, m in enumerate(members):          # each member: image.convert("RGB"), then its resize and crops
        out[:, 3 * i:3 * i + 3, :m.image_size, :m.image_size] = m._views(image.convert("RGB"))
    return out


def before(pre, path: Path) -> torch.Tensor:
    return pixels_before(pre, read_photo_before(path))


def once(pre, path: Path) -> torch.Tensor:
    return pre.pixels(read_photo(path)[0])


def now(pre, path: Path) -> torch.Tensor:
    return pre.pixels(read_photo(path, pre.min_side)[0])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--files", type=int, default=6, help="generated JPEGs of each size")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the files, the two paths alternating")
    ap.add_argument("--hardware", default=f"CPU, {os.cpu_count()} cores ({_cpu_model()}), shared with other jobs; "
                                          f"one process, one thread")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decode_throughput_cpu.json"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    pre = shipped_preprocess(Path(args.model))
    tmp = Path(tempfile.mkdtemp(prefix="decode-throughput-"))
    rows = []
    try:
        for label, (w, h) in SIZES.items():
            files = []
            for i in range(args.files):
                f = tmp / f"{label.replace(' ', '')}-{i}.jpg"
                photo(w, h, seed=i).save(f, quality=90)
                files.append(f)
            mean_bytes = sum(f.stat().st_size for f in files) / len(files)
            diff = float(np.mean([(before(pre, f).float() - now(pre, f).float()).abs().mean() for f in files]))
            cpu = {"before": 0.0, "once": 0.0, "now": 0.0}
            wall = {"before": 0.0, "once": 0.0, "now": 0.0}
            for _ in range(args.rounds):
                for f in files:
                    for name, fn in (("before", before), ("once", once), ("now", now)):
                        c, t = time.process_time(), time.perf_counter()
                        fn(pre, f)
                        cpu[name] += time.process_time() - c
                        wall[name] += time.perf_counter() - t
            n = args.files * args.rounds
            row = {"images": f"{label} ({w} × {h})", "mean_bytes": mean_bytes, "dct_scale": dct_scale((w, h), pre.min_side),
                   "n": n, "mean_abs_pixel_diff": diff}
            for name in ("before", "once", "now"):
                row[name] = {"cpu_s": cpu[name], "wall_s": wall[name], "img_per_cpu_s": n / cpu[name],
                             "img_per_s": n / wall[name]}
            row["speedup_per_core"] = row["now"]["img_per_cpu_s"] / row["before"]["img_per_cpu_s"]
            row["once_speedup_per_core"] = row["once"]["img_per_cpu_s"] / row["before"]["img_per_cpu_s"]
            rows.append(row)
            print(f"{row['images']}: {mean_bytes / 1e6:.2f} MB, before {row['before']['img_per_cpu_s']:.1f} img/s per "
                  f"core, now {row['now']['img_per_cpu_s']:.1f} (×{row['speedup_per_core']:.2f}; scale 1/"
                  f"{row['dct_scale']}; mean pixel difference {diff:.2f}); load {os.getloadavg()[0]:.1f}", flush=True)
            for f in files:
                f.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_json(Path(args.out), {
        "description": "decode + preprocessing of generated photo-like JPEGs (quality 90) into the shipped model's "
                       "stacked pixels (Lite2 260 + Lite0 224 + Lite1 240 px), as an index worker does per photo; "
                       "before: full decode, each member from the full image; once: full decode, one image for all "
                       "members; now: shrunk while decoding, one image (what runs while shrink_to_embed is on) "
                       "(python benchmarks/decode_throughput.py)",
        "shrink_to_embed": SHRINK_TO_EMBED,
        "hardware": args.hardware, "date": dt.date.today().isoformat(), "commit": current_commit(),
        "python": platform.python_version(), "pillow": Image.__version__, "preprocess": pre.to_dict(),
        "load_1min_at_end": os.getloadavg()[0], "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
