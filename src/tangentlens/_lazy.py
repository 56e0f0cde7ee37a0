"""Lazy package exports (PEP 562): a package re-exports names of its modules, each imported on
first access. Importing a light module of a package (a config, a schedule) then imports only
that module, not torch or transformer_lens through its heavier siblings."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["LazyModule", "lazy_exports"]


def lazy_exports(
    package: str,
    names: Mapping[str, Sequence[str]] | None = None,
    *,
    submodules: Sequence[str] = (),
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for the package named ``package``.

    ``names`` maps a module (absolute, or relative to the package: ``".suites"``) to the names
    the package re-exports from it; ``submodules`` are submodules exported as themselves. Each
    is imported on first access and bound on the package, so later lookups are plain.
    """
    source = {name: module for module, listed in (names or {}).items() for name in listed}
    exported = sorted({*source, *submodules})

    def getattr_(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")  # the import binds it
        if name not in source:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exported})

    return exported, getattr_, dir_


class LazyModule:
    """A module imported on first attribute access: ``torch = LazyModule("torch")`` at module
    level keeps a light module light until one of its functions runs."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
