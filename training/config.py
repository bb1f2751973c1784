"""Run configuration: YAML files with sections ``data image text model loss train decoder attention scst``.

Every key has a default here, so a config file names only what it changes. A key that is not in the
defaults is an error (a typo must not silently train the wrong model), and ``--set a.b=value`` overrides
any key by its dotted path, the value parsed as YAML (``--set train.lr=1e-4``, ``--set text.encoder=bow``).

Some sections hold open-ended option maps (``text.options``, ``image.options``, ``loss.options``) for
encoder- or loss-specific settings that later models add; those sub-maps accept any key.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

DEFAULTS: dict[str, Any] = {
    "name": "unnamed",
    "data": {
        "min_word_count": 1,        # STT §4.2 uses > 3 on COCO; 1 keeps every word of small sets
        "max_caption_len": 50,      # tokens; longer captions are truncated
        "max_words": None,          # keep only the N most frequent training words (RCN §IV-A: 5000); None = all
    },
    "image": {
        "backbone": "resnet152",    # STT §4.2 / RCN: ResNet-152 pooled features
        "weights": None,            # local weights file; None = the backbone's default source
        "image_size": 224,          # network input side
        "resize": 256,              # shorter side before cropping (ignored when crops == 1 and resize == image_size)
        "crops": 1,                 # 1 (centre), 5 (corners + centre) or 10 (5 + flips), features averaged
        "train_crops": 0,           # view augmentation of a frozen backbone's training features: 0 (off), 5 or 10
                                    # crops of the image resized to train_resize; each training sample reads one
                                    # random view among the evaluation view and these crops (embed.view_source)
        "train_resize": 256,
        "cache_dir": None,          # feature cache; None = $JOINTSPACE_CACHE or ~/.cache/jointspace
        "channels_last": True,      # faster CPU convolutions
        "train_blocks": 0,          # partial fine-tuning of a pretrained EfficientNet: its last k units (the head
                                    # convolution, then MBConv blocks from the top) train over cached activations
                                    # of the frozen units below them; 0 = frozen backbone
        "pooling": "mean",          # over the final feature grid: mean (global average pooling) | gpo (VSE∞)
        "options": {},              # backbone-specific (e.g. smallcnn width)
    },
    "text": {
        "encoder": "gru",           # gru | bow | ... (training.text_encoders registry)
        "word_dim": 300,            # STT §4.2
        "hidden": 1024,             # STT §4.2
        "layers": 1,
        "bidirectional": False,
        "dropout": 0.0,
        "options": {},
    },
    "model": {
        "embed_dim": 1024,          # STT Table 4: 1024
        "projection": "linear",     # linear (STT §3.1: one FC) | two_branch (two-branch §3.1) | mlp (BiR §5.2:
                                    # FC-ReLU-FC) | none (W2VV §III: the visual feature space itself)
        "text_projection": None,    # the text side's projection when it differs; None = same as projection
        "projection_hidden": 2048,  # two_branch: width of the hidden FC layer
        "projection_dropout": 0.0,
        "similarity": "cosine",     # cosine (STT eq. 8) | order (STT eq. 9)
    },
    "loss": {
        "name": "max_violation",    # sum (STT eq. 7) | max_violation (RCN eqs. 11-13) | khardest | hard | semihard | hard_semihard
        "margin": 0.2,
        "k": 10,                    # khardest: negatives per anchor (two-branch §3.3)
        "lambda": 1.0,              # weight of the caption-anchored direction (two-branch eq. 3)
        "reduction": "sum",         # sum over the batch (STT eq. 7) or mean (RCN eq. 11)
        "warmup_epochs": 0,         # use the sum of hinges (STT eq. 7) this many epochs first: hardest-negative
                                    # training from scratch can collapse to one point (VSE++ §3.3)
        "options": {},
    },
    "train": {
        "epochs": 30,
        "batch_size": 128,          # STT §4.2
        "lr": 2.0e-4,               # STT §4.2
        "lr_decay_epochs": 15,      # STT §4.2: 2e-4 for 15 epochs, then 2e-5
        "lr_decay_factor": 0.1,
        "weight_decay": 0.0,
        "grad_clip": 2.0,
        "patience": 10,             # early stopping (epochs without a better select_on value)
        "select_on": "rsum",        # best checkpoint + early stopping: rsum (validation R-sum) | nll (the
                                    # decoder's validation NLL per word: captions keep improving after R-sum)
        "seed": 0,
        "device": "auto",           # auto | cpu | cuda
        "amp": "auto",              # auto (bf16 autocast on CUDA) | off
        "workers": 2,               # image decoding processes
        "eval_every": 1,
        "finetune_epochs": 0,       # STT §4.2 second stage: train the backbone end to end
        "finetune_lr": 2.0e-5,
        "finetune_batch_size": 32,
        "sampling": "caption",      # caption: every (image, caption) pair once per epoch;
                                    # image: every image once per epoch with one random caption of it
                                    # minimal_pairs: image, with each minimal pair in one batch (hard negatives)
        "max_steps_per_epoch": None,  # cap for smoke runs
        "optimizer": "adam",        # adam (STT §4.2) | rmsprop (W2VV §III-B) | sgd (BiR §6.3: no momentum)
        "optimizer_options": {},    # extra optimiser arguments, e.g. {alpha: 0.9, eps: 1.0e-6} for rmsprop
        "lr_schedule": "step",      # step: x lr_decay_factor once after lr_decay_epochs (STT §4.2)
                                    # plateau: x lr_decay_factor after lr_plateau_patience epochs without a
                                    #   better val R-sum (W2VV §III-B) | linear: down to lr_final_factor at
                                    #   lr_decay_epochs (BiR §6.3) | cosine: per update, warm-up, then a
                                    #   half cosine down to lr_final_factor at the last epoch (SGDR, VSE∞)
        "lr_plateau_patience": 3,
        "warmup_steps": 0,          # cosine: linear warm-up over this many updates first
        "encoder_lr_factor": 1.0,   # lr of the pretrained encoder weights being trained (text.options.train_layers,
                                    # finetune; image.train_blocks; the finetune stage's backbone) as a multiple
                                    # of the stage's lr: 0.1 trains them 10x slower than the heads
        "cache_dtype": "float16",   # stored frozen-bottom activations (train_layers, train_blocks): float16 | float32
        "lr_final_factor": 0.01,
        "init_from": None,          # a model.pt whose same-named tensors start this run (e.g. a retrieval
                                    # model's projections under a new STT decoder)
        "freeze": [],               # top-level modules not trained: backbone, image_proj, text_encoder, text_proj, decoder
    },
    "decoder": {                    # STT §3.2: a sentence decoder trained jointly on the common space
        "enabled": False,           # False: retrieval only (no decoder in the model)
        "rnn": "gru",               # gru | lstm
        "word_dim": 300,
        "hidden": 1024,
        "layers": 1,
        "dropout": 0.0,             # on the word embeddings and the RNN outputs
        "cond_dropout": 0.0,        # on the conditioning vector (image or sentence embedding), training only
        "lambda_ic": 1.0,           # λ1 of eq. 12: image captioning loss (eq. 10)
        "lambda_para": 1.0,         # λ2 of eq. 12: sentence paraphrasing loss (eq. 11)
        "lambda_sim": 1.0,          # λ3 of eq. 12: the ranking loss of the loss section (eq. 7)
        "beam_size": 3,             # inference defaults (CLI, evaluation, service); 1 = greedy
        "max_len": 20,              # words generated at most
        "length_penalty": 1.0,      # hypotheses ranked by log P / steps**length_penalty (0 = raw log P)
        "no_repeat": True,          # never emit the same word twice in a row
        "no_repeat_ngram": 0,       # m > 0: no m-gram twice in one sentence ("on a bike on a bike"); 0 = off
    },
    "attention": {                  # STT-ATT §3.3: region-word attention similarity (eqs. 13-17)
        "enabled": False,
        "grid": 0,                  # regions = CNN feature-map cells, average-pooled to grid x grid (0: as is)
        "temperature": 9.0,         # λ of eq. 15 (softmax temperature over the words)
        "pooled_weight": 1.0,       # ranking loss on the pooled vectors too (they feed the decoder and index)
    },
    "scst": {                       # self-critical sequence training (Rennie et al. 2017; not in STT): after the
                                    # eq. 12 stages, the decoder alone learns to maximise CIDEr-D (training/scst.py)
        "steps": 0,                 # updates; 0 = off
        "lr": 5.0e-5,               # Adam (Rennie et al. §5: 5e-5)
        "images_per_batch": 16,     # training images per update (captioning; paraphrasing one caption of each)
        "samples": 5,               # sentences sampled per input; each one's baseline is the others' mean reward
        "eval_every": 100,          # updates between val CIDEr-D (greedy) checks; the best checkpoint is kept
    },
}

_OPEN_MAPS = {("text", "options"), ("image", "options"), ("loss", "options"), ("train", "optimizer_options")}


class ConfigError(ValueError):
    """A config file or override names a key that does not exist or has a bad value."""


def _merge(base: dict, update: dict, path: tuple[str, ...] = ()) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        here = path + (key,)
        if here in _OPEN_MAPS:  # encoder/loss-specific options: any key is allowed
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{'.'.join(here)}' is a mapping; got {value!r}")
            out[key] = _merge_open(base[key], value)
            continue
        if key not in base:
            raise ConfigError(f"unknown config key '{'.'.join(here)}' (known: {', '.join(sorted(base))})")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{'.'.join(here)}' is a section; got {value!r}")
            out[key] = _merge(base[key], value, here)
        else:
            out[key] = _coerce(base[key], value, here)
    return out


def _coerce(default: Any, value: Any, here: tuple[str, ...]) -> Any:
    """YAML 1.1 reads ``1e-4`` as a string; a key whose default is a number takes numbers only."""
    if isinstance(default, float) and isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"config key '{'.'.join(here)}' must be a number, got {value!r}") from None
    return value


def _merge_open(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = _merge_open(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=1e-4"`` → (["train", "lr"], 1e-4); the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"--set has an empty key: {item!r}")
    return keys, yaml.safe_load(raw) if raw.strip() else None


def _nest(keys: list[str], value: Any) -> dict:
    out: Any = value
    for key in reversed(keys):
        out = {key: out}
    return out


def build_config(file_values: dict | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Defaults ← file values ← ``--set`` overrides, checking every key."""
    cfg = _merge(DEFAULTS, file_values or {})
    for item in overrides:
        keys, value = parse_override(item)
        cfg = _merge(cfg, _nest(keys, value))
    validate(cfg)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    values: dict = {}
    if path is not None:
        text = Path(path).read_text()
        values = yaml.safe_load(text) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: a config file must be a YAML mapping")
    return build_config(values, overrides)


def validate(cfg: dict) -> None:
    t = cfg["train"]
    for key in ("epochs", "batch_size", "finetune_batch_size"):
        if not isinstance(t[key], int) or t[key] < (0 if key == "epochs" else 1):
            raise ConfigError(f"train.{key} must be a positive integer, got {t[key]!r}")
    if cfg["image"]["crops"] not in (1, 5, 10):
        raise ConfigError(f"image.crops must be 1, 5 or 10, got {cfg['image']['crops']!r}")
    im = cfg["image"]
    if im["train_crops"] not in (0, 5, 10) or isinstance(im["train_crops"], bool):
        raise ConfigError(f"image.train_crops must be 0 (off), 5 or 10, got {im['train_crops']!r}")
    if not isinstance(im["train_resize"], int) or im["train_resize"] < im["image_size"]:
        raise ConfigError(f"image.train_resize must be an integer >= image.image_size ({im['image_size']}), "
                          f"got {im['train_resize']!r}")
    if im["train_crops"] and cfg.get("attention", {}).get("enabled"):
        raise ConfigError("image.train_crops does not apply to STT-ATT grid features (attention.enabled)")
    if isinstance(im["train_blocks"], bool) or not isinstance(im["train_blocks"], int) or im["train_blocks"] < 0:
        raise ConfigError(f"image.train_blocks must be an integer >= 0, got {im['train_blocks']!r}")
    if im["pooling"] not in ("mean", "gpo"):
        raise ConfigError(f"image.pooling must be mean or gpo, got {im['pooling']!r}")
    if (im["train_blocks"] or im["pooling"] != "mean") and (im["crops"] != 1 or cfg["attention"]["enabled"]):
        raise ConfigError("image.train_blocks and image.pooling: gpo need image.crops: 1 and no attention "
                          "(the cached activations are per view, pooled after the trained top)")
    if cfg["model"]["similarity"] not in ("cosine", "order"):
        raise ConfigError(f"model.similarity must be 'cosine' or 'order', got {cfg['model']['similarity']!r}")
    if cfg["loss"]["reduction"] not in ("sum", "mean"):
        raise ConfigError(f"loss.reduction must be 'sum' or 'mean', got {cfg['loss']['reduction']!r}")
    if t["sampling"] not in ("caption", "image", "minimal_pairs"):
        raise ConfigError(f"train.sampling must be caption, image or minimal_pairs, got {t['sampling']!r}")
    if t["optimizer"] not in ("adam", "rmsprop", "sgd"):
        raise ConfigError(f"train.optimizer must be adam, rmsprop or sgd, got {t['optimizer']!r}")
    if t["lr_schedule"] not in ("step", "plateau", "linear", "cosine"):
        raise ConfigError(f"train.lr_schedule must be step, plateau, linear or cosine, got {t['lr_schedule']!r}")
    if isinstance(t["warmup_steps"], bool) or not isinstance(t["warmup_steps"], int) or t["warmup_steps"] < 0:
        raise ConfigError(f"train.warmup_steps must be an integer >= 0, got {t['warmup_steps']!r}")
    if not isinstance(t["encoder_lr_factor"], (int, float)) or not 0 < t["encoder_lr_factor"] <= 10:
        raise ConfigError(f"train.encoder_lr_factor must be in (0, 10], got {t['encoder_lr_factor']!r}")
    if t["cache_dtype"] not in ("float16", "float32"):
        raise ConfigError(f"train.cache_dtype must be float16 or float32, got {t['cache_dtype']!r}")
    if not isinstance(t["lr_plateau_patience"], int) or t["lr_plateau_patience"] < 1:
        raise ConfigError(f"train.lr_plateau_patience counts epochs without a validation gain before the lr drops: "
                          f"an integer >= 1 (1 = at the first such epoch), got {t['lr_plateau_patience']!r}")
    if t["select_on"] not in ("rsum", "nll"):
        raise ConfigError(f"train.select_on must be rsum or nll, got {t['select_on']!r}")
    if t["select_on"] == "nll" and not (cfg["decoder"]["enabled"]
                                        and cfg["decoder"]["lambda_ic"] + cfg["decoder"]["lambda_para"] > 0):
        raise ConfigError("train.select_on: nll needs a decoder (decoder.enabled, lambda_ic or lambda_para > 0)")
    if not isinstance(t["freeze"], list) or not all(isinstance(m, str) for m in t["freeze"]):
        raise ConfigError(f"train.freeze must be a list of module names, got {t['freeze']!r}")
    if t["init_from"] is not None and not isinstance(t["init_from"], str):
        raise ConfigError(f"train.init_from must be a model.pt path, got {t['init_from']!r}")
    if t["device"] not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"train.device must be auto, cpu or cuda, got {t['device']!r}")
    d = cfg["decoder"]
    if d["rnn"] not in ("gru", "lstm"):
        raise ConfigError(f"decoder.rnn must be gru or lstm, got {d['rnn']!r}")
    if not all(isinstance(d[k], (int, float)) and 0 <= d[k] < 1 for k in ("dropout", "cond_dropout")):
        raise ConfigError(f"decoder.dropout and decoder.cond_dropout must be in [0, 1), got {d['dropout']!r} and "
                          f"{d['cond_dropout']!r}")
    if any(d[k] < 0 for k in ("lambda_ic", "lambda_para", "lambda_sim")):
        raise ConfigError("decoder.lambda_ic, lambda_para and lambda_sim must be >= 0")
    if not isinstance(d["no_repeat_ngram"], int) or isinstance(d["no_repeat_ngram"], bool) or d["no_repeat_ngram"] < 0:
        raise ConfigError(f"decoder.no_repeat_ngram must be an integer >= 0 (0 = off), got {d['no_repeat_ngram']!r}")
    if not isinstance(d["beam_size"], int) or d["beam_size"] < 1:
        raise ConfigError(f"decoder.beam_size must be a positive integer, got {d['beam_size']!r}")
    sc = cfg["scst"]
    for key, low in (("steps", 0), ("images_per_batch", 1), ("samples", 2), ("eval_every", 1)):
        if not isinstance(sc[key], int) or isinstance(sc[key], bool) or sc[key] < low:
            raise ConfigError(f"scst.{key} must be an integer >= {low}, got {sc[key]!r}")
    if not sc["lr"] > 0:
        raise ConfigError(f"scst.lr must be > 0, got {sc['lr']!r}")
    if sc["steps"] and not (d["enabled"] and d["lambda_ic"] + d["lambda_para"] > 0):
        raise ConfigError("scst.steps > 0 needs a decoder (decoder.enabled, lambda_ic or lambda_para > 0)")
    if cfg["attention"]["enabled"] and (cfg["model"]["similarity"] != "cosine" or cfg["text"]["encoder"] != "gru"):
        raise ConfigError("attention (STT-ATT) needs model.similarity: cosine and text.encoder: gru")


def dump_config(cfg: dict) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)
