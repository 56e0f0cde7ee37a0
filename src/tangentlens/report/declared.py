"""Which probes a report shows, and what each declares (:mod:`tangentlens.reporting`): the
probes whose rows are present — the built-in ones first, then the others — each group by scope
(:data:`~tangentlens.contract.SCOPES` order) and name. A probe the registry cannot find here (a
user's probe not installed where the report is drawn) gets the default table and figure of
the metrics its rows hold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tangentlens.findings import Findings
from tangentlens.registry import FIT_PROBE, SCOPES, builtin_probes, resolve
from tangentlens.reporting import Figure, Table, default_figures, default_tables

__all__ = ["Reported", "reported_probes"]

#: Rows the core writes (not a probe's): the capture's and the proxy fit's.
CORE_ROWS = ("capture", FIT_PROBE)


@dataclass(frozen=True)
class Reported:
    """A probe present in the rows, with its declared (or default) tables and figures, and
    its declared findings (none for a probe the registry cannot find)."""

    name: str
    tables: tuple[Table, ...]
    figures: tuple[Figure, ...]
    order: tuple[bool, int, str]
    findings: tuple[Findings, ...] = ()


def _declared(name: str, key: str, metrics: list[str]) -> Reported:
    try:
        probe = resolve(key)
    except ValueError:
        probe = None
    if probe is None or probe.name != name:
        order = (True, len(SCOPES), name)
        return Reported(name, default_tables(name, metrics), default_figures(name, metrics), order)
    order = (name not in builtin_probes(), list(SCOPES).index(probe.scope), name)
    return Reported(name, probe.tables, probe.figures, order, probe.reporting.findings)


def reported_probes(
    rows: Iterable[Mapping[str, Any]], manifests: Iterable[Mapping[str, Any]]
) -> list[Reported]:
    """The probes of ``rows`` (core rows aside), built-in first, by scope and name; the
    manifests' ``probes`` say which recipe key found each."""
    metrics: dict[str, list[str]] = {}
    for r in rows:
        if r["probe"] not in CORE_ROWS:
            metrics.setdefault(r["probe"], [])
            if r["metric"] not in metrics[r["probe"]]:
                metrics[r["probe"]].append(r["metric"])
    keys: dict[str, str] = {}
    for manifest in manifests:
        for key, entry in manifest.get("probes", {}).items():
            name = entry.get("name", key) if isinstance(entry, Mapping) else key
            keys.setdefault(name, key)
    found = [_declared(name, keys.get(name, name), sorted(metrics[name])) for name in metrics]
    return sorted(found, key=lambda probe: probe.order)
