"""Build things by name: every encoder, backbone, loss and similarity has a name a config can use."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of builders, given whole (``Registry("loss", {"sum": SumOfHinges})``) or added with
    ``@REG.register("name")`` in the module that defines them; ``REG.get("name")`` returns one."""

    def __init__(self, kind: str, items: dict[str, T] | None = None):
        self.kind = kind
        self._items: dict[str, T] = dict(items or {})

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} '{name}' is registered twice")
            self._items[name] = item
            return item
        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} '{name}'; choose one of: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
