"""The text side's settings of a photo hit's relevance (index/relevance.py: the weight λ of r(q), the description
margin M₀, the null margin N₀, and the name term's floor T₀ and margin A₀), chosen on development galleries and
written to ``benchmarks/results/relevance_margins.json`` (rendered into docs/index.md by benchmarks/tables.py).

    python benchmarks/relevance_margins.py --model training/pretrained/flickr8k.pt \
        --flickr8k ../shared/datasets/flickr8k

The galleries: the demo's photos indexed as ``make demo`` indexes them (with the resized, recompressed copy of one
photo) and as benchmarks/open_vocab.py does (without it), each with the image tower in float32 and, on a CPU with
native bf16, in bf16 (index build ``--backend openvino-bf16``; elsewhere that backend would run the float32 tower, so
those galleries are left out and the results file says so), under ``--work``. For every query of the demo's
development sets — its 20 photo captions (*present*), and its captions of things no photo shows,
``absent_queries_demo.txt``, ``nonsense_queries.txt`` and ``absent_queries_check.txt`` (*absent*) — and each hit of
its first page of 10, the parts of the relevance that do not depend on the settings are computed once through the
index (the photo side; q·v − b(v); r(q); q·v − n(v); the name margin a(q, v) − t(q) and t(q)). A query then has a
strong match under (λ, M₀, N₀, T₀, A₀) when one of its hits with a strong photo side has

    d = min(q·v − b(v) − λ r(q) − M₀,  q·v − n(v) − N₀,  a(q, v) − t(q) − A₀ where t(q) ≥ T₀) ≥ 0,

and its *distance* is the largest such d over those hits (negative: no strong match). A grid of settings is searched;
the rule: among the settings that meet the targets on every gallery (at least 90 % of the captions strong, at most 1
in 10 absent queries), the ones leaving the fewest absent queries strong on their worst gallery — up to
:data:`ABSENT_SLACK` more counting as as few, the difference one photo saved again makes (the galleries with and
without the near-duplicate copy differ by one) — and of those the one whose smallest |distance| over the captions and
absent queries on all galleries is largest: the decisions that a small change of a vector (bf16 against float32, a
photo saved again) is least likely to flip. Two more sets of absent things and nonsense are never used to choose:
the *unseen* set (``absent_queries_unseen.txt``, *check*), written before any setting was chosen with it in view — the
results give the fewest of it that any setting keeping the captions' target leaves strong (``check_floor``); its
count under an earlier rule was one reason for the rule's fewest-absent order — and the *holdout* set
(``absent_queries_holdout.txt``), written after the rule and the settings were fixed and looked at by nothing that
chose them (its misses were read before the name term's aliases were added, which chose no setting): its strong
count is the rate to expect on queries of one's own. Before
the search, the counts under the settings in index/relevance.py are checked against the index's own ``strong_match``
(they must agree). The photo's best names the name term looks at (index/relevance.py ``NAMED_TOP``) are swept too
(:data:`NAMED_TOPS`): the rule's choice at each count, in the rule's order (``named_top`` in the results).
``--flickr8k``: Flickr8k dev indexed too (``jointspace index build --split val``), and the share of its captions
whose own photo is a strong match under the settings in use, the chosen ones and the first runners-up, as a check in
the model's own domain.
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import math
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.flickr8k_levers import commit, hardware  # noqa: E402
from training.data.fileio import write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "relevance_margins.json"
PRESENT_SHARE = 0.9            # the targets (issue 58): at least 18 of 20 captions strong,
ABSENT_SHARE = 0.1             # at most 1 in 10 absent or nonsense queries
WEIGHTS = np.round(np.arange(0.0, 0.801, 0.05), 3) + 0.0    # λ (+ 0.0: no −0.0)
DESCRIPTION = np.round(np.arange(-0.45, -0.149, 0.005), 3) + 0.0  # M₀
NULL = np.round(np.arange(-0.10, 0.051, 0.01), 3) + 0.0    # N₀
NAMED_FLOOR = np.array([0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 1.01])    # T₀ (1.01: no query names a class)
NAMED = np.round(np.arange(-0.30, 0.001, 0.025), 3) + 0.0    # A₀
ABSENT_SLACK = 1               # absent queries strong: this many more than the fewest count as as few (the rule)
NAMED_TOPS = (1, 2, 3, 5, 8, 12, 20)    # the photo's best names a(q, v) looks at (index/relevance.py NAMED_TOP), swept
SELECTED = ("present", "absent")    # the query sets the settings are chosen on (query_sets: not "check", "holdout")


@dataclass(frozen=True)
class Parts:
    """The setting-free parts of each query's hits, ``(queries, hits)`` arrays: ``usable`` (the photo side is a
    strong match), ``described`` (q·v − b(v)), ``null`` (q·v − n(v)) and ``named`` (a(q, v) − t(q), +inf for a
    photo without names); ``rq``: r(q) and ``closest_class``: t(q), ``(queries,)``."""
    usable: np.ndarray
    described: np.ndarray
    rq: np.ndarray
    null: np.ndarray
    named: np.ndarray
    closest_class: np.ndarray


def distances(parts: Parts, weight: float, description: float, null: float, named_floor: float,
              named: float) -> np.ndarray:
    """Each query's distance from a strong match under (λ, M₀, N₀, T₀, A₀) (the module's d; −inf: no hit with a
    strong photo side)."""
    return grid_distances(parts, weight, np.array([description]), np.array([null]), named_floor, named)[0, 0]


def grid_distances(parts: Parts, weight: float, descriptions: np.ndarray, nulls: np.ndarray, named_floor: float,
                   named: float) -> np.ndarray:
    """:func:`distances` for every M₀ of ``descriptions`` and N₀ of ``nulls`` at once: ``(M, N, queries)``."""
    gate = np.where(parts.closest_class[:, None] >= named_floor, parts.named - named, np.inf)           # (Q, H)
    text = np.minimum((parts.described - weight * parts.rq[:, None])[None] - descriptions[:, None, None], gate)
    d = np.minimum(text[:, None], parts.null[None, None] - nulls[None, :, None, None])         # (M, N, Q, H)
    return np.where(parts.usable, d, -np.inf).max(axis=-1)


SETTINGS = ("weight", "description", "null", "named_floor", "named")
GRID_AXES = ("weight", "named_floor", "named", "description", "null")   # the search's array axes, outermost first


def search(galleries: dict[str, dict[str, Parts]], keep: int = 10, also: tuple[tuple[float, ...], ...] = (),
           floors: np.ndarray = NAMED_FLOOR) -> tuple[list[dict], dict]:
    """The grid's settings with, per gallery, their strong counts per query set and their smallest |distance| over
    the sets they are chosen on: the ``keep`` best (those meeting the targets on every gallery first — where none
    does, those meeting the captions' — then the fewest absent queries strong on the worst gallery, to within
    :data:`ABSENT_SLACK`, then by that margin, largest first), with the settings of ``also`` wherever they rank; and a
    summary of the grid (its size, how many meet the targets, the check floor: :func:`check_floor`). ``floors``: the T₀ searched (``[1.01]``: the rule without the name term)."""
    names = list(galleries)
    sets = sorted({k for g in galleries.values() for k in g})
    shape = (len(WEIGHTS), len(floors), len(NAMED), len(DESCRIPTION), len(NULL))
    counts = {(n, k): np.zeros(shape, np.int32) for n in names for k in sets}
    margins = {n: np.zeros(shape) for n in names}
    for (i, weight), (j, floor), (k, named) in itertools.product(enumerate(WEIGHTS), enumerate(floors),
                                                                 enumerate(NAMED)):
        for n in names:
            d = {key: grid_distances(p, weight, DESCRIPTION, NULL, floor, named) for key, p in galleries[n].items()}
            for key, x in d.items():
                counts[n, key][i, j, k] = (x >= 0).sum(axis=-1)
            chosen_on = np.concatenate([x for key, x in d.items() if key in SELECTED], axis=-1)
            margins[n][i, j, k] = np.where(np.isfinite(chosen_on), np.abs(chosen_on), np.inf).min(axis=-1)
    captions, meets = np.ones(shape, bool), np.ones(shape, bool)
    for n in names:
        captions &= counts[n, "present"] >= PRESENT_SHARE * len(galleries[n]["present"].rq)
        meets &= counts[n, "absent"] <= ABSENT_SHARE * len(galleries[n]["absent"].rq)
    meets &= captions
    margin = np.minimum.reduce([np.where(np.isfinite(m), m, 0.0) for m in margins.values()])
    absent = np.maximum.reduce([counts[n, "absent"] for n in names])    # on the worst gallery
    # meeting the targets first (where none does, keeping the captions' first), then the fewest absent queries strong
    # (up to ABSENT_SLACK more counting as as few), then by margin, largest first
    fewest = int(absent[captions].min()) if captions.any() else 0
    tier = absent_tier(absent, fewest)
    order = np.lexsort((-margin.ravel(), tier.ravel(), ~meets.ravel(), ~captions.ravel()))
    rank = np.empty(order.size, np.int64)                # each setting's place in that order
    rank[order] = np.arange(order.size)
    grid = dict(zip(GRID_AXES, (WEIGHTS, floors, NAMED, DESCRIPTION, NULL)))

    def row(flat: int) -> dict:
        at = np.unravel_index(flat, shape)
        values = {name: float(axis[x]) for (name, axis), x in zip(grid.items(), at)}
        per = {n: {**{key: int(counts[n, key][at]) for key in sets},
                   "margin": float(margins[n][at]) if np.isfinite(margins[n][at]) else 0.0} for n in names}
        return {**{k: values[k] for k in SETTINGS}, "per": per, "meets": bool(meets[at]),
                "margin": float(margin[at]), "rank": int(rank[flat]) + 1}

    rows = [row(int(f)) for f in order[:keep]]
    for values in also:
        asked = dict(zip(SETTINGS, values))
        at = tuple(int(np.flatnonzero(np.isclose(axis, asked[name]))[0]) if np.isclose(axis, asked[name]).any() else -1
                   for name, axis in grid.items())
        if -1 in at:
            raise SystemExit(f"the settings {asked} are not on the grid: widen it")
        rows.append(row(int(np.ravel_multi_index(at, shape))))
    summary: dict = {"settings": int(meets.size), "meeting_targets": int(meets.sum())}
    if "check" in sets:
        summary["check_floor"] = check_floor(counts, names, rank, row,
                                             math.ceil(PRESENT_SHARE * len(galleries[names[0]]["present"].rq) - 1e-9))
    return rows, summary


def named_top_sweep(swept: dict[int, dict[str, dict[str, Parts]]]) -> list[dict]:
    """The rule's choice with the photo's best names counted at each count of ``swept`` (``{count: galleries}``),
    in the rule's order across the counts (meeting the targets, then the fewest absent queries strong on the worst
    gallery, up to :data:`ABSENT_SLACK` more counting as as few, then the nearest decision, widest first): the
    first is the count the rule would serve."""
    rows = [dict(search(galleries, keep=1)[0][0], named_top=k) for k, galleries in swept.items()]

    def absent(r: dict) -> int:
        return max(p["absent"] for p in r["per"].values())

    fewest = min((absent(r) for r in rows if r["meets"]), default=0)
    return sorted(rows, key=lambda r: (not r["meets"], int(absent_tier(absent(r), fewest)), -r["margin"]))


def absent_tier(absent, fewest: int):
    """The rule's tier of an absent count: up to :data:`ABSENT_SLACK` more than the fewest count as as few."""
    return np.maximum(absent, fewest + ABSENT_SLACK)


def check_floor(counts: dict, names: list[str], rank: np.ndarray, row, present: int) -> dict | None:
    """Of the settings leaving at least ``present`` captions strong on every gallery, the one leaving the fewest of
    the check set strong on its worst gallery (ties: the better ranked): how far any setting of the grid could carry
    over (None: no such setting)."""
    kept = np.logical_and.reduce([counts[n, "present"] >= present for n in names])
    if not kept.any():
        return None
    worst = np.maximum.reduce([counts[n, "check"] for n in names]).astype(np.float64)
    worst[~kept] = np.inf
    best = int(np.lexsort((rank, worst.ravel()))[0])
    out = row(best)
    return {k: out[k] for k in (*SETTINGS, "per")}


def query_sets() -> dict[str, list[str]]:
    """The demo's query sets: *present* and *absent* choose the settings (:data:`SELECTED`); *check*, absent things
    and nonsense written before any setting was chosen with them in view (``absent_queries_unseen.txt``), and
    *holdout*, written after the settings were fixed (``absent_queries_holdout.txt``), only measure how a choice
    carries over to queries it was not chosen on. ``absent_queries_check.txt``, the check set of the settings before
    the name term, is among the absent queries."""
    from benchmarks.open_vocab import demo_absent, demo_truth, query_set

    return {"present": [t for t, _ in demo_truth()],
            "absent": demo_absent() + query_set("absent_queries_demo") + query_set("nonsense_queries")
            + query_set("absent_queries_check"),
            "check": query_set("absent_queries_unseen"), "holdout": query_set("absent_queries_holdout")}


def hit_parts(gallery, queries: np.ndarray, hits: list[list[tuple[int, float]]]) -> Parts:
    """The setting-free parts of ``hits`` (one list per raw query, as the index returned them), as served."""
    from index.relevance import NAMED_TOP

    return hit_parts_at(gallery, queries, hits, (NAMED_TOP,))[NAMED_TOP]


def hit_parts_at(gallery, queries: np.ndarray, hits: list[list[tuple[int, float]]],
                 named_tops: tuple[int, ...]) -> dict[int, Parts]:
    """:func:`hit_parts` with a(q, v) over each photo's ``k`` best names, for each ``k`` of ``named_tops``: the other
    parts computed once, and each photo's best names once, at the largest count (a smaller count's are its first)."""
    from index.gallery import plain_queries, queries_for
    from index.relevance import STRONG, name_margins

    reference = gallery.references["images"]
    text = reference.descriptions
    photo = reference.relevance(queries_for(gallery.manifest, "images", queries), [[s for _, s in h] for h in hits])
    width = max(len(h) for h in hits)
    shape = (len(hits), width)
    usable, described, null = np.zeros(shape, bool), np.zeros(shape), np.zeros(shape)
    named = {k: np.zeros(shape) for k in named_tops}
    rq, closest = np.zeros(len(hits)), np.zeros(len(hits))
    for n, (q, h, p) in enumerate(zip(plain_queries(gallery.manifest, queries), hits, photo)):
        vectors = np.stack([gallery.image_vector(i) for i, _ in h]).astype(np.float32)
        floors = text.floors(vectors, max(named_tops))
        raw = vectors @ q
        usable[n, :len(h)] = np.asarray(p) >= STRONG
        described[n, :len(h)] = raw - floors[:, 0]
        null[n, :len(h)] = raw - floors[:, 1]
        said = text.query_names(q)
        for k, margins in named.items():
            margins[n, :len(h)] = name_margins(said, floors[:, 2:2 + k], np.zeros(len(h), dtype=np.intp),
                                               named_floor=-np.inf)
        closest[n] = said.max() if said.size else -np.inf
        rq[n] = text.query_floor(q)
    return {k: Parts(usable, described, rq, null, margins, closest) for k, margins in named.items()}


def demo_parts(model, index: Path, named_tops: tuple[int, ...] = ()) -> tuple[dict[str, Parts], dict[int, dict]]:
    """The demo's query sets on one built index, checked against the index's own ``strong_match``; and the same
    with the photo's best names counted at each of ``named_tops`` instead (``{count: {set: Parts}}``)."""
    from index import relevance
    from index.embed import embed_text_queries
    from index.gallery import Gallery
    from index.query import ImageFilter

    gallery = Gallery.load(index, model=model)
    try:
        out: dict[str, Parts] = {}
        swept: dict[int, dict] = {k: {} for k in named_tops}
        for key, texts in query_sets().items():
            queries = embed_text_queries(model, texts, progress=False)
            hits = gallery.search_images(queries, 10, flt=ImageFilter(media="photo"))
            at = hit_parts_at(gallery, queries, hits, (relevance.NAMED_TOP, *named_tops))
            out[key] = parts = at[relevance.NAMED_TOP]
            served = [bool(r.strong_match) for r in gallery.ranked("images", queries, hits)]
            mine = distances(parts, **relevance.text_side_settings())
            if sum(served) != int((mine >= 0).sum()):
                raise SystemExit(f"{index}: {key}: {int((mine >= 0).sum())} strong from the parts, "
                                 f"{sum(served)} as served")
            for k in named_tops:
                swept[k][key] = at[k]
        return out, swept
    finally:
        gallery.close()


def dev_parts(model, index: Path, data: str) -> Parts:
    """Every Flickr8k dev caption with its own photo as its one hit (the index built from the dev split: ids are
    positions)."""
    from index.embed import embed_text_queries
    from index.gallery import Gallery
    from training.data.datasets import load_dataset

    records = load_dataset(data).split("val").images
    captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
    gallery = Gallery.load(index, model=model)
    try:
        queries = embed_text_queries(model, [c for c, _ in captions], progress=False)
        own = []
        for (_, pos), row in zip(captions, gallery.search_images(queries, len(records))):
            own.append([next((i, s) for i, s in row if i == pos)])
        return hit_parts(gallery, queries, own)
    finally:
        gallery.close()


GALLERIES = {                   # name: (with the near-duplicate copy, the image tower's backend)
    "float32": (False, None), "bf16": (False, "openvino-bf16"),
    "float32, with the near-duplicate": (True, None), "bf16, with the near-duplicate": (True, "openvino-bf16")}


def galleries_here() -> dict[str, tuple[bool, str | None]]:
    """:data:`GALLERIES` this CPU can build: the bf16 ones need native bf16 (without it ``openvino-bf16`` falls back
    to the float32 tower, which would measure float32 twice)."""
    from training.inference.backend import native_bf16

    bf16 = native_bf16()
    return {n: g for n, g in GALLERIES.items() if bf16 or g[1] != "openvino-bf16"}


def build_galleries(model: Path, work: Path, galleries: dict[str, tuple[bool, str | None]]) -> dict[str, Path]:
    """The demo gallery indexed as ``make demo`` does (with the resized, recompressed copy of one photo) and as
    benchmarks/open_vocab.py does (without it), each with the image tower in float32 and, where the CPU has it, in
    bf16 (``galleries``: :func:`galleries_here`)."""
    from benchmarks.open_vocab import JOINTSPACE, build

    out = {}
    for name, (duplicate, backend) in galleries.items():
        samples = work / ("samples" if duplicate else "samples-no-duplicate")
        if not (samples / "captions.txt").exists():
            subprocess.run([*JOINTSPACE, "index", "samples", "--out", str(samples),
                            *([] if duplicate else ["--no-duplicate"])], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        out[name] = work / ("demo-" + name.replace(", ", "-").replace(" ", "-"))
        shutil.rmtree(out[name], ignore_errors=True)
        build(model=model, out=out[name], images=samples / "photos", captions=samples / "captions.txt",
              backend=backend)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "training" / "pretrained" / "flickr8k.pt"))
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "jointspace-relevance-margins"),
                    help="where the indexes are built")
    ap.add_argument("--flickr8k", help="the Flickr8k folder: also index its dev split and measure the settings there")
    args = ap.parse_args(argv)
    from benchmarks.open_vocab import JOINTSPACE
    from index import relevance
    from training.models.checkpoint import load_model

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = load_model(args.model)
    here = galleries_here()
    missing = [name for name in GALLERIES if name not in here]
    if missing:
        print(f"not measured, this CPU has no native bf16: {', '.join(missing)}", flush=True)
    galleries: dict[str, dict[str, Parts]] = {}
    swept: dict[int, dict[str, dict[str, Parts]]] = {k: {} for k in NAMED_TOPS}
    for name, index in build_galleries(Path(args.model), work, here).items():
        galleries[name], by_top = demo_parts(model, index, NAMED_TOPS)
        for k, parts in by_top.items():
            swept[k][name] = parts
        print(f"{name}: parts of {sum(len(p.rq) for p in galleries[name].values())} queries", flush=True)
    now = tuple(relevance.text_side_settings()[k] for k in SETTINGS)
    rows, summary = search(galleries, also=(now,))
    in_use, rows = rows[-1], rows[:-1]
    chosen = rows[0]
    unnamed = search(galleries, keep=1, floors=np.array([NAMED_FLOOR[-1]]))[0][0]    # the rule without the name term
    named_top = named_top_sweep(swept)
    result = {"model": args.model, "targets": {"present": PRESENT_SHARE, "absent": ABSENT_SHARE},
              "grid": {"weight": [float(WEIGHTS[0]), float(WEIGHTS[-1])],
                       "description": [float(DESCRIPTION[0]), float(DESCRIPTION[-1])],
                       "null": [float(NULL[0]), float(NULL[-1])],
                       "named_floor": [float(x) for x in NAMED_FLOOR], "named": [float(NAMED[0]), float(NAMED[-1])],
                       "named_top": relevance.NAMED_TOP, "settings": summary["settings"],
                       "meeting_targets": summary["meeting_targets"]},
              "queries": {k: len(v) for k, v in query_sets().items()},
              "not_measured": {n: "this CPU has no native bf16" for n in missing},
              "in_use": in_use, "chosen": chosen, "runners_up": rows[1:10], "without_names": unnamed,
              "named_top": named_top,
              "check_floor": summary.get("check_floor"),
              "hardware": hardware(), "date": dt.date.today().isoformat(), "commit": commit()}
    if args.flickr8k:
        dev_index = work / "dev-index"
        shutil.rmtree(dev_index, ignore_errors=True)
        subprocess.run([*JOINTSPACE, "index", "build", "--model", args.model, "--data", args.flickr8k, "--split", "val",
                        "--out", str(dev_index), "--quiet"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        dev = dev_parts(model, dev_index, args.flickr8k)
        for row in (in_use, chosen, *rows[1:4], unnamed):
            row["dev_own_photo_strong"] = round(
                100 * float((distances(dev, *(row[k] for k in SETTINGS)) >= 0).mean()), 1)
    write_json(RESULTS, result)
    print({k: result[k] for k in ("in_use", "chosen")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
