"""The registry every part of tangentlens asks for probes: the built-in catalogue, the probes
installed packages register, and those a recipe names by import path.

A probe module declares one :class:`~tangentlens.contract.Probe` value, conventionally named
``PROBE`` (:mod:`tangentlens.contract`, re-exported here with the inputs of each scope): its
name (the ``probe`` column of its rows and its ``[probes.<name>]`` recipe table), its config
class (the recipe table *is* that frozen dataclass), what it needs from a capture
(:class:`Needs`), its scope (:data:`SCOPES`), its rows function, its metrics with their
definitions (the docs' metric glossary is generated from them, :mod:`tangentlens.glossary`)
and what it reports (:mod:`tangentlens.reporting`). Recipe parsing, the plan, the units, the
memory plan, ``measure``, the report, its figures, ``compare`` and the manifest ask this
registry.

Where probes come from, in this order:

* the built-in catalogue: every module of :mod:`tangentlens.probes` that defines ``PROBE``;
* installed packages: entry points of the group :data:`ENTRY_POINT_GROUP` (``tangentlens.probes``)
  naming a ``Probe`` value (``grad_norm = "mypkg.grad_norm:PROBE"``);
* an import path written as the recipe's probe key: ``[probes."mypkg.grad_norm:PROBE"]`` (or the
  module alone, whose ``PROBE`` is taken).

This module imports neither torch nor a model library: a recipe is checked without them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangentlens.capture.needs import Needs
from tangentlens.checks import suggest
from tangentlens.contract import (
    FIT_PROBE,
    SCOPES,
    STATE_KEYS,
    AcrossInputs,
    ModelFreeInputs,
    Probe,
    StateInputs,
    StepInputs,
    Transition,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "FIT_PROBE",
    "SCOPES",
    "STATE_KEYS",
    "AcrossInputs",
    "ModelFreeInputs",
    "Probe",
    "ProbeEntry",
    "StateInputs",
    "StepInputs",
    "Transition",
    "builtin_probes",
    "entries",
    "installed_probes",
    "resolve",
]

#: The entry-point group an installed package registers its probes under.
ENTRY_POINT_GROUP = "tangentlens.probes"


@functools.cache
def builtin_probes() -> dict[str, Probe]:
    """The built-in catalogue: name → probe of every :mod:`tangentlens.probes` module that
    declares ``PROBE`` (modules imported here; they import no torch until they run)."""
    import tangentlens.probes as package

    found: dict[str, Probe] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        probe = getattr(module, "PROBE", None)
        if isinstance(probe, Probe):
            found[probe.name] = probe
    return found


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load(target: str, source: str) -> Probe:
    """The ``Probe`` at ``module:attribute`` (or ``module``, taking its ``PROBE``)."""
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise ValueError(
            f"probe {source}: cannot import {module_name!r} ({type(error).__name__}: {error})"
        ) from None
    name = attribute or "PROBE"
    if not hasattr(module, name):
        probes = [n for n, v in vars(module).items() if isinstance(v, Probe) and n[0] != "_"]
        offered = f"; its probes: {', '.join(probes)}" if probes else ""
        raise ValueError(
            f"probe {source}: module {module_name} has no attribute {name!r}"
            f"{offered}{suggest(name, probes)}"
        )
    value = getattr(module, name)
    if not isinstance(value, Probe):
        raise ValueError(
            f"probe {source}: {module_name}:{attribute or 'PROBE'} is not a tangentlens.registry"
            f".Probe (got {type(value).__name__})"
        )
    return value


@functools.cache
def installed_probes() -> dict[str, Probe]:
    """Probes registered by installed packages (entry points of :data:`ENTRY_POINT_GROUP`); a
    name taken by a built-in probe is refused."""
    out: dict[str, Probe] = {}
    for name, entry in _entry_points().items():
        probe = _load(entry.value, f"{name!r} (entry point {entry.value!r})")
        if probe.name != name:
            raise ValueError(
                f"entry point {name!r} ({entry.value}) declares a probe named {probe.name!r}: "
                "register it under its own name"
            )
        if name in builtin_probes():
            raise ValueError(f"entry point {name!r} ({entry.value}) shadows a built-in probe")
        out[name] = probe
    return out


def resolve(key: str) -> Probe:
    """The probe a recipe names: a built-in or registered name, or an import path
    (``package.module:ATTRIBUTE`` or ``package.module``). Unknown names are refused with the
    allowed ones."""
    if key in builtin_probes():
        return builtin_probes()[key]
    if "." in key or ":" in key:
        probe = _import_path(key)
        if probe.name in builtin_probes():
            raise ValueError(f"probe {key!r} is named {probe.name!r}, a built-in probe's name")
        return probe
    if key in _entry_points():
        return installed_probes()[key]
    allowed = [*builtin_probes(), *_entry_points()]
    raise ValueError(
        f"unknown probe {key!r}; allowed: {allowed} (or an import path, "
        f"'package.module:PROBE'){suggest(key, allowed)}"
    )


@functools.cache
def _import_path(key: str) -> Probe:
    return _load(key, repr(key))


@dataclass(frozen=True)
class ProbeEntry:
    """One probe of a recipe, resolved: its recipe ``key`` (a name or an import path), the
    ``probe`` the registry found for it and its validated ``config`` (an instance of
    ``probe.config``)."""

    key: str
    probe: Probe[Any]
    config: Any

    @property
    def needs(self) -> Needs:
        """What the probe needs from a capture with this config (``Probe.needs_for``)."""
        return self.probe.needs_for(self.config)


def entries(configs: Mapping[str, Any]) -> dict[str, ProbeEntry]:
    """Key → :class:`ProbeEntry` of a recipe's probes, from each key's config (its probe found
    by :func:`resolve`) or its entry (kept: a probe already found, or one given as a value, as
    :func:`tangentlens.conformance.check_probe` does); two keys declaring one name and a config
    of another class than the probe's are refused."""
    out: dict[str, ProbeEntry] = {}
    names: dict[str, str] = {}
    for key, config in configs.items():
        if isinstance(config, ProbeEntry):
            probe, config = config.probe, config.config
        else:
            probe = resolve(key)
        if probe.name in names:
            raise ValueError(
                f"probes {names[probe.name]!r} and {key!r} are both named {probe.name!r}"
            )
        names[probe.name] = key
        if not isinstance(config, probe.config):
            raise ValueError(
                f"probes.{key}: its config must be a {probe.config.__name__}, got "
                f"{type(config).__name__}"
            )
        out[key] = ProbeEntry(key, probe, config)
    return out
