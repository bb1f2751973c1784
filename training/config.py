"""Run configuration: YAML files with sections ``data image text model loss train decoder attention scst querybank``.

Every key has a default (the typed models of models/config_schema.py), so a config file names only what it
changes. A key that is not there is an error (a typo must not silently train the wrong model), and so is a
value of the wrong type or outside its allowed values; ``--set a.b=value`` overrides any key by its dotted
path, the value parsed as YAML (``--set train.lr=1e-4``, ``--set text.encoder=bow``).

The names (``text.encoder``, ``image.backbone``, ``loss.name``, ``model.similarity``) are the registry's
(``models/factory.py``), and the option maps (``text.options``, ``image.options``, ``loss.options``) are checked
against the options model of the name they configure: an unknown name or option is an error that lists the known
ones. :func:`build_config` and :func:`load_config` return the typed :class:`RunConfig`.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import yaml

from training.models.config_schema import ConfigError, RunConfig, complete, defaults

DEFAULTS: dict[str, Any] = defaults()       # every key and its default: models/config_schema.py

_OPEN_MAPS = {("text", "options"), ("image", "options"), ("loss", "options"), ("train", "optimizer_options")}


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


def build_config(file_values: dict | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Defaults ← file values ← ``--set`` overrides, checking every key; every option map filled in."""
    cfg = _merge(DEFAULTS, file_values or {})
    for item in overrides:
        keys, value = parse_override(item)
        cfg = _merge(cfg, _nest(keys, value))
    return complete(cfg)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    values: dict = {}
    if path is not None:
        text = Path(path).read_text()
        values = yaml.safe_load(text) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: a config file must be a YAML mapping")
    return build_config(values, overrides)


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(), sort_keys=False)
