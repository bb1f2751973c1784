"""Run configuration: YAML files with sections ``data image text model loss train decoder attention scst querybank``.

Every key has a default (the typed models of config_schema.py), so a config file names only what it
changes. A key that is not there is an error (a typo must not silently train the wrong model), and so is a
value of the wrong type or outside its allowed values; ``--set a.b=value`` overrides any key by its dotted
path, the value parsed as YAML (``--set train.lr=1e-4``, ``--set text.encoder=bow``).

The names (``text.encoder``, ``image.backbone``, ``loss.name``, ``model.similarity``) are the registry's
(``models/factory.py``), and the option maps (``text.options``, ``image.options``, ``loss.options``) are checked
against the options model of the name they configure: an unknown name or option is an error that lists the known
ones.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import ValidationError

from training.models.factory import BACKBONES, LOSSES, TEXT_ENCODERS
from .config_schema import ExtraBackbone, RunConfig, defaults

DEFAULTS: dict[str, Any] = defaults()       # every key and its default: config_schema.py

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


def build_config(file_values: dict | None = None, overrides: Sequence[str] = ()) -> dict:
    """Defaults ← file values ← ``--set`` overrides, checking every key."""
    cfg = _merge(DEFAULTS, file_values or {})
    for item in overrides:
        keys, value = parse_override(item)
        cfg = _merge(cfg, _nest(keys, value))
    validate(cfg)
    # every key of each extra backbone, its defaults filled in (the code reads cfg["image"]["extra_backbones"])
    cfg["image"]["extra_backbones"] = [ExtraBackbone.model_validate(e).model_dump()
                                       for e in cfg["image"]["extra_backbones"]]
    return cfg


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> dict:
    values: dict = {}
    if path is not None:
        text = Path(path).read_text()
        values = yaml.safe_load(text) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: a config file must be a YAML mapping")
    return build_config(values, overrides)


def _where(loc: tuple) -> str:
    return ".".join(str(x) for x in loc)


def _explain(err: ValidationError, prefix: str = "") -> ConfigError:
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])   # a misspelt key first
    key = prefix + _where(first["loc"])
    if first["type"] == "extra_forbidden":
        return ConfigError(f"unknown config key '{key}'")
    if first["type"] == "value_error":                        # e.g. a name the registry does not have
        return ConfigError(f"config key '{key}': {first['ctx']['error']}")
    return ConfigError(f"config key '{key}': {first['msg']} (got {first.get('input')!r})")


def _check_options(cfg: dict) -> None:
    """Each option map against the options model of the encoder / backbone / loss it configures."""
    for registry in (TEXT_ENCODERS, BACKBONES, LOSSES):
        section, selector = registry.key.split(".")
        try:
            registry.check_options(cfg[section][selector], cfg[section]["options"])
        except ValueError as err:
            raise ConfigError(str(err)) from None


def validate(cfg: dict) -> None:
    try:
        RunConfig.model_validate(cfg)
    except ValidationError as err:
        raise _explain(err) from None
    _check_options(cfg)
    t = cfg["train"]
    for key in ("epochs", "batch_size", "finetune_batch_size"):
        if not isinstance(t[key], int) or t[key] < (0 if key == "epochs" else 1):
            raise ConfigError(f"train.{key} must be a positive integer, got {t[key]!r}")
    if cfg["image"]["crops"] not in (1, 5, 10):
        raise ConfigError(f"image.crops must be 1, 5 or 10, got {cfg['image']['crops']!r}")
    im = cfg["image"]
    if im["train_crops"] not in (0, 5, 10) or isinstance(im["train_crops"], bool):
        raise ConfigError(f"image.train_crops must be 0 (off), 5 or 10, got {im['train_crops']!r}")
    if not isinstance(im["train_resize"], int) or (im["train_crops"] and im["train_resize"] < im["image_size"]):
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
    if im["extra_backbones"] and (im["train_blocks"] or im["pooling"] != "mean" or cfg["attention"]["enabled"]
                                  or cfg["train"]["finetune_epochs"]):
        raise ConfigError("image.extra_backbones are frozen and pooled: they take no image.train_blocks, "
                          "image.pooling: gpo, attention or train.finetune_epochs")
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
