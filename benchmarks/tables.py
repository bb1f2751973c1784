"""The docs' tables of numbers, rendered from the result files in benchmarks/results/.

    python benchmarks/tables.py            # rewrite every table in README.md and docs/*.md in place
    python benchmarks/tables.py --check    # exit 1, naming each table that differs from what its data gives

A table lives in a Markdown file between two marker comments (benchmarks/doc_blocks.py),

    <!-- table:NAME -->
    ...generated text...
    <!-- /table:NAME -->

and NAME is a key of TABLES: the function that renders it and the data file it reads. A result says its
hardware, date and commit: from the row, else from the file's top-level keys, else "unknown"; when every row of
a table shares them they follow the table as one line, otherwise they are a column. The check also names a
marker that neither TABLES nor benchmarks/config_reference.py (the config reference) owns.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import config_reference  # noqa: E402
from benchmarks.doc_blocks import rewrite  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROVENANCE = ("hardware", "date", "commit")


# ------------------------------------------------------------------ data


def current_commit() -> str:
    """The checkout's short commit, for a results file's provenance ("" outside a git checkout)."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def provenance(row: dict, data: dict, file: str | None = None) -> tuple[str, str, str]:
    """(hardware, date, commit) of a row: the row's own keys, else the file's, else provenance.json's."""
    side: dict = {}
    if file is not None and (RESULTS / "provenance.json").exists():
        side = next((r for r in load("provenance.json")["rows"] if r["file"] == file), {})
    out = []
    for key in PROVENANCE:
        value = row.get(key) or data.get(key) or side.get(key)
        out.append(str(value) if value else f"{key} unknown")
    return tuple(out)  # type: ignore[return-value]


# ------------------------------------------------------------------ formatting


def f(x: Any, digits: int = 1) -> str:
    """a number with `digits` decimals; None as an em dash; strings as they are."""
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    return f"{x:.{digits}f}"


def join(values: list | None, digits: int = 1) -> str:
    if values is None:
        return "—"
    return " / ".join(f(v, digits) for v in values)


def md_table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    rule = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def with_provenance(headers: list[str], cells: list[list[str]], rows: list[dict], data: dict,
                    file: str | None = None, column: bool = False, right: set[int] = frozenset()) -> str:
    """The table, and its hardware/date/commit: one line after it when all rows share them, else a column."""
    prov = [provenance(r, data, file) for r in rows]
    if not rows:
        return md_table(headers, [["no rows yet"] + [""] * (len(headers) - 1)], right)
    if column or len(set(prov)) > 1:
        headers = headers + ["hardware, date, commit"]
        cells = [c + ["; ".join(p)] for c, p in zip(cells, prov)]
        return md_table(headers, cells, right)
    hw, date, commit = prov[0]
    return md_table(headers, cells, right) + f"\n\nHardware: {hw}; date: {date}; commit: {commit}."


# ------------------------------------------------------------------ tables

RECALL_HEADERS = ["i2t R@1 / R@5 / R@10", "t2i R@1 / R@5 / R@10", "R-sum"]
SCORE_HEADERS = ["captioning B1 / B2 / B3 / B4 / METEOR / CIDEr",
                 "paraphrasing B1 / B2 / B3 / B4 / METEOR / CIDEr"]


def recall_cells(r: dict) -> list[str]:
    return [join(r["i2t"]), join(r.get("t2i")), f(r["rsum"])]


def t_flickr8k_dev() -> str:
    data = load("flickr8k_dev.json")
    headers = ["name", "lever", "i2t R@1/5/10", "t2i R@1/5/10", "R-sum", "wall (min)", "peak (GiB)"]
    cells = [[r["name"], r["lever"], join(r["i2t"]), join(r["t2i"]), f(r["rsum"]), f(r.get("wall_min")),
              f(r.get("peak_gib"))] for r in data["rows"]]
    if not data["rows"]:
        headers = headers + ["hardware, date, commit"]
    return with_provenance(headers, cells, data["rows"], data, column=True)


def t_flickr8k_seeds() -> str:
    """The shipped recipe and the XBM lever over seeds, and the decision of the rule written before the runs
    (flickr8k_seeds.json, benchmarks/flickr8k_seeds.py)."""
    data = load("flickr8k_seeds.json")
    rows = sorted(data["rows"], key=lambda r: (r["recipe"], r["seed"]))
    headers = ["recipe", "seed", "R-sum (raw)", "QB i2t R@1/5/10", "QB t2i R@1/5/10", "R-sum (QB)", "best epoch",
               "wall (min)", "peak (GiB)"]
    cells = [[r["recipe"], str(r["seed"]), f(r["rsum"]), join(r["i2t_qb"]), join(r["t2i_qb"]), f(r["rsum_qb"]),
              f(r.get("best_epoch"), 0), f(r["wall_min"]), f(r["peak_gib"], 2)] for r in rows]
    table = with_provenance(headers, cells, rows, data, column=True)
    decision = data.get("decision")
    if not decision:
        return table
    lines = []
    for name, st in decision["stats"].items():
        if st["mean_qb"] is not None:
            sd = f" ± {f(st['sd_qb'], 2)}" if st["sd_qb"] is not None else ""
            raw_sd = f" ± {f(st['sd_raw'], 2)}" if st["sd_raw"] is not None else ""
            lines.append(f"- {name}, seeds {', '.join(map(str, st['seeds']))}: R-sum (QB) {f(st['mean_qb'], 2)}{sd}; "
                         f"raw {f(st['mean_raw'], 2)}{raw_sd} (mean ± sample sd)")
    for e in data.get("stopped", []):
        lines.append(f"- Stopped: {e['recipe']} seed {e['seed']} ({', '.join(e['sets'])}; {e['date']}, {e['commit']}):"
                     f" dev R-sum by epoch {', '.join(f(v) for v in e['val_rsum_by_epoch'])}; loss by epoch "
                     f"{', '.join(f(v) for v in e['loss_by_epoch'])}; {e['reason']}.")
    ship = decision.get("ship")
    lines.append(f"- Decision: {decision['reason']}"
                 + (f" → {decision['recipe']}, seed {ship['seed']} (R-sum (QB) {f(ship['rsum_qb'])})." if ship else "."))
    return table + "\n\n" + "\n".join(lines)


def t_weight_average() -> str:
    """The shipped recipe's run with train.ema: the raw weights and the averages, epoch by epoch and at their best
    checkpoints (weight_average.json, benchmarks/weight_average.py)."""
    data = load("weight_average.json")
    rows = data["rows"]
    headers = ["weights", "dev R-sum by epoch", "best epoch", "R-sum (raw)", "QB i2t R@1/5/10", "QB t2i R@1/5/10",
               "R-sum (QB)"]
    names = {"raw": "raw (the recipe as shipped)"}
    cells = []
    for r in rows:
        name = names.get(r["variant"], f"average, train.ema {r['variant'].removeprefix('ema')}")
        curve = ", ".join(f(v) for v in r["val_rsum_by_epoch"])
        if "same_as" in r:
            same = names.get(r["same_as"], f"train.ema {r['same_as'].removeprefix('ema')}")
            cells.append([name, curve, f"the same weights as {same}", "", "", "", ""])
        else:
            cells.append([name, curve, f(r.get("best_epoch"), 0), f(r["rsum"]), join(r["i2t_qb"]), join(r["t2i_qb"]),
                          f(r["rsum_qb"])])
    return (with_provenance(headers, cells, rows, data)
            + f" Wall time of the run, with four validations an epoch: {f(data['wall_min'])} min.")


def t_model_card() -> str:
    """The shipped model's row of flickr8k_dev.json (docs/model-card.md)."""
    data = load("flickr8k_dev.json")
    rows = [r for r in data["rows"] if r["name"] == "flickr8k (shipped)"]
    headers = ["i2t R@1/5/10", "t2i R@1/5/10", "R-sum", "training wall (min)", "peak (GiB)"]
    cells = [[join(r["i2t"]), join(r["t2i"]), f(r["rsum"]), f(r.get("wall_min")), f(r.get("peak_gib"))]
             for r in rows]
    return with_provenance(headers, cells, rows, data, column=True)


def t_querybank_sweep() -> str:
    """Flickr8k dev under the bank sizes and test-time augmentation (querybank_dev.json, sweep)."""
    data = load("querybank_dev.json")
    rows = [r for r in data.get("sweep", []) if r["tta"] == "none"]
    tta = {(r["tta"], r["bank_captions"], r["bank_images"]): r for r in data.get("sweep", [])}
    headers = ["bank captions", "bank images", "i2t R@1/5/10", "t2i R@1/5/10", "R-sum", "R-sum, --tta flip",
               "R-sum, --tta flip-crop"]
    cells = [[f"{r['bank_captions']:,}", f"{r['bank_images']:,}", join(r["i2t"]), join(r["t2i"]), f(r["rsum"]),
              *(f(tta.get((mode, r["bank_captions"], r["bank_images"]), {}).get("rsum"))
                for mode in ("flip", "flip-crop"))] for r in rows]
    return with_provenance(headers, cells, rows, data, right={0, 1})


def t_querybank_unseen() -> str:
    """Galleries the shipped model never saw, through index build with and without its bank."""
    data = load("querybank_dev.json")
    rows = data.get("unseen", [])
    headers = ["gallery", "index build", "i2t R@1/5/10", "t2i R@1/5/10", "R-sum"]
    cells = [[r["gallery"], r["build"], join(r["i2t"]), join(r["t2i"]), f(r["rsum"])] for r in rows]
    return with_provenance(headers, cells, rows, data)


def t_querybank_timing() -> str:
    """Seconds to embed the bank's captions, and gallery images with and without test-time augmentation."""
    data = load("querybank_dev.json")
    rows = data.get("timing", [])
    headers = ["what", "how many", "seconds", "ms per image"]
    cells = [[r["what"], f"{r['n']:,}", f(r["seconds"]), f(r.get("per_image_ms"), 0)] for r in rows]
    return with_provenance(headers, cells, rows, data, right={1, 2, 3})


def t_open_vocab_served() -> str:
    """Open-vocabulary search as served by default (benchmarks/open_vocab.py served)."""
    data = load("open_vocab.json")
    rows = data.get("served", [])

    def share(pair) -> str:                    # [strong, queries] (older rows: a count of 10)
        if pair is None:
            return "–"
        return f"{pair[0]} of {pair[1]}" if isinstance(pair, list) else f"{pair} of 10"

    from index.relevance import text_side_settings

    now = text_side_settings()

    def settings(r) -> str:     # a row counted under other relevance settings than index/relevance.py's says so
        then = r.get("relevance")
        if then is None or then == now:
            return ""
        names = (f", T₀ {then['named_floor']:g}, A₀ {then['named']:g}" if "named" in then else ", without the name term")
        return f" (λ {then['weight']:g}, M₀ {then['description']:g}, N₀ {then['null']:g}{names})"

    def strong(r) -> str:
        demo = r.get("strong_demo") or {}
        parts = [f"{f(r.get('strong_present'), 0)} of 20", share(r.get("strong_absent"))]
        if demo:
            parts += [share(demo.get(k)) for k in ("absent_queries_demo", "nonsense_queries", "absent_queries_check",
                                                   "absent_queries_unseen", "absent_queries_holdout")]
        return " / ".join(parts) + settings(r)

    def imagenet_strong(r) -> str:
        d = r.get("strong_imagenet")
        clean = f" (curated names: {share(d['present_clean_names'])})" if d and "present_clean_names" in d else ""
        return "–" if not d else " / ".join(
            share(d.get(k)) for k in ("present", "absent_queries_imagenet", "nonsense_queries")) + clean + settings(r)

    def demo_margins(r) -> str:             # the smallest margin; the two smallest where each caption's is kept
        if "demo_margins" in r:
            kept = sorted(r["demo_margins"].values())[:2]
        else:
            kept = [r["demo_min_margin"]] if "demo_min_margin" in r else []
        return f" ({', '.join(f'{m:+.3f}' for m in kept)})" if kept else ""

    def sentence_to_photo(r) -> str:        # and with the classes' curated names, where measured
        clean = (f"; curated names {f(r['imagenet_t2i_clean_r1'])} / {f(r['imagenet_t2i_clean_r5'])}"
                 if "imagenet_t2i_clean_r1" in r else "")
        return f"{f(r['imagenet_t2i_r1'])} / {f(r['imagenet_t2i_r5'])}{clean}"

    def people(r) -> str:                   # the six, then the development and holdout sets where measured
        d = r.get("people_first")
        more = r.get("people_sets", {})
        sets = " / ".join(f"{a} of {b}" for a, b in (more[k] for k in ("people_queries_dev", "people_queries_holdout")
                                                       if k in more))
        return "–" if d is None else f"{sum(bool(v) for v in d.values())} of {len(d)}" + (f" / {sets}" if sets else "")

    headers = ["model", "backend", "ImageNet photo → sentence top-1 / top-5", "sentence → photo R@1 / R@5",
               "demo captions finding their photo first (smallest margins)", "\"a cup of coffee\", \"a rocket\"",
               "people queries finding a person first: the six / development set / holdout set",
               "strong match on the demo: captions / things no photo shows / absent things / nonsense / more absent "
               "things and nonsense / unseen set / holdout set",
               "strong match on ImageNet: \"a {class}\" / absent things / nonsense", "index s / photo", "model.pt MB"]
    cells = [[r["name"], r.get("backend", "auto"), f"{f(r['imagenet_i2t_top1'])} / {f(r['imagenet_i2t_top5'])}",
              sentence_to_photo(r), f"{r['demo_first']} of 20" + demo_margins(r),
              ", ".join("✓" if ok else "✗" for ok in r["user_queries"].values()), people(r), strong(r),
              imagenet_strong(r), f(r["index_s_per_photo"], 3), f(r["model_mb"])] for r in rows]
    return with_provenance(headers, cells, rows, data, right={4, 9, 10})


def t_relevance_margins() -> str:
    """The relevance's text-side settings, chosen by benchmarks/relevance_margins.py."""
    data = load("relevance_margins.json")
    rows = [dict(r, what="chosen" + (" (in use)" if r == data["in_use"] else "")) for r in [data["chosen"]]]
    if data["in_use"] != data["chosen"]:
        rows.append(dict(data["in_use"], what="in use"))
    rows += [dict(r, what=f"runner-up {n}") for n, r in enumerate(data["runners_up"][:3], 1)]
    if "without_names" in data:               # the same rule with the name term off (T₀ above every query's t)
        rows.append(dict(data["without_names"], what="the rule without the name term"))
    names = list(data["chosen"]["per"])
    counts = data["queries"]
    named = "named" in data["chosen"]         # rows chosen with the name term (T₀, A₀)
    headers = ["setting", "λ", "M₀", "N₀", *(["T₀", "A₀"] if named else []), f"captions strong (of {counts['present']})",
               f"absent strong (of {counts['absent']})", "nearest decision",
               "Flickr8k dev captions whose own photo is strong (%)"]
    cells = [[r["what"], f(r["weight"], 2), f(r["description"], 3), f(r["null"], 2),
              *(([f(r["named_floor"], 2), f(r["named"], 3)] if r["named_floor"] <= 1 else ["off", "–"])
                if named else []),
              " / ".join(str(r["per"][n]["present"]) for n in names),
              " / ".join(str(r["per"][n]["absent"]) for n in names), f(r["margin"], 4),
              f(r.get("dev_own_photo_strong"))] for r in rows]
    first = 6 if named else 4                 # the captions column
    unchosen = [(k, label) for k, label in (("check", "unseen set strong (of {}; not chosen on)"),
                                            ("holdout", "holdout set strong (of {}; written after the choice)"))
                if k in counts]         # the sets no setting is chosen on (benchmarks/relevance_margins.py)
    for at, (key, label) in enumerate(unchosen, first + 2):
        headers.insert(at, label.format(counts[key]))
        for row, r in zip(cells, rows):
            row.insert(at, " / ".join(str(r["per"][n].get(key, "–")) for n in names))
    grid = data["grid"]
    right = {*range(1, first), first + 2 + len(unchosen), first + 3 + len(unchosen)}
    return (with_provenance(headers, cells, rows, data, right=right)
            + f"\n\nThe galleries, in each column's order: {'; '.join(names)}. "
              f"Settings searched: {grid['settings']:,} (λ {grid['weight'][0]}–{grid['weight'][1]}, "
              f"M₀ {grid['description'][0]}–{grid['description'][1]}, N₀ {grid['null'][0]}–{grid['null'][1]}"
              + (f", T₀ {', '.join(f'{x:g}' for x in grid['named_floor'])}, A₀ {grid['named'][0]}–{grid['named'][1]}"
                 if "named_floor" in grid else "") + "); "
              f"{grid['meeting_targets']} meet the targets."
            + "".join(f" Not measured ({why}): {'; '.join(n for n, w in data['not_measured'].items() if w == why)}."
                      for why in dict.fromkeys(data.get("not_measured", {}).values()))
            + check_floor_note(data))


def t_relevance_named_top() -> str:
    """The rule's choice at each count of the photo's best names (benchmarks/relevance_margins.py's sweep)."""
    from index.relevance import NAMED_TOP

    data = load("relevance_margins.json")
    rows = data.get("named_top", [])
    names = list(rows[0]["per"]) if rows else []

    def counts(r: dict, key: str) -> str:
        return " / ".join(str(r["per"][n].get(key, "–")) for n in names)

    headers = ["best names looked at", "λ", "M₀", "N₀", "T₀", "A₀", "meets the targets", "captions strong",
               "absent strong", "unseen set strong", "holdout set strong", "nearest decision"]
    cells = [[f"{r['named_top']}" + (" (in use)" if r["named_top"] == NAMED_TOP else ""), f(r["weight"], 2),
              f(r["description"], 3), f(r["null"], 2),
              *([f(r["named_floor"], 2), f(r["named"], 3)] if r["named_floor"] <= 1 else ["off", "–"]),
              "yes" if r["meets"] else "no", counts(r, "present"), counts(r, "absent"), counts(r, "check"),
              counts(r, "holdout"), f(r["margin"], 4)] for r in rows]
    return with_provenance(headers, cells, rows, data, right={1, 2, 3, 4, 5, 11})


def check_floor_note(data: dict) -> str:
    """The fewest of the check set any setting of the grid keeping the captions' target leaves strong."""
    floor = data.get("check_floor")
    if not floor:
        return ""
    counts = " / ".join(str(p["check"]) for p in floor["per"].values())
    return (f" Of the settings keeping at least {round(100 * data['targets']['present'])} % of the captions "
            f"strong on every gallery, the fewest unseen-set strong matches: {counts} of {data['queries']['check']} "
            f"(λ {floor['weight']:g}, M₀ {floor['description']:g}, N₀ {floor['null']:g}"
            + (f", T₀ {floor['named_floor']:g}, A₀ {floor['named']:g}" if "named" in floor else "") + ").")


def t_open_vocab_levers() -> str:
    """The concept head's settings on arrays (benchmarks/open_vocab.py levers)."""
    data = load("open_vocab.json")
    rows = data.get("levers", [])
    headers = ["lever", "what", "ImageNet photo → sentence top-1 / top-5", "sentence → photo R@1 / R@5",
               "demo (of 20; smallest margin)", "people queries (of 6)", "Flickr8k dev R-sum", "head ms / photo",
               "model.pt MB (float16 slim)"]
    cells = [[r["name"], r["lever"], f"{f(r['imagenet_i2t_top1'])} / {f(r['imagenet_i2t_top5'])}",
              f"{f(r['imagenet_t2i_r1'])} / {f(r['imagenet_t2i_r5'])}",
              str(r["demo_first"]) + (f" ({r['demo_min_margin']:+.3f})" if "demo_min_margin" in r else ""),
              str(r["people_found"]) if "people_found" in r else "–",
              f(r["dev_rsum"]) + ("" if r.get("dev_views") == "flip-crop" else " (one view)"),
              f(r["head_ms_per_photo"], 3), f(r["model_mb_half"])] for r in rows]
    return with_provenance(headers, cells, rows, data, right={4, 5, 6, 7, 8})


def t_subject_emphasis() -> str:
    """The query's subject added to it (benchmarks/subject_emphasis.py): the demo and Flickr8k dev, per β."""
    data = load("subject_emphasis.json")
    rows = data.get("rows", [])
    weakest = sorted(rows[0]["demo_margins"], key=rows[0]["demo_margins"].get)[:2] if rows else []   # at β 0
    headers = ["β", "demo (of 20; smallest margin)", *(f"margin of '{c}'" for c in weakest),
               "Flickr8k dev text → image R@1 / R@5 / R@10", "text → image R-sum"]
    cells = [[f"{r['beta']:g}", f"{r['demo_first']} ({r['demo_min_margin']:+.3f})",
              *(f"{r['demo_margins'][c]:+.3f}" for c in weakest),
              " / ".join(f(x) for x in r["t2i"]), f(sum(r["t2i"]))] for r in rows]
    return with_provenance(headers, cells, rows, data, right={0, 1, 2, 3, 4, 5})


def t_ensemble_cost() -> str:
    """What an ensemble of seeds costs where it is served (benchmarks/ensemble_cost.py)."""
    data = load("ensemble_cost.json")
    rows = data.get("rows", [])
    headers = ["model", "members", "dimensions", "index bytes per item", "file (MB)", "load (s)",
               "one sentence (ms)", "one photo (ms)", "sentences/s at 32", "photos/s at 16"]
    cells = [[r["name"], str(r["members"]), f"{r['embed_dim']:,}", f"{r['index_bytes_per_item']:,}",
              f(r["file_mb"]), f(r["load_s"]), f(r["text_ms"]), f(r["image_ms"]), f(r["texts_per_s"], 0),
              f(r["images_per_s"])] for r in rows]
    return with_provenance(headers, cells, rows, data, right=set(range(1, 10)))


def t_synthetic_demo() -> str:
    data = load("synthetic_demo.json")
    rows = data["rows"]
    cells = [[r["name"], *recall_cells(r), f(r["minimal_pairs"]) + " %", r["train_wall"]] for r in rows]
    return with_provenance(["model", *RECALL_HEADERS, "minimal pairs", "train wall"], cells, rows, data)


def t_minimal_pairs_ablation() -> str:
    data = load("minimal_pairs_ablation.json")
    rows = data["rows"]
    cells = [[r["text_encoder"], r["batches"], r["loss"], f(r["colour_swap"]) + " %",
              f(r["position_swap"]) + " %", f(r["all"]) + " %", f(r["val_rsum"])] for r in rows]
    return with_provenance(["text encoder", "batches", "loss", "colour swap", "position swap", "all", "val R-sum"],
                           cells, rows, data)


def t_flickr8k_text_branch() -> str:
    data = load("flickr8k_text_branch.json")
    rows = data["rows"]
    cells = [[r["name"], r["loss"], *recall_cells(r), r["train_wall"]] for r in rows]
    return with_provenance(["text branch", "loss", *RECALL_HEADERS, "train wall"], cells, rows, data)


def t_papers_flickr8k() -> str:
    rows = load("papers_flickr8k.json")["rows"]
    cells = []
    for r in rows:
        rsum = sum(r["i2t"]) + sum(r["t2i"]) if r["t2i"] else None
        cells.append([f'{r["model"]} ({r["source"]})', join(r["i2t"]), join(r["t2i"]), f(rsum), r["setting"]])
    return md_table(["model (source)", "i2t R@1 / R@5 / R@10", "t2i R@1 / R@5 / R@10", "R-sum", "setting"], cells)


def zoo_epochs(r: dict) -> str:
    e, budget, best = r["epochs"], r.get("budget_epochs"), r.get("best_epoch")
    best_s = f" ({best})" if best is not None else ""
    if r.get("stopped") == "cut":
        return f"*cut* at {e} of {budget}{best_s}"
    if r.get("stopped"):
        return f"{e}{best_s}, {r['stopped']}"
    return (f"{e} of {budget}" if budget else f"{e}") + best_s


def zoo_table(file: str, run_as: bool = False) -> str:
    data = load(file)
    rows = data["rows"]
    headers = ["config"] + (["run as"] if run_as else []) + [
        "epochs run (best)" if not run_as else "epochs", "i2t R@1", "R@5", "R@10", "t2i R@1", "R@5", "R@10",
        "R-sum", "MIR i2t / t2i", "rPrec(5)", "train s"]
    cells = []
    for r in rows:
        name = f'`{r["config"]}`' + (f', {r["overrides"]}' if r["overrides"] and not run_as else "")
        cells.append([name] + ([r["overrides"]] if run_as else []) + [
            zoo_epochs(r), *(f(x) for x in r["i2t"]), *(f(x) for x in r["t2i"]), f(r["rsum"]),
            join(r["mir"], 3), f(r["rprecision5"], 2), f(r["train_s"], 0)])
    first_num = 3 if run_as else 2
    return with_provenance(headers, cells, rows, data, right=set(range(first_num, len(headers))))


def stt_row_cells(r: dict) -> list[str]:
    return [join(r.get("caption"), 3), join(r.get("paraphrase"), 3)]


def t_stt_gpu_h100() -> str:
    data = load("stt_gpu_h100.json")
    rows = data["rows"]
    cells = [[r["name"], f'{f(r["rsum"])} ({join(r["i2t"])}; {join(r["t2i"])})', *stt_row_cells(r), r["train"]]
             for r in rows]
    return with_provenance(["model", "R-sum (i2t R@1/5/10; t2i R@1/5/10)", *SCORE_HEADERS, "train"], cells, rows,
                           data)


def t_stt_synthetic() -> str:
    data = load("stt_synthetic.json")
    rows = data["rows"]
    cells = [[r["name"], *recall_cells(r), *stt_row_cells(r), r["train_wall"]] for r in rows]
    return with_provenance(["model", *RECALL_HEADERS, *SCORE_HEADERS, "train wall"], cells, rows, data)


def t_stt_cpu_teacher_forced() -> str:
    data = load("stt_cpu_teacher_forced.json")
    rows = data["rows"]
    cells = [[r["name"], r["steps"], join(r["nll"], 3), f'{f(r["rsum"])} ({join(r["i2t"])}; {join(r["t2i"])})',
              *stt_row_cells(r), r["train_wall"]] for r in rows]
    return with_provenance(["decoder", "steps (lr)", "val NLL ic / para", "R-sum (i2t; t2i)", *SCORE_HEADERS,
                            "train wall"], cells, rows, data)


def t_stt_cpu_scst() -> str:
    data = load("stt_cpu_scst.json")
    rows = data["rows"]
    cells = [[r["model"], r["decoding"], *stt_row_cells(r)] for r in rows]
    return with_provenance(["model", "decoding", *SCORE_HEADERS], cells, rows, data)


def t_stt_cpu_scst_curve() -> str:
    data = load("stt_cpu_scst_curve.json")
    rows = data["rows"]
    cells = [[r["run"], r["task"], *("" if v is None else f(v, 3) for v in r["values"])] for r in rows]
    headers = ["run", "series"] + [f"{u:,}" for u in data["updates"]]
    return with_provenance(headers, cells, rows, data, right=set(range(2, len(headers))))


def t_stt_cpu_nll_curve() -> str:
    data = load("stt_cpu_nll_curve.json")
    rows = data["rows"]
    cells = [[r["series"], *("" if v is None else f(v, 3) for v in r["values"])] for r in rows]
    headers = ["NLL per word, captioning"] + [f"{s:,}" for s in data["steps"]]
    return with_provenance(headers, cells, rows, data, right=set(range(1, len(headers))))


def t_stt_decoding_sweep() -> str:
    data = load("stt_decoding_sweep.json")
    rows = data["rows"]
    cells = [[str(r["beam"]), f"{r['length_penalty']:g}", f(r["mean_words"]), f(r["bleu4"], 3), f(r["cider"], 3)]
             for r in rows]
    return with_provenance(["beam", "length penalty", "mean caption length (words)", "BLEU-4", "CIDEr"], cells,
                           rows, data, right={0, 1, 2, 3, 4})


def _service_pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    on = {(r["route"], r["concurrency"]): r for r in rows if r["batching"]}
    off = {(r["route"], r["concurrency"]): r for r in rows if not r["batching"]}
    return [(on[k], off[k]) for k in on if k in off]


def _service_cells(a: dict, b: dict) -> list[str]:
    ratio = f"{a['rps'] / b['rps']:.2f}×" if a["rps"] and b["rps"] else "—"
    return [a["route"], str(a["concurrency"]), f(a["rps"], 0), f(a["p50_ms"]), f(a["p99_ms"]), f(a["mean_batch"]),
            f(b["rps"], 0), f(b["p50_ms"]), f(b["p99_ms"]), ratio]


SERVICE_HEADERS = ["route", "concurrency", "batching on: req/s", "p50 ms", "p99 ms", "mean batch",
                   "batching off: req/s", "p50 ms", "p99 ms", "on/off"]


def t_service_load_cpu(file: str = "service_load_cpu.json") -> str:
    data = load(file)
    pairs = _service_pairs(data["rows"])
    cells = []
    for a, b in pairs:
        raw = a.get("raw_limit")
        cells.append(_service_cells(a, b) + [f(raw, 0), f"{100 * a['rps'] / raw:.0f}%" if raw else "—",
                                             f(data["http_ceiling"].get(str(a["concurrency"])), 0)])
    headers = SERVICE_HEADERS + ["raw limit (items/s, batch = concurrency)", "on/raw",
                                 "HTTP ceiling (GET /healthz, req/s)"]
    return with_provenance(headers, cells, [{}] * len(cells), data, file=file,
                           right=set(range(1, len(headers))))


def t_serve_workers_cpu(file: str = "serve_workers_cpu.json") -> str:
    """service_load.py --workers 1 2 --batching on --baseline MAIN: per route and concurrency, the baseline
    checkout's one process, this code's ``--workers 1`` and ``--workers 2`` (one run, alternating), and the
    batching-on number recorded in service_load_cpu.json."""
    data = load(file)
    recorded = {(r["route"], r["concurrency"]): r["rps"] for r in load("service_load_cpu.json")["rows"]
                if r["batching"]}
    cells: dict[tuple[str, int], dict[str, dict]] = {}
    for r in data["rows"]:
        key = "baseline" if r.get("checkout") else f"w{r['workers']}"
        cells.setdefault((r["route"], r["concurrency"]), {})[key] = r

    def cell(r: dict | None) -> list[str]:
        return [f(r["rps"], 0), f(r["p50_ms"]), f(r["p99_ms"])] if r else ["—"] * 3

    def ratio(a: dict | None, b: dict | None) -> str:
        return f"{a['rps'] / b['rps']:.2f}×" if a and b and b["rps"] else "—"

    out = []
    for (route, c), row in cells.items():
        base, one, two = row.get("baseline"), row.get("w1"), row.get("w2")
        out.append([route, str(c), *cell(base), *cell(one), ratio(one, base), *cell(two), ratio(two, one),
                    f(recorded.get((route, c)), 0)])
    servers = {("baseline" if r.get("checkout") else f"w{r['workers']}"): r for r in data.get("servers", [])}
    for what, key, digits in (("start → ready, s", "ready_s", 1), ("resident memory after the run, MB", "rss_mb", 0)):
        if servers:     # one value per server, in its req/s column
            base, one, two = (f(servers[n].get(key), digits) if n in servers else "—" for n in ("baseline", "w1", "w2"))
            out.append([what, "", base, "", "", one, "", "", "", two, "", "", "", ""])
    headers = ["route", "concurrency", f"main ({data.get('baseline_commit') or '?'}): req/s", "p50 ms", "p99 ms",
               "--workers 1: req/s", "p50 ms", "p99 ms", "workers 1 / main", "--workers 2: req/s", "p50 ms",
               "p99 ms", "workers 2 / 1", "service_load_cpu.json: req/s"]
    return with_provenance(headers, out, [{}] * len(out), data, file=file, right=set(range(1, len(headers))))


def t_blas_threads_cpu() -> str:
    """benchmarks/blas_threads.py: the text search at one batch with numpy's and FAISS's BLAS pools as they load
    and with one thread each, per torch thread count."""
    file = "blas_threads_cpu.json"
    data = load(file)
    base = {r["torch_threads"]: r["ms"] for r in data["rows"] if r["blas"] == "as loaded"}

    def pools(r: dict) -> str:
        threads = sorted(set(r["pools"].values()))
        return f"{r['blas']}: {len(r['pools'])} pools, " + "/".join(map(str, threads)) + " thread(s) each"

    cells = [[str(r["torch_threads"]), pools(r), f(r["ms"]), f(r["queries_per_s"], 0),
              ", ".join(f(x, 0) for x in r["runs_ms"]), f"{base[r['torch_threads']] / r['ms']:.2f}×"]
             for r in data["rows"]]
    headers = ["torch threads", "numpy's and FAISS's BLAS pools", f"text search, batch {data['batch']}: ms",
               "queries/s", "each round, ms", "speed-up"]
    return with_provenance(headers, cells, [{}] * len(cells), data, file=file, right={0, 2, 3, 5})


def t_name_term_cost_cpu() -> str:
    """benchmarks/name_term_cost.py: the text search in process with the relevance's name term off and on."""
    file = "name_term_cost_cpu.json"
    data = load(file)
    cells = [[r["setting"], str(r["batch"]), f(r["ms"], 2), ", ".join(f(x, 1) for x in r["runs_ms"]),
              f"{r['ratio']:.3f}"] for r in data["rows"]]
    headers = ["relevance", "sentences a search", "ms a search (median)", "each round, ms", "against the term off"]
    return with_provenance(headers, cells, [{}] * len(cells), data, file=file, right={1, 2, 4})


def t_serve_blas_threads_cpu() -> str:
    """service_load.py --workers 1 --batching on --baseline: the commit before the BLAS pools' setting and the
    commit with it, one server each, in one run."""
    file = "serve_blas_threads_cpu.json"
    data = load(file)
    pairs: dict[tuple[str, int], dict[str, dict]] = {}
    for r in data["rows"]:
        pairs.setdefault((r["route"], r["concurrency"]), {})["before" if r.get("checkout") else "after"] = r
    cells = []
    for (route, c), pair in pairs.items():
        before, after = pair["before"], pair["after"]
        cells.append([route, str(c), f(before["rps"], 0), f(before["p50_ms"]), f(before["p99_ms"]),
                      f(after["rps"], 0), f(after["p50_ms"]), f(after["p99_ms"]),
                      f"{after['rps'] / before['rps']:.2f}×" if before["rps"] else "—",
                      f"{before.get('errors', 0)} / {after.get('errors', 0)}"])
    headers = ["route", "concurrency", f"before ({data.get('baseline_commit') or '?'}): req/s", "p50 ms", "p99 ms",
               "one BLAS thread: req/s", "p50 ms", "p99 ms", "after / before", "errors before / after"]
    return with_provenance(headers, cells, [{}] * len(cells), data, file=file, right=set(range(1, len(headers))))


def gpu_host_table(file: str) -> str:
    """benchmarks/gpu_host.py's results: one row per measurement."""
    data = load(file)
    rows: list[list[str]] = [["model", data["model"]]]
    for r in data.get("index_build", []):
        label = (f"index build, {r['photo']} JPEGs" + (f", --tta {r['tta']}" if "tta" in r else "")
                 + (f", --batch-size {r['batch_size']}" if r.get("batch_size") else ""))
        cell = f"{r['img_per_s']:.1f} img/s end to end ({r['images']} images in {r['seconds']:.1f} s, {r['workers']} workers)"
        if "startup_s" in r:
            cell += (f"; start-up {f(r['startup_s'], 1)} s, then {f(r['steady_img_per_s'], 1)} img/s steady; CPU "
                     f"{f(r['cpu_util_pct'], 0)}%, GPU {f(r['gpu_util_pct'], 0)}%")
        if r.get("startup_steps"):         # when each step of the start-up was done
            cell += "; start-up steps done at " + ", ".join(f"{k} {v:.1f} s" for k, v in r["startup_steps"].items())
        if r.get("phases"):                # the host's time after the first batch, step by step
            cell += "; after the first batch: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["phases"].items())
        if r.get("backend_warnings"):      # the image tower fell back to eager PyTorch: say why
            cell += "; " + "; ".join(sorted(set(r["backend_warnings"])))
        rows.append([label, cell])
    profile = data.get("profile")
    if profile:                            # an index build's main process under cProfile: where its time went
        rows.append([f"index build under cProfile, {profile['images']} {profile['photo']} JPEGs",
                     f"{profile['seconds']:.1f} s end to end; most own time: "
                     + ", ".join(f"{r['function']} {r['self_s']:.1f} s ({r['calls']} calls)" for r in profile["self"][:6])
                     + "; the project's functions by cumulative time: "
                     + ", ".join(f"{r['function']} {r['cumulative_s']:.1f} s" for r in profile["project"][:6])])
    for r in data.get("ceilings", []):
        if "error" in r:               # a backend that did not load
            rows.append([f"{r['tower']} tower alone, {r['mode']}", f"not loaded: {r['error']}"])
            continue
        unit = "views" if r["tower"] == "image" else "sentences"
        rows.append([f"{r['tower']} tower alone, {r['mode']}, batch {r['batch']}",
                     f"{r['per_s']:,.0f} {unit}/s" + (f" (first call {r['first_call_s']:.1f} s)"
                                                       if "first_call_s" in r else "")])
    first = data.get("first_answer")
    if first:
        rows.append(["start → ready", f"{first['start_to_ready_s']:.1f} s (warm-up {f(first['warmup_s'], 1)} s; "
                                      f"batch sizes {', '.join(map(str, first['batch_sizes'] or [])) or 'any'}; search backend "
                                      f"{first['search_backend']}" + (f"; image backend {first['image_backend']}"
                                                                      if first.get("image_backend") else "") + ")"])
        for route in ("image", "text"):
            cs = list(first[route])
            cells = []
            for c in cs:
                cell = first[route][c]
                shed = ", ".join(f"{n} × {status}" for status, n in cell["not_200"].items())
                since = f", {cell['from_start_s']:.1f} s from start" if "from_start_s" in cell else ""
                cells.append(f"{cell['seconds']:.2f} s{since}" + (f" ({shed})" if shed else ""))
            rows.append([f"{route} route: all answers after ready, c = {' / '.join(cs)}", " / ".join(cells)])
    for r in (data.get("decode") or {}).get("rows", []):
        rows.append([f"decode + preprocessing, {r['images']} JPEGs (no model)",
                     f"before {r['before']['img_per_cpu_s']:.1f}, one decode {r['once']['img_per_cpu_s']:.1f}, shrunk "
                     f"(1/{r['dct_scale']}) {r['now']['img_per_cpu_s']:.1f} img/s per core"])
    for r in data.get("search", []):
        extra = ""
        if "gb_per_s" in r:
            card = f" of the card's {r['card_gb_per_s']:,.0f}" if r.get("card_gb_per_s") else ""
            extra = f", {r['gb_per_s']:,.0f} GB/s read{card}" + (
                f", p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms" if "p50_ms" in r else "")
        rows.append([f"exact search, {r['vectors']:,} × {r['dim']}, {r['backend']}, batch {r['batch']}",
                     f"{r['qps']:,.0f} QPS (recall@10 {r['recall_at_10']:.3f}{extra})"])
    mp = data.get("service_mp")
    for r in (mp or {}).get("rows", []):
        raw = r.get("raw_limit")
        workers = mp.get("serve_workers")
        shed = ", ".join(f"{n} × {status}" for status, n in r["not_200"].items())
        rows.append([f"{r['route']} route, c = {r['concurrency']} ({r['client_processes']} client processes, serve "
                     f"--workers {workers if workers is not None else 'default'})",
                     f"{r['rps']:,.0f} req/s, p50 {f(r['p50_ms'])} ms, p99 {f(r['p99_ms'])} ms; raw limit "
                     f"{f(raw, 0)}/s" + (f" ({100 * r['rps'] / raw:.0f}%)" if raw else "")
                     + f"; client CPU {r['client_cpu_cores']:.2f} cores, host CPU {f(r['cpu_util_pct'], 0)}%, GPU "
                     f"{f(r['gpu_util_pct'], 0)}%" + (f"; not 200: {shed}" if shed else "")])
    for service in filter(None, [data.get("service"), *data.get("service_decode_workers", [])]):
        workers = service.get("decode_workers")
        threads = ("" if workers is None else f", {workers} decoding threads" if workers
                   else f", decoding threads by default ({data.get('cores', '?')})")
        for a, b in _service_pairs(service.get("rows", [])):
            raw = a.get("raw_limit")
            rows.append([f"{a['route']} route, c = {a['concurrency']}{threads}",
                         f"batching on {a['rps']:.0f} req/s (p99 {f(a['p99_ms'])} ms, mean batch "
                         f"{f(a['mean_batch'])}), off {b['rps']:.0f} req/s; raw limit {f(raw, 0)}/s"
                         + (f" (on/raw {100 * a['rps'] / raw:.0f}%)" if raw else "")])
    if data.get("not_measured"):
        rows.append(["not measured in this run", data["not_measured"]])
    if data.get("notes"):
        rows.append(["notes", data["notes"]])
    return with_provenance(["measurement", "result"], rows, [{}] * len(rows), data, file=file)


LINE = re.compile(r"^(\w+)\s+c=(\d+)\s+batching=(on|off)\s+([\d.]+) req/s .*?p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms"
                  r"\s+mean batch\s+([\d.]+)")


def read_service_txt(name: str) -> dict:
    """the lines benchmarks/service_load.py prints, as the rows of its JSON output"""
    rows, ceiling = [], {}
    for line in (RESULTS / name).read_text().splitlines():
        if line.startswith("HTTP ceiling"):
            ceiling = {c: float(v) for c, v in re.findall(r"c=(\d+) ([\d.]+)/s", line)}
        m = LINE.match(line)
        if m:
            route, c, batching, rps, p50, p99, batch = m.groups()
            rows.append({"route": route, "concurrency": int(c), "batching": batching == "on", "rps": float(rps),
                         "p50_ms": float(p50), "p99_ms": float(p99), "mean_batch": float(batch)})
    return {"rows": rows, "http_ceiling": ceiling}


def t_service_load_cuda_h100() -> str:
    name = "service_load_cuda_h100.txt"
    data = read_service_txt(name)
    pairs = _service_pairs(data["rows"])
    cells = [_service_cells(a, b) + [f(data["http_ceiling"].get(str(a["concurrency"])), 0)] for a, b in pairs]
    headers = SERVICE_HEADERS + ["HTTP ceiling (req/s)"]
    return with_provenance(headers, cells, [{}] * len(cells), {}, file=name, right=set(range(1, len(headers))))


def t_soak_cpu() -> str:
    data = load("soak_cpu.json")
    rows = data["rows"]
    cells = [[r["route"], f"{r['requests']:,}", f"{r['2xx']:,}", f"{r['4xx']:,}",
              f"{r['outside_5xx']} / {r['outside_errors']}", f"{r['5xx']} / {r['errors']}", f(r["p50_ms"], 0),
              f(r["p99_ms"], 0)] for r in rows]
    headers = ["route", "requests", "2xx", "4xx", "5xx / connection errors outside the kill window",
               "5xx / connection errors in all", "p50 ms", "p99 ms"]
    table = with_provenance(headers, cells, [{}] * len(cells), data, right=set(range(1, len(headers))))
    rss, check, syncs = data["rss_mb"], data["index_check"], data["syncs"]
    window = data["kill_window_s"]
    return (table + f"\n\n{data['seconds'] / 60:g} minutes; killed (SIGKILL) at {window[0]:.0f} s, ready again at "
            f"{window[1] - 1:.0f} s (kill window {window[1] - window[0]:.0f} s); {sum(s['ok'] for s in syncs)} of "
            f"{len(syncs)} syncs acknowledged; index afterwards: {check['indexed_photos']} photos, "
            f"{len(check['missing'])} acknowledged ones missing, {len(check['unexpected'])} unexpected, "
            f"latest generation served: {'yes' if check['served_generation_is_latest'] else 'no'}; server RSS "
            f"(sampled every 5 s) first / peak / last: {_rss(rss['samples'], 0)} MB before the kill, "
            f"{_rss(rss['samples'], 1, data['ready_again_s'])} MB after the restart (once ready)."
            + (f" Hostile uploads answered another status than their own: {data['hostile_wrong_status_count']}."
               if "hostile_wrong_status_count" in data else ""))


def _rss(samples: list, life: int, since: float = 0.0) -> str:
    mb = [m for t, m, n in samples if n == life and t >= since]
    return f"{mb[0]:.0f} / {max(mb):.0f} / {mb[-1]:.0f}" if mb else "—"


def t_index_recall_cpu() -> str:
    data = load("index_recall_cpu.json")
    rows = data["rows"]
    cells = [[r["factory"], "-" if r["nprobe"] is None else str(r["nprobe"]), f(r["build_s"]), f(r["search_ms"], 3),
              f(r["recall10"], 3), r.get("note", "")] for r in rows]
    return with_provenance(["factory", "nprobe", "build s", "search ms/query", "recall@10", "note"], cells, rows,
                           data, right={1, 2, 3, 4})


def t_scale_index() -> str:
    data = load("scale_index.json")
    rows = data["rows"]
    cells = [[r["step"], r["factory"], f(r["seconds"], 2), f(r.get("peak_rss_mb"), 0),
              f(None if r.get("peak_rss_mb") is None else r["peak_rss_mb"] - r["start_rss_mb"], 0),
              f(r["vector_mb_written"], 2), r.get("note", "")] for r in rows]
    return with_provenance(["step", "index type", "seconds", "peak RSS MB", "RSS growth MB", "vector MB written",
                            "note"], cells, rows, data, right={2, 3, 4, 5})


def t_scale_index_search() -> str:
    data = load("scale_index.json")
    rows = data["search"]
    # load_rss_mb is not shown: both loads run in one process after large arrays were freed, so heap reuse hides
    # part of what a load takes
    cells = [[r["mode"], r["state"], str(r["segments"]), str(r["nprobe"] or "-"), f(r["load_s"], 2),
              f(r["p50_ms"], 2), f(r["p99_ms"], 2), f(r["recall10"], 3)] for r in rows]
    return with_provenance(["index", "state", "segments", "nprobe", "load s", "p50 ms/query", "p99 ms/query",
                            "recall@10"], cells, rows, data, right=set(range(2, 8)))


def t_rcn_speed_cpu() -> str:
    data = load("rcn_speed_cpu.json")
    rows = data["rows"]
    cells = [[r["what"], f(r["fused_s"], 4), f(r["stepwise_s"], 4), f(r["stepwise_s"] / r["fused_s"], 2)]
             for r in rows]
    return with_provenance(["what", "fused s", "step by step s", "step by step / fused"], cells, rows, data,
                           right={1, 2, 3})


def t_pairing_leak_check_cpu() -> str:
    data = load("pairing_leak_check_cpu.json")
    rows = data["rows"]
    cells = [[r["variant"], f(r["first20"], 2), f(r["last20"], 2), f(r["last20"] / data["floor"], 3),
              f"{r['batch_order_error']:.2e}"] for r in rows]
    return with_provenance(["variant", "loss, first 20 steps", "loss, last 20 steps", "last / floor",
                            "batch-order error"], cells, rows, data, right={1, 2, 3, 4})


def t_embed_throughput() -> str:
    data = load("embed_throughput.json")
    rows = data["rows"]
    cells = [[str(r["round"]), r["engine"], r["workers"], f(r["seconds"]), f(r["images_per_s"], 2),
              f"{r['max_abs_diff']:.1e}", f(r["load_1min"])] for r in rows]
    table = with_provenance(["round", "engine", "workers", "seconds", "images/s", "largest difference to in-process",
                             "load average at end"], cells, rows, data, right={0, 3, 4, 5, 6})
    return (table + f" {data['images']} photos; starting the local Ray (not in the times above) took "
                    f"{f(data['ray_init_s'])} s; Ray {data['ray']}.")


def t_backend_throughput(file: str = "backend_throughput.json") -> str:
    """benchmarks/backend_throughput.py: index build photos/s per inference backend and --tta mode (medians over
    the rounds) with peak memory; no rows until it has been run."""
    path = RESULTS / file
    data = json.loads(path.read_text()).get("throughput", {}) if path.exists() else {}
    rows = data.get("summary", [])
    baseline = data.get("baseline") or "baseline"

    def process_s(r: dict) -> str:         # the whole process's seconds (interpreter and imports too), median
        runs = [x["process_s"] for x in data.get("rows", [])
                if (x["code"], x["backend"], x["tta"]) == (r["code"], r["backend"], r["tta"])]
        return f(statistics.median(runs), 1) if runs else "—"
    cells = [[r["tta"], r["backend"] if r["code"] == "this" else f"{r['backend']} ({baseline})",
              f(r["photos_per_s"], 2), f(r["embed_photos_per_s"], 2), f"×{f(r['vs_eager'], 2)}" if r["vs_eager"] else "—",
              f"×{f(r['vs_baseline'], 2)}" if r.get("vs_baseline") else "—", process_s(r), f(r["peak_rss_mb"], 0)]
             for r in rows]
    headers = ["--tta", "backend", "photos/s (index build)", "photos/s (embedding alone)", "× eager",
               f"× {baseline}", "whole process (s)", "peak RSS (MB)"]
    table = with_provenance(headers, cells, rows, data, right={2, 3, 4, 5, 6, 7})
    if not rows:
        return table
    first = "; ".join(f"{c['backend']}{'' if c['code'] == 'this' else f' ({baseline})'} {f(c['backend_s'])} s"
                      for c in data.get("conversion", []) if c["converted"])
    return (table + f" {data['photos']} photos of {f(data['megapixels'], 0)} MP, median of {data['rounds']} rounds; "
            "index build's own time (the model's and the backend's loading, the embedding, the index), its Python "
            "and torch imports left out; the whole process's seconds, with them, beside it"
            + (f"; converting the backbones on first use: {first}" if first else "")
            + ".")


def t_backend_ranking() -> str:
    """benchmarks/backend_throughput.py ranking: Flickr8k dev as served, per inference backend."""
    path = RESULTS / "backend_throughput.json"
    data = json.loads(path.read_text()).get("ranking", {}) if path.exists() else {}
    order = ["eager", "openvino", "openvino-bf16", "onnxruntime"]
    rows = sorted(data.get("rows", []), key=lambda r: (r["tta"], r["images"], order.index(r["backend"])))
    cells = [[r["backend"], r["tta"], str(r["images"]), join(r["i2t"]), join(r["t2i"]), f(r["rsum"]),
              f(r.get("rsum_vs_eager"))] for r in rows]
    return with_provenance(["backend", "--tta", "dev images", "i2t R@1/5/10", "t2i R@1/5/10", "R-sum",
                            "R-sum − eager"], cells, rows, data, right={2, 5, 6})


def t_text_tower() -> str:
    """benchmarks/text_tower.py: embed_texts sentences/s per batch size, this checkout beside its baseline."""
    name = "text_tower_cpu.json"
    data = load(name)
    rows = data["rows"]
    base = {r["batch"]: r for r in rows if r["checkout"] == "baseline"}
    cells = []
    for r in rows:
        if r["checkout"] != "this":
            continue
        b = base.get(r["batch"])
        cells.append([str(r["batch"]), f"{r['sentences_per_s']:,.1f}",
                      f"{b['sentences_per_s']:,.1f} ({b['commit']})" if b else "—",
                      f"×{r['sentences_per_s'] / b['sentences_per_s']:.2f}" if b else "—"])
    out = with_provenance(["batch", "sentences/s", "before (commit)", "× before"], cells, [{}] * len(cells), data,
                          file=name, right={0, 1, 2, 3})
    return out + (f" Median of {len(rows[0]['rounds'])} rounds of {data['seconds']:g} s per batch size, the two "
                  f"checkouts alternating (python benchmarks/text_tower.py --baseline …)." if rows else "")


def t_tower_throughput() -> str:
    """benchmarks/tower_throughput.py: the image tower alone per way of running it (torch.compile the baseline)."""
    data = load("tower_throughput.json")
    rows = data["rows"]
    cells = [[r["variant"], f(r["views_per_s"]), f"×{r['x_eager']:.2f}" if r.get("x_eager") else "—",
              f(r["first_call_s"]), "—" if r.get("min_cosine_vs_eager") is None else f"{r['min_cosine_vs_eager']:.6f}"]
             for r in rows]
    table = with_provenance(["runs the tower", "views/s", "× eager", "first call (s)", "least cosine to eager"],
                            cells, [{}] * len(cells), data, right={1, 2, 3, 4})
    what = data["description"]
    return table + f" {what[:1].upper()}{what[1:]}; {data['threads']} threads, torch {data['torch']}."


def t_feature_extraction() -> str:
    """benchmarks/feature_extraction.py: the feature cache's extraction in eager PyTorch and on the float32 backend."""
    data = load("feature_extraction.json")
    rows = data["rows"]
    cells = [[str(r["views"]), r["runs"], f(r["photos_per_s"]), f"×{r['x_eager']:.2f}" if r.get("x_eager") else "—",
              "—" if r.get("max_rel_diff_vs_eager") is None else f"{r['max_rel_diff_vs_eager']:.1e}"] for r in rows]
    table = with_provenance(["views a photo", "runs the backbones", "photos/s", "× eager",
                             "largest difference to eager (relative)"], cells, [{}] * len(cells), data,
                            right={0, 2, 3})
    what = data["description"]
    return table + f" {what[:1].upper()}{what[1:]}; {data['threads']} threads, torch {data['torch']}."


def t_video_retrieval() -> str:
    """benchmarks/video_retrieval.py: text → moment and text → video on generated clips, per moment setting."""
    data = load("video_cpu.json")
    rows = data["rows"]
    cells = [[r["setting"], str(r["moments"]), join(r["moment_r"]), f(r["top_tiou"], 2), f(r["placed_tiou"], 2),
              join(r["video_r_mean"]), join(r["video_r_best_moment"])] for r in rows]
    table = with_provenance(["moments", "count", "text → moment R@1/5/10 (tIoU ≥ 0.5)", "tIoU of the top moment",
                             "tIoU, right clip's best moment", "text → video R@1/5/10 (video vector)",
                             "text → video R@1/5/10 (best moment)"], cells, rows, data, right={1, 3, 4})
    return table + f" {data['description']}; {rows[0]['queries'] if rows else 0} queries (5 captions a scene)."


def t_video_speed() -> str:
    """benchmarks/video_retrieval.py: how fast videos are indexed."""
    data = load("video_cpu.json")
    r = data["speed"]
    cells = [[f(r["video_seconds"]), str(r["frames"]), f(r["wall_s"], 2), f(r["video_s_per_s"]),
              f(r["frames_per_s"]), f(r["decode_frames_per_s"])]]
    return with_provenance(["video seconds", "frames sampled", "wall (s)", "video-seconds / s", "frames / s",
                            "decoding alone: frames / s"], cells, [r], data, right={0, 1, 2, 3, 4, 5}) + \
        f" {r['workers']} decoding workers, {r['torch_threads']} torch threads."


def t_video_memory() -> str:
    """benchmarks/video_memory.py: peak RSS while indexing one long 1080p video."""
    data = load("video_memory_cpu.json")
    rows = data["rows"]
    cells = [[f"{r['seconds'] // 60} min", f"{r['width']} × {r['height']}, {r['fps']} fps", f(r["file_mb"]),
              str(r["frames"]), f(r["rss_after_model_mb"], 0), " / ".join(f(q, 0) for q in r["rss_by_quarter_mb"]),
              f(r["peak_rss_mb"], 0), f(r["wall_s"])] for r in rows]
    return with_provenance(["video", "stream", "file (MB)", "frames sampled", "RSS with the model (MB)",
                            "largest RSS per quarter of the run (MB)", "peak RSS (MB)", "wall (s)"],
                           cells, rows, data, right={2, 3, 4, 6, 7}) + \
        f" Model: {data['model']}; {data['workers']} decoding worker; frames sampled at {data['sampling']['rate']:g}/s."


def t_hostile_media() -> str:
    """benchmarks/hostile_media.py: the aspect-extreme PNGs at upload and at index time; frames of an 8192² video."""
    data = load("hostile_media_cpu.json")
    upload = md_table(["upload", "bytes", "status", "longest answer (s)", "largest RSS growth in one request (MB)"],
                      [[r["file"], f"{r['bytes']:,}", " / ".join(map(str, r["statuses"])), f(r["max_s"], 3),
                        f(r["max_rss_growth_mb"], 1)] for r in data["upload"]], right={1, 3, 4})
    index = md_table(["index build", "wall (s)", "peak RSS (MB)", "vs the photos alone: wall / peak RSS",
                      "skip reason"],
                     [[r["file"], f(r["wall_s"], 2), str(r["peak_rss_mb"]),
                       f"{r['extra_s']:+.2f} s / {r['extra_rss_mb']:+d} MB" if "extra_s" in r else "—",
                       r.get("skip_reason", "") or "—"] for r in data["index"]], right={1, 2})
    reader = md_table(["the index's reader alone, one file", "time (ms)", "peak RSS growth (MB)", "skip reason"],
                      [[r["file"], f(r["seconds"] * 1000, 2), f(r["rss_growth_mb"], 1), r["skip_reason"] or "—"]
                       for r in data["index_reader"]], right={1, 2})
    fr = data["frames"]
    alone, settings = fr["one_frame_alone"], fr["settings"]

    def counts(summary: dict) -> str:
        return ", ".join(f"{n:,} × {status}" for status, n in sorted(summary["statuses"].items()))

    frames = md_table(["answers", "statuses", "p50 (s)", "max (s)"],
                      [[f"{fr['clients']} clients: full-size frames", counts(fr["frames"]), f(fr["frames"]["p50_s"], 2),
                        f(fr["frames"]["max_s"], 2)],
                       ["meanwhile, a 128-px thumbnail every 0.25 s", counts(fr["thumbnails_128px"]),
                        f(fr["thumbnails_128px"]["p50_s"], 3), f(fr["thumbnails_128px"]["max_s"], 3)],
                       ["meanwhile, a text search every 0.5 s", counts(fr["text_search"]),
                        f(fr["text_search"]["p50_s"], 3), f(fr["text_search"]["max_s"], 3)]], right={2, 3})
    hw, day, commit = provenance({}, data)
    demo = md_table(["index build of the demo's photos", "wall (s)", "peak RSS (MB)",
                     "vs the photos alone: wall / peak RSS", "skip reason"],
                    [[r["file"], f(r["wall_s"], 2), str(r["peak_rss_mb"]),
                      f"{r['extra_s']:+.2f} s / {r['extra_rss_mb']:+d} MB" if "extra_s" in r else "—",
                      r.get("skip_reason", "") or "—"] for r in data.get("index_demo", [])], right={1, 2})
    r3 = data.get("round3")
    round3 = ""
    if r3:
        side = r3["side"]
        alone_rows = md_table([f"upload ({side} × {side} decode bombs)", "bytes", "status", "answer (s)",
                               "RSS growth (MB)", "detail"],
                              [[r["file"], f"{r['bytes']:,}", str(r["status"]), f(r["seconds"], 3),
                                f(r["rss_growth_mb"], 1), r["detail"] or "—"] for r in r3["alone"]],
                              right={1, 3, 4})
        b = r3["beside_two_scan_bombs"]
        beside = md_table(["for " + f"{b['seconds']:g} s", "statuses", "p50 (s)", "max (s)"],
                          [["two clients sending the scan bomb without pause", counts(b["two_scan_bomb_clients"]),
                            f(b["two_scan_bomb_clients"]["p50_s"], 3), f(b["two_scan_bomb_clients"]["max_s"], 3)],
                           ["meanwhile, a 128-px thumbnail every 0.25 s", counts(b["thumbnails_128px"]),
                            f(b["thumbnails_128px"]["p50_s"], 3), f(b["thumbnails_128px"]["max_s"], 3)],
                           ["meanwhile, a normal upload (the control JPEG) every 0.5 s", counts(b["normal_uploads"]),
                            f(b["normal_uploads"]["p50_s"], 3), f(b["normal_uploads"]["max_s"], 3)]], right={2, 3})
        conc = md_table(["sent at once", "statuses", "wall (s)", "server's peak RSS growth (MB)"],
                        [[name, counts(c), f(c["wall_s"], 2), str(c["peak_rss_growth_mb"])]
                         for name, c in r3["concurrent"].items()], right={2, 3})
        round3 = "\n\n" + alone_rows + "\n\n" + beside + "\n\n" + conc
    dup_rows = []
    for r in data.get("duplicates", []):
        for a in r["answers"]:
            dup_rows.append([f"{r['photos']:,} {r['vectors']}", f"{a['threshold']:g}", str(a["status"]),
                             f(a["seconds"], 3), f"{a['groups']:,}", f"{a['largest']:,}",
                             f"{r['rss_served_mb']} / {r['peak_growth_mb']:+d}"])
    dups = ""
    if dup_rows:
        dups = "\n\n" + md_table(["GET /v1/duplicates, photos (synthetic vectors)", "threshold", "status",
                                   "answer (s)", "groups", "largest group",
                                   "server RSS served / peak growth over all answers (MB)"], dup_rows,
                                  right={1, 3, 4, 5})
        recall = next((r["neighbours"] for r in data["duplicates"] if "neighbours" in r), None)
        if recall:
            parts = ", ".join(f"{v['found']:.4f} of {v['exact_pairs']:,} exact pairs at {t}"
                              for t, v in recall["recall"].items())
            dups += (f"\n\nNeighbours found against exact search ({recall['sampled_photos']} sampled photos of the "
                     f"clustered set, {'exact' if recall['exact_method'] else 'projected'} search): {parts}.")
    limits = data.get("limits", {})
    limit_line = (f" Limits: at most {limits['max_scans']} JPEG scans; {limits['decode_memory_mb']} MiB of upload "
                  f"decoding; duplicates from threshold {limits['duplicate_floor']:g}, "
                  f"{limits['duplicate_neighbours']} neighbours a photo.") if limits else ""
    return (upload + "\n\n" + index + ("\n\n" + demo if data.get("index_demo") else "") + "\n\n" + reader +
            round3 + dups + "\n\n" + frames +
            f"\n\nFrames: {fr['video']}, {fr['seconds']:g} s of load. Server RSS before / peak / growth: "
            f"{fr['rss_before_mb']} / {max(fr['vmhwm_mb'], fr['rss_peak_sampled_mb'])} / {fr['growth_mb']:+d} MB "
            f"(bound: {settings['media_memory_mb']} MiB of estimated frames and thumbnails at once, one larger job "
            f"alone; {settings['thumbnail_workers']} threads, {settings['max_thumbnails']} admitted). One frame "
            f"alone: {alone['seconds']:g} s, {alone['rss_growth_mb']:+d} MB (the admission's estimate: "
            f"{alone['estimate_mb']} MB). Model: {data['model']}.{limit_line}\n\nHardware: {hw}; date: {day}; "
            f"commit: {commit}.")


def t_decode_throughput_cpu() -> str:
    data = load("decode_throughput_cpu.json")
    rows = data["rows"]
    on = data.get("shrink_to_embed", False)
    cells = [[r["images"], f(r["mean_bytes"] / 1e6, 2), f(r["before"]["img_per_cpu_s"]), f(r["once"]["img_per_cpu_s"]),
              f"{r['once_speedup_per_core']:.2f}×", f"1/{r['dct_scale']}", f(r["now"]["img_per_cpu_s"]),
              f"{r['speedup_per_core']:.2f}×", f(r["mean_abs_pixel_diff"], 2)] for r in rows]
    return with_provenance(["JPEG", "MB", "before: img/s per core", f"one decode{'' if on else ' (runs)'}: img/s per core",
                            "speed-up", "DCT scale", f"shrunk ({'runs' if on else 'off'}): img/s per core", "speed-up",
                            "shrunk: mean pixel difference"], cells, rows, data, right=set(range(1, 9)))


def with_interval(value: float, interval: list[float] | None) -> str:
    """``value`` with its 95 % paired-bootstrap interval (decode_ranking.py ``paired_interval``), where the file
    has one."""
    return f(value, 2) + (f" ({f(interval[0], 2)} to {f(interval[1], 2)})" if interval else "")


def t_decode_ranking() -> str:
    data = load("decode_ranking.json")
    rows = data["rows"]
    cells = [[r["images"], r["scale"], f(r["full"]["rsum"], 2), f(r["shrunk"]["rsum"], 2),
              with_interval(r["loss"], r.get("loss_95")),
              f'{join(r["shrunk"]["i2t"])}; {join(r["shrunk"]["t2i"])}'] for r in rows]
    table = with_provenance(["dev images", "DCT scale", "R-sum, full decode", "R-sum, shrunk while decoding",
                             "loss (95 % interval)", "shrunk: i2t R@1/5/10; t2i R@1/5/10"], cells, rows, data,
                            right={2, 3, 4})
    s = data.get("summary")
    if not s:
        return table
    return table + (f"\n\nEnlarged sides: mean loss {s['mean_loss']:.2f} (sd {s['sd_loss']:.2f}); null spread (full "
                    f"decodes of the sides) {s['null_spread']:.2f}. Rule: {s['rule']} — shrinking images to embed: "
                    f"{'on' if s['shrink_to_embed'] else 'off'}.")


def t_decode_ranking_torch() -> str:
    """Flickr8k dev ranked through the index's path decoded by Pillow and by torch (decode_ranking.py --compare)."""
    data = load("decode_ranking_torch.json")
    rows = data["rows"]
    other = any("torch_other" in r for r in rows)
    def difference(row: dict) -> str:
        return with_interval(row["difference"], row.get("difference_95"))

    cells = [[r["images"], f(r["pil"]["rsum"], 2), f(r["torch"]["rsum"], 2), difference(r),
              *([f'{f(r["torch_other"]["rsum"], 2)}; {difference(r["torch_other"])}' if "torch_other" in r
                 else "same pixels"] if other else []),
              f(r["pixels"]["mean_abs"], 3), str(r["pixels"]["max_abs"]),
              f'{join(r["torch"]["i2t"])}; {join(r["torch"]["t2i"])}'] for r in rows]
    s = data["summary"]
    shipped = "box-reduced first" if s.get("reduce_like_pil", True) else "resized from the full decode"
    headers = ["dev images", "R-sum, PIL decode", f"R-sum, torch decode ({shipped})", "difference (95 % interval)",
               *([f"R-sum, torch, {'resized from the full decode' if s.get('reduce_like_pil', True) else 'box-reduced first'}"
                  "; difference (95 % interval)"] if other else []),
               "pixels: mean abs. difference", "largest", "torch: i2t R@1/5/10; t2i R@1/5/10"]
    table = with_provenance(headers, cells, rows, data, right=set(range(1, len(headers) - 1)))
    text = (f"\n\nImage backend: {data['backend']}; torch {data['torch']}. Target: {s['target']} — "
            f"largest difference {s['largest_difference']:.2f}: {'met' if s['met'] else 'not met'}.")
    if "rule" in s:
        text += (f" Rule: {s['rule']} — mean |difference| {s['mean_abs_difference']:.2f} as run, "
                 f"{s['mean_abs_difference_other']:.2f} the other way: "
                 f"{'as run' if s['reduce_like_pil_wins'] == s.get('reduce_like_pil', True) else 'the other way'} "
                 f"is kept.")
    return table + text


def t_duplicates() -> str:
    """Near-duplicate groups on generated copies of real photos (benchmarks/duplicates.py)."""
    data = load("duplicates.json")
    chosen, edits = data["threshold"], data["edits"]
    shown = [r for r in data["sweep"] if r["threshold"] in (0.8, 0.85, 0.88, 0.9, 0.92, 0.94, 0.96, 0.98)]
    cells = [[f"**{r['threshold']:.2f}**" if r["threshold"] == chosen else f"{r['threshold']:.2f}",
              str(r["pairs_above"]), f(r["precision"], 3), *(f(r["recall"][k], 3) for k in edits),
              f(r["recall_all"], 3)] for r in shown]
    sweep = md_table(["threshold", "pairs at or above", "pair precision", *(f"recall: {k}" for k in edits),
                      "recall: all copy pairs"], cells, right=set(range(1, 4 + len(edits))))
    at = data["at_threshold"]
    hashes = md_table(["copy", "pHash bits differing from the photo: median", "max",
                       f"within {data['hash_distance']} bits (re-encode)"],
                      [[k, f(at["hash_distance"][k]["median"], 1), str(at["hash_distance"][k]["max"]),
                        f(at["hash_distance"][k]["within"], 3)] for k in edits], right={1, 2, 3})
    kinds = ", ".join(f"{n} {k}" for k, n in at["group_kinds"].items())
    text = (f"{sweep}\n\nAt {chosen:g}, as `index duplicates` groups them ({data['photos']:,} photos: "
            f"{data['distinct']:,} distinct, {data['edited']} of them with {len(edits)} copies each): "
            f"{at['groups']} groups ({kinds}); {at['edited_in_exactly_their_group']} of the {data['edited']} edited "
            f"photos share one group with exactly their copies ({at['edited_in_one_group']} with all their copies "
            f"in one group), {at['mixed_groups']} groups mix two photos, and {at['distinct_grouped']} of the "
            f"{at['distinct_ungrouped_of']:,} unedited photos are grouped with another photo. Two distinct photos' "
            f"perceptual hashes differ in at least {at['distinct_hash_distance']['min']} bits (1st percentile "
            f"{at['distinct_hash_distance']['p01']:g}); a copy's from its photo:\n\n{hashes}")
    # the time to group is measured with the bounded neighbour search in hostile_media.json (20,000 photos);
    # group_seconds here timed the all-pairs product it replaced
    hw, date, commit = provenance({}, data, "duplicates.json")
    return f"{text}\n\nHardware: {hw}; date: {date}; commit: {commit}."


def t_cli_search() -> str:
    """The index commands as processes: wall seconds and peak RSS (benchmarks/cli_search.py)."""
    data = load("cli_search.json")

    def target(r: dict) -> str:
        parts = [f"≤ {r['target_s']:g} s" if r.get("target_s") else "",
                 f"≤ {r['target_rss_mb']:g} MB" if r.get("target_rss_mb") else ""]
        return ", ".join(p for p in parts if p) or "—"
    galleries = {"demo": "demo (14 photos, 3 videos)", "10k": f"{data['photos_10k']:,} photos (synthetic vectors)",
                 "unknown": "no such index"}
    cells = [[f"`index {r['command']}`", galleries.get(r["gallery"], r["gallery"]), str(r["runs"]),
              f(r["median_s"], 2), f(r["max_s"], 2), f(r["max_rss_mb"], 0), target(r)] for r in data["rows"]]
    table = md_table(["command", "gallery", "runs", "wall s (median)", "wall s (max)", "peak RSS MB (max)",
                      "target"], cells, right={2, 3, 4, 5})
    hw, date, commit = provenance({}, data, "cli_search.json")
    cost = data.get("text_tower_preparation")
    said = (f"Preparing the text tower at `index build` (once per model file) adds {f(cost['build_added_s'], 1)} s "
            f"to a build of the demo (median of {cost['build_repeats']} builds with and without it; the build "
            f"itself reports {f(cost['build_reported_s'], 1)} s). " if cost else "")
    return f"{table}\n\n{said}Hardware: {hw}; date: {date}; commit: {commit}."


def t_ocr_keyword() -> str:
    """Text in photos and keyword search (benchmarks/ocr_keyword.py): the gate, OCR's cost, recall by mode."""
    data = load("ocr_keyword.json")
    g, b, m = data["gate"], data["build"], data["modes"]
    rows = [
        ["gate: text photos passed (recall)", f"{g['recall_text_photos']:.3f}",
         f"signs {g['by_kind']['sign']:.2f}, receipts {g['by_kind']['receipt']:.2f}, "
         f"screenshots {g['by_kind']['screenshot']:.2f}; threshold {g['threshold']}"],
        ["gate: ImageNet samples passed", f"{g['imagenet_pass_rate']:.3f}", f"of {g['imagenet_photos']}"],
        ["gate: demo sample photos passed", f"{g['demo_pass_rate']:.3f}", f"of {g['demo_photos']}"],
        ["gate: precision on the benchmark's mix", f"{g['precision_on_mix']:.3f}",
         f"{data['set']['text_photos']} text photos, {data['set']['distractors']} ImageNet photos"],
        ["gate: ms per photo", f(g["ms_per_photo"], 2),
         g.get("timing", "thumbnail decode included")],
        ["OCR: s per photo read", f(b["ocr_s_per_photo_read"], 3),
         f"{b['read_by_ocr']} of {b['photos']} photos read, {b['ocr_workers']} at a time"],
        ["OCR's share of the index build", f"{b['ocr_share_of_build']:.0%}",
         f"{f(b['ocr_s'])} s of {f(b['build_s_with_ocr'])} s (shipped model, --tta none)"],
        ["words read (conf. ≥ 50), by font px", ", ".join(f"{k}: {v:.2f}" for k, v in
                                                          data["words_read_by_font_px"].items()), ""],
    ] + [[f"recall@1 / @5, {mode}", f"{m[mode]['recall1']:.3f} / {m[mode]['recall5']:.3f}",
          ", ".join(f"{k} {v:.2f}" for k, v in m[mode]["by_kind_recall1"].items()) + " (R@1)"]
         for mode in ("vector", "keyword", "hybrid")] + [
        [f"recall@1 / @5, hybrid, RRF k = {r['rrf_k']}, keyword weight {r['keyword_weight']:g}",
         f"{r['recall1']:.3f} / {r['recall5']:.3f}", "the vector list's weight 1"]
        for r in data.get("hybrid_sweep", [])]
    table = md_table(["measure", "value", "detail"], rows, right={1})
    hw, date, commit = provenance({}, data, "ocr_keyword.json")
    return table + f"\n\nHardware: {hw}; date: {date}; commit: {commit}; Tesseract {data.get('tesseract', '?')}."


def t_demo_ready() -> str:
    """benchmarks/demo_ready.py: make demo's steps from an empty cache and one query at a time, two checkouts."""
    data = load("demo_ready.json")
    headers = ["checkout", "sample gallery (s)", "index build (s)", "serve → ready (s)", "ready after (s)",
               "text query p50 (ms)", "photo query p50 (ms)"]
    cells = [[r["checkout"], f(r["samples_s"]), f(r["build_s"]), f(r["serve_to_ready_s"]), f(r["ready_s"]),
              f(r["text_p50_ms"]), f(r["image_p50_ms"])] for r in data["rows"]]
    cells.append([f"ratio (this / {data['baseline']})", "", "", "", f"{1 / data['ready_speedup']:.2f}×",
                  f"{data['text_p50_ratio']:.2f}×", f"{data['image_p50_ratio']:.2f}×"])
    return with_provenance(headers, cells, [{}] * len(cells), data, file="demo_ready.json",
                           right=set(range(1, len(headers))))


TABLES: dict[str, Callable[[], str]] = {
    "ocr_keyword": t_ocr_keyword,
    "flickr8k_dev": t_flickr8k_dev,
    "flickr8k_seeds": t_flickr8k_seeds,
    "weight_average": t_weight_average,
    "model_card": t_model_card,
    "querybank_sweep": t_querybank_sweep,
    "querybank_unseen": t_querybank_unseen,
    "querybank_timing": t_querybank_timing,
    "ensemble_cost": t_ensemble_cost,
    "open_vocab_served": t_open_vocab_served,
    "open_vocab_levers": t_open_vocab_levers,
    "subject_emphasis": t_subject_emphasis,
    "relevance_margins": t_relevance_margins,
    "relevance_named_top": t_relevance_named_top,
    "synthetic_demo": t_synthetic_demo,
    "minimal_pairs_ablation": t_minimal_pairs_ablation,
    "flickr8k_text_branch": t_flickr8k_text_branch,
    "papers_flickr8k": t_papers_flickr8k,
    "zoo_gpu_h100": lambda: zoo_table("zoo_gpu_h100.json"),
    "zoo_cpu_full": lambda: zoo_table("zoo_cpu_full.json"),
    "zoo_cpu_reduced": lambda: zoo_table("zoo_cpu_reduced.json", run_as=True),
    "stt_gpu_h100": t_stt_gpu_h100,
    "stt_synthetic": t_stt_synthetic,
    "stt_cpu_teacher_forced": t_stt_cpu_teacher_forced,
    "stt_cpu_scst": t_stt_cpu_scst,
    "stt_cpu_scst_curve": t_stt_cpu_scst_curve,
    "stt_cpu_nll_curve": t_stt_cpu_nll_curve,
    "stt_decoding_sweep": t_stt_decoding_sweep,
    "service_load_cpu": t_service_load_cpu,
    "serve_workers_cpu": t_serve_workers_cpu,
    "serve_blas_threads_cpu": t_serve_blas_threads_cpu,
    "blas_threads_cpu": t_blas_threads_cpu,
    "name_term_cost_cpu": t_name_term_cost_cpu,
    "gpu_host_cpu": lambda: gpu_host_table("gpu_host_cpu.json"),
    "demo_ready": t_demo_ready,
    "gpu_host_cuda_h100": lambda: gpu_host_table("gpu_host_cuda_h100.json"),
    "gpu_host_cuda_h200": lambda: gpu_host_table("gpu_host_cuda_h200.json"),
    "gpu_host_cuda_h200_decode": lambda: gpu_host_table("gpu_host_cuda_h200_decode.json"),
    "gpu_host_cuda_h200_build": lambda: gpu_host_table("gpu_host_cuda_h200_build.json"),
    "service_load_cpu_shipped": lambda: t_service_load_cpu("service_load_cpu_shipped.json"),
    "service_load_cpu_shipped_padded": lambda: t_service_load_cpu("service_load_cpu_shipped_padded.json"),
    "service_load_cuda_h100": t_service_load_cuda_h100,
    "soak_cpu": t_soak_cpu,
    "index_recall_cpu": t_index_recall_cpu,
    "rcn_speed_cpu": t_rcn_speed_cpu,
    "scale_index": t_scale_index,
    "scale_index_search": t_scale_index_search,
    "pairing_leak_check_cpu": t_pairing_leak_check_cpu,
    "embed_throughput": t_embed_throughput,
    "backend_throughput": t_backend_throughput,
    "tower_throughput": t_tower_throughput,
    "feature_extraction": t_feature_extraction,
    "text_tower_cpu": t_text_tower,
    "backend_throughput_12mp": lambda: t_backend_throughput("backend_throughput_12mp.json"),
    "backend_ranking": t_backend_ranking,
    "video_retrieval": t_video_retrieval,
    "video_speed": t_video_speed,
    "video_memory": t_video_memory,
    "decode_throughput_cpu": t_decode_throughput_cpu,
    "hostile_media": t_hostile_media,
    "decode_ranking": t_decode_ranking,
    "decode_ranking_torch": t_decode_ranking_torch,
    "duplicates": t_duplicates,
    "cli_search": t_cli_search,
}


# ------------------------------------------------------------------ rewriting the docs


def run(check: bool, root: Path = ROOT) -> int:
    return rewrite(TABLES, check, root, "benchmarks/tables.py", elsewhere=config_reference.BLOCKS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 naming every table that differs from its data")
    args = ap.parse_args(argv)
    return run(args.check)


if __name__ == "__main__":
    sys.exit(main())
