"""A hit's *relevance*: how its score compares with the scores of a fixed reference set of typical items for the
same query — a number that means the same in every gallery, where a raw score does not.

A score (cosine, or QB-Norm's ``q·v − o``, index/qbnorm.py) has no fixed meaning: 0.31 is a good match for one
query and a poor one for another, and the best hit of a gallery is the best whether or not the gallery holds
anything the query describes. So an index built with a query bank also stores a *reference set* per side (up to
:data:`REFERENCE_SIZE` of the bank's own vectors of that side, evenly spaced through it, folded as that side's
items are: for the image index, typical photos of the model's training data; for the caption index, typical
captions), and a hit's relevance is

    relevance(q, hit) = |{r in reference : s(q, r) < s(q, hit)}| / |reference|

— the share of typical items the hit outscores for this query: in [0, 1], computed from the hit's own score
only, so adding or removing other photos never changes it. A result list has a *strong match* when one of its
hits reaches :data:`STRONG` (:func:`is_strong`); when none does, the list holds only the closest items, not ones
the query describes.

That direction alone cannot say no for a photo unlike the reference photos: such a photo outscores typical
training photos for *any* query (a texture for "xqzv", a cat photo for "a giraffe"). So an image index whose bank
also holds *reference sentences* (the model's concept head's sentence per ImageNet class, ``"a photo of a
tabby."``, with the bank's reference captions: :class:`Descriptions`) checks the other direction too: whether the
query is nearly as good a description of the hit as the best sentences the model has for it. With ``b(v)`` the
mean of photo ``v``'s :data:`DESCRIPTION_TOP` best cosines among the reference sentences (the neighbourhood term
r(v) of CSLS, cross-domain similarity local scaling, Conneau et al., ICLR 2018, on the text side only), the
query's *description margin* is ``m(q, v) = q·v − b(v) − λ r(q)``, with ``r(q)`` the mean of the query's
:data:`QUERY_TOP` best cosines among the reference photos (CSLS's other neighbourhood term, weighted by λ =
:data:`QUERY_WEIGHT`: a query that typical training photos already answer well — "a sunset over the ocean" — needs a
closer fit to count as a description of an unusual photo than one they answer poorly — "old coins"), and

    text-side relevance(q, v) = σ(logit(STRONG) + (m − M₀) / τ)    (M₀: DESCRIPTION_MARGIN, τ: DESCRIPTION_SPREAD)

— exactly :data:`STRONG` at ``m = M₀``, rising with the margin. A hit's relevance is then the smaller of the two
directions: it is a strong match only when it outscores typical photos for the query *and* the query is within
``|M₀|`` of the photo's own best descriptions. Both directions grow with the hit's score, so the relevance does
too, and both depend on the query and the hit alone. λ, M₀ and N₀, with the name term's T₀ and A₀ (below), were
chosen together on development sets (the demo gallery's captions, absent things and nonsense) by
benchmarks/relevance_margins.py's rule: of the settings that give ≥ 90 % of the captions and ≤ 10 % of the rest a
strong match on the demo indexed with and without its near-duplicate copy, in float32 and in bf16, those leaving
the fewest of the rest strong (one more counting as as few), and of those the one whose decisions lie farthest from
their thresholds; docs/index.md#relevance-and-no-strong-match has the rates. Absent things and nonsense written
apart from that choice get a strong match more often (about one in six on the demo): mostly things that look like
a photo the gallery holds, which the model's text side cannot tell apart from it.

A third term checks the *names*: the model's class sentences (:attr:`Descriptions.names`, one per ImageNet class).
A query *names a class* when its closest class, text against text, is at least :data:`NAMED_FLOOR` close (``t(q) =
max_c s(q, c)``: "a bowl of ramen" is close to "a photo of a soup bowl", "old coins on a grey background" to no
class), with ``s(q, c)`` the largest cosine of the query with the class's sentence and with its *alias sentences*,
the class's other names in the same template (its synset's other WordNet lemmas, training/models/concepts.py
``class_aliases``: "a hedgehog" names "porcupine, hedgehog" though the class sentence says "porcupine"). For such a
query the hit must carry a name about as close: with ``a(q, v)`` the largest ``s(q, c)`` over the
:data:`NAMED_TOP` class sentences closest to photo ``v`` (the photo's own best names), its *name margin*
``a(q, v) − t(q)`` (0 when one of them is the query's closest class) is calibrated as the others at
:data:`NAMED_MARGIN`. So "a goldfish" on a photo of coins, whose best names are a bubble, a thimble and a beaker, is
not a strong match however high its score, while "a cup of coffee" on a photo whose best names are espresso and a
coffee mug is; a query that names no class (a scene, a person, nonsense) is not weighed by it.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Sequence

import numpy as np

STRONG = 0.99               # a hit outscoring 99% of the reference set for its query is a strong match
REFERENCE_SIZE = 1000       # reference items per index side, at most
DESCRIPTION_TOP = 5         # b(v): the mean of a photo's 5 best cosines among the reference sentences (CSLS's k)
DESCRIPTION_MARGIN = -0.35  # M₀: the description margin at which the text side reaches STRONG (see below)
QUERY_TOP = 10              # r(q): the mean of a query's 10 best cosines among the reference photos
QUERY_WEIGHT = 0.5          # λ: r(q)'s weight in the description margin (see below)
DESCRIPTION_SPREAD = 0.05   # τ: how fast the text side's relevance moves with a margin
NULL_COUNT = 380            # null sentences (null_sentences)
NULL_TOP = 3                # n(v): the mean of a photo's 3 best cosines among the null sentences
NULL_MARGIN = 0.0           # N₀: the null margin at which the text side reaches STRONG (see below)
NAMED_TOP = 5               # a(q, v): over the photo's 5 closest class sentences (its best names)
NAMED_FLOOR = 0.65          # T₀: a query names a class when its closest class sentence is this close (text·text)
NAMED_MARGIN = -0.25        # A₀: the name margin a(q, v) − t(q) at which the text side reaches STRONG
# λ, M₀, N₀, T₀ and A₀: chosen together by benchmarks/relevance_margins.py on the demo gallery's development queries
# (results/relevance_margins.json, docs/index.md#relevance-and-no-strong-match)


def text_side_settings() -> dict[str, float]:
    """The text side's settings in use, by name: λ (``weight``), M₀ (``description``), N₀ (``null``), T₀
    (``named_floor``) and A₀ (``named``)."""
    return {"weight": QUERY_WEIGHT, "description": DESCRIPTION_MARGIN, "null": NULL_MARGIN,
            "named_floor": NAMED_FLOOR, "named": NAMED_MARGIN}


def name_margins(query_names: np.ndarray, photo_names: np.ndarray, owner: np.ndarray | None = None,
                 named_floor: float = NAMED_FLOOR) -> np.ndarray:
    """Each hit's name margin ``a(q, v) − t(q)`` (see the module): ``query_names`` ``(Q, C)``, each query against
    every class sentence; ``photo_names`` ``(H, K)``, the rows of each hit's photo's best names (−1: none, as where
    there are fewer than K names); ``owner`` ``(H,)``, each hit's query (None: hit ``i`` is query ``i``'s). +inf where
    the query names no class (``t(q) < named_floor``) or the photo has no names."""
    query_names = np.asarray(query_names, dtype=np.float32)
    photo_names = np.asarray(photo_names).astype(np.intp)
    owner = np.arange(len(photo_names)) if owner is None else np.asarray(owner, dtype=np.intp)
    out = np.full(len(photo_names), np.inf, dtype=np.float32)
    if query_names.shape[1] == 0 or photo_names.shape[1] == 0:
        return out
    t = query_names.max(axis=1)[owner]
    known = photo_names >= 0
    a = np.where(known, query_names[owner[:, None], np.maximum(photo_names, 0)], -np.inf).max(axis=1)
    weighed = (t >= named_floor) & known.any(axis=1)
    out[weighed] = (a - t)[weighed]
    return out


def reference_rows(n: int, size: int = REFERENCE_SIZE) -> np.ndarray:
    """The rows of a bank of ``n`` vectors that form its reference set: ``min(n, size)`` of them, evenly spaced
    (row ``⌊i·n/m⌋`` for ``i < m``), so the same bank always gives the same set."""
    m = min(int(n), int(size))
    return (np.arange(m, dtype=np.int64) * int(n)) // max(m, 1)


def is_strong(relevance: float | None) -> bool:
    """Whether a hit of this relevance is a strong match (at least :data:`STRONG`; None, no relevance: False)."""
    return relevance is not None and relevance >= STRONG


def strong_threshold() -> float:
    """The relevance at which a hit is a strong match (:data:`STRONG`)."""
    return STRONG


def calibrated(margins: np.ndarray, at: float) -> np.ndarray:
    """A side's relevance of margins ``m`` (see the module): σ(logit(STRONG) + (m − at)/τ), in (0, 1), increasing,
    :data:`STRONG` at ``m = at`` (τ: :data:`DESCRIPTION_SPREAD`)."""
    z = np.log(STRONG / (1.0 - STRONG)) + (np.asarray(margins, dtype=np.float64) - at) / DESCRIPTION_SPREAD
    return 1.0 / (1.0 + np.exp(-z))


def null_sentences(count: int = NULL_COUNT, seed: int = 0) -> list[str]:
    """The null sentences: ``count`` strings that describe nothing, the same for a seed — made-up words of 2 to 9
    letters, alone and in twos to fours, numbers, and runs of punctuation (in the shares 4 : 4 : 1.5 : 0.5)."""
    rng = random.Random(seed)
    letters, marks = string.ascii_lowercase, "?!.,;:-#*"

    def word() -> str:
        return "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))

    n = [int(count * share / 10) for share in (4, 4, 1.5)]
    return ([word() for _ in range(n[0])] + [" ".join(word() for _ in range(rng.randint(2, 4))) for _ in range(n[1])]
            + [str(rng.randint(0, 10 ** rng.randint(1, 7))) for _ in range(n[2])]
            + ["".join(rng.choice(marks) for _ in range(rng.randint(1, 4))) for _ in range(count - sum(n))])


class Descriptions:
    """The reference sentences of an image index (unit vectors, as the model embeds text): what the model can say
    of a photo, against which a query's fit to a hit is measured (the module's text side), the null sentences
    (None: no null side), the reference photos (unit image vectors, unfolded; None: no r(q) term), ``names``:
    how many of the sentences, the last ones, are the model's class sentences (0: no name term), and ``aliases``:
    sentences naming a class by its other words (``alias_classes``: each one's class, a row of :attr:`names`;
    None: none), so that a query is as close to a class as to the closest of its sentences ("a hedgehog" to the
    class "porcupine, hedgehog")."""

    def __init__(self, sentences: np.ndarray, nulls: np.ndarray | None = None, photos: np.ndarray | None = None,
                 names: int = 0, aliases: np.ndarray | None = None, alias_classes: np.ndarray | None = None):
        self.sentences = _rows(sentences, "reference sentences")
        self.nulls = None if nulls is None else _rows(nulls, "null sentences")
        self.photos = None if photos is None else _rows(photos, "reference photos")
        self.aliases = None if aliases is None else _rows(aliases, "alias sentences")
        for other in (self.nulls, self.photos, self.aliases):
            if other is not None and other.shape[1] != self.sentences.shape[1]:
                raise ValueError("null sentences, reference photos, alias sentences and reference sentences must "
                                 "have the same width")
        if not 0 <= int(names) <= len(self.sentences):
            raise ValueError(f"names: {names} class sentences among {len(self.sentences)} reference sentences")
        self.names = self.sentences[len(self.sentences) - int(names):]      # a view: the last ``names`` rows
        self._named, self._starts = self.names, None
        if self.aliases is not None or alias_classes is not None:
            if self.aliases is None or alias_classes is None:
                raise ValueError("alias sentences and their classes go together")
            owner = alias_rows(alias_classes, len(self.aliases), int(names)).astype(np.intp)
            # every sentence of a class side by side, the class's own first: a query's closeness to each class is
            # the largest over one run of columns (np.maximum.reduceat)
            classes = np.concatenate([np.arange(int(names)), owner])
            order = np.argsort(classes, kind="stable")
            self._named = np.concatenate([self.names, self.aliases])[order]
            self._starts = np.searchsorted(classes[order], np.arange(int(names)))

    def __len__(self) -> int:
        return len(self.sentences)

    def floors(self, photos: np.ndarray, named_top: int = NAMED_TOP) -> np.ndarray:
        """``(P, 2 + named_top)`` per row of ``photos`` (unit image vectors, unfolded): b(v), the mean of its
        :data:`DESCRIPTION_TOP` best cosines among the reference sentences; n(v), of its :data:`NULL_TOP` best among
        the null sentences (−inf without them); then the rows in :attr:`names` of its ``named_top`` closest class
        sentences, closest first (−1 without names). ``named_top``: :data:`NAMED_TOP` as served (other counts:
        benchmarks/relevance_margins.py's sweep)."""
        photos = np.asarray(photos, dtype=np.float32).reshape(-1, self.sentences.shape[1])
        out = np.full((len(photos), 2 + named_top), -np.inf, dtype=np.float32)
        scores = photos @ self.sentences.T
        out[:, 0] = _top_mean(scores, DESCRIPTION_TOP)
        if self.nulls is not None:
            out[:, 1] = _top_mean(photos @ self.nulls.T, NULL_TOP)
        out[:, 2:] = -1
        if len(self.names):
            named = scores[:, len(self.sentences) - len(self.names):]
            k = min(named_top, named.shape[1])
            best = np.argpartition(-named, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(named, best, axis=1), axis=1, kind="stable")
            out[:, 2:2 + k] = np.take_along_axis(best, order, axis=1)
        return out

    def query_floor(self, query: np.ndarray) -> float:
        """r(q): the mean of the raw ``query``'s :data:`QUERY_TOP` best cosines among the reference photos (0
        without them)."""
        return float(self.query_floors(np.asarray(query, dtype=np.float32)[None])[0])

    def query_floors(self, queries: np.ndarray) -> np.ndarray:
        """:meth:`query_floor` of each row of ``queries`` ``(Q, D)``, in one product: ``(Q,)``."""
        queries = np.asarray(queries, dtype=np.float32).reshape(-1, self.sentences.shape[1])
        if self.photos is None:
            return np.zeros(len(queries), dtype=np.float32)
        return _top_mean(queries @ self.photos.T, QUERY_TOP)

    def query_names(self, queries: np.ndarray) -> np.ndarray:
        """Each raw query against every class, text against text: ``(Q, len(names))``, a class's closeness the
        largest over its class sentence and its alias sentences."""
        queries = np.asarray(queries, dtype=np.float32).reshape(-1, self.sentences.shape[1])
        scores = queries @ self._named.T
        if self._starts is None or not len(self.names):
            return scores
        return np.maximum.reduceat(scores, self._starts, axis=1)

    def relevance(self, query: np.ndarray, photos: np.ndarray, floors: np.ndarray | None = None) -> np.ndarray:
        """The text side's relevance of each of ``photos`` (rows, unfolded) for one raw ``query``: the smallest of
        its description margin ``q·v − b(v) − λ r(q)`` calibrated at :data:`DESCRIPTION_MARGIN`, its null margin
        ``q·v − n(v)`` calibrated at :data:`NULL_MARGIN` and its name margin ``a(q, v) − t(q)`` calibrated at
        :data:`NAMED_MARGIN`. ``floors``: their :meth:`floors` when known."""
        photos = np.asarray(photos, dtype=np.float32).reshape(-1, self.sentences.shape[1])
        return self.relevance_of(np.asarray(query, dtype=np.float32)[None], photos,
                                 np.zeros(len(photos), dtype=np.intp), floors)

    def relevance_of(self, queries: np.ndarray, photos: np.ndarray, owner: np.ndarray,
                     floors: np.ndarray | None = None) -> np.ndarray:
        """:meth:`relevance` of many queries' hits at once: row ``i`` of ``photos`` (unfolded) is a hit of the raw
        query ``queries[owner[i]]``; ``(len(photos),)``. Each query's r(q) and its closeness to every class sentence
        are computed once (one product for all)."""
        queries = np.asarray(queries, dtype=np.float32).reshape(-1, self.sentences.shape[1])
        photos = np.asarray(photos, dtype=np.float32).reshape(-1, self.sentences.shape[1])
        floors = self.floors(photos) if floors is None else np.asarray(floors, dtype=np.float32)
        owner = np.asarray(owner, dtype=np.intp)
        raw = np.empty(len(photos), dtype=np.float32)
        for q in np.unique(owner):                  # each query against its own hits: one product a query
            mine = owner == q
            raw[mine] = photos[mine] @ queries[q]
        # λ r(q) in float64, rounded once to float32 (as a Python float against a float32 array)
        shift = (QUERY_WEIGHT * self.query_floors(queries).astype(np.float64)).astype(np.float32)
        described = raw - floors[:, 0] - shift[owner]
        named = name_margins(self.query_names(queries), floors[:, 2:], owner)
        return np.minimum.reduce([calibrated(described, DESCRIPTION_MARGIN), calibrated(raw - floors[:, 1], NULL_MARGIN),
                                  calibrated(named, NAMED_MARGIN)])


def alias_rows(alias_classes: np.ndarray, aliases: int, names: int) -> np.ndarray:
    """``alias_classes`` as int32, checked: one per alias sentence (``aliases`` of them), each a row of the
    ``names`` class sentences; ValueError saying what is wrong otherwise."""
    classes = np.asarray(alias_classes).astype(np.int32).reshape(-1)
    if len(classes) != aliases or classes.min(initial=0) < 0 or classes.max(initial=0) >= names:
        raise ValueError(f"alias classes: one row of the {names} class sentences per alias sentence ({aliases}), got "
                         f"{len(classes)} from {classes.min(initial=0)} to {classes.max(initial=0)}")
    return classes


def _rows(vectors: np.ndarray, what: str) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or len(vectors) == 0:
        raise ValueError(f"{what} must be a non-empty (n, dim) array, got shape {vectors.shape}")
    return np.ascontiguousarray(vectors)


def _top_mean(scores: np.ndarray, top: int) -> np.ndarray:
    return np.sort(scores, axis=1)[:, -min(top, scores.shape[1]):].mean(1)


class Reference:
    """The reference items of one index side, as that side stores its items (``[v, −o]`` when it is folded), and,
    for an image index, its reference sentences (:class:`Descriptions`; None: the photo side alone)."""

    def __init__(self, items: np.ndarray, descriptions: Descriptions | None = None):
        items = np.asarray(items, dtype=np.float32)
        if items.ndim != 2 or len(items) == 0:
            raise ValueError(f"a reference set must be a non-empty (n, dim) array, got shape {items.shape}")
        self.items = np.ascontiguousarray(items)
        self.descriptions = descriptions

    def __len__(self) -> int:
        return len(self.items)

    def relevance(self, queries: np.ndarray, scores: Sequence[Sequence[float]]) -> list[list[float]]:
        """``scores[i]``: the scores of query ``i``'s hits → their relevance. ``queries`` as the index searches
        them (``[q, 1]`` against a folded side), one row per list of scores."""
        ref = np.sort(np.asarray(queries, dtype=np.float32) @ self.items.T, axis=1)       # (Q, m), ascending
        n = ref.shape[1]
        return [(np.searchsorted(row, np.asarray(s, dtype=np.float32), side="left") / n).tolist()
                for row, s in zip(ref, scores)]


def both_sides(photo_side: Sequence[float], text_side: Sequence[float]) -> list[float]:
    """A hit's relevance from its two directions (see the module): the smaller."""
    return [float(min(p, t)) for p, t in zip(photo_side, text_side)]


def strong_match(relevance: Sequence[float] | None) -> bool | None:
    """Whether a hit of a result list is a strong match (:func:`is_strong`; None: the list has no relevance)."""
    return None if relevance is None else any(is_strong(r) for r in relevance)


@dataclass(frozen=True)
class Ranking:
    """One query's hits, best first, ``(id, score)``, with each hit's relevance (None: the index has no reference
    set for that side)."""
    hits: list[tuple[int, float]]
    relevance: list[float] | None = None

    @property
    def strong_match(self) -> bool | None:
        return strong_match(self.relevance)
