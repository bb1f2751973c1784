"""Captioning and paraphrasing scores (STT §4.5, Tables 10–11, 14–15, 20–21, 24–25) with the COCO caption
toolkit ``pycocoevalcap``: BLEU-1..4, METEOR and CIDEr(-D), the numbers the paper reports.

* captioning: the caption generated for each image against the image's reference captions;
* paraphrasing: the paraphrase of every caption A against the *other* captions of its image.

The toolkit tokenises with the Stanford PTB tokenizer and scores METEOR with ``meteor-1.5.jar``, both
shipped in the wheel and run with Java (no download; SPICE, which fetches Stanford CoreNLP, is not used).
Without Java, METEOR is reported as skipped (``null`` plus ``skipped``) and sentences are tokenised with
jointspace's own tokenizer, which the result names under ``tokenizer``. To get the toolkit's numbers for
sentences generated on a machine without Java, ``jointspace evaluate --generations FILE`` writes them and
``jointspace score-generations FILE`` scores them where Java is (:func:`load_generations`,
:func:`score_generations`).
"""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Hashable

import torch

from training.data.vocab import tokenize

if TYPE_CHECKING:
    from pycocoevalcap.meteor.meteor import Meteor

    from training.models.protocol import EmbeddingModel

METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "cider")


def java_available() -> bool:
    java = shutil.which("java")
    if java is None:
        return False
    try:
        return subprocess.run([java, "-version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class CocoScorer:
    """Scores candidate sentences against references; keeps one METEOR process for several calls."""

    def __init__(self, meteor: bool = True):
        self.java = java_available()
        self.want_meteor = meteor
        self._meteor: Meteor | None = None

    def close(self) -> None:
        if self._meteor is not None:
            try:
                self._meteor.meteor_p.stdin.close()
                self._meteor.meteor_p.kill()
                self._meteor.meteor_p.wait()
            except Exception:  # pragma: no cover - best effort
                pass
            self._meteor = None

    def __enter__(self) -> CocoScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tokenize(self, sentences: dict[Hashable, list[str]]) -> tuple[dict, str]:
        if self.java:
            try:
                from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

                return PTBTokenizer().tokenize({k: [{"caption": s} for s in v] for k, v in sentences.items()}), "ptb"
            except Exception as err:     # e.g. the package folder is read-only (the tokenizer writes there)
                self.ptb_error = f"PTB tokenizer failed: {err}"
        return {k: [" ".join(tokenize(s)) for s in v] for k, v in sentences.items()}, "jointspace"

    def score(self, references: dict[Hashable, list[str]], candidates: dict[Hashable, str]) -> dict:
        """``references[key]``: reference sentences; ``candidates[key]``: one generated sentence.
        Returns ``bleu1..bleu4, meteor, cider`` (``None`` where skipped), ``n``, ``tokenizer`` and
        ``skipped`` (metric → reason)."""
        if set(references) != set(candidates):
            raise ValueError("references and candidates must have the same keys")
        out: dict = {m: None for m in METRICS}
        out.update({"n": len(candidates), "tokenizer": None, "skipped": {}})
        if not candidates:
            out["skipped"] = {m: "no sentences" for m in METRICS}
            return out
        try:
            from pycocoevalcap.bleu.bleu import Bleu
            from pycocoevalcap.cider.cider import Cider
        except ImportError as err:
            out["skipped"] = {m: f"pycocoevalcap not installed ({err})" for m in METRICS}
            return out
        keys = list(candidates)
        refs, out["tokenizer"] = self._tokenize({k: references[k] for k in keys})
        cands, _ = self._tokenize({k: [candidates[k]] for k in keys})
        bleu, _ = Bleu(4).compute_score(refs, cands, verbose=0)
        for i, value in enumerate(bleu):
            out[f"bleu{i + 1}"] = round(float(value), 4)
        out["cider"] = round(float(Cider().compute_score(refs, cands)[0]), 4)
        if not self.want_meteor:
            out["skipped"]["meteor"] = "not requested"
        elif not self.java:
            out["skipped"]["meteor"] = "java not found (METEOR runs meteor-1.5.jar)"
        else:
            try:
                if self._meteor is None:
                    from pycocoevalcap.meteor.meteor import Meteor

                    self._meteor = Meteor()
                out["meteor"] = round(float(self._meteor.compute_score(refs, cands)[0]), 4)
            except Exception as err:
                self.close()
                out["skipped"]["meteor"] = f"METEOR failed: {err}"
        return out


def coco_scores(references: dict[Hashable, list[str]], candidates: dict[Hashable, str], meteor: bool = True) -> dict:
    """One-off :meth:`CocoScorer.score`."""
    with CocoScorer(meteor=meteor) as scorer:
        return scorer.score(references, candidates)


TASKS = ("captioning", "paraphrasing")
EXAMPLES = 5        # images whose caption and paraphrase a result shows under "examples"


def score_generations(generations: dict, meteor: bool = True) -> dict:
    """``captioning`` and ``paraphrasing`` scores of generated sentences, each task a list of
    ``{"key", "candidate", "references", ...}`` (``generation_metrics``' ``_generations``, or a file written by
    ``jointspace evaluate --generations``); one scorer, so one METEOR process, for both tasks."""
    with CocoScorer(meteor=meteor) as scorer:
        return {task: scorer.score({e["key"]: list(e["references"]) for e in generations[task]},
                                   {e["key"]: e["candidate"] for e in generations[task]})
                for task in TASKS}


def load_generations(path: str | Path) -> dict:
    """Reads and checks a ``jointspace evaluate --generations`` file; ``ValueError`` says what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such generations file: {path}")
    try:   # a .gz file is read through gzip (generations of a whole split compress ~10x)
        data = json.loads(gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text())
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a JSON file: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with 'captioning' and 'paraphrasing' lists")
    for task in TASKS:
        entries = data.get(task)
        if not isinstance(entries, list):
            raise ValueError(f"{path}: '{task}' is missing or not a list (write the file with "
                             f"`jointspace evaluate --generations`)")
        seen = set()
        for i, e in enumerate(entries):
            where = f"{path}: {task}[{i}]"
            if not isinstance(e, dict) or not {"key", "candidate", "references"} <= set(e):
                raise ValueError(f"{where}: expected an object with 'key', 'candidate' and 'references'")
            if not isinstance(e["key"], (int, str)) or isinstance(e["key"], bool):
                raise ValueError(f"{where}: 'key' must be an integer or a string")
            if e["key"] in seen:
                raise ValueError(f"{where}: duplicate key {e['key']!r}")
            seen.add(e["key"])
            if not isinstance(e["candidate"], str):
                raise ValueError(f"{where}: 'candidate' must be a string")
            refs = e["references"]
            if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
                raise ValueError(f"{where}: 'references' must be a non-empty list of strings")
    return data


def generation_metrics(model: EmbeddingModel, dataset, image_emb: torch.Tensor, caption_emb: torch.Tensor,
                       cap_to_img: torch.Tensor, meteor: bool = True, progress: bool = True, **decode) -> dict:
    """``captioning`` and ``paraphrasing`` scores of a split, from its embedded images and captions
    (``embedding.embed_split``), decoded with the model's decoding defaults (``decode`` overrides them). The scored
    sentences are under ``_generations`` (``{"captioning": [...], "paraphrasing": [...]}``, see
    :func:`score_generations`), the first :data:`EXAMPLES` images' under ``examples``."""
    from tqdm.auto import tqdm

    from training.inference.generate import caption_embeddings, decode_settings

    settings = decode_settings(model, **decode)
    captions = [c for r in dataset.images for c in r.captions]
    chunk = 256

    def decode_all(emb, desc, exclude=None):
        out = []
        for s in tqdm(range(0, emb.shape[0], chunk), desc=desc, disable=not progress, unit="batch", leave=False):
            ex = exclude[s:s + chunk] if exclude is not None else None
            out += caption_embeddings(model, emb[s:s + chunk], n=1, settings=settings, exclude=ex)
        return [r[0][0] if r else "" for r in out]

    generated = decode_all(image_emb, "captioning")
    # the paraphraser's output as a user gets it: a copy of the input sentence is not a paraphrase
    paraphrases = decode_all(caption_emb, "paraphrasing", exclude=[[" ".join(tokenize(c))] for c in captions])
    # the sentences exactly as scored: ``jointspace evaluate --generations`` writes them for re-scoring elsewhere
    captioning = [{"key": r.image_id, "image": str(r.path), "candidate": generated[i],
                   "references": list(r.captions)} for i, r in enumerate(dataset.images)]
    by_image: dict[int, list[int]] = {}
    for j, img in enumerate(cap_to_img.tolist()):
        by_image.setdefault(img, []).append(j)
    paraphrasing = []
    for caps in by_image.values():
        for j in caps:
            others = [captions[k] for k in caps if k != j]
            if others:      # a lone caption has nothing to be scored against
                paraphrasing.append({"key": j, "source": captions[j], "candidate": paraphrases[j],
                                     "references": others})
    generations = {"captioning": captioning, "paraphrasing": paraphrasing}
    scores = score_generations(generations, meteor=meteor)
    shown = [{"image": str(r.path), "caption": generated[i], "references": list(r.captions),
              "paraphrase_of": captions[by_image[r.image_id][0]], "paraphrase": paraphrases[by_image[r.image_id][0]]}
             for i, r in enumerate(dataset.images[:EXAMPLES]) if r.image_id in by_image]
    return {**scores, "decoding": settings.as_dict(), "examples": shown, "_generations": generations}


def format_generation(result: dict) -> str:
    """The captioning/paraphrasing rows of ``jointspace evaluate``'s table."""
    lines = [f"{'':14}" + "".join(f"{m.upper():>8}" for m in ("b1", "b2", "b3", "b4", "meteor", "cider"))]
    for task in ("captioning", "paraphrasing"):
        if task in result:
            row = result[task]
            lines.append(f"{task:14}" + "".join(f"{row[m]:8.3f}" if row[m] is not None else f"{'—':>8}"
                                                for m in METRICS))
            if row.get("skipped"):
                lines.append("  skipped: " + "; ".join(f"{k}: {v}" for k, v in row["skipped"].items()))
    return "\n".join(lines)
