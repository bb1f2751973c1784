"""Ensembles that serve as one model: ``jointspace ensemble --models A.pt B.pt --out E.pt``.

The ensemble's embedding is the concatenation of its members' normalised embeddings, member i scaled by its
weight w_i, then normalised again (the similarity is cosine). The score of an (image, caption) pair is then
Σ_i w_i² cos_i / Σ_i w_i², the weighted mean of the members' cosine scores, so one FAISS inner-product search
over the concatenated vectors ranks by the ensemble's score. :class:`EnsembleEmbedding` offers the methods of
``JointEmbedding`` that evaluation, indexing, query composition and the service call, so they take an
ensemble ``model.pt`` unchanged; ``model.save_model`` / ``model.load_model`` write and read it.

One decoded image feeds all members: when their preprocessing differs (another image size, say EfficientNet-Lite0
at 224 px with Lite2 at 260), the ensemble's pixels are the members' own, stacked along the channel axis
(``preprocess.StackedPreprocess``), and each member reads exactly its part. Each member tokenises text its own
way, so the ensemble's own "token ids" are the text's UTF-8 bytes (+1, 0 is padding), decoded back to text and
re-tokenised by each member.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from training.data.preprocess import StackedPreprocess
from training.data.vocab import Vocabulary, pad_batch
from .config_schema import Disabled, EnsembleConfig, EnsembleData, EnsembleModel, MembersSection, RunConfig
from .similarity import Cosine, Similarity

if TYPE_CHECKING:
    from training.data.preprocess import ImagePreprocess

KIND = "ensemble"
MAX_TEXT_BYTES = 2048


class Member(Protocol):
    """What an ensemble uses of a member: a ``model.JointEmbedding`` (not imported: model.py imports this module)."""
    cfg: RunConfig
    vocab: Vocabulary
    preprocess: ImagePreprocess
    backbone_name: str
    backbone: nn.Module
    backbone_pretrained: bool
    image_split: Any          # its CNN's frozen bottom and trained top (backbones.SplitCNN), or None
    cached_dim: int

    def image_features(self, images: torch.Tensor, pool: bool = True) -> torch.Tensor: ...
    def project_features(self, features: torch.Tensor) -> torch.Tensor: ...
    def embed_features(self, features: torch.Tensor) -> torch.Tensor: ...
    def person_discount(self) -> float: ...
    def unfamiliarity(self, features: torch.Tensor) -> torch.Tensor: ...
    def encode_text_ids(self, texts: Sequence[str]) -> list[list[int]]: ...
    def project_texts(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor: ...
    def state_dict(self) -> dict[str, torch.Tensor]: ...


class CommonSpace(nn.Module):
    """What a model of the common space (``model.JointEmbedding``) and an ensemble of them do alike, given the
    subclass's ``similarity`` and ``project_texts``: normalised text embeddings and scores. (Raw sentences go
    through ``training.inference.embedding.embed_texts``, the one text inference path.)"""
    similarity: Similarity
    fingerprint: str          # set by model.load_model: the fingerprint of the file it was read from
    extra: dict               # what the file carries beside the weights (a query bank): set by model.load_model

    def __init__(self):
        super().__init__()
        self.fingerprint = ""  # a model not read from a file has no file's fingerprint
        self.extra = {}       # and carries nothing

    def project_texts(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def embed_texts(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.similarity.normalize(self.project_texts(ids, lengths))

    def score(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        return self.similarity(images, captions)


class EnsembleEmbedding(CommonSpace):
    """Members' embeddings, normalised, weighted and concatenated (see the module docstring)."""

    def __init__(self, members: Sequence[nn.Module], weights: Sequence[float], names: Sequence[str]):
        super().__init__()
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two models")
        if len(weights) != len(members) or any(not w > 0 for w in weights):
            raise ValueError(f"an ensemble needs one positive weight per model ({len(members)}), got {list(weights)}")
        models = cast("list[Member]", list(members))
        for name, m in zip(names, models):
            if m.cfg.model.similarity != "cosine":
                raise ValueError(f"{name}: ensembles combine cosine-similarity models; it uses "
                                 f"{m.cfg.model.similarity!r}")
            if m.preprocess.crops != models[0].preprocess.crops:
                raise ValueError(f"{name}: it averages {m.preprocess.crops} crops per image and {names[0]} "
                                 f"{models[0].preprocess.crops}; members must take the same number of crops")
        self.members = nn.ModuleList(members)
        self.weights = [float(w) for w in weights]
        self.names = list(names)
        self.cfg = EnsembleConfig(name="ensemble(" + "+".join(m.cfg.name for m in models) + ")",
                                  ensemble=MembersSection(members=self.names, weights=self.weights),
                                  data=EnsembleData(max_caption_len=MAX_TEXT_BYTES), image=models[0].cfg.image,
                                  model=EnsembleModel(embed_dim=sum(m.cfg.model.embed_dim for m in models)),
                                  decoder=Disabled(), attention=Disabled())
        self.vocab = Vocabulary.build([])
        self.similarity = Cosine()
        same = all(m.preprocess == models[0].preprocess for m in models)
        # each member's plain preprocessings (a member reading several backbones has one per backbone), in order
        leaves = [m.preprocess.members if isinstance(m.preprocess, StackedPreprocess) else (m.preprocess,)
                  for m in models]
        self._leaf_counts = [len(x) for x in leaves]
        self._shared_pixels = same             # every member reads the ensemble's pixels whole
        self.preprocess: ImagePreprocess = (
            models[0].preprocess if same else StackedPreprocess(tuple(p for x in leaves for p in x)))
        self._twins = feature_twins(models)
        self.backbone_name = "ensemble:" + ",".join(m.backbone_name for m in models)
        self.backbone = nn.ModuleList(m.backbone for m in models)
        self.backbone_pretrained = all(m.backbone_pretrained for m in models)
        self.feature_dim = sum(m.cached_dim for m in models)
        self.image_split = None     # no frozen bottom of its own: its cached features are its members' whole
        self.decoder = None
        self.attention = None
        # its members' concept heads act inside their own embeddings (embed_features) and their person discounts
        # combine (person_discount, unfamiliarity); the relevance's reference sentences are a single model's
        # (index/qbnorm.py ``reference_sentences``): an ensemble has none
        self.concepts = None
        self.region_layout = None   # its cached features are its members' pooled ones

    @property
    def cached_dim(self) -> int:
        return self.feature_dim

    @property
    def models(self) -> list[Member]:
        """The members, typed (``self.members`` is the ``nn.ModuleList`` that registers them)."""
        return cast("list[Member]", list(self.members))

    def _combine(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Members' vectors → each normalised, scaled by its weight, concatenated."""
        return torch.cat([w * F.normalize(p.float(), dim=-1) for w, p in zip(self.weights, parts)], dim=-1)

    # --- image side -------------------------------------------------------------------------------
    def image_features(self, images: torch.Tensor, pool: bool = True) -> torch.Tensor:
        # each member's channels at its own size, or all of them when the members share one preprocessing (which
        # may itself be stacked: members that each read several backbones); a member whose features are another's
        # (feature_twins: seeds of one recipe over the same frozen networks) takes them instead of running its own
        pre = self.preprocess
        parts = (pre.split(images, self._leaf_counts) if isinstance(pre, StackedPreprocess) and not self._shared_pixels
                 else [images] * len(self.models))
        feats: list[torch.Tensor] = []
        for j, (m, part) in enumerate(zip(self.models, parts)):
            twin = self._twins[j]
            feats.append(feats[twin] if twin != j else m.image_features(part, pool=pool))
        return torch.cat(feats, dim=-1)

    def _member_slices(self, features: torch.Tensor) -> list[torch.Tensor]:
        """The ensemble's cached features ``(..., Σ cached_dim)`` → each member's part."""
        return list(features.split([m.cached_dim for m in self.models], dim=-1))

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """The members' projections alone (without their concept heads), combined."""
        return self._combine([m.project_features(part) for m, part in zip(self.models, self._member_slices(features))])

    def embed_features(self, features: torch.Tensor) -> torch.Tensor:
        """Each member's own image embedding (its concept head or region attention included), combined."""
        return self.similarity.normalize(
            self._combine([m.embed_features(part) for m, part in zip(self.models, self._member_slices(features))]))

    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        return self.embed_features(self.image_features(images))

    def _discount_weights(self) -> list[float]:
        """w_i² λ_i per member: how much of the ensemble's score each member's person discount moves."""
        return [w * w * m.person_discount() for w, m in zip(self.weights, self.models)]

    def person_discount(self) -> float:
        """λ of the ensemble: Σ w_i² λ_i / Σ w_i². The ensemble's score is Σ w_i² cos_i / Σ w_i² (module
        docstring), so with :meth:`unfamiliarity` its discounted score is the same weighted mean of the members'
        discounted scores (index/people.py)."""
        return sum(self._discount_weights()) / sum(w * w for w in self.weights)

    def unfamiliarity(self, features: torch.Tensor) -> torch.Tensor:
        """a(x) of the ensemble ``(B,)``: the members' a_i(x), weighted by w_i² λ_i (in [0, 1]); zeros when no
        member has a person discount."""
        weights, out = self._discount_weights(), torch.zeros(features.shape[0], device=features.device)
        for c, m, part in zip(weights, self.models, self._member_slices(features)):
            if c:                       # a member without a discount adds nothing (its a(x) is not computed)
                out = out + c * m.unfamiliarity(part).float()
        return out / sum(weights) if sum(weights) else out

    # --- text side --------------------------------------------------------------------------------
    def encode_text_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [[b + 1 for b in t.encode("utf-8", "replace")[:MAX_TEXT_BYTES]] for t in texts]

    def project_texts(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        texts = [bytes(int(b) - 1 for b in row[:n]).decode("utf-8", "replace")
                 for row, n in zip(ids.cpu().tolist(), lengths.cpu().tolist())]
        parts = []
        for m in self.models:
            m_ids, m_lengths = pad_batch(m.encode_text_ids(texts))
            parts.append(m.project_texts(m_ids.to(ids.device), m_lengths.to(ids.device)))
        return self._combine(parts)


def feature_twins(models: Sequence[Member]) -> list[int]:
    """For each member, the first member whose ``image_features`` are the same function of the same pixels — the
    same networks with equal weights, preprocessing, cut and memory format (e.g. seeds of one recipe over frozen
    pretrained CNNs) — so that the ensemble runs them once; a member's own index when there is none."""
    def same(a: Member, b: Member) -> bool:
        ia, ib = a.cfg.image, b.cfg.image
        if (a.backbone_name, a.preprocess, a.cached_dim) != (b.backbone_name, b.preprocess, b.cached_dim) or \
                (ia.channels_last, ia.train_blocks) != (ib.channels_last, ib.train_blocks):
            return False
        sa, sb = a.backbone.state_dict(), b.backbone.state_dict()
        return sa.keys() == sb.keys() and all(sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]) for k in sa)

    twins: list[int] = []
    for j, m in enumerate(models):
        twins.append(next((i for i in range(j) if twins[i] == i and same(models[i], m)), j))
    return twins


def member_payloads(model: EnsembleEmbedding) -> list[dict]:
    """What ``model.pt`` keeps of each member: its config, vocabulary and every weight."""
    return [{"config": m.cfg.model_dump(), "vocab": m.vocab.to_dict(),
             "state_dict": {k: v.detach().cpu() for k, v in m.state_dict().items()}} for m in model.models]


def ensemble_from_payload(payload: dict, build_member: Callable[[dict], nn.Module]) -> EnsembleEmbedding:
    """An ensemble ``model.pt``'s payload → the model; ``build_member`` rebuilds one member's part."""
    return EnsembleEmbedding([build_member(part) for part in payload["members"]], payload["weights"],
                             payload["names"])
