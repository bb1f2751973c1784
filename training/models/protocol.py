"""What the inference API, the index and the service use of a model of the common space: the
:class:`EmbeddingModel` protocol, which ``model.JointEmbedding`` and ``ensemble.EnsembleEmbedding`` both satisfy
(mypy checks it: :func:`_conforms`), and its capabilities — a sentence decoder (STT §3.2: captions,
paraphrases), region attention (STT-ATT §3.3) and query composition (W2VV §IV-C, a model that embeds an image as
one vector) — asked by name instead of probing attributes. A sentence encoder's protocol is
text_protocol.py's."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

import torch
from torch import nn

from training.data.preprocess import ImagePreprocess
from training.data.vocab import Vocabulary
from training.models.config_schema import ModelConfig
from training.models.similarity import Similarity

if TYPE_CHECKING:
    from training.models.ensemble import EnsembleEmbedding
    from training.models.model import JointEmbedding


class EmbeddingModel(Protocol):
    """Images and sentences into one space: pixels → ``embed_images``, token ids → ``embed_texts``; the config
    and vocabulary it was built from, its preprocessing and similarity, and the optional parts."""

    @property
    def cfg(self) -> ModelConfig: ...       # a RunConfig, or an ensemble's EnsembleConfig
    @property
    def vocab(self) -> Vocabulary: ...
    @property
    def preprocess(self) -> ImagePreprocess: ...
    @property
    def similarity(self) -> Similarity: ...
    @property
    def decoder(self) -> Any: ...           # a sentence decoder (models/decoder.py), or None
    @property
    def attention(self) -> Any: ...         # region-word attention (models/attention.py), or None
    @property
    def fingerprint(self) -> str: ...       # of the model.pt it was loaded from (model.fingerprint); "" if none
    @property
    def extra(self) -> dict: ...            # what the model.pt carries beside it (its query bank, dev metrics)
    @property
    def concepts(self) -> Any: ...          # the concept head (models/concepts.py: ConSE, gated), or None
    @property
    def backbone_pretrained(self) -> bool: ...  # frozen pretrained image backbones (an ensemble: every member's)
    @property
    def image_split(self) -> Any: ...       # a CNN's frozen bottom and trained top (backbones.SplitCNN), or None
    @property
    def training(self) -> bool: ...

    def embed_images(self, images: torch.Tensor) -> torch.Tensor: ...
    def image_features(self, images: torch.Tensor, pool: bool = True) -> torch.Tensor: ...
    def project_features(self, features: torch.Tensor) -> torch.Tensor: ...
    def embed_features(self, features: torch.Tensor) -> torch.Tensor: ...
    def person_discount(self) -> float: ...  # λ of its person discount (models/concepts.py), 0 without one
    def unfamiliarity(self, features: torch.Tensor) -> torch.Tensor: ...   # a(x) for that discount
    def encode_text_ids(self, texts: Sequence[str]) -> list[list[int]]: ...
    def project_texts(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor: ...
    def embed_texts(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor: ...
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...
    def eval(self) -> Any: ...
    def train(self, mode: bool = True) -> Any: ...


def has_decoder(model: EmbeddingModel) -> bool:
    """Writes sentences: captions of images and paraphrases of sentences (STT §3.2)."""
    return model.decoder is not None


def has_attention(model: EmbeddingModel) -> bool:
    """Scores image regions against words (STT-ATT §3.3): an image is not one vector."""
    return model.attention is not None


def can_compose(model: EmbeddingModel) -> bool:
    """Composes queries (W2VV §IV-C: an image's vector ± words'): needs an image embedded as one vector."""
    return not has_attention(model)


def _conforms(joint: JointEmbedding, ensemble: EnsembleEmbedding) -> tuple[EmbeddingModel, EmbeddingModel]:
    """Never called: mypy checks here that both model classes satisfy the protocol."""
    return joint, ensemble

