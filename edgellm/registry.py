"""One generic registry: duplicate names fail, unknown names get "did you mean" plus every choice."""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable, Collection, Iterator
from typing import Generic, TypeVar

from edgellm.errors import BugError, UnsupportedError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> None:
        if name in self._items:
            raise BugError(f"{self.what} {name!r} registered twice ({self._items[name]!r} and {item!r})")
        self._items[name] = item

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator registering the decorated object under each of ``names``."""
        if not names:
            raise BugError(f"register() for {self.what} needs at least one name")

        def deco(item: T) -> T:
            for name in names:
                self.add(name, item)
            return item

        return deco

    def remove(self, name: str) -> None:
        """Drop a name (tests that register a throwaway item clean up with it); an unknown name is a bug."""
        if self._items.pop(name, None) is None:
            raise BugError(f"{self.what} {name!r} is not registered")

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnsupportedError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        choices = sorted(self._items)
        close = difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        return f"unknown {self.what} {name!r}{hint}; registered: {', '.join(choices) or '(none)'}"

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())

    def __len__(self) -> int:
        return len(self._items)


def import_submodules(package: str, *, skip: Collection[str] = (), private: bool = True) -> list[str]:
    """Import every module and subpackage of ``package`` but those named in ``skip`` (and, unless ``private``, those
    whose name starts with ``_``), sorted by name (a stable registration order): their decorators fill the
    registries; returns their names. The one place the farm and the library walk a package: called when a registry
    is first asked, never at import."""
    module = importlib.import_module(package)
    names = [info.name for info in sorted(pkgutil.iter_modules(module.__path__), key=lambda m: m.name)
             if info.name not in skip and (private or not info.name.startswith("_"))]
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names
