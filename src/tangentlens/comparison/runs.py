"""Run directories read for a comparison: the manifest, the rows, the number of layers, and where
each row sits in the model (its site kind and relative depth).

Relative depth puts models of different depths on one axis: the embedding is at 0 and a site in
block ``l`` of an ``n_layers``-block model at ``(l + 1) / n_layers`` (the share of the blocks the
residual stream has passed once the block is done: the last block is at 1). A 4-block and a
12-block model meet at 1/4, 1/2, 3/4 and 1 (blocks 0, 1, 2, 3 against 2, 5, 8, 11). Rows about
the whole model (site ``"-"``) have no depth.

>>> relative_depth("embed", None, 4), relative_depth("resid_post", 2, 12)
(Fraction(0, 1), Fraction(1, 4))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from tangentlens.core.proxy_stage import move_legacy_keys
from tangentlens.models.sites import site_kind
from tangentlens.sweep.store import read_parts, read_replicates, read_results

__all__ = [
    "ACROSS_PART",
    "MODEL_LEVEL",
    "Run",
    "read_run",
    "relative_depth",
    "row_identity",
    "row_place",
]

Row = dict[str, Any]

#: The site kind of rows about the whole model (site ``"-"``: losses, token counts, correlations
#: across layers).
MODEL_LEVEL = "-"
#: The result part of a run's across-steps unit (the rows that compare steps).
ACROSS_PART = "results/across-steps.parquet"


@dataclass(frozen=True)
class Run:
    """One run directory: ``label`` (its name in the comparison), ``root``, ``manifest``,
    every row (``rows``, all steps), ``n_layers`` (the suite's blocks), ``finished`` (False
    for a run still going or stopped: its rows so far are compared), the bootstrap
    replicates it kept (``replicates``: one record per row with an interval, see
    :data:`tangentlens.results.REPLICATE_FIELDS`; empty unless the sweep kept them) and which
    rows compare steps (``across``: the identities, :func:`row_identity`, of the rows the
    across-steps unit wrote — each reads the transition from the previous scored step)."""

    label: str
    root: Path
    manifest: dict[str, Any]
    rows: tuple[Row, ...]
    n_layers: int
    replicates: tuple[Row, ...] = ()
    across: frozenset[tuple[Any, ...]] = frozenset()

    def place(self, row: Row) -> tuple[str, Fraction | None]:
        """Where ``row`` (one of this run's) sits in the model: :func:`row_place`."""
        return row_place(row, self.n_layers)

    def is_across(self, row: Row) -> bool:
        """Whether ``row`` (one of this run's) compares steps: a transition into its step."""
        return row_identity(row) in self.across

    def transition(self, step: int) -> tuple[int | None, int]:
        """The transition an across row at ``step`` reads: ``(previous scored step, step)``
        (None before the first)."""
        earlier = [s for s in self.steps if s < step]
        return (earlier[-1] if earlier else None, step)

    @property
    def finished(self) -> bool:
        return bool(self.manifest.get("finished"))

    @property
    def steps(self) -> list[int]:
        """The scored steps with rows: the manifest's ``steps`` that have rows (not the fit
        window's other checkpoints, which only the proxy fit's rows name; not model-free rows,
        at a negative step)."""
        present = {r["step"] for r in self.rows if r["step"] is not None and r["step"] >= 0}
        scored = self.manifest.get("steps")
        return sorted(present if scored is None else present & set(scored))

    @property
    def recipe(self) -> dict[str, Any]:
        """The manifest's recipe (a run from before the ``[proxies]`` stage: its keys read from
        ``probes.tangent_energy``, where they were recorded)."""
        return move_legacy_keys(self.manifest.get("recipe", {}), notice=False)

    def pick_step(self, step: int | str) -> int:
        """``"last"`` → the last scored step with rows; an integer → that step, which the run must
        have (a ``ValueError`` listing its steps otherwise)."""
        steps = self.steps
        if not steps:
            raise ValueError(f"run {self.label} ({self.root}) holds no checkpoint rows yet")
        if step == "last":
            return steps[-1]
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"step must be 'last' or a checkpoint step (an integer), got {step!r}")
        if step not in steps:
            raise ValueError(f"run {self.label} has no rows at step {step}; its steps: {steps}")
        return step


def _n_layers(root: Path, manifest: dict[str, Any]) -> int:
    """The manifest's ``n_layers``; for a run written before it was recorded, the suite's shape
    as the sweep planned it (a mini suite's config, Pythia's table, a hub suite's published
    config, a local folder's ``config.json``)."""
    if "n_layers" in manifest:
        return int(manifest["n_layers"])
    from tangentlens.models.shapes import suite_shape

    name = manifest.get("recipe", {}).get("suite", {}).get("name")
    try:
        return suite_shape(name).n_layers
    except (ValueError, OSError, KeyError, TypeError) as error:
        raise ValueError(
            f"{root}: the number of layers is unknown (the manifest has no n_layers and suite "
            f"{name!r} cannot be read: {error})"
        ) from None


def read_run(path: str | Path, label: str | None = None) -> Run:
    """The run in ``path`` (a directory written by ``tangentlens sweep``, finished or not)."""
    root = Path(path)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"{root} is not a run directory (no manifest.json)")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    rows = tuple(read_results(root).to_pylist())
    replicates = tuple(read_replicates(root).to_pylist())
    part = root / ACROSS_PART
    across = frozenset(
        row_identity(r) for r in (read_parts([part]).to_pylist() if part.is_file() else [])
    )
    n_layers = _n_layers(root, manifest)
    return Run(label or root.name, root, manifest, rows, n_layers, replicates, across)


def row_identity(row: Row) -> tuple[Any, ...]:
    """What names one row of a run: its step, probe, metric, site, method, rank and bin."""
    return tuple(row[k] for k in ("step", "probe", "metric", "site", "method", "rank", "freq_bin"))


def relative_depth(kind: str, layer: int | None, n_layers: int) -> Fraction | None:
    """0 for the embedding, ``(layer + 1) / n_layers`` for a site of block ``layer``, None for a
    row without a layer that is not the embedding (a row about the whole model)."""
    if kind == "embed":
        return Fraction(0)
    if layer is None:
        return None
    return Fraction(layer + 1, n_layers)


def row_place(row: Row, n_layers: int) -> tuple[str, Fraction | None]:
    """``(site kind, relative depth)`` of a row; a site name of no known kind is its own kind
    (so it matches only the same name)."""
    site = row["site"]
    kind = MODEL_LEVEL if site == MODEL_LEVEL else site_kind(site) or site
    return kind, relative_depth(kind, row["layer"], n_layers)
