"""The shape of learning (Razzhigaev et al. 2023; METHODS.md §2), per site:
``centred_anisotropy`` — ``σ₁²/Σσᵢ²`` of the centred activations (largest covariance eigenvalue
over the trace, as the authors' ``llm_microscope.calculate_anisotropy_torch`` computes it), from
the streamed moments of every kept token; with ``singular_anisotropy = true`` also
``centred_singular_anisotropy`` — ``σ₁/Σσᵢ``, the reading of the paper's text, under its own
name; ``isoscore`` (from the same covariance) and ``twonn_dimension`` on the distinct sampled
rows (the paper's protocol by default: shuffled batches of ``twonn_batch`` points, averaged — one
batch when fewer rows are distinct, e.g. at the embedding where every occurrence of a token is
the same vector; ``twonn_fit`` "razzhigaev" or "facco")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tangentlens import metrics  # lazy packages
from tangentlens._lazy import LazyModule
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.checks import check_choice, check_count
from tangentlens.contract import Probe, StepInputs
from tangentlens.findings import (
    Finding,
    left_out,
    mean_by,
    per_kind,
    same_cells,
    step_label,
    steps_of,
    untestable,
)
from tangentlens.metrics.options import TWONN_FITS
from tangentlens.reporting import Estimator, Figure, Reporting, Table
from tangentlens.results import make_row

torch = LazyModule("torch")

__all__ = ["NAME", "PROBE", "ShapeOfLearningConfig", "rows"]


@dataclass(frozen=True)
class ShapeOfLearningConfig:
    """``singular_anisotropy``: also emit ``centred_singular_anisotropy`` (σ₁/Σσᵢ); TwoNN
    ``twonn_fit``, batch size (``twonn_batch``) and shuffling ``seed``."""

    singular_anisotropy: bool = False
    twonn_fit: str = "razzhigaev"
    twonn_batch: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.singular_anisotropy, bool):
            raise ValueError(
                f"singular_anisotropy must be true or false, got {self.singular_anisotropy!r}"
            )
        check_choice(self.twonn_fit, "twonn_fit", TWONN_FITS)
        check_count(self.twonn_batch, "twonn_batch", minimum=3)


#: The probe's name: its recipe table ``[probes.shape_of_learning]`` and its rows' ``probe``.
NAME = "shape_of_learning"


def rows(data: Capture, config: ShapeOfLearningConfig) -> list[dict[str, Any]]:
    """Per site, ``centred_anisotropy`` (and ``centred_singular_anisotropy``) and ``isoscore``
    from the streamed moments, ``twonn_dimension`` on the distinct rows of the reservoir."""
    out: list[dict[str, Any]] = []
    for site, stats in data.statistics.sites.items():
        h = stats.h
        common = {"site": site, "n_tokens": h.count}
        anisotropy = metrics.centred_anisotropy_from_moments(h.count, h.sum, h.second_moment)
        out.append(make_row(data, NAME, "centred_anisotropy", anisotropy, **common))
        if config.singular_anisotropy:
            singular = metrics.centred_singular_anisotropy_from_moments(
                h.count, h.sum, h.second_moment
            )
            out.append(make_row(data, NAME, "centred_singular_anisotropy", singular, **common))
        out.append(
            make_row(
                data, NAME, "isoscore", metrics.isoscore_from_covariance(h.covariance()), **common
            )
        )
        if stats.reservoir is not None:
            sample = torch.unique(stats.reservoir.columns()["H"], dim=0)  # TwoNN drops repeats
            batch = config.twonn_batch if sample.shape[0] >= config.twonn_batch else None
            dim = metrics.twonn_dimension(
                sample, config.twonn_fit, batch_size=batch, seed=config.seed
            )
            out.append(
                make_row(data, NAME, "twonn_dimension", dim, site=site, n_tokens=sample.shape[0])
            )
    return out


def _step_rows(inputs: StepInputs, config: ShapeOfLearningConfig) -> list[dict[str, Any]]:
    return rows(inputs.capture, config)


def _bell(kind: str, picked: list[dict[str, Any]]) -> Finding:
    """Razzhigaev et al.: anisotropy over depth is bell-shaped in decoders (no interval and no
    null: read against the baseline's profile over the same layers) — at the last step the
    peak is at an interior layer (≥ 3 layers), and the interior peak stands higher above the
    larger end layer than at the baseline (the bell grew with training)."""
    claim = (
        f"bell-shaped anisotropy over depth (centred_anisotropy σ₁²/Σσ², no null: read against "
        f"the baseline's profile) at {kind}"
    )
    steps = steps_of(picked)
    reason = steps.too_few()
    if reason:
        return untestable(claim, reason)
    same, dropped = same_cells(picked, (steps.baseline, steps.last))
    last, base = _by_layer(same, steps.last), _by_layer(same, steps.baseline)
    if len(last) < 3:
        return untestable(
            claim,
            f"{len(last)} layers scored at both step {steps.last} and the baseline (a bell "
            "needs ≥ 3)",
        )
    layers = sorted(last)
    peak = max(layers, key=last.__getitem__)
    grown = _bump(last) > max(_bump(base), 0.0)
    holds = peak not in (layers[0], layers[-1]) and grown
    return Finding(
        claim,
        holds,
        f"at step {steps.last}: {_profile(last)}; peak at L{peak}; baseline "
        f"{steps.baseline_label()}: {_profile(base)}" + left_out(dropped),
    )


def _bump(by_layer: dict[Any, float]) -> float:
    """How far the highest interior layer stands above the larger end layer (−inf: none)."""
    layers = sorted(by_layer)
    inner = [by_layer[k] for k in layers[1:-1]]
    if not inner:
        return -float("inf")
    return max(inner) - max(by_layer[layers[0]], by_layer[layers[-1]])


def _by_layer(rows: list[dict[str, Any]], step: int) -> dict[Any, float]:
    return mean_by((r for r in rows if r["step"] == step), "layer")


def _profile(by_layer: dict[Any, float]) -> str:
    """``"L0 0.115, L1 0.135"``."""
    return ", ".join(f"L{k} {by_layer[k]:.3f}" for k in sorted(by_layer))


def _rise_fall(kind: str, picked: list[dict[str, Any]]) -> Finding:
    """Razzhigaev et al.: the intrinsic dimension (mean over the layers scored at every step)
    rises then falls — it peaks at a step between the baseline and the last step, at least 5 %
    above the baseline, and ends at least 5 % below the peak."""
    claim = (
        f"intrinsic dimension rises early, then falls (twonn_dimension, mean over layers, "
        f"against the baseline) at {kind}"
    )
    steps = steps_of(picked)
    reason = steps.too_few()
    if reason:
        return untestable(claim, reason)
    same, dropped = same_cells(picked, steps.steps)
    if not same:
        return untestable(claim, "no layer is scored at every step")
    by_step = mean_by(same, "step")
    after = [s for s in steps.steps if s > steps.baseline]
    peak = max(after, key=by_step.__getitem__)
    holds = (
        peak != steps.last
        and by_step[peak] > 1.05 * by_step[steps.baseline]
        and by_step[steps.last] < by_step[peak] / 1.05
    )
    trace = ", ".join(f"{step_label(s)}: {by_step[s]:.1f}" for s in steps.steps)
    return Finding(
        claim,
        holds,
        f"by step — {trace}; baseline {steps.baseline_label()}; peak at step {peak}"
        + left_out(dropped),
    )


def findings(rows: list[dict[str, Any]]) -> list[Finding]:
    """Per site kind: the bell over depth, then the intrinsic dimension's rise and fall."""
    out = per_kind(rows, NAME, "centred_anisotropy", _bell, layered=True)
    return out + per_kind(rows, NAME, "twonn_dimension", _rise_fall, layered=True)


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=ShapeOfLearningConfig,
    scope="step",
    needs=Needs(reservoir=True),
    rows=_step_rows,
    metrics={
        "centred_anisotropy": (
            "`σ₁² / Σσᵢ²` of the centred activations (largest covariance eigenvalue over the trace)"
        ),
        "centred_singular_anisotropy": "`σ₁ / Σσᵢ` (with `singular_anisotropy = true`)",
        "isoscore": "IsoScore of the activation covariance (1 isotropic, 0 one direction)",
        "twonn_dimension": "TwoNN intrinsic dimension of the distinct sampled rows",
    },
    reporting=Reporting(
        tables=(
            Table("centred_anisotropy", "centred anisotropy σ₁²/Σσ²"),
            Table("twonn_dimension", "TwoNN intrinsic dimension"),
        ),
        figures=(
            Figure(
                "anisotropy_depth.png",
                "centred_anisotropy",
                "centred anisotropy σ₁²/Σσ²",
                "Anisotropy against depth, over training",
                over="depth",
                in_compare=True,
                compare_title="Anisotropy against relative depth",
            ),
            Figure(
                "twonn.png",
                "twonn_dimension",
                "TwoNN intrinsic dimension",
                "Intrinsic dimension over training",
            ),
        ),
        findings=(findings,),
        estimators=(
            Estimator(
                "centred_anisotropy",
                "σ₁²/Σσᵢ² of the centred activations (llm-microscope)",
                metric_prefix="centred_",
            ),
        ),
    ),
)
