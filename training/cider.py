"""CIDEr-D (Vedantam et al., CVPR 2015, §4 and the "-D" variant of §6) as a fast, reusable reward.

The COCO caption toolkit (``pycocoevalcap``, what :mod:`training.caption_eval` reports) scores a whole split at
once. Self-critical training (:mod:`training.scst`) needs the same number for a few hundred sampled sentences per
step against references whose statistics never change, so this scorer builds the references' document
frequencies and tf-idf vectors once and then scores any candidate against any reference set by key.

Definition, as the toolkit computes it (its "CIDEr" is CIDEr-D):

* a sentence's n-grams (n = 1..4) are weighted ``tf · (log N − log max(1, df))``: ``tf`` the raw count in the
  sentence, ``df`` the number of reference *sets* that contain the n-gram, ``N`` the number of sets;
* for each n the candidate/reference similarity is ``Σ_g min(c_g, r_g) · r_g / (‖c‖ ‖r‖)`` (clipped counts:
  repeating a word earns nothing extra), times the length penalty ``exp(−(len_c − len_r)² / (2σ²))``, σ = 6;
* the score is 10 × the mean over n and over the set's references.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Mapping, Sequence, TypeVar

N_MAX = 4
SIGMA = 6.0
K = TypeVar("K", bound=Hashable)                   # a reference set's key

Vector = tuple[list[dict], list[float], int]        # per-n tf-idf maps, per-n norms, sentence length


def ngrams(tokens: Sequence[Hashable], n_max: int = N_MAX) -> list[Counter]:
    """The counts of the 1..n_max-grams of ``tokens``, one Counter per n."""
    return [Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)) for n in range(1, n_max + 1)]


class CiderD:
    """CIDEr-D of candidates against fixed reference sets ``{key: [tokens, ...]}`` (tokenised sentences)."""

    def __init__(self, references: Mapping[K, Sequence[Sequence[Hashable]]], sigma: float = SIGMA):
        if not references:
            raise ValueError("CIDEr-D needs at least one reference set")
        self.sigma = sigma
        counts = {key: [ngrams(ref) for ref in refs] for key, refs in references.items()}
        self.df: Counter = Counter()
        for ref_counts in counts.values():      # df counts reference sets, not sentences
            self.df.update({g for rc in ref_counts for per_n in rc for g in per_n})
        self.log_n = math.log(float(len(references)))
        self.refs: dict[Hashable, list[Vector]] = {
            key: [self._vector(rc, len(ref)) for rc, ref in zip(ref_counts, references[key])]
            for key, ref_counts in counts.items()}

    def _vector(self, counts: list[Counter], length: int) -> Vector:
        vecs, norms = [], []
        for per_n in counts:
            vec = {g: tf * (self.log_n - math.log(max(1.0, self.df[g]))) for g, tf in per_n.items()}
            vecs.append(vec)
            norms.append(math.sqrt(sum(v * v for v in vec.values())))
        return vecs, norms, length

    def _similarity(self, cand: Vector, ref: Vector) -> float:
        (cv, cn, cl), (rv, rn, rl) = cand, ref
        total = 0.0
        for c, r, c_norm, r_norm in zip(cv, rv, cn, rn):
            if c_norm == 0.0 or r_norm == 0.0:
                continue
            dot = sum(min(value, r[g]) * r[g] for g, value in c.items() if g in r)
            total += dot / (c_norm * r_norm)
        return total * math.exp(-((cl - rl) ** 2) / (2 * self.sigma ** 2))

    def score(self, key: Hashable, candidate: Sequence[Hashable]) -> float:
        """CIDEr-D of one tokenised candidate against the reference set ``key``."""
        refs = self.refs[key]
        cand = self._vector(ngrams(candidate), len(candidate))
        return 10.0 * sum(self._similarity(cand, r) for r in refs) / (N_MAX * len(refs))

    def corpus_score(self, candidates: dict[Hashable, Sequence[Hashable]]) -> float:
        """The mean over keys: the toolkit's corpus CIDEr when the scorer was built from exactly these keys."""
        if not candidates:
            raise ValueError("no candidates to score")
        return sum(self.score(k, c) for k, c in candidates.items()) / len(candidates)
