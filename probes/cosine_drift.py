"""Cosine anisotropy and drift of the mean (Godey et al. 2024; METHODS.md §3), per site, from the
streamed sums of every kept token: ``cosine_anisotropy`` (exact mean pairwise cosine),
``drift_norm`` (‖mean(H)‖), ``relative_drift`` (‖mean‖ / mean ‖h‖).

The drift–anisotropy correlation relates ‖mean(H)‖ to cosine anisotropy, as Godey et al. do —
not relative drift, which for rows of equal norm is a monotone function of the mean cosine
(``‖mean‖² / r² = 1/n + (1 − 1/n)·cos``), so its Spearman would be 1 whatever the model does:

* ``drift_cosine_pearson`` / ``drift_cosine_spearman`` with ``method = "across_layers"`` — across
  the sites of one step (site "-"; ≥ 3 sites);
* the same metrics with ``method = "across_steps"`` — per site, across every scored step
  (:func:`across_steps_rows`; ``step`` = the last step, ≥ 3 steps).

``n_tokens`` of a correlation row is its number of points (sites or steps): a Spearman over a
handful of points takes few values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tangentlens import metrics  # lazy packages
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.contract import AcrossInputs, Probe, StepInputs
from tangentlens.reporting import Estimator, Figure, Reporting, Table
from tangentlens.results import make_row, row

__all__ = ["NAME", "PROBE", "CosineDriftConfig", "across_steps_rows", "rows"]


@dataclass(frozen=True)
class CosineDriftConfig:
    """No settings: the metrics are exact functions of the streamed sums."""


#: The probe's name: its recipe table ``[probes.cosine_drift]`` and its rows' ``probe``.
NAME = "cosine_drift"

#: Fewest points a drift–anisotropy correlation is computed on.
MIN_POINTS = 3


def _correlation(drifts: list[float], cosines: list[float]) -> list[tuple[str, float]]:
    """``(metric, value)`` of the drift–anisotropy Pearson and Spearman (none below 3 points)."""
    if len(drifts) < MIN_POINTS:
        return []
    corr = metrics.correlations(np.array(drifts), np.array(cosines))
    return [("drift_cosine_pearson", corr.pearson), ("drift_cosine_spearman", corr.spearman)]


def rows(data: Capture, config: CosineDriftConfig) -> list[dict[str, Any]]:
    """Per site, ``cosine_anisotropy``, ``drift_norm`` and ``relative_drift`` from the streamed
    sums of every kept token; then, over the sites, the drift–anisotropy Pearson and Spearman
    (``method = "across_layers"``, none below :data:`MIN_POINTS` sites)."""
    out: list[dict[str, Any]] = []
    drifts, cosines = [], []
    for site, stats in data.statistics.sites.items():
        h = stats.h
        cosine = metrics.cosine_anisotropy_from_sums(h.sum_unit, h.n_nonzero)
        drift = metrics.drift_norm_from_sums(h.sum, None, h.count)
        relative = metrics.relative_drift_from_sums(h.sum, float(h.sum_norms), h.count)
        drifts.append(drift)
        cosines.append(cosine)
        for metric, value in (
            ("cosine_anisotropy", cosine),
            ("drift_norm", drift),
            ("relative_drift", relative),
        ):
            out.append(make_row(data, NAME, metric, value, site=site, n_tokens=h.count))
    common = {"method": "across_layers", "n_tokens": len(drifts)}
    for metric, value in _correlation(drifts, cosines):
        out.append(make_row(data, NAME, metric, value, **common))
    return out


def across_steps_rows(step_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per site, the drift–anisotropy correlation across steps from the ``drift_norm`` and
    ``cosine_anisotropy`` rows of every scored step (any order; other rows are ignored). Keyed
    at the last step, ``method = "across_steps"``; sites seen at fewer than 3 steps give none."""
    points: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in step_rows:
        if r["probe"] == NAME and r["metric"] in ("drift_norm", "cosine_anisotropy"):
            points.setdefault((r["suite"], r["site"]), {}).setdefault(r["step"], {})[
                r["metric"]
            ] = r
    out: list[dict[str, Any]] = []
    for (suite, site), by_step in sorted(points.items()):
        steps = sorted(s for s, m in by_step.items() if len(m) == 2)
        if len(steps) < MIN_POINTS:
            continue
        last = by_step[steps[-1]]["drift_norm"]
        drifts = [by_step[s]["drift_norm"]["value"] for s in steps]
        cosines = [by_step[s]["cosine_anisotropy"]["value"] for s in steps]
        for metric, value in _correlation(drifts, cosines):
            out.append(
                row(
                    suite,
                    last["step"],
                    last["tokens_seen"],
                    NAME,
                    metric,
                    value,
                    site=site,
                    layer=last["layer"],
                    method="across_steps",
                    n_tokens=len(steps),
                )
            )
    return out


def _step_rows(inputs: StepInputs, config: CosineDriftConfig) -> list[dict[str, Any]]:
    return rows(inputs.capture, config)


def _across_rows(inputs: AcrossInputs, config: CosineDriftConfig) -> list[dict[str, Any]]:
    return across_steps_rows(inputs.step_rows)


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=CosineDriftConfig,
    scope="step",
    needs=Needs(),
    rows=_step_rows,
    across=_across_rows,
    metrics={
        "cosine_anisotropy": "exact mean cosine over all pairs of distinct token vectors",
        "drift_norm": "`‖mean(H)‖`",
        "relative_drift": "`‖mean(H)‖ / mean ‖h‖`",
        "drift_cosine_pearson": (
            "Pearson of `drift_norm` with `cosine_anisotropy`: `method = across_layers` (per "
            "step, over sites) or `across_steps` (per site, at the last step); `n_tokens` = "
            "number of points"
        ),
        "drift_cosine_spearman": "the same with Spearman",
    },
    reporting=Reporting(
        tables=(
            Table("cosine_anisotropy", "cosine anisotropy (mean pairwise cosine)"),
            Table("drift_norm", "drift ‖mean(H)‖"),
        ),
        figures=(
            Figure(
                "anisotropy_depth.png",
                "cosine_anisotropy",
                "cosine anisotropy",
                "Anisotropy against depth, over training",
                over="depth",
                in_compare=True,
                compare_title="Anisotropy against relative depth",
            ),
        ),
        estimators=(
            Estimator(
                "drift_cosine",
                (
                    "‖mean(H)‖ against cosine anisotropy, across layers (per step) and across "
                    "steps (per site, at the last step); n_tokens = number of points"
                ),
                metric_prefix="drift_cosine_",
            ),
        ),
    ),
)
