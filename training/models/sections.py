"""The keys of the config sections the registry's builders read (``image``, ``text``, ``loss``), typed. The
registry (``factory.py``) imports the builders, which import this module; ``config_schema.py`` imports the registry
and derives the sections of :class:`config_schema.RunConfig` from these, adding the checks of each name against
the registry and the validation of each option map into the options model of the name it configures. Code reads a
section's attributes (``cfg_image.pooling``); ``options`` is that options model (``options.options_as``).
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import ConfigDict, SerializeAsAny, field_validator, model_validator

from .options import Key, Section

# an option map: the options model of the name its section chose, stored as that model's fields
Options = SerializeAsAny[Section]


class RunSection(Section):
    """A section of the run config: unknown keys refused, and types strict — an integer key takes a YAML integer
    (not ``2.0``, ``"2"`` or ``true``); a number key takes an integer too."""
    model_config = ConfigDict(extra="forbid", validate_default=False, strict=True)


class ExtraBackbone(RunSection):
    """One of ``image.extra_backbones``."""
    backbone: str = Key(..., "a pretrained (frozen) backbone by name, as image.backbone")
    weights: Optional[str] = Key(None, "local weights file; None = the backbone's default source")
    image_size: int = Key(..., "its network input side (its own preprocessing of the same image)", ge=8)
    resize: int = Key(..., "its shorter side before cropping", ge=8)


class ImageKeys(RunSection):
    """The keys of ``image``: what an image backbone builder reads."""
    backbone: str = Key("resnet152", "image backbone by name (the names below)")
    weights: Optional[str] = Key(None, "local weights file; None = the backbone's default source")
    image_size: int = Key(224, "network input side", ge=8)
    resize: int = Key(256, "shorter side before cropping (ignored when crops == 1 and resize == image_size)", ge=8)
    crops: Literal[1, 5, 10] = Key(1, "1 (centre), 5 (corners + centre) or 10 (5 + flips), features averaged")
    train_crops: Literal[0, 5, 10] = Key(0, "view augmentation of a frozen backbone's training features: 0 (off), 5 "
                                            "or 10 crops of the image resized to train_resize; each sample reads one "
                                            "random view")
    train_resize: int = Key(256, "side the training crops are cut from", ge=8)
    train_views: Literal["none", "flip", "flip-crop"] = Key(
        "none", "view augmentation of a frozen backbone's training features with the views `index build --tta` "
                "averages (training/inference/names.py TTA): each sample reads one of them at random; none = off")
    cache_dir: Optional[str] = Key(None, "feature cache; None = $JOINTSPACE_CACHE or ~/.cache/jointspace")
    channels_last: bool = Key(True, "faster CPU convolutions")
    train_blocks: int = Key(0, "partial fine-tuning of an EfficientNet: its last k units (the head convolution, then "
                               "MBConv blocks from the top) train over cached activations of the units below; 0 = "
                               "frozen", ge=0)
    pooling: Literal["mean", "gpo"] = Key("mean", "over the final feature grid: mean (global average) | gpo (VSE∞)")
    feature_dropout: float = Key(0.0, "dropout on the pooled backbone features before the projection, in training "
                                      "only (regularises the map from fixed features); 0 = off", ge=0.0, lt=1.0)
    options: Options = Key({}, "the options of image.backbone (its table below)", validate_default=True)
    extra_backbones: list[ExtraBackbone] = Key([], "more frozen pretrained backbones read beside image.backbone, "
                                                   "each with its own input size ({backbone, image_size, resize, "
                                                   "weights}); their pooled features are concatenated")

    @field_validator("crops", "train_crops", mode="before")
    @classmethod
    def _a_count(cls, value):
        if isinstance(value, bool):            # True == 1, False == 0 to a Literal: a count is an integer
            raise ValueError(f"a number of crops, not {value!r}")
        return value

    @model_validator(mode="after")
    def _views_fit(self):
        if self.train_crops and self.train_views != "none":
            raise ValueError("train_crops and train_views are two kinds of training views: choose one")
        if self.train_crops and self.train_resize < self.image_size:
            raise ValueError(f"train_resize must be >= image_size ({self.image_size}) to cut training crops, got "
                             f"{self.train_resize}")
        return self


class TextKeys(RunSection):
    """The keys of ``text``: what a text encoder builder reads."""
    encoder: str = Key("gru", "text encoder by name (the names below)")
    word_dim: int = Key(300, "word embedding size (STT §4.2)", ge=1)
    hidden: int = Key(1024, "hidden / output size (STT §4.2)", ge=1)
    layers: int = Key(1, "recurrent layers", ge=1)
    bidirectional: bool = Key(False, "bidirectional GRU")
    dropout: float = Key(0.0, "dropout on word embeddings", ge=0.0, lt=1.0)
    options: Options = Key({}, "the options of text.encoder (its table below)", validate_default=True)


class LossKeys(RunSection):
    """The keys of ``loss``: what ``factory.build_loss`` reads."""
    name: str = Key("max_violation", "ranking loss by name (the names below)")
    margin: float = Key(0.2, "ranking margin")
    k: int = Key(10, "khardest: negatives per anchor (two-branch §3.3)", ge=1)
    lambda_: float = Key(1.0, "weight of the caption-anchored direction (two-branch eq. 3)", alias="lambda", ge=0.0)
    reduction: Literal["sum", "mean"] = Key("sum", "over the batch: sum (STT eq. 7) or mean (RCN eq. 11)")
    warmup_epochs: int = Key(0, "epochs of the sum of hinges (STT eq. 7) first: hardest negatives from scratch can "
                                "collapse (VSE++ §3.3)", ge=0)
    memory: int = Key(0, "XBM cross-batch memory: the last N (image, caption) embedding pairs, detached, are extra "
                         "negatives after the warm-up epochs (emptied each epoch); 0 = off", ge=0)
    distill_from: list[str] = Key([], "trained model files whose ensemble (mean cosine) the in-batch similarities are "
                                      "distilled towards (training/distill.py); [] = off")
    distill_weight: float = Key(1.0, "weight of the distillation term beside the ranking loss", ge=0.0)
    distill_temperature: float = Key(0.05, "tau of the distillation term's softmax over cosines", gt=0.0)
    options: Options = Key({}, "the options of loss.name (its table below)", validate_default=True)
