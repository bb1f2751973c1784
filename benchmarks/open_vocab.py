"""Open-vocabulary search, measured: rows of ``benchmarks/results/open_vocab.json`` (rendered into
docs/benchmarks.md by benchmarks/tables.py).

    python benchmarks/open_vocab.py served --model shipped=training/pretrained/flickr8k.pt \
        --imagenet ../shared/datasets/imagenet-samples --work /tmp/ov
    python benchmarks/open_vocab.py levers --model training/pretrained/flickr8k.pt \
        --imagenet ../shared/datasets/imagenet-samples --flickr8k ../shared/datasets/flickr8k --work /tmp/ov

* ``served`` — as a user gets it: ``jointspace index build`` with its defaults (the bank the model carries,
  ``--tta flip-crop``), timed, then searched through the index (index/gallery.py, what the HTTP routes call):
  the ImageNet sample photos (one per class) against the 1,000 class sentences "a photo of a {first name}." as
  the caption corpus — image → sentence top-1/top-5 (each photo's stored vector searched in the captions; a
  sentence that reads the same as the right one counts, as two classes share a first name) and sentence → image
  R@1/R@5 — and the gallery of ``make demo``: how many of its 20 photo captions find their photo first among its
  photos (and the smallest margin of a caption's photo over the best other photo), two queries a new user types,
  and whether each of six people queries finds the astronaut or the cameraman first (and how many of
  benchmarks/data/people_queries_dev.txt and people_queries_holdout.txt do); and the share of queries
  with ``strong_match`` on their first page of 10 (index/relevance.py): on the demo, its 20 captions, its 10
  captions of things no photo shows (a dog, a beach, a skier), benchmarks/data/absent_queries_demo.txt,
  nonsense_queries.txt, absent_queries_check.txt, absent_queries_unseen.txt and absent_queries_holdout.txt; on the
  ImageNet photos, "a {name}" per class, absent_queries_imagenet.txt and the nonsense. The relevance's settings were
  chosen on the demo's captions and its first four sets of absent things and nonsense
  (benchmarks/relevance_margins.py); the unseen set took no part in choosing them, and the holdout set, written after
  they were fixed, says how they carry over to queries nothing was chosen on. Flickr8k dev as
  served is benchmarks/flickr8k_levers.py ``--through-index`` (its own results file).
* ``levers`` — the concept head's settings on arrays: each setting fitted to the model (training/fit_concepts.py) and
  ranked with QB-Norm and the person discount exactly as a built index ranks (tests/test_querybank.py and
  tests/test_people.py hold the index to these scores), on backbone features computed once under ``--work`` (the
  views of ``--tta flip-crop``, averaged, for the galleries, Flickr8k dev's too unless ``--dev-one-view``; one view
  for the training photos): ImageNet, the demo's 20 captions (which miss) and Flickr8k dev, with what each setting
  costs (the head's time per photo, the model file's size).

A row with the same name is replaced (a full ``levers`` run replaces them all). Select on dev only: the test
split is never read here.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from training.data.fileio import write_json  # noqa: E402
RESULTS = REPO / "benchmarks" / "results" / "open_vocab.json"
JOINTSPACE = [sys.executable, "-m", "service.cli"]
TEMPLATE = "a photo of a {}."            # the headline row's class sentence (issue 45)
USER_QUERIES = {"a cup of coffee": "coffee.jpg", "a rocket": "rocket.jpg"}
DATA = REPO / "benchmarks" / "data"      # development sets of queries (absent things, nonsense): selected on
PEOPLE_QUERIES = ["people", "a woman", "a man with a camera", "a person", "a man", "a smiling woman"]
PEOPLE_PHOTOS = {"astronaut.jpg", "cameraman.jpg"}     # the demo's photos of a person
# more people queries: a development set (the WordNet nouns of training/inference/person_words.py were built with its
# misses in view) and a holdout, written before those nouns were built and read only to measure them
PEOPLE_SETS = ("people_queries_dev", "people_queries_holdout")


def query_set(name: str) -> list[str]:
    """A development set of queries, one a line (benchmarks/data/{name}.txt)."""
    return [line.strip() for line in (DATA / f"{name}.txt").read_text().splitlines() if line.strip()]


def hardware() -> str:
    from benchmarks.flickr8k_levers import hardware as hw

    return hw()


def commit() -> str:
    from benchmarks.flickr8k_levers import commit as c

    return c()


def save_rows(kind: str, rows: list[dict], replace: bool = False) -> None:
    """``rows`` into the results file's list ``kind``: a row of the same name replaced; ``replace``: the whole
    list (a full run, so that no row of an earlier model or lever list is left beside it)."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    kept = [] if replace else [r for r in data.get(kind, []) if r["name"] not in {row["name"] for row in rows}]
    data[kind] = kept + rows
    write_json(RESULTS, data)


def demo_truth() -> list[tuple[str, str]]:
    """The demo corpus's 20 photo captions, each with its photo's file name (index/samples.py writes the captions
    of each photo in the order of SAMPLES: two for each of the first six photos, then one)."""
    from index.samples import CAPTIONS, SAMPLES

    lines = CAPTIONS.splitlines()[:20]
    owners = [s.name for s in SAMPLES[:6] for _ in range(2)] + [s.name for s in SAMPLES[6:]]
    if len(owners) != len(lines):
        raise ValueError("the demo's captions and photos no longer pair up as demo_truth reads them")
    return list(zip(lines, owners))


def demo_absent() -> list[str]:
    """The demo corpus's 10 other captions: things none of its photos shows (a dog, a beach, a skier, ...)."""
    from index.samples import CAPTIONS

    return CAPTIONS.splitlines()[20:]


def imagenet_classes(root: Path) -> list[tuple[str, str]]:
    """(file, first class name) per photo, in classes.tsv's order."""
    rows = (root / "classes.tsv").read_text().splitlines()[1:]
    return [(line.split("\t")[0], line.split("\t")[3].split(",")[0].strip()) for line in rows]


def build(model: Path, out: Path, images: Path, captions: Path, backend: str | None = None) -> float:
    """``jointspace index build`` with its defaults (``backend``: the image tower's, else ``auto``); seconds."""
    start = time.perf_counter()
    extra = ["--backend", backend] if backend else []
    subprocess.run([*JOINTSPACE, "index", "build", "--model", str(model), "--images", str(images), "--captions",
                    str(captions), "--out", str(out), *extra], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def class_indices(root: Path) -> list[int]:
    """Each photo's ImageNet-1k class index, in classes.tsv's order."""
    return [int(line.split("\t")[1]) for line in (root / "classes.tsv").read_text().splitlines()[1:]]


def sentence_ranks(model, gallery, sentences: list[str], truth_ids: np.ndarray) -> list[int]:
    """The 1-based rank of each sentence's own photo among its first 5 hits (99: not among them)."""
    from index.embed import embed_text_queries

    ranks = []
    for hits, want in zip(gallery.search_images(embed_text_queries(model, sentences, progress=False), 5), truth_ids):
        ranked = [i for i, _ in hits]
        ranks.append(ranked.index(int(want)) + 1 if int(want) in ranked else 99)
    return ranks


def name_ids(gallery) -> dict[str, int]:
    return {Path(row.path).name: row.id for row in gallery.meta.all_images()}


def served(args) -> int:
    from index.embed import embed_text_queries
    from index.gallery import Gallery
    from index.query import ImageFilter
    from index.relevance import text_side_settings
    from training.models.checkpoint import load_model
    from training.models.concepts import class_names

    clean_names = class_names("clean")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    samples = work / "samples"
    if not (samples / "captions.txt").exists():
        subprocess.run([*JOINTSPACE, "index", "samples", "--out", str(samples), "--no-duplicate"], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
    root = Path(args.imagenet)
    classes = imagenet_classes(root)
    sentences = [TEMPLATE.format(name) for _, name in classes]
    corpus = work / "imagenet_sentences.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    rows = []
    for spec in args.model:
        name, _, path = spec.rpartition("=")
        name, path = name or Path(path).stem, Path(path)
        model = load_model(path)
        row: dict = {"name": name, "model": str(path), "model_mb": round(path.stat().st_size / 1e6, 1),
                     "backend": args.backend or "auto", "relevance": text_side_settings()}
        # the demo gallery
        demo_index = work / f"demo-{name}"
        build(model=path, out=demo_index, images=samples / "photos", captions=samples / "captions.txt",
              backend=args.backend)
        gallery = Gallery.load(demo_index, model=model)
        try:
            ids, photos = name_ids(gallery), ImageFilter(media="photo")
            truth = demo_truth()
            queries = embed_text_queries(model, [t for t, _ in truth] + list(USER_QUERIES), progress=False)
            hits = gallery.search_images(queries, len(ids), flt=photos)
            strong = [r.strong_match for r in gallery.ranked("images", queries, [h[:10] for h in hits])]
            row["strong_present"] = None if None in strong else int(sum(bool(x) for x in strong[:len(truth)]))
            row["strong_absent"] = strong_count(model, gallery, demo_absent(), photos)
            row["strong_demo"] = {name: strong_count(model, gallery, query_set(name), photos)
                                  for name in ("absent_queries_demo", "nonsense_queries", "absent_queries_check",
                                               "absent_queries_unseen", "absent_queries_holdout")}
            found = [bool(h) and h[0][0] == ids[photo] for h, (_, photo) in zip(hits, truth)]
            row["demo_first"] = int(sum(found))
            row["demo_missed"] = [t for ok, (t, _) in zip(found, truth) if not ok]
            margins = {t: round(own_margin(h, ids[photo]), 4) for h, (t, photo) in zip(hits, truth)}
            row["demo_min_margin"], row["demo_margins"] = min(margins.values()), margins
            named = {i: n for n, i in ids.items()}
            row["people_first"] = dict(zip(PEOPLE_QUERIES, person_first(model, gallery, PEOPLE_QUERIES, named, photos)))
            row["people_found"] = int(sum(row["people_first"].values()))
            row["people_sets"] = {name: [int(sum(first)), len(first)] for name in PEOPLE_SETS
                                  for first in [person_first(model, gallery, query_set(name), named, photos)]}
            row["user_queries"] = {q: bool(h) and h[0][0] == ids[photo]
                                   for h, (q, photo) in zip(hits[len(truth):], USER_QUERIES.items())}
        finally:
            gallery.close()
        # ImageNet samples
        inet_index = work / f"imagenet-{name}"
        seconds = build(model=path, out=inet_index, images=root / "images", captions=corpus, backend=args.backend)
        row["index_s_per_photo"] = round(seconds / len(classes), 3)
        gallery = Gallery.load(inet_index, model=model)
        try:
            ids = name_ids(gallery)
            truth_ids = np.array([ids[f] for f, _ in classes])
            texts = {c.id: c.text for c in gallery.meta.captions(gallery.meta.caption_ids()).values()}
            vectors = np.stack([gallery.image_vector(int(i)) for i in truth_ids])
            i2t = []
            for hits, sentence in zip(gallery.search_captions(vectors, 5), sentences):
                ranked = [texts[c] for c, _ in hits]
                i2t.append(ranked.index(sentence) + 1 if sentence in ranked else 99)
            t2i = sentence_ranks(model, gallery, sentences, truth_ids)
            # the same classes in the words of the imagenet-classes package's curated names ("tea cup" for "cup")
            clean = [clean_names[int(c)] for c in class_indices(root)]
            t2i_clean = sentence_ranks(model, gallery, [TEMPLATE.format(n) for n in clean], truth_ids)
            row["strong_imagenet"] = {
                "present": strong_count(model, gallery, [f"a {name}" for _, name in classes]),
                "present_clean_names": strong_count(model, gallery, [f"a {name}" for name in clean]),
                **{name: strong_count(model, gallery, query_set(name))
                   for name in ("absent_queries_imagenet", "nonsense_queries")}}
        finally:
            gallery.close()
        i2t_a, t2i_a = np.array(i2t), np.array(t2i)
        row.update({"imagenet_i2t_top1": round(100 * float(np.mean(i2t_a <= 1)), 1),
                    "imagenet_i2t_top5": round(100 * float(np.mean(i2t_a <= 5)), 1),
                    "imagenet_t2i_r1": round(100 * float(np.mean(t2i_a <= 1)), 1),
                    "imagenet_t2i_r5": round(100 * float(np.mean(t2i_a <= 5)), 1),
                    "imagenet_t2i_clean_r1": round(100 * float(np.mean(np.array(t2i_clean) <= 1)), 1),
                    "imagenet_t2i_clean_r5": round(100 * float(np.mean(np.array(t2i_clean) <= 5)), 1),
                    "hardware": hardware(), "date": dt.date.today().isoformat(), "commit": commit()})
        print(json.dumps(row), flush=True)
        rows.append(row)
    save_rows("served", rows)
    return 0


def strong_count(model, gallery, texts: list[str], flt=None) -> list[int] | None:
    """``[queries with a strong match on their first page of 10, queries]`` (None: the index has no relevance)."""
    from index.embed import embed_text_queries

    queries = embed_text_queries(model, texts, progress=False)
    strong = [r.strong_match for r in gallery.ranked("images", queries, gallery.search_images(queries, 10, flt=flt))]
    return None if None in strong else [int(sum(bool(x) for x in strong)), len(texts)]


def person_first(model, gallery, texts: list[str], named: dict[int, str], flt) -> list[bool]:
    """Per query of ``texts``: whether its first photo is a person's (astronaut or cameraman; ``named``: each
    photo's file name by id)."""
    from index.embed import embed_text_queries

    hits = gallery.search_images(embed_text_queries(model, texts, progress=False), 1, flt=flt)
    return [bool(h) and named[h[0][0]] in PEOPLE_PHOTOS for h in hits]


def own_margin(hits: list[tuple[int, float]], want: int) -> float:
    """The score of ``want`` minus the best other score in ``hits`` (every photo of the gallery, best first):
    above 0 when it is first."""
    own = next(s for i, s in hits if i == want)
    return own - max(s for i, s in hits if i != want)


# --- levers, on arrays ---------------------------------------------------------------------------------------

def features(model, name: str, paths: list, work: Path, tta: bool) -> np.ndarray:
    """Pooled backbone features of ``paths`` (the flip-crop views averaged when ``tta``), cached under ``work``."""
    import torch
    from torch.utils.data import DataLoader

    from training.data.features import ImageFiles
    from training.data.preprocess import ZOOM, MirroredViews

    out = work / f"features-{name}.npy"
    if out.exists():
        return np.load(out)
    pre = MirroredViews(model.preprocess, zoom=ZOOM) if tta else model.preprocess
    rows = []
    with torch.no_grad():
        for _, pixels in DataLoader(ImageFiles(paths, pre), batch_size=16, num_workers=1):
            rows.append(model.image_features(pre.normalize(pixels)).float().numpy())
    feats = np.concatenate(rows)
    np.save(out, feats)
    return feats


def ranks(scores, truth):
    """0-based rank of each query's true item (ties counted in the query's favour)."""
    return (scores > scores.gather(1, truth[:, None])).sum(1)


class Arrays:
    """Everything a lever's rows need that no lever changes: features, caption embeddings, truths."""

    def __init__(self, base, args):
        import torch

        from training.models.concepts import class_names, class_sentences
        from training.data.datasets import load_dataset
        from training.data.features import Compute, extract_features
        from training.inference.embedding import embed_texts
        from training.inference.person_words import names_person
        from training.inference.querybank import sample, sample_indices

        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        data = load_dataset(args.flickr8k)
        dev, train = data.split("val"), data.split("train")
        classes = imagenet_classes(Path(args.imagenet))
        samples = work / "samples"
        if not (samples / "captions.txt").exists():
            subprocess.run([*JOINTSPACE, "index", "samples", "--out", str(samples), "--no-duplicate"], check=True, cwd=REPO,
                           stdout=subprocess.DEVNULL)
        photos = sorted((samples / "photos").glob("*.jpg"))
        truth = demo_truth()
        section = base.cfg.querybank
        bank_captions, _ = sample(train, section.captions, 0, seed=base.cfg.train.seed)
        self.bank_images = sample_indices(len(train.images), section.images, base.cfg.train.seed + 1)

        def texts(key: str, lines: list[str]):
            path = work / f"text-{key}.npy"
            if not path.exists():
                np.save(path, embed_texts(base, lines).float().cpu().numpy())
            return torch.from_numpy(np.load(path))

        names = class_names()
        said = {"dev": [c for r in dev.images for c in r.captions],
                "classes": [TEMPLATE.format(n) for _, n in classes], "demo": [t for t, _ in truth],
                "people": PEOPLE_QUERIES}
        self.text = {**{key: texts(key, lines) for key, lines in said.items()},
                     "bank": texts("bank", bank_captions),
                     "bank_classes": texts("bank_classes", class_sentences(names, "a {}"))}
        # P(q) of each text query (index/people.py): 1 where it names a person
        self.names_person = {key: torch.tensor([float(names_person(t)) for t in lines]) for key, lines in said.items()}
        self.demo_photos = [p.name for p in photos]
        self.train_captions = [r.captions for r in train.images]
        self.features = {
            "train": torch.from_numpy(np.array(extract_features(base, [r.path for r in train.images],
                                                             compute=Compute(workers=1)))),
            "dev": torch.from_numpy(features(base, "dev" if args.dev_tta else "dev-one-view",
                                             [r.path for r in dev.images], work, tta=args.dev_tta)),
            "imagenet": torch.from_numpy(features(base, "imagenet", [Path(args.imagenet) / "images" / f
                                                                      for f, _ in classes], work, tta=True)),
            "demo": torch.from_numpy(features(base, "demo", photos, work, tta=True))}
        self.dev_owner = torch.tensor([i for i, r in enumerate(dev.images) for _ in r.captions])
        self.demo_owner = torch.tensor([[p.name for p in photos].index(photo) for _, photo in truth])
        self.demo_captions = [t for t, _ in truth]


def lever_metrics(model, arrays: Arrays, bank: str) -> dict:
    """``bank``: ``none`` (raw cosine), ``captions`` (the bank's training captions and images), ``classes`` (and a
    sentence per ImageNet class among its captions), ``dynamic-K`` (the bank's captions and images through the
    dynamic inverted softmax, training/inference/querybank.py: a gallery item is a hub when it is among the K nearest
    of some bank query, and only a query whose nearest item is a hub is corrected)."""
    import torch

    from training.inference.querybank import activation_set, dynamic_scores, item_offsets

    with torch.no_grad():
        emb = {k: model.embed_features(v.float()).float() for k, v in arrays.features.items() if k != "train"}
        # the person discount, as the index folds it in (index/people.py): λ · a(x) off a text query naming a person
        lam = model.cfg.concepts.person_discount if model.concepts is not None else 0.0
        unlike = {k: lam * model.unfamiliarity(v.float()).float() for k, v in arrays.features.items() if k != "train"}
        bank_img = model.embed_features(arrays.features["train"][arrays.bank_images].float()).float()
        start = time.perf_counter()
        model.embed_features(arrays.features["imagenet"].float())
        head_ms = 1000 * (time.perf_counter() - start) / len(arrays.features["imagenet"])
    bank_cap = torch.cat([arrays.text["bank"], arrays.text["bank_classes"]]) if bank == "classes" else \
        arrays.text["bank"]
    beta = 20.0

    def corrected(queries, items, bank_vectors):
        """The (Q, N) scores of ``queries`` against ``items`` under the lever's correction."""
        raw = queries @ items.t()
        if bank == "none":
            return raw
        if bank.startswith("dynamic-"):
            hubs = activation_set(bank_vectors, items, int(bank.split("-")[1]))
            return dynamic_scores(raw, item_offsets(bank_vectors, items, beta), hubs)
        return raw - item_offsets(bank_vectors, items, beta)[None]

    def searched(texts: str, photos: str):
        """The (Q, N) scores of the text queries ``texts`` on the photos ``photos`` (keys of the arrays), as an
        image index scores them: corrected, then the person discount."""
        scores = corrected(arrays.text[texts], emb[photos], bank_cap)
        return scores - arrays.names_person[texts][:, None] * unlike[photos][None]

    out: dict = {"head_ms_per_photo": round(head_ms, 3)}
    dev_t2i = ranks(searched("dev", "dev"), arrays.dev_owner)
    s = corrected(emb["dev"], arrays.text["dev"], bank_img)
    own = torch.where(arrays.dev_owner[None] == torch.arange(len(s))[:, None], s, torch.tensor(float("-inf")))
    dev_i2t = (s > own.max(1).values[:, None]).sum(1)
    recall = [round(100 * float((r < k).float().mean()), 1) for r in (dev_i2t, dev_t2i) for k in (1, 5, 10)]
    out["dev_i2t"], out["dev_t2i"], out["dev_rsum"] = recall[:3], recall[3:], round(sum(recall), 1)
    n = len(emb["imagenet"])
    classes = arrays.text["classes"]
    s = corrected(emb["imagenet"], classes, bank_img)
    r = ranks(s, torch.arange(n))
    out["imagenet_i2t_top1"], out["imagenet_i2t_top5"] = (round(100 * float((r < k).float().mean()), 1)
                                                          for k in (1, 5))
    r = ranks(searched("classes", "imagenet"), torch.arange(n))
    out["imagenet_t2i_r1"], out["imagenet_t2i_r5"] = (round(100 * float((r < k).float().mean()), 1) for k in (1, 5))
    demo = searched("demo", "demo")
    out["demo_first"] = int((ranks(demo, arrays.demo_owner) == 0).sum())
    own = demo.gather(1, arrays.demo_owner[:, None])[:, 0]
    others = demo.scatter(1, arrays.demo_owner[:, None], float("-inf")).max(1).values
    out["demo_min_margin"] = round(float((own - others).min()), 4)
    out["demo_missed"] = [t for t, m in zip(arrays.demo_captions, (own - others).tolist()) if m <= 0]
    best = searched("people", "demo").argmax(1)
    out["people_found"] = int(sum(arrays.demo_photos[int(i)] in PEOPLE_PHOTOS for i in best))
    return out


FIXED = {"quantile": 0.999999, "temperature": 1e6,   # r₀ above every photo, τ huge: σ(·) = 0.5 for all,
         "confidence_floor": 1.0, "familiar_weight": None}  # and neither the COSMO term nor the split gate
TYPICALITY = {"confidence_floor": 1.0, "familiar_weight": None}   # the typicality gate alone, for every photo
LEVERS: list[tuple[str, str | None, dict | None, str]] = [
    # name, what it is (None: the model's own settings, in words), concepts overrides of the model's own config
    # (None: no concept head), the query bank (lever_metrics)
    ("no concepts, no correction", "the model without a concept head, raw cosine scores", None, "none"),
    ("no concepts", "the model without a concept head, its bank as trained", None, "captions"),
    ("no concepts, class sentences in the bank", "the bank's captions plus 'a {name}' per class", None, "classes"),
    ("shipped", None, {}, "captions"),
    ("shipped, no correction", "raw cosine scores", {}, "none"),
    ("shipped, class sentences in the bank", "the bank's captions plus 'a {name}' per class",
     {"bank_template": "a {}"}, "classes"),
    ("shipped, dynamic inverted softmax", "the bank through DIS (Balance Act): hubs = the nearest item of some "
     "bank query", {}, "dynamic-1"),
    ("shipped, dynamic inverted softmax, k 3", "hubs = among the 3 nearest items of some bank query", {},
     "dynamic-3"),
    ("one COSMO gate", "no split: w 1.25 and the COSMO term for every photo", {"familiar_weight": None}, "captions"),
    ("typicality gate alone, w 0.75", "no COSMO term, no split (the first head)", {**TYPICALITY, "weight": 0.75},
     "captions"),
    ("typicality gate alone, w 1.25", "", {**TYPICALITY}, "captions"),
    ("fixed 0.25", "no gate: every photo gets 0.25 c(x)", {**FIXED, "weight": 0.5}, "captions"),
    ("fixed 0.5", "no gate: every photo gets 0.5 c(x)", {**FIXED, "weight": 1.0}, "captions"),
    ("plain ConSE probabilities", "class temperature 1", {"class_temperature": 1.0}, "captions"),
    ("class temperature 1.5", "", {"class_temperature": 1.5}, "captions"),
    ("class temperature 2.5", "", {"class_temperature": 2.5}, "captions"),
    ("top 1", "", {"top_k": 1}, "captions"),
    ("top 3", "", {"top_k": 3}, "captions"),
    ("top 8", "", {"top_k": 8}, "captions"),
    ("w 1.0", "", {"weight": 1.0}, "captions"),
    ("w 1.5", "", {"weight": 1.5}, "captions"),
    ("f 0.35", "", {"confidence_floor": 0.35}, "captions"),
    ("f 0.6", "", {"confidence_floor": 0.6}, "captions"),
    ("kappa0 0.25", "", {"confidence_at": 0.25}, "captions"),
    ("kappa0 0.35", "", {"confidence_at": 0.35}, "captions"),
    ("w_f 0.6", "", {"familiar_weight": 0.6}, "captions"),
    ("w_f 0.9", "", {"familiar_weight": 0.9}, "captions"),
    ("split at 20 %", "", {"familiar_split": 0.2}, "captions"),
    ("split at 40 %", "", {"familiar_split": 0.4}, "captions"),
    ("r0 at 5 %", "", {"quantile": 0.05}, "captions"),
    ("r0 at 20 %", "", {"quantile": 0.2}, "captions"),
    ("tau 0.5 x spread", "", {"temperature": 0.5}, "captions"),
    ("tau 2.0 x spread", "", {"temperature": 2.0}, "captions"),
    ("2 templates", "'a photo of a {}.' and 'a {}' averaged", {"templates": ["a photo of a {}.", "a {}"]},
     "captions"),
    ("3 templates", "'a photo of a {}.', 'a {}', 'a close-up photo of a {}.' averaged",
     {"templates": ["a photo of a {}.", "a {}", "a close-up photo of a {}."]}, "captions"),
    ("'a {}'", "the class sentence 'a {}' alone", {"templates": ["a {}"]}, "captions"),
    ("people", "and the person sentence for a photo the trained embedding sees a person in (w_p 0.25)",
     {"people_weight": 0.25}, "captions"),
]


def own_settings(cfg) -> str:
    """The concept head's settings of a model config, in words (the row whose overrides are none)."""
    c = cfg.concepts
    words = f"ConSE top {c.top_k} at class temperature {c.class_temperature:g}; w {c.weight:g}"
    if c.confidence_floor < 1:
        words += f" with the COSMO term (f {c.confidence_floor:g}, alpha {c.confidence:g}, kappa0 {c.confidence_at:g})"
    if c.familiar_weight is not None:
        words += (f" for photos unlike the training photos, the typicality gate at w {c.familiar_weight:g} for the "
                  f"others (split at t's {100 * c.familiar_split:g} %)")
    return words + f"; r0 at the {100 * c.quantile:g} % quantile, tau {c.temperature:g} x spread"


def without_concepts(model):
    """``model`` without its concept head (every other tensor as it was): the levers' base, fitted one per lever."""
    from training.models.config_schema import complete
    from training.models.model import build_model

    if model.concepts is None:
        return model
    config = model.cfg.model_dump()
    config["concepts"] = {**config["concepts"], "enabled": False, "people_weight": 0.0}
    plain = build_model(complete(config), model.vocab, load_weights=True)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("concepts.")})
    plain.extra = {k: v for k, v in (model.extra or {}).items() if k != "concepts"}
    return plain.eval()


def levers(args) -> int:
    from training.fit_concepts import fit, with_concepts
    from training.models.checkpoint import load_model

    base = without_concepts(load_model(args.model))
    arrays = Arrays(base, args)
    rows = []
    for name, what, overrides, bank in LEVERS:
        if args.only and name not in args.only:
            continue
        model = base
        if overrides is not None:
            model = with_concepts(base, overrides)
            fit(model, arrays.features["train"].numpy(), log=lambda *_: None, captions=arrays.train_captions)
        size = None
        with tempfile.TemporaryDirectory() as tmp:
            if overrides is not None:
                from training.models.checkpoint import save_slim

                save_slim(model, Path(tmp) / "m.pt", half=True)
                size = round((Path(tmp) / "m.pt").stat().st_size / 1e6, 1)
        what = own_settings(base.cfg) if what is None else what or json.dumps(overrides)
        row = {"name": name, "lever": what, **lever_metrics(model, arrays, bank),
               "dev_views": "flip-crop" if args.dev_tta else "one",
               "model_mb_half": size, "hardware": hardware(), "date": dt.date.today().isoformat(),
               "commit": commit()}
        print(json.dumps(row), flush=True)
        rows.append(row)
    save_rows("levers", rows, replace=not args.only)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("served", help="index build with its defaults, then searches through the index")
    s.add_argument("--model", action="append", required=True, metavar="[NAME=]PATH", help="a model.pt (repeatable)")
    s.add_argument("--imagenet", required=True, help="the ImageNet sample photos' folder (classes.tsv, images/)")
    s.add_argument("--work", required=True, help="a scratch folder (indexes, the sample photos)")
    s.add_argument("--backend", help="the image tower's backend for index build (e.g. openvino-bf16; default auto)")
    s.set_defaults(func=served)
    lv = sub.add_parser("levers", help="the concept head's settings on arrays")
    lv.add_argument("--model", required=True, help="a model.pt without a concept head")
    lv.add_argument("--imagenet", required=True)
    lv.add_argument("--flickr8k", required=True)
    lv.add_argument("--work", required=True, help="a scratch folder (features, caption embeddings)")
    lv.add_argument("--only", action="append", help="only the lever of this name (repeatable)")
    lv.add_argument("--dev-one-view", dest="dev_tta", action="store_false",
                    help="Flickr8k dev's photos in one view (a quarter of the feature time), not flip-crop's four")
    lv.set_defaults(func=levers)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
