"""Fitting a model's concept head (training/models/concepts.py) after training, on the training split's photos:

1. s(y): the model's own text embedding of ``concepts.templates`` filled with each ImageNet class's name
   (``concepts.class_names``: its first WordNet lemma, its curated name, or both), averaged over the templates (and
   names) and normalised;
2. the prototypes: spherical k-means of the backbone features of five sixths of the training photos;
3. the gate: r₀ = the ``concepts.quantile`` quantile of r(x) over the held-out sixth, τ = ``concepts.temperature``
   × (its 50 % minus its 10 % quantile); the confidence term's α and κ₀ are config keys, selected on Flickr8k dev
   and the ImageNet samples (benchmarks/open_vocab.py);
4. with ``concepts.person_discount`` > 0 or ``concepts.familiar_weight``, t(x) (the person discount, the split
   gate): B, the first ``concepts.familiar_dims`` principal components of the unit backbone features of the
   training photos but the held-out sixth (the eigenvectors of their second moment), every training photo kept as
   B f̂ (float16); t₀ = the
   ``concepts.familiar_quantile`` quantile and t_g the ``concepts.familiar_split`` quantile of t over the held-out
   sixth, each against the other photos;
5. with ``concepts.people_weight`` > 0, the people side: d, the unit difference of the mean trained embedding of
   the training photos whose captions name a person (training/inference/person_words.py's words in at least half
   of them) and of the others; z₀, τ_p by a logistic regression of that label on d · u; s_p,
   ``concepts.people_sentences`` embedded and averaged.

``jointspace train`` fits it when ``concepts.enabled``; ``jointspace concepts`` fits it for a trained model. A
model whose carried query bank predates the fit gets its bank images embedded again (they are image embeddings),
and ``concepts.bank_template`` adds a sentence per class to the bank's captions.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, cast

import numpy as np
import torch
import torch.nn.functional as F

from training.inference.embedding import embed_texts
from training.inference.person_words import names_person
from training.models.concepts import ConceptHead, class_names, class_sentences, naming_sources
from training.models.model import JointEmbedding

HELD_OUT_EVERY = 6      # every sixth training photo is held out of the k-means, to place r₀


def shows_a_person(captions: Sequence[str]) -> bool:
    """Whether a photo shows a person, by its captions: at least half of them name one
    (training/inference/person_words.py)."""
    return 2 * sum(names_person(c) for c in captions) >= max(len(captions), 1)


@torch.no_grad()
def logistic(z: torch.Tensor, labels: torch.Tensor, steps: int = 50) -> tuple[float, float]:
    """A one-feature logistic regression P(label | z) = σ((z − z₀) / τ) by Newton's method (a tiny ridge keeps
    separable data finite): (z₀, τ)."""
    x = torch.stack([z.double(), torch.ones_like(z, dtype=torch.float64)], 1)
    y = labels.double()
    w = torch.zeros(2, dtype=torch.float64)
    for _ in range(steps):
        p = torch.sigmoid(x @ w)
        grad = x.t() @ (p - y) + 1e-3 * w
        hess = (x * (p * (1 - p))[:, None]).t() @ x + 1e-3 * torch.eye(2, dtype=torch.float64)
        w = w - torch.linalg.solve(hess, grad)
    if not float(w[0]) > 0:
        raise ValueError("the person label does not rise along the person direction: the people side cannot be "
                         "fitted on these photos (set concepts.people_weight: 0)")
    return float(-w[1] / w[0]), float(1 / w[0])


@torch.no_grad()
def fit_people(model: JointEmbedding, features: torch.Tensor, captions: Sequence[Sequence[str]]) -> dict:
    """Step 4 of the module on ``model.concepts``: d, z₀, τ_p and s_p from the training photos' features and
    captions (one list per photo, in the features' order)."""
    head = cast(ConceptHead, model.concepts)
    if len(captions) != len(features):
        raise ValueError(f"{len(captions)} photos' captions for {len(features)} photos' features")
    labels = torch.tensor([shows_a_person(c) for c in captions])
    if bool(labels.all()) or not bool(labels.any()):
        raise ValueError("fitting the people side needs training photos both with and without a person in their "
                         "captions")
    unit = torch.cat([F.normalize(model.project_features(chunk.to(next(model.parameters()).device)).float().cpu(),
                                  dim=-1) for chunk in features.split(1024)])
    d = F.normalize(unit[labels].mean(0) - unit[~labels].mean(0), dim=0)
    z0, tau = logistic(unit @ d, labels)
    said = F.normalize(embed_texts(model, list(head.cfg.people_sentences)).float().cpu(), dim=-1)
    head.person.copy_(torch.stack([d, F.normalize(said.mean(0), dim=0)]))
    head.person_gate.copy_(torch.tensor([z0, tau]))
    pi = head.person_weights(unit)
    return {"person_photos": int(labels.sum()), "z0": z0, "tau_p": tau,
            "person_mean_pi": float(pi[labels].mean()), "other_mean_pi": float(pi[~labels].mean())}


@torch.no_grad()
def fit_familiar(head: ConceptHead, features: torch.Tensor, held: torch.Tensor) -> dict:
    """Step 4 of the module: B, the kept photos and t₀ from the training photos' backbone features ``(N, ΣD)``;
    ``held``: the held-out photos (a bool mask) t₀ is placed on."""
    unit = F.normalize(features.float(), dim=-1)
    dims = head.familiar_basis.shape[1]
    if len(unit) <= head.cfg.familiar_neighbours:
        raise ValueError(f"the person discount's t(x) needs more than {head.cfg.familiar_neighbours} training photos "
                         f"(concepts.familiar_neighbours); got {len(unit)}")
    fitted = unit[~held]                  # the components from the others: t₀ is placed on photos they did not see
    _, vectors = torch.linalg.eigh((fitted.t() @ fitted).double())   # ascending: the last are the first components
    basis = vectors[:, -dims:].flip(1).float()
    head.familiar_basis.copy_(basis.half())
    head.familiar_photos = (unit @ head.familiar_basis.float()).half()
    rows = torch.nonzero(held)[:, 0]
    sims = (unit[rows] @ head.familiar_basis.float()) @ head.familiar_photos.float().t()
    sims[torch.arange(len(rows)), rows] = float("-inf")               # a held-out photo is not its own neighbour
    t = sims.topk(head.cfg.familiar_neighbours, dim=-1).values.mean(-1)
    t0, t_g = (float(torch.quantile(t, q)) for q in (head.cfg.familiar_quantile, head.cfg.familiar_split))
    head.familiar_gate.copy_(torch.tensor([t0, head.cfg.familiar_temperature, t_g]))
    return {"familiar_t0": t0, "familiar_t_gate": t_g, "familiar_photos": len(unit), "familiar_dims": dims,
            "familiar_t_median": float(t.median())}


@torch.no_grad()
def class_embeddings(model: JointEmbedding, names: Sequence[Sequence[str]],
                     templates: Sequence[str]) -> torch.Tensor:
    """s(y) ``(C, E)``: each class's sentences (each template with each of its names: ``names``, one list of C names
    per source) embedded by the model's text side, averaged, normalised."""
    total = sum(embed_texts(model, class_sentences(said, t)).float().cpu() for said in names for t in templates)
    return F.normalize(torch.as_tensor(total), dim=-1)


@torch.no_grad()
def spherical_kmeans(x: torch.Tensor, k: int, iterations: int = 25, seed: int = 0) -> torch.Tensor:
    """``k`` unit centroids of the unit rows of ``x`` (cosine k-means; an empty cluster takes the row worst served)."""
    x = F.normalize(x.float(), dim=-1)
    k = min(k, len(x))
    g = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(len(x), generator=g)[:k]].clone()
    for _ in range(iterations):
        sims = x @ centroids.t()
        best, assign = sims.max(1)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k)
        for empty in (counts == 0).nonzero().flatten().tolist():
            worst = int(best.argmin())
            sums[empty], best[worst] = x[worst], 1.0
        centroids = F.normalize(sums, dim=-1)
    return centroids


@torch.no_grad()
def fit(model: JointEmbedding, features: np.ndarray | torch.Tensor, log: Callable[[str], None] = print,
        names: Sequence[str] | None = None, captions: Sequence[Sequence[str]] | None = None) -> dict:
    """Fits ``model.concepts`` on the pooled backbone features ``(N, D)`` of the training photos (and, for the
    people side, their ``captions``: one list per photo); returns what was fitted (r₀, τ, the held-out gate's
    mean, the people side's)."""
    head = model.concepts
    if not isinstance(head, ConceptHead):
        raise ValueError("this model has no concept head (concepts.enabled: false)")
    cfg = head.cfg
    feats = (features.detach().float().clone() if isinstance(features, torch.Tensor)     # a copy: the cache is
             else torch.from_numpy(np.array(features, dtype=np.float32)))                   # read-only
    if feats.ndim != 2 or feats.shape[1] != head.prototypes.shape[1]:
        raise ValueError(f"the concept head reads ({head.prototypes.shape[1]},) backbone features; got "
                         f"{tuple(feats.shape)}")
    held = torch.zeros(len(feats), dtype=torch.bool)
    held[::HELD_OUT_EVERY] = True
    if int(held.sum()) < 2 or int((~held).sum()) < cfg.prototypes:
        raise ValueError(f"fitting {cfg.prototypes} concept prototypes needs more training photos than "
                         f"{len(feats)} (at least {cfg.prototypes} besides every {HELD_OUT_EVERY}th, held out): "
                         "set concepts.prototypes lower")
    was = model.training
    model.eval()
    lists = [list(names)] if names is not None else [class_names(s) for s in naming_sources(cfg.class_names)]
    for said in lists:
        if len(said) != head.n_classes:
            raise ValueError(f"{len(said)} class names for {head.n_classes} classes")
    head.class_embeddings.copy_(class_embeddings(model, lists, cfg.templates))
    head.prototypes.copy_(spherical_kmeans(feats[~held], cfg.prototypes, seed=model.cfg.train.seed))
    r = head.typicality(feats[held])
    q = torch.quantile(r, torch.tensor([cfg.quantile, 0.1, 0.5]))
    tau = max(float(cfg.temperature * (q[2] - q[1])), 1e-4)
    head.gate.copy_(torch.tensor([float(q[0]), tau]))
    familiar = fit_familiar(head, feats, held) if head.familiar else {}
    people: dict = {}
    if head.people:
        if captions is None:
            raise ValueError("concepts.people_weight > 0 fits the people side on the training photos' captions; "
                             "none were given")
        people = fit_people(model, feats, captions)
    head.fitted.fill_(True)
    held_unit = F.normalize(model.project_features(feats[held].to(next(model.parameters()).device)).float().cpu(),
                            dim=-1)
    gate = head.gate_weights(feats[held], head.person_weights(held_unit) if head.people else None)
    model.train(was)
    report = {"r0": float(q[0]), "tau": tau, "held_out": int(held.sum()), "prototypes": int(head.prototypes.shape[0]),
              "gate_mean_held_out": float(gate.mean()), "classes": head.n_classes, "templates": list(cfg.templates),
              **familiar, **people}
    log(f"concepts: r0 {report['r0']:.4f}, tau {tau:.4f}; mean gate over {report['held_out']} held-out training "
        f"photos {report['gate_mean_held_out']:.3f} (of w = {cfg.weight})"
        + (f"; familiarity: t0 {familiar['familiar_t0']:.4f}, t_g {familiar['familiar_t_gate']:.4f} over "
           f"{familiar['familiar_photos']} photos"
           if familiar else "")
        + (f"; people: z0 {people['z0']:.4f}, tau_p {people['tau_p']:.4f}, mean pi {people['person_mean_pi']:.2f} "
           f"on {people['person_photos']} person photos, {people['other_mean_pi']:.2f} on the others"
           if people else ""))
    return report


def with_concepts(model: JointEmbedding, overrides: dict | None = None) -> JointEmbedding:
    """``model`` rebuilt with a concept head (``concepts.enabled`` and the keys in ``overrides``), unfitted, every
    other tensor as it was; the backbones' classifiers come from their weight packages."""
    from training.models.config_schema import complete
    from training.models.model import build_model

    config = model.cfg.model_dump()
    config["concepts"] = {**config.get("concepts", {}), **(overrides or {}), "enabled": True}
    rebuilt = build_model(complete(config), model.vocab, load_weights=True)
    missing, unexpected = rebuilt.load_state_dict(model.state_dict(), strict=False)
    stray = [k for k in missing if not k.startswith("concepts.")] + [k for k in unexpected
                                                                     if not k.startswith("concepts.")]
    if stray:
        raise ValueError(f"the model's tensors do not fit its rebuilt self: {stray[:5]}")
    if model.concepts is not None:      # a fitted head is refitted from scratch, keeping nothing of it
        cast(ConceptHead, rebuilt.concepts).fitted.fill_(False)
    rebuilt.extra = dict(model.extra or {})
    return rebuilt.eval()


@dataclass(frozen=True)
class Written:
    """Where :func:`fit_file` writes the fitted model: ``out`` (None: in place), slim when it was slim, ``half``:
    in float16 (None: as it was)."""
    out: str | Path | None = None
    half: bool | None = None


IN_PLACE = Written()


def fit_file(model_file, train_set, overrides: dict | None = None, written: Written = IN_PLACE, device="cpu",
             workers: int = 2, progress: bool = False, log: Callable[[str], None] = print) -> dict:
    """``jointspace concepts`` and ``jointspace train``: loads ``model_file``, gives it a concept head when it has
    none (or ``overrides`` change it), fits it on the photos of ``train_set`` it was trained on (its
    ``train.fit_splits``: the train split, and val for a final fit; features from the feature cache), draws
    the query bank again when the model carries one (its images are image embeddings; ``concepts.bank_template``
    adds a sentence per class to its captions) and writes the model as ``written`` says."""
    from training.data.features import Compute, extract_features
    from training.inference.backend import extraction_tower
    from training.inference.querybank import attach, carried, describe
    from training.models.checkpoint import load_model, read_checkpoint, save_model, save_slim
    from training.inference.querybank import BankDraw, make_bank

    model_file = Path(model_file)
    out = Path(written.out) if written.out else model_file
    loaded = load_model(model_file)
    if not isinstance(loaded, JointEmbedding):
        raise ValueError("an ensemble's members get their concept heads one by one (jointspace concepts on each "
                         "member, then jointspace ensemble)")
    model = loaded if loaded.concepts is not None and not overrides else with_concepts(loaded, overrides)
    model.extra = dict(loaded.extra or {})
    train_set = train_set.splits(model.cfg.train.fit_splits)
    model.to(device)
    feats = extract_features(model, [r.path for r in train_set.images],
                             compute=Compute(device=device, workers=workers, progress=progress,
                                             tower=extraction_tower))
    report = fit(model, feats, log=log, captions=[r.captions for r in train_set.images])
    model.cpu()
    model.extra["concepts"] = report
    slim = read_checkpoint(model_file).get("slim")
    bank = carried(loaded)
    model.extra.pop("querybank", None)
    if slim:
        save_slim(model, out, half=bool(slim.get("half")) if written.half is None else written.half)
    else:
        save_model(model, out, extra=model.extra)
    if bank is not None:
        section = model.cfg.querybank
        drawn = make_bank(load_model(out), train_set,
                          BankDraw(section.captions, section.images, float(bank["beta"]), seed=model.cfg.train.seed),
                          Compute(workers=workers, progress=progress), features=feats)
        attach(out, drawn)
        log(f"querybank: {describe(drawn)} attached to {out}")
    return report
