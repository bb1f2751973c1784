"""The run configuration as typed models: every section, key, type, allowed value and default. The names
``text.encoder``, ``image.backbone``, ``loss.name`` and ``model.similarity`` may take, what each means and the
options it accepts come from the model library's registry (``models/factory.py``). :func:`complete` checks a
config against these (an unknown or misspelt key, name or option is an error naming it and what is allowed) and
fills in every key it leaves out, option maps included: the one place a default is written. ``config.build_config``
(YAML files and ``--set``) and the loading of a ``model.pt`` (whose stored config may predate keys added since)
both go through it, so the code indexes a config (``cfg["image"]["pooling"]``) and never restates a default.
The config reference in docs/training.md is generated from these models (:func:`reference_markdown`).
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, cast, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from training.models.factory import BACKBONES, CONFIG_REGISTRIES, LOSSES, SIMILARITIES, TEXT_ENCODERS
from training.models.options import Key, Section
from training.models.registry import Registry

# a name of the registry's: anything else is refused, naming it and the names there are
BackboneName = Annotated[str, AfterValidator(BACKBONES.check_name)]
TextEncoderName = Annotated[str, AfterValidator(TEXT_ENCODERS.check_name)]
LossName = Annotated[str, AfterValidator(LOSSES.check_name)]
SimilarityName = Annotated[str, AfterValidator(SIMILARITIES.check_name)]


# --- sections ------------------------------------------------------------------------------------------------

class RunSection(Section):
    """A section of the run config: unknown keys refused, and types strict — an integer key takes a YAML integer
    (not ``2.0``, ``"2"`` or ``true``); a number key takes an integer too."""
    model_config = ConfigDict(extra="forbid", validate_default=False, strict=True)


class DataSection(RunSection):
    min_word_count: int = Key(1, "words seen fewer times in training are unknown (STT §4.2 uses > 3 on COCO)", ge=1)
    max_caption_len: int = Key(50, "tokens; longer captions are truncated", ge=1)
    max_words: Optional[int] = Key(None, "keep only the N most frequent training words (RCN §IV-A: 5000); None = all",
                                   ge=1)


class ExtraBackbone(RunSection):
    backbone: BackboneName = Key(..., "a pretrained (frozen) backbone by name, as image.backbone")
    weights: Optional[str] = Key(None, "local weights file; None = the backbone's default source")
    image_size: int = Key(..., "its network input side (its own preprocessing of the same image)", ge=8)
    resize: int = Key(..., "its shorter side before cropping", ge=8)


class ImageSection(RunSection):
    backbone: BackboneName = Key("resnet152", "image backbone by name (the names below)")
    weights: Optional[str] = Key(None, "local weights file; None = the backbone's default source")
    image_size: int = Key(224, "network input side", ge=8)
    resize: int = Key(256, "shorter side before cropping (ignored when crops == 1 and resize == image_size)", ge=8)
    crops: Literal[1, 5, 10] = Key(1, "1 (centre), 5 (corners + centre) or 10 (5 + flips), features averaged")
    train_crops: Literal[0, 5, 10] = Key(0, "view augmentation of a frozen backbone's training features: 0 (off), 5 "
                                            "or 10 crops of the image resized to train_resize; each sample reads one "
                                            "random view")
    train_resize: int = Key(256, "side the training crops are cut from", ge=8)
    cache_dir: Optional[str] = Key(None, "feature cache; None = $JOINTSPACE_CACHE or ~/.cache/jointspace")
    channels_last: bool = Key(True, "faster CPU convolutions")
    train_blocks: int = Key(0, "partial fine-tuning of an EfficientNet: its last k units (the head convolution, then "
                               "MBConv blocks from the top) train over cached activations of the units below; 0 = "
                               "frozen", ge=0)
    pooling: Literal["mean", "gpo"] = Key("mean", "over the final feature grid: mean (global average) | gpo (VSE∞)")
    feature_dropout: float = Key(0.0, "dropout on the pooled backbone features before the projection, in training "
                                      "only (regularises the map from fixed features); 0 = off", ge=0.0, lt=1.0)
    options: dict = Key({}, "the options of image.backbone (its table below)")
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
        if self.train_crops and self.train_resize < self.image_size:
            raise ValueError(f"train_resize must be >= image_size ({self.image_size}) to cut training crops, got "
                             f"{self.train_resize}")
        return self


class TextSection(RunSection):
    encoder: TextEncoderName = Key("gru", "text encoder by name (the names below)")
    word_dim: int = Key(300, "word embedding size (STT §4.2)", ge=1)
    hidden: int = Key(1024, "hidden / output size (STT §4.2)", ge=1)
    layers: int = Key(1, "recurrent layers", ge=1)
    bidirectional: bool = Key(False, "bidirectional GRU")
    dropout: float = Key(0.0, "dropout on word embeddings", ge=0.0, lt=1.0)
    options: dict = Key({}, "the options of text.encoder (its table below)")


class ModelSection(RunSection):
    embed_dim: int = Key(1024, "common space size (STT Table 4: 1024)", ge=1)
    projection: Literal["linear", "two_branch", "mlp", "none"] = Key(
        "linear", "linear (STT §3.1) | two_branch (two-branch §3.1) | mlp (BiR §5.2) | none (W2VV §III)")
    text_projection: Optional[Literal["linear", "two_branch", "mlp", "none"]] = Key(
        None, "the text side's projection when it differs; None = same as projection")
    projection_hidden: int = Key(2048, "two_branch / mlp: width of the hidden layer", ge=1)
    projection_dropout: float = Key(0.0, "two_branch / mlp: dropout after the hidden layer", ge=0.0, lt=1.0)
    similarity: SimilarityName = Key("cosine", "image-caption similarity by name (the names below)")


class LossSection(RunSection):
    name: LossName = Key("max_violation", "ranking loss by name (the names below)")
    margin: float = Key(0.2, "ranking margin")
    k: int = Key(10, "khardest: negatives per anchor (two-branch §3.3)", ge=1)
    lambda_: float = Key(1.0, "weight of the caption-anchored direction (two-branch eq. 3)", alias="lambda", ge=0.0)
    reduction: Literal["sum", "mean"] = Key("sum", "over the batch: sum (STT eq. 7) or mean (RCN eq. 11)")
    warmup_epochs: int = Key(0, "epochs of the sum of hinges (STT eq. 7) first: hardest negatives from scratch can "
                                "collapse (VSE++ §3.3)", ge=0)
    memory: int = Key(0, "XBM cross-batch memory: the last N (image, caption) embedding pairs, detached, are extra "
                         "negatives after the warm-up epochs (emptied each epoch); 0 = off", ge=0)
    options: dict = Key({}, "the options of loss.name (its table below)")
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    @model_validator(mode="after")
    def _memory_applies(self):
        if self.memory and not getattr(LOSSES.get(self.name), "takes_memory", False):
            raise ValueError(f"loss.memory: loss {self.name!r} does not mine negatives from a cross-batch memory "
                             f"(set loss.memory: 0)")
        return self


class TrainSection(RunSection):
    epochs: int = Key(30, "epochs of the main stage", ge=0)
    batch_size: int = Key(128, "STT §4.2", ge=1)
    lr: float = Key(2.0e-4, "Adam learning rate (STT §4.2)", gt=0.0)
    lr_decay_epochs: int = Key(15, "step: epochs before the decay (STT §4.2); linear: the horizon", ge=0)
    lr_decay_factor: float = Key(0.1, "step / plateau: lr multiplier", gt=0.0)
    weight_decay: float = Key(0.0, "optimiser weight decay", ge=0.0)
    grad_clip: float = Key(2.0, "gradient norm clip; 0 = off", ge=0.0)
    patience: int = Key(10, "early stopping: epochs without a better select_on value", ge=1)
    select_on: Literal["rsum", "nll"] = Key("rsum", "best checkpoint + early stopping: validation R-sum, or the "
                                                    "decoder's validation NLL per word")
    seed: int = Key(0, "random seed")
    device: Literal["auto", "cpu", "cuda"] = Key("auto", "auto = cuda when available")
    amp: Literal["auto", "off"] = Key("auto", "auto: bf16 autocast on CUDA")
    workers: int = Key(2, "image decoding processes", ge=0)
    eval_every: int = Key(1, "epochs between validations", ge=1)
    finetune_epochs: int = Key(0, "STT §4.2 second stage: the backbone trained end to end", ge=0)
    finetune_lr: float = Key(2.0e-5, "learning rate of that stage", gt=0.0)
    finetune_batch_size: int = Key(32, "batch size of that stage", ge=1)
    sampling: Literal["caption", "image", "minimal_pairs"] = Key(
        "caption", "caption: every pair once an epoch | image: every image once with a random caption | "
                   "minimal_pairs: image, each minimal pair in one batch")
    max_steps_per_epoch: Optional[int] = Key(None, "cap for smoke runs", ge=1)
    optimizer: Literal["adam", "rmsprop", "sgd"] = Key(
        "adam", "adam (STT §4.2) | rmsprop (W2VV §III-B) | sgd (BiR §6.3)")
    optimizer_options: dict = Key({}, "extra optimiser arguments, e.g. {alpha: 0.9, eps: 1.0e-6} for rmsprop")
    lr_schedule: Literal["step", "plateau", "linear", "cosine"] = Key(
        "step", "step: × lr_decay_factor after lr_decay_epochs (STT §4.2) | plateau: after lr_plateau_patience "
                "epochs without gain (W2VV §III-B) | linear: to lr_final_factor at lr_decay_epochs (BiR §6.3) | "
                "cosine: per update, warm-up then a half cosine to lr_final_factor")
    lr_plateau_patience: int = Key(3, "plateau: epochs without a validation gain before the lr drops", ge=1)
    warmup_steps: int = Key(0, "cosine: linear warm-up over this many updates", ge=0)
    encoder_lr_factor: float = Key(1.0, "lr of the pretrained encoder weights being trained, as a multiple of the "
                                        "stage's lr (0.1: 10× slower than the heads)", gt=0.0, le=10.0)
    cache_dtype: Literal["float16", "float32"] = Key("float16", "stored frozen-bottom activations (train_layers)")
    lr_final_factor: float = Key(0.01, "linear / cosine: the final lr multiplier", ge=0.0)
    init_from: Optional[str] = Key(None, "a model.pt whose same-named tensors start this run")
    freeze: list[str] = Key([], "top-level modules not trained: backbone, image_proj, text_encoder, text_proj, decoder")
    gather_negatives: bool = Key(False, "multi-process (DDP) runs, where batch_size is the global batch split over the "
                                        "processes: every rank's ranking loss sees the whole global batch's embeddings "
                                        "as negatives (all-gathered); false: only its own share's")


class DecoderSection(RunSection):
    enabled: bool = Key(False, "STT §3.2: a sentence decoder trained jointly on the common space")
    rnn: Literal["gru", "lstm"] = Key("gru", "decoder cell")
    word_dim: int = Key(300, "word embedding size", ge=1)
    hidden: int = Key(1024, "hidden size", ge=1)
    layers: int = Key(1, "recurrent layers", ge=1)
    dropout: float = Key(0.0, "on the word embeddings and the RNN outputs", ge=0.0, lt=1.0)
    cond_dropout: float = Key(0.0, "on the conditioning vector, training only", ge=0.0, lt=1.0)
    lambda_ic: float = Key(1.0, "λ1 of eq. 12: image captioning loss (eq. 10)", ge=0.0)
    lambda_para: float = Key(1.0, "λ2 of eq. 12: sentence paraphrasing loss (eq. 11)", ge=0.0)
    lambda_sim: float = Key(1.0, "λ3 of eq. 12: the ranking loss (eq. 7)", ge=0.0)
    beam_size: int = Key(3, "inference default; 1 = greedy", ge=1)
    max_len: int = Key(20, "words generated at most", ge=1)
    length_penalty: float = Key(1.0, "hypotheses ranked by log P / steps**length_penalty", ge=0.0)
    no_repeat: bool = Key(True, "never the same word twice in a row")
    no_repeat_ngram: int = Key(0, "m > 0: no m-gram twice in one sentence; 0 = off", ge=0)


class AttentionSection(RunSection):
    enabled: bool = Key(False, "STT-ATT §3.3: region-word attention similarity (eqs. 13-17)")
    grid: int = Key(0, "regions = feature-map cells average-pooled to grid × grid (0: as is)", ge=0)
    temperature: float = Key(9.0, "λ of eq. 15", gt=0.0)
    pooled_weight: float = Key(1.0, "ranking loss on the pooled vectors too", ge=0.0)


class SCSTSection(RunSection):
    steps: int = Key(0, "self-critical updates of the decoder on CIDEr-D (Rennie et al. 2017); 0 = off", ge=0)
    lr: float = Key(5.0e-5, "Adam (Rennie et al. §5)", gt=0.0)
    images_per_batch: int = Key(16, "training images per update", ge=1)
    samples: int = Key(5, "sentences sampled per input (leave-one-out baseline)", ge=2)
    eval_every: int = Key(100, "updates between validations (greedy CIDEr-D)", ge=1)


class QueryBankSection(RunSection):
    enabled: bool = Key(True, "after training, model.pt carries a query bank sampled from the training split, which "
                              "`index build` uses by default to correct hubness (QB-Norm; training/querybank.py); "
                              "false: none")
    captions: int = Key(10000, "training captions kept as text (embedded when an index is built, then cached)", ge=0)
    images: int = Key(5000, "training images kept as this model's embeddings (int8 with a scale per image: "
                            "about embed_dim bytes each)", ge=0)
    beta: float = Key(20.0, "inverse temperature of the inverted softmax (QB-Norm eq. 3)", gt=0.0)


class RunConfig(RunSection):
    name: str = Key("unnamed", "the run's name")
    data: DataSection = Key(DataSection())
    image: ImageSection = Key(ImageSection())
    text: TextSection = Key(TextSection())
    model: ModelSection = Key(ModelSection())
    loss: LossSection = Key(LossSection())
    train: TrainSection = Key(TrainSection())
    decoder: DecoderSection = Key(DecoderSection())
    attention: AttentionSection = Key(AttentionSection())
    scst: SCSTSection = Key(SCSTSection())
    querybank: QueryBankSection = Key(QueryBankSection())

    @model_validator(mode="after")
    def _sections_agree(self):
        """The rules that tie sections together."""
        im, attention, d = self.image, self.attention.enabled, self.decoder
        decoder = d.enabled and d.lambda_ic + d.lambda_para > 0
        if self.loss.memory and (decoder or attention or d.enabled):
            raise ValueError("loss.memory applies to the retrieval trainer (decoder and attention off)")
        if im.train_crops and attention:
            raise ValueError("image.train_crops does not apply to STT-ATT grid features (attention.enabled)")
        if (im.train_blocks or im.pooling != "mean") and (im.crops != 1 or attention):
            raise ValueError("image.train_blocks and image.pooling: gpo need image.crops: 1 and no attention (the "
                             "cached activations are per view, pooled after the trained top)")
        if im.extra_backbones and (im.train_blocks or im.pooling != "mean" or attention
                                   or self.train.finetune_epochs):
            raise ValueError("image.extra_backbones are frozen and pooled: they take no image.train_blocks, "
                             "image.pooling: gpo, attention or train.finetune_epochs")
        if self.train.select_on == "nll" and not decoder:
            raise ValueError("train.select_on: nll needs a decoder (decoder.enabled, lambda_ic or lambda_para > 0)")
        if self.scst.steps and not decoder:
            raise ValueError("scst.steps > 0 needs a decoder (decoder.enabled, lambda_ic or lambda_para > 0)")
        if attention and (self.model.similarity != "cosine" or self.text.encoder != "gru"):
            raise ValueError("attention (STT-ATT) needs model.similarity: cosine and text.encoder: gru")
        return self


SECTIONS = {name: cast("type[BaseModel]", field.annotation)      # each section is a model
            for name, field in RunConfig.model_fields.items() if name != "name"}


def defaults() -> dict:
    """Every key with its default, as the plain dict the code reads (``cfg["train"]["lr"]``)."""
    return RunConfig().model_dump(by_alias=True)


class ConfigError(ValueError):
    """A config file, override or stored config names a key that does not exist or has a bad value."""


def complete(values: dict) -> dict:
    """``values`` checked against the typed models (keys, types, allowed values, the rules between sections, each
    option map against the options model of the name it configures) and returned with every key, each option map
    included, its default filled in where ``values`` leaves it out. Raises :class:`ConfigError` naming the key."""
    try:
        cfg = RunConfig.model_validate(values).model_dump(by_alias=True)
    except ValidationError as err:
        raise _explain(err) from None
    for registry in (TEXT_ENCODERS, BACKBONES, LOSSES):
        section, selector = registry.key.split(".")
        try:
            cfg[section]["options"] = registry.check_options(cfg[section][selector], cfg[section]["options"])
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return cfg


def _explain(err: ValidationError) -> ConfigError:
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])   # a misspelt key first
    key = ".".join(str(x) for x in first["loc"])
    if first["type"] == "extra_forbidden":
        return ConfigError(f"unknown config key '{key}'")
    if first["type"] == "value_error" and not first["loc"]:     # a rule between sections (RunConfig)
        return ConfigError(str(first["ctx"]["error"]))
    if first["type"] == "value_error":                        # e.g. a name the registry does not have
        return ConfigError(f"config key '{key}': {first['ctx']['error']}")
    return ConfigError(f"config key '{key}': {first['msg']} (got {first.get('input')!r})")


def _registry(field: FieldInfo) -> Registry | None:
    """The registry whose names ``field`` takes (a ``*Name`` field above), if any."""
    for meta in field.metadata:
        owner = getattr(getattr(meta, "func", None), "__self__", None)
        if isinstance(owner, Registry):
            return owner
    return None


def _type_name(annotation) -> str:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(annotation))
    if args and type(None) in get_args(annotation):                       # Optional[X]
        return _type_name(args[0]) + " or null"
    return getattr(annotation, "__name__", str(annotation))


def _table(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        default = field.default
        shown = "null" if default is None else (str(default).lower() if isinstance(default, bool) else repr(default)
                                                if isinstance(default, str) else str(default))
        registry = _registry(field)
        kind = "a name (below)" if registry else _type_name(field.annotation)
        rows.append(f"| `{prefix}{key}` | {kind} | `{shown}` | {(field.description or '').replace('|', '/')} |")
    return rows


def _names(registry: Registry) -> list[str]:
    rows = ["| name | meaning | options |", "|---|---|---|"]
    for entry in registry:
        fields = entry.options.model_fields if entry.options else {}
        options = ", ".join(f"`{f.alias or k}`" for k, f in fields.items()) or "none"
        rows.append(f"| `{entry.name}` | {entry.description.replace('|', '/')} | {options} |")
    return rows


def reference_markdown() -> str:
    """The config reference (docs/training.md): every section's keys, the names each registry offers, then every
    name's options."""
    out = []
    for name, model in SECTIONS.items():
        out += [f"#### `{name}`", "", *_table(model, f"{name}."), ""]
    for registry in CONFIG_REGISTRIES:
        out += [f"#### `{registry.key}` names", "", *_names(registry), ""]
    for registry in CONFIG_REGISTRIES:
        section = registry.key.split(".")[0]
        for entry in registry:
            if entry.options is not None and entry.options.model_fields:
                out += [f"#### `{section}.options` for `{registry.key}: {entry.name}`", "",
                        *_table(entry.options, f"{section}.options."), ""]
    return "\n".join(out).rstrip() + "\n"
