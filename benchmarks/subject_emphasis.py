"""Does stressing a text query's subject put the demo's weak captions first, and what does it cost on Flickr8k dev?
A lever for the demo's temple caption (issue 58), measured and not shipped.

The demo's "an ornate temple with a tiled roof under a blue sky" finds the brick wall first: the trained embedding
reads "a tiled roof" as the brick texture, while "an ornate temple" alone finds the temple. The lever composes the
query with its own subject, as W2VV §IV-C composes a query by adding and subtracting word embeddings:

    q = normalise(t(text) + β t(subject))

with the subject the text's words before its first preposition, auxiliary verb or relative word (:func:`subject`:
"an ornate temple", "a woman", "a cup of coffee"; a text that is all subject is left as it is). Both sides are
measured as served, for each β: the demo gallery's 20 captions (how many find their own photo first, and every
margin) on an index of `jointspace index samples`, and the Flickr8k dev captions' text → image R@1/5/10 on an index
of the dev split. Image → caption does not change: the captions are the gallery's items, not queries.

    python benchmarks/subject_emphasis.py --model training/pretrained/flickr8k.pt \
        --data ../shared/datasets/flickr8k --work /tmp/jointspace-subject

writes benchmarks/results/subject_emphasis.json and a plot beside it; docs/benchmarks.md's table comes from
benchmarks/tables.py.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from training.data.fileio import atomic_path, write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "subject_emphasis.json"
JOINTSPACE = [sys.executable, "-m", "service.cli"]
BETAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
# closed-class words that end an English caption's subject ("a man stands outside | with a camera"): prepositions
# but "of" ("a cup of coffee"), auxiliary verbs, relative and subordinating words
BOUNDARY = frozenset("""with on in under at for from into onto through near by behind beside besides over across
along around against between among beneath below above past toward towards inside outside while where as who that
which whose during after before like next atop amid amidst than via within without upon
is are was were be been being am has have had does do did can will would could should may might""".split())
_WORD = re.compile(r"[a-z0-9']+")


def subject(text: str) -> str:
    """The text's words (lower case) before its first :data:`BOUNDARY` word after the first word."""
    words = _WORD.findall(text.lower())
    end = next((i for i, w in enumerate(words) if i and w in BOUNDARY), len(words))
    return " ".join(words[:end])


def composed(full: np.ndarray, parts: np.ndarray, whole: np.ndarray, beta: float) -> np.ndarray:
    """``normalise(t(text) + β t(subject))`` per row; a row whose subject is the whole text (``whole``) is left as
    it is."""
    q = full + beta * parts * (~whole)[:, None]
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _queries(model, texts: list[str]):
    """(t(text), t(subject), whether the subject is the whole text) of ``texts``."""
    from index.embed import embed_sentences

    subjects = [subject(t) for t in texts]
    whole = np.array([len(s.split()) == len(_WORD.findall(t.lower())) for s, t in zip(subjects, texts)])
    return embed_sentences(model, texts, progress=False), embed_sentences(model, subjects, progress=False), whole


def demo_rows(model, index: Path) -> list[dict]:
    from benchmarks.open_vocab import demo_truth, name_ids, own_margin
    from index.gallery import Gallery
    from index.people import text_queries
    from index.query import ImageFilter

    truth = demo_truth()
    texts = [t for t, _ in truth]
    full, parts, whole = _queries(model, texts)
    gallery = Gallery.load(index, model=model)
    try:
        ids, rows = name_ids(gallery), []
        for beta in BETAS:
            hits = gallery.search_images(text_queries(composed(full, parts, whole, beta), texts), len(ids),
                                         flt=ImageFilter(media="photo"))
            margins = {t: round(own_margin(h, ids[photo]), 4) for h, (t, photo) in zip(hits, truth)}
            rows.append({"beta": beta, "demo_first": sum(m > 0 for m in margins.values()),
                         "demo_min_margin": min(margins.values()), "demo_margins": margins})
    finally:
        gallery.close()
    return rows


def dev_rows(model, index: Path, data: str) -> list[dict]:
    from index.gallery import Gallery
    from index.people import text_queries
    from training.data.datasets import load_dataset

    records = load_dataset(data).split("val").images
    captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
    texts, truth = [c for c, _ in captions], [pos for _, pos in captions]
    full, parts, whole = _queries(model, texts)
    gallery = Gallery.load(index, model=model)
    try:
        rows = []
        for beta in BETAS:
            found = gallery.search_images(text_queries(composed(full, parts, whole, beta), texts), len(records))
            ranks = np.array([[i for i, _ in row].index(want) + 1 for row, want in zip(found, truth)])
            rows.append({"beta": beta, "t2i": [round(100 * float(np.mean(ranks <= k)), 1) for k in (1, 5, 10)],
                         "subject_is_whole": round(100 * float(np.mean(whole)), 1)})
    finally:
        gallery.close()
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Demo margins of the two weakest captions at β = 0 and dev text → image R-sum, against β."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    betas = [r["beta"] for r in rows]
    weakest = sorted(rows[0]["demo_margins"], key=rows[0]["demo_margins"].get)[:2]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for caption in weakest:
        left.plot(betas, [r["demo_margins"][caption] for r in rows], marker="o", label=caption[:40])
    left.plot(betas, [r["demo_min_margin"] for r in rows], marker="s", linestyle="--", label="smallest margin")
    left.axhline(0.01, color="grey", linewidth=0.8)
    left.set(xlabel="β", ylabel="margin over the best other photo", title="demo captions")
    left.legend(fontsize=7)
    right.plot(betas, [sum(r["t2i"]) for r in rows], marker="o")
    right.set(xlabel="β", ylabel="text → image R@1 + R@5 + R@10", title="Flickr8k dev")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.flickr8k_levers import commit, hardware
    from training.models.checkpoint import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "training" / "pretrained" / "flickr8k.pt"))
    ap.add_argument("--data", required=True, help="the Flickr8k folder (its dev split is measured)")
    ap.add_argument("--work", required=True, help="a scratch folder (the two indexes)")
    args = ap.parse_args(argv)
    at_start, work = commit(), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model_id = hashlib.sha256(Path(args.model).read_bytes()).hexdigest()[:12]     # an index per model file
    samples, demo, dev = work / "samples", work / f"demo-{model_id}", work / f"dev-{model_id}"
    if not (samples / "captions.txt").exists():
        subprocess.run([*JOINTSPACE, "index", "samples", "--out", str(samples), "--no-duplicate"], check=True,
                       cwd=REPO, stdout=subprocess.DEVNULL)
    for out, source in ((demo, ["--images", str(samples / "photos"), "--captions", str(samples / "captions.txt")]),
                        (dev, ["--data", args.data, "--split", "val"])):
        if not out.exists():
            subprocess.run([*JOINTSPACE, "index", "build", "--model", args.model, *source, "--out", str(out),
                            "--quiet"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    model = load_model(Path(args.model))
    rows = [{**a, **b} for a, b in zip(demo_rows(model, demo), dev_rows(model, dev, args.data))]
    for r in rows:
        print(f"β {r['beta']:g}: demo {r['demo_first']} of 20 (smallest margin {r['demo_min_margin']:+.3f}); "
              f"dev text → image {r['t2i']}", flush=True)
    write_json(RESULTS, {"description": __doc__.split("\n\n")[0], "model": args.model, "rows": rows,
                         "hardware": hardware(), "date": dt.date.today().isoformat(), "commit": at_start})
    plot(rows, RESULTS.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
