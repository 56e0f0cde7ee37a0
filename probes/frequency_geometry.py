"""Token frequency and geometry (Bernas et al. 2026; METHODS.md §1.6), per site:

* ``freq_distance_pearson`` (**the headline**) / ``freq_distance_spearman`` — Pearson / Spearman
  correlation, across the token types seen at least ``min_count`` (≥ 2) times in the capture
  stream, of the type's log-frequency ``log f_t`` (analysis corpus table) with its
  Bessel-corrected mean squared distance to its centroid::

      s²_t = Σᵢ ‖hᵢ − c_t‖² / (n_t − 1) = (Σᵢ ‖hᵢ‖² − n_t ‖c_t‖²) / (n_t − 1),   c_t = Σᵢ hᵢ / n_t,

  exact from the streamed per-type sums over every kept token (``n_t`` = the type's count over
  the whole stream, no sample). ``E[s²_t]`` is the type's mean occurrence variance at every
  count, heteroscedastic occurrences included, so the Pearson on ``s²_t`` reads ≈ 0 when spread
  does not depend on frequency (mini-pythia at step 0 with its tokens shuffled across positions:
  +0.005 to +0.012 per site, sd 0.02 over 10 shuffles). The Spearman does not: a rare type's
  ``s²_t`` is right-skewed, so the ranks read positive under that null (+0.13 to +0.19 on the
  same control), whatever the width;
* ``freq_distance_spearman_null_mean`` / ``freq_distance_spearman_null_std`` /
  ``freq_distance_spearman_excess`` and ``freq_distance_pearson_null_mean`` /
  ``freq_distance_pearson_null_std`` (the headline Pearson's null, from the same replicates: a
  reproduction verdict needs the Pearson beyond it by more than 2 null sd) — the count-preserving
  shuffle null: ``null_draws``
  replicates in which every correlated type keeps its count ``n_t`` and draws that many
  residuals, with replacement, from one pool (the reservoir rows of the correlated types minus
  their type's full-stream centroid, rescaled by ``√(n_t/(n_t − 1))``); their Spearman's mean,
  standard deviation (ddof 1), and the excess ``observed − null mean`` (−0.000 to +0.010 on the
  shuffled control, −0.06 to −0.07 on mini-pythia's real token order at step 0). The null
  assumes one residual distribution for every type: where spreads differ by type
  (independently of frequency) its rank bias is the larger one and the excess leans negative
  (−0.08 for per-type log-normal spread factors with σ = 0.5, −0.15 with σ = 1, on simulated
  data), so read it next to the Pearson, not instead of it. Omitted without a reservoir or when
  the reservoir holds fewer than ``max(2d, 256)`` rows of correlated types. Seeds: replicate
  ``b`` from ``(seed, step, layer + 1, b)``; cost ``null_draws × Σ n_t × d`` multiply-adds.

  ``n_tokens`` of these rows is the number of types correlated. All seven are omitted where
  every occurrence of a type is the same vector (e.g. at the embedding). See
  :mod:`tangentlens.metrics.frequency` for why ``n_t − 1`` (the ``÷ n_t`` spread makes rare types
  look tight and manufactures a positive correlation), for the Pearson's argument and for the
  null's measured behaviour;
* ``curvature_visibility`` per frequency bin (ours) — pooled outside/inside variance of the
  ``k``-nearest-neighbour patches of sampled (reservoir) anchors, grouped by the anchor token's
  bin. What it can show: at matched sampling density and noise, more visibility is more
  curvature within the patch (a cylinder of radius R reads ``r²/(32R²)`` for patches of radius
  r, a plane 0). What it cannot: compare regions of different density — on one flat manifold
  with noise σ it reads ``(d − m)σ² / (r²/2 + mσ²)``, 0.12 where dense and 0.0003 where sparse
  — and frequency bins differ in density by construction, so a difference between bins is not
  by itself a difference in curvature.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tangentlens import capture, metrics  # lazy packages
from tangentlens._lazy import LazyModule
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.checks import check_count
from tangentlens.contract import Probe, StepInputs
from tangentlens.findings import (
    NULL_SDS,
    Finding,
    cell,
    left_out,
    pick,
    same_cells,
    steps_of,
    untestable,
)
from tangentlens.reporting import Estimator, Figure, Reporting, Table
from tangentlens.results import make_row

if TYPE_CHECKING:
    from jaxtyping import Int

torch = LazyModule("torch")
frequency = LazyModule("tangentlens.metrics.frequency")
twonn = LazyModule("tangentlens.metrics.twonn")

__all__ = [
    "NAME",
    "PROBE",
    "FrequencyGeometryConfig",
    "null_pool",
    "null_seed_key",
    "rows",
    "tracked_types",
]


@dataclass(frozen=True)
class FrequencyGeometryConfig:
    """``min_count`` (≥ 2) occurrences in the capture stream for a type to enter the correlation;
    ``null_draws`` replicates of the Spearman's count-preserving shuffle null (0 = no null
    rows, else ≥ 2 for its standard deviation); curvature patches of ``k`` neighbours, tangent
    dimension ``tangent_dim``, ``n_anchors`` anchors; ``seed`` of the anchors and of the null's
    draws."""

    min_count: int = 5
    null_draws: int = 20
    k: int = 32
    tangent_dim: int = 8
    n_anchors: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        check_count(self.min_count, "frequency_geometry min_count", minimum=2)
        check_count(self.null_draws, "frequency_geometry null_draws", minimum=0)
        if self.null_draws == 1:
            raise ValueError(
                "frequency_geometry null_draws must be 0 (no shuffle null) or ≥ 2 (the null's "
                "standard deviation needs two replicates), got 1"
            )
        check_count(self.seed, "frequency_geometry seed", minimum=0)


#: The probe's name: its recipe table ``[probes.frequency_geometry]`` and its rows' ``probe``.
NAME = "frequency_geometry"

#: Relative RMS spread below which a type's occurrences count as one vector (rounding only).
_SAME_VECTOR_TOL = 1e-6


def tracked_types(
    config: FrequencyGeometryConfig, counts: Int[np.ndarray, " vocab"]
) -> Int[np.ndarray, " n_types"]:
    """The type ids whose per-type sums the probe reads: those counted at least ``min_count``
    times in the analysis data (``counts``, the frequency table; a type seen fewer times there
    is seen fewer times in any capture of that data)."""
    return np.flatnonzero(np.asarray(counts) >= config.min_count)


def rows(data: Capture, config: FrequencyGeometryConfig) -> list[dict[str, Any]]:
    """Per site, the frequency–distance correlations (with the Spearman's shuffle null) from the
    per-type sums, and ``curvature_visibility`` per frequency bin on the distinct sampled rows
    (needs at least ``k`` of them). A capture without a frequency table is refused."""
    if data.frequencies is None:
        raise ValueError("the frequency_geometry probe needs the analysis corpus frequency table")
    log_frequency = torch.from_numpy(data.frequencies.log_frequency())
    out: list[dict[str, Any]] = []
    for site, stats in data.statistics.sites.items():
        types = stats.types
        sample = stats.reservoir.columns() if stats.reservoir is not None else None
        if types is not None:
            out += _correlation_rows(data, site, types, sample, log_frequency, config)
        if sample is None:
            continue
        first = twonn.remove_duplicate_rows(sample["H"])
        points = sample["H"][first]  # distinct rows: repeated vectors have no patch
        if "bin" in sample and points.shape[0] >= config.k:
            spectra = metrics.local_spectra(
                points,
                k=config.k,
                tangent_dim=min(config.tangent_dim, points.shape[1] - 1),
                n_anchors=config.n_anchors,
                seed=config.seed,
            )
            anchor_bins = sample["bin"][first][spectra.anchors]
            binned = anchor_bins >= 0
            n_bins = len(stats.h_bins)
            trimmed = type(spectra)(
                spectra.anchors[binned], spectra.inside[binned], spectra.outside[binned]
            )
            visibility = metrics.pooled_visibility(trimmed, anchor_bins[binned], n_bins)
            for b in range(n_bins):
                out.append(
                    make_row(
                        data,
                        NAME,
                        "curvature_visibility",
                        float(visibility[b]),
                        site=site,
                        freq_bin=str(b),
                        n_tokens=int((anchor_bins == b).sum()),
                    )
                )
    return out


def null_seed_key(config: FrequencyGeometryConfig, step: int, layer: int | None) -> tuple[int, ...]:
    """The shuffle null's seed key (without the replicate): ``(seed, step, layer + 1)``, the
    embedding's layer counting as 0."""
    return (config.seed, step, 0 if layer is None else layer + 1)


def null_pool(
    types: capture.TypeSums, sample: dict[str, torch.Tensor], correlated: torch.Tensor
) -> torch.Tensor:
    """The residual pool of the shuffle null: the reservoir rows (``sample``'s ``H`` and
    ``token``) of the ``correlated`` types (a mask over ``types``' rows), each minus its type's
    full-stream centroid and rescaled by ``√(n_t/(n_t − 1))``
    (:func:`~tangentlens.metrics.frequency.centroid_residuals`)."""
    tokens = sample["token"].long()
    ids = types.ids.to(tokens.device)
    at = torch.searchsorted(ids, tokens).clamp(max=len(ids) - 1)
    chosen = (ids[at] == tokens) & correlated.to(tokens.device)[at]
    type_rows = torch.where(chosen, at, torch.full_like(at, -1))
    return frequency.centroid_residuals(types.count, types.sum, type_rows, sample["H"])


def _correlation_rows(
    data: Capture,
    site: str,
    types: capture.TypeSums,
    sample: dict[str, torch.Tensor] | None,
    log_frequency: torch.Tensor,
    config: FrequencyGeometryConfig,
) -> list[dict[str, Any]]:
    """The ``freq_distance_*`` rows of one site from its streamed per-type sums (of the tracked
    types only; ``log_frequency`` covers the vocabulary) and, for the Spearman's shuffle null,
    its reservoir ``sample`` (None: no null rows)."""
    min_count = config.min_count
    counts = types.count.double()
    spread = metrics.centroid_spread_from_sums(types.count, types.sum, types.sum_sq_norms)
    kept = counts >= min_count
    # relative RMS spread: below _SAME_VECTOR_TOL every occurrence of a type is one vector
    mean_sq_norm = types.sum_sq_norms.double()[kept] / counts[kept]
    relative = (spread[kept] / mean_sq_norm).sqrt().nan_to_num(0)
    if not relative.numel() or float(relative.max()) <= _SAME_VECTOR_TOL:
        return []
    lf = log_frequency[types.ids].to(spread.device)
    corr = metrics.frequency_distance_correlation(lf, spread, counts, min_count)
    common = {"site": site, "n_tokens": corr.n}
    out = [
        make_row(data, NAME, "freq_distance_pearson", corr.pearson, **common),
        make_row(data, NAME, "freq_distance_spearman", corr.spearman, **common),
    ]
    if config.null_draws == 0 or sample is None or "token" not in sample:
        return out
    correlated = kept & torch.isfinite(spread) & torch.isfinite(lf)
    pool = null_pool(types, sample, correlated)
    if pool.shape[0] < frequency.min_pool_rows(types.sum.shape[1]):
        return out  # too few sampled residuals to stand for the residual distribution
    null = frequency.frequency_spearman_null(
        lf,
        spread,
        counts,
        pool,
        draws=config.null_draws,
        seed_key=null_seed_key(config, data.step, data.layers.get(site)),
        min_count=min_count,
    )
    return [
        *out,
        make_row(data, NAME, "freq_distance_spearman_null_mean", null.mean, **common),
        make_row(data, NAME, "freq_distance_spearman_null_std", null.std, **common),
        make_row(data, NAME, "freq_distance_spearman_excess", null.excess, **common),
        make_row(data, NAME, "freq_distance_pearson_null_mean", null.pearson_mean, **common),
        make_row(data, NAME, "freq_distance_pearson_null_std", null.pearson_std, **common),
    ]


def _step_rows(inputs: StepInputs, config: FrequencyGeometryConfig) -> list[dict[str, Any]]:
    return rows(inputs.capture, config)


def _max_tracked_types(config: FrequencyGeometryConfig, max_tokens: int) -> int:
    """At most ``max_tokens // min_count`` types are seen ``min_count`` times."""
    return max_tokens // config.min_count


def _frequency_finding(
    kind: str, picked: list[dict[str, Any]], nulls: dict[str, list[dict[str, Any]]]
) -> Finding:
    """Bernas et al.: log-frequency correlates negatively with centroid spread
    (``freq_distance_pearson``, mean over the sites with a shuffle null at the last step and at
    the baseline) — at the last step below 0, below its count-preserving shuffle null's mean by
    more than 2 null standard deviations (the null of the mean has at most the mean of the
    sites' sds), and below the baseline's by more than 2 sd (each step's shuffle-null sd
    standing for its statistic's: the Pearson rows carry no interval)."""
    claim = (
        "log-frequency correlates negatively with centroid spread (freq_distance_pearson, "
        f"beyond {NULL_SDS:g} sd of its count-preserving shuffle null, {NULL_SDS:g} sd below the "
        f"baseline) at {kind}"
    )
    steps = steps_of(picked)
    reason = steps.too_few()
    if reason:
        return untestable(claim, reason)
    last, baseline = steps.last, steps.baseline
    compared = (baseline, last)
    with_null = {
        (r["step"], cell(r))
        for r in nulls.get("freq_distance_pearson_null_std", [])
        if r["step"] in compared
    } & {(r["step"], cell(r)) for r in nulls.get("freq_distance_pearson_null_mean", [])}
    for step in (last, baseline):
        if not any(s == step for s, _ in with_null):
            return untestable(
                claim,
                f"no shuffle null at step {step} (freq_distance_pearson_null_mean/_std: "
                f"{NAME}.null_draws = 0, no reservoir, or too few sampled rows)",
            )
    usable = [r for r in picked if (r["step"], cell(r)) in with_null]
    same, _ = same_cells(usable, compared)
    if not same:
        return untestable(claim, "no site has the Pearson and its null at both compared steps")
    cells = {cell(r) for r in same}
    dropped = sorted({cell(r) for r in picked if r["step"] in compared} - cells, key=str)

    def mean(rows: list[dict[str, Any]], step: int) -> float:
        return statistics.fmean(r["value"] for r in rows if r["step"] == step and cell(r) in cells)

    observed, base = mean(same, last), mean(same, baseline)
    null_mean = mean(nulls["freq_distance_pearson_null_mean"], last)
    null_sd = mean(nulls["freq_distance_pearson_null_std"], last)
    base_sd = mean(nulls["freq_distance_pearson_null_std"], baseline)
    beyond = observed < null_mean - NULL_SDS * null_sd
    spread = math.hypot(null_sd, base_sd)  # the change's sd: √(sd_last² + sd_baseline²)
    below = (base - observed) / spread if spread > 0 else (math.inf if base > observed else 0.0)
    return Finding(
        claim,
        observed < 0 and beyond and below >= NULL_SDS,
        f"Pearson at step {last}, mean over {len(cells)} site{'s' * (len(cells) != 1)}: "
        f"{observed:.3f}; shuffle null {null_mean:.3f} ± {null_sd:.3f} (effect "
        f"{_in_sds(observed - null_mean, null_sd)}); baseline {steps.baseline_label()}: "
        f"{base:.3f} ± {base_sd:.3f} (change {_in_sds(observed - base, spread)}; seeds: ≈ −0.5, "
        "for a statistic of their own)"
        + left_out(dropped, "no shuffle null, or not scored at both compared steps"),
    )


def _in_sds(effect: float, sd: float) -> str:
    return f"{effect / sd:+.1f} null sd" if sd > 0 else f"{effect:+.3f}, null sd 0"


def findings(rows: list[dict[str, Any]]) -> list[Finding]:
    """The frequency–spread verdict per site kind (:func:`_frequency_finding`)."""
    nulls = {
        metric: pick(rows, NAME, metric)
        for metric in ("freq_distance_pearson_null_mean", "freq_distance_pearson_null_std")
    }
    return [
        _frequency_finding(kind, picked, {m: by.get(kind, []) for m, by in nulls.items()})
        for kind, picked in pick(rows, NAME, "freq_distance_pearson").items()
    ]


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=FrequencyGeometryConfig,
    scope="step",
    needs=Needs(bins=True, type_sums=True, reservoir=True),
    rows=_step_rows,
    tracked_types=tracked_types,
    max_tracked_types=_max_tracked_types,
    metrics={
        "freq_distance_pearson": (
            "the headline: Pearson, across types seen ≥ `min_count` times, of log-frequency with "
            "the Bessel-corrected squared spread around the type's centroid; its expectation is "
            "the mean occurrence variance at every count, so it reads ≈ 0 when spread does not "
            "depend on frequency (+0.005 to +0.012 on mini-pythia's step 0 with tokens shuffled)"
        ),
        "freq_distance_spearman": (
            "the same with Spearman: biased upward by the right skew of rare types' spread (+0.13"
            " to +0.19 on that control), read it against its null"
        ),
        "freq_distance_spearman_null_mean": (
            "mean Spearman over `null_draws` count-preserving shuffles: each type keeps its count"
            " and draws that many within-type residuals, with replacement, from one pool of the "
            "reservoir's residuals"
        ),
        "freq_distance_spearman_null_std": "their standard deviation (ddof 1)",
        "freq_distance_spearman_excess": (
            "observed Spearman minus the null mean: ≈ 0 when spread depends neither on frequency "
            "nor on type; it leans negative when spreads differ by type (−0.08 to −0.15 on "
            "synthetic data), so the Pearson stays the headline"
        ),
        "freq_distance_pearson_null_mean": (
            "mean Pearson over the same `null_draws` shuffles: the headline's null (≈ 0 when "
            "spread does not depend on frequency); a verdict needs the Pearson beyond it by more "
            "than 2 `freq_distance_pearson_null_std`"
        ),
        "freq_distance_pearson_null_std": "their standard deviation (ddof 1)",
        "curvature_visibility": (
            "per bin, pooled variance outside / inside the local tangent of k-nearest-neighbour "
            "patches. It separates curved from flat patches only at matched sampling density "
            "and noise (a cylinder reads `r²/(32R²)`, a plane 0); on one flat manifold with "
            "noise it reads 0.12 where points are dense and 0.0003 where sparse (noise over the "
            "patch's width), so bins of different density — frequent tokens sit in denser "
            "regions — cannot be compared by it alone (`tests/unit/test_curvature_visibility.py`)"
        ),
    },
    reporting=Reporting(
        tables=(
            Table("freq_distance_pearson", "Pearson(log freq, centroid spread s²)"),
            Table(
                "freq_distance_spearman_excess",
                "Spearman(log freq, s²) minus its shuffle null",
                compare_title="Spearman(log freq, s²) − null",
            ),
        ),
        figures=(
            Figure(
                "frequency_correlation.png",
                "freq_distance_pearson",
                "Pearson(log freq, spread s²)",
                "Token frequency against centroid spread, over relative depth",
                over="depth",
                in_report=False,
                in_compare=True,
            ),
            Figure(
                "frequency_correlation.png",
                "freq_distance_spearman_excess",
                "Spearman(log freq, s²) − shuffle null",
                "Token frequency against centroid spread, over relative depth",
                over="depth",
                in_report=False,
                in_compare=True,
            ),
        ),
        findings=(findings,),
        estimators=(
            Estimator(
                "frequency_spread",
                (
                    "Σ‖h − c‖² / (n − 1) per type from the streamed sums over every kept token "
                    "(n = the type's count in the stream); Pearson on the squared spread"
                ),
            ),
        ),
    ),
)
