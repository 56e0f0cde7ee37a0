"""Tangent energy (Bernas et al. 2026; METHODS.md §1.2–1.3, 1.5): the share of gradient energy
in each tangent proxy against matched-rank random controls, overall and per frequency bin.

**Beyond the drift (ours; METHODS.md §1.3, m̂'s own estimation error).** A proxy that avoids the
mean direction m̂ is scored on the drift-regressed gradients ``r = g − b (m̂ᵀg)``, ``b = M m̂ /
(m̂ᵀ M m̂)`` the least-squares coefficient of the bin's gradients on their drift coordinate
(:func:`tangentlens.metrics.drift_regression`), and so are its controls: m̂ is estimated from the
activations and errs mostly along the high-variance directions the proxy spans, so the proxy
holds part of the true drift m, and gradients with energy along m credited it to the proxy (ratio
1.035, P(p ≤ .05) = 0.93 under the null at ρ = ‖μ‖/√tr Σ_H = 0.3, d = 128, k = 8, 4 096
tokens). The regression removes what the gradients' drift coordinate explains, wherever the
true m lies; the null of the scored moment does not depend on m̂'s error and the exchangeable
frames stay exchangeable with a proxy uniform in m̂⊥ (the p-value exactly calibrated): at
ρ = 0.3, 1, 3, 30 the null reads ratio 1 ± 0.01 and P(p ≤ .05) 0.035–0.065
(tests/slow/test_drift_null.py). Fitting m̂ and the proxy on half of the sequences and scoring
the other half does not remove it (the drift's error direction is random, the gradients do not
depend on the half): it doubled the excess. With m̂ exact and the drift coordinate uncorrelated
with the others ``b = m̂``: the orthogonal estimator; where the gradients' drift coordinate
co-varies with a direction of the proxy, that shared energy is the drift's. Fractions stay
shares of the gradients' whole energy ``tr M``. The rank-1 proxy m̂ itself is scored on the
gradients.

Per site, proxy method and frequency bin (``all`` and each bin), from the accumulated gradient
moment of that bin, ``energy_fraction`` ``E(T)`` (with a bootstrap interval) and
``energy_enrichment`` ``E(T)/(k/d)`` beside its null ``energy_enrichment_null``
(``(1 − D) · d/(d − 1)``, D the share of the energy the drift regression removes, ≥ E(m̂):
never read it against 1; the enrichment over its null is ``energy_ratio``), then the proxy
against two control families (:mod:`tangentlens.metrics.controls`), drawn from the same seeded
Gaussians:

* **exchangeable** (the headline): Haar k-frames in ``span(m̂)⊥``, m̂ the mean direction that was
  projected out of the proxy (in ℝ^d for ``mean_direction`` itself, or when no m̂ was projected
  out). Exchangeable with a proxy whose span is uniform in ``span(m̂)⊥``, so ``energy_p_value``
  is calibrated under "the proxy is a random set of directions": ``energy_control_mean/std/min/
  max``, ``energy_null_mean`` (their exact mean ``k/(d − 1) · (1 − D)``), ``energy_ratio``
  ``= E(T) / energy_null_mean``, ``energy_z``, ``energy_p_value``;
* **complement** (the paper's "normal directions"): Haar k-frames in ``span(T, m̂)⊥``,
  ``energy_complement_control_mean``, ``energy_complement_null_mean`` (``k/(d − 1 − k_T) ·
  (1 − D − E(T))``), ``energy_complement_ratio`` ``= E(T) / energy_complement_null_mean``,
  ``energy_complement_p_value``. Not calibrated: the controls share a fixed energy budget with
  the proxy.

**Ratios read the family's exact mean.** Both families are Haar frames outside a known span X,
whose mean projector is ``k/(d − r) · (I − P_X)`` exactly, so each ratio divides by that
closed-form mean, not by the mean of the frames drawn: the ratio then estimates the population
ratio ``E(T) / [k/(d − r) · (tr S − tr XᵀSX)/tr M]`` (S the scored moment) with no Monte-Carlo
error from the frames, which does
not shrink with the sequences (an interval around a ratio to 100 drawn frames covered the
population ratio 0.93 → 0.84 from 400 to 1 600 sequences at d = 16, k = 2: tests/slow/
test_interval_coverage.py's simulation; 0.83 → 0.61 at d = 64 on the audit's). The frames still give
``energy_z`` and the p-values; their sampled mean (``energy_control_mean``) is reported beside the
exact one as a self-check. Propagating the frames' error instead would widen every interval to
keep an estimator the closed form makes unnecessary.

With ``data_matched_m`` set, frames inside the top-m PCA span of the activations: outside m̂
(``data_matched_energy_ratio``, ``data_matched_energy_p_value``, calibrated against a proxy
uniform in that span) and outside the proxy and m̂ (``data_matched_complement_energy_*``); their
ratios are to the frames' mean (no interval).
Control draws are seeded from ``(seed, step, layer + 1, bin + 1, draw)`` (0 stands for the
embedding and for "all").

**The mean direction.** Where the proxies hold m̂ (``mean_direction``), every other proxy must be
orthogonal to it: its controls avoid m̂, so a proxy holding part of m̂ would be credited with the
drift's energy (a proxy holding m̂ read ratio 3.7, p at the floor, under the null). The sweep and
``tangentlens.measure`` project m̂ out of every proxy and record ``mean_direction_overlap``;
:func:`rows` and the per-sequence sums (``tangentlens.proxies.sequence_energy_config``) refuse
a basis that overlaps m̂ (``tangentlens.proxies.check_mean_direction``), as
``metrics.compare_energy`` refuses a proxy that reaches into the span its controls exclude.

``energy_fraction``, ``energy_ratio`` and ``energy_complement_ratio`` carry bootstrap intervals
(studentized, resampling sequences) that describe the reported values, which use every kept
token; each is a ratio of per-sequence sums (``Σ‖rQ‖²`` over ``Σ‖g‖²``, or over the family's
exact mean energy ``k/(d − r) · Σ(‖r‖² − ‖Xᵀr‖²)``; ``r`` the drift-regressed gradients, ``b``
held at the bin's pooled value), so it covers the population ratio given the proxy and ``b``
(the fit's own variability is not in it). Their source (:func:`interval_source`):

* ``"all_sequences"`` — when the proxies were known before the step was captured (fit policy
  ``frozen_early``) and the capture gathered per-sequence energy sums (the probe's needs ask
  for ``sequence_sums`` when it draws intervals; the sweep builds their projectors with
  ``tangentlens.proxies.sequence_energy_config``): the bootstrap resamples *every* analysed
  sequence, and its point values are the reported values (checked);
* ``"reservoir_sample"`` — otherwise (``per_checkpoint``, the proxy fitted after the capture):
  the bootstrap resamples the reservoir's sampled sequences, and the interval of that sample's
  ratio is rescaled onto the reported value (``× reported / sample ratio``; the fraction's
  clipped to [0, 1]). Its width is that of the smaller sample: conservative.

Every interval contains its own point value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tangentlens import capture, dictionaries, metrics  # lazy packages
from tangentlens._lazy import LazyModule
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.checks import Bound, check_choice, check_count
from tangentlens.contract import Probe, StepInputs
from tangentlens.dictionaries.proxy_config import MEAN_DIRECTION
from tangentlens.findings import (
    NULL_SDS,
    Estimate,
    Finding,
    cell,
    left_out,
    mean_by,
    per_kind,
    same_cells,
    sds_apart,
    step_label,
    steps_of,
    tokens_seen,
    untestable,
)
from tangentlens.metrics.options import BOOTSTRAP_METHODS, MIN_REPLICATES
from tangentlens.models.sites import site_kind
from tangentlens.reporting import Estimator, Figure, MustMatch, Reporting, Table
from tangentlens.results import make_row, measurement, replicate_record

if TYPE_CHECKING:
    from tangentlens.typing import Basis

proxy_fits = LazyModule("tangentlens.proxies")
torch = LazyModule("torch")

__all__ = [
    "INTERVAL_ALL_SEQUENCES",
    "INTERVAL_SAMPLE",
    "NAME",
    "PROBE",
    "RATIO_ESTIMATOR",
    "TangentEnergyConfig",
    "complement_excluded",
    "exchangeable_frames",
    "exchangeable_room",
    "interval_source",
    "rows",
]


@dataclass(frozen=True)
class TangentEnergyConfig:
    """The energy settings (``[probes.tangent_energy]``; the proxies, the control ``draws`` and
    the ``seed`` are the ``[proxies]`` stage's): ``bootstrap`` replicates for the energy
    interval (0 = none); ``data_matched_m`` the PCA span of the data-matched control (None =
    off); ``interval`` the bootstrap interval (one of
    :data:`tangentlens.metrics.options.BOOTSTRAP_METHODS`; studentized by default: it covered
    best on simulated sequences); ``keep_replicates``: a sweep also stores each interval's
    bootstrap replicates (``replicates/<unit>.parquet``), so that ``tangentlens compare`` can give
    the differences between runs an interval."""

    bootstrap: int = 200
    data_matched_m: int | None = None
    interval: str = "studentized"
    keep_replicates: bool = False

    def __post_init__(self) -> None:
        check_count(self.bootstrap, "bootstrap", minimum=0)
        if 0 < self.bootstrap < MIN_REPLICATES:
            raise ValueError(
                f"bootstrap must be 0 (no interval) or ≥ {MIN_REPLICATES} replicates, got "
                f"{self.bootstrap}"
            )
        check_choice(self.interval, "interval", BOOTSTRAP_METHODS)
        if not isinstance(self.keep_replicates, bool):
            raise ValueError(f"keep_replicates must be true or false, got {self.keep_replicates!r}")
        if self.keep_replicates and not self.bootstrap:
            raise ValueError(
                "keep_replicates = true stores bootstrap replicates: set bootstrap > 0"
            )
        m = self.data_matched_m
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 2):
            raise ValueError(
                f"data_matched_m must be an integer ≥ 2 (above the proxy rank) or None, got {m!r}"
            )

    def to_table(self) -> dict[str, Any]:
        """The recipe table (every key, defaults included, but ``keep_replicates`` only when
        true: a run from before that key resumes)."""
        table = dataclasses.asdict(self)
        if not self.keep_replicates:
            del table["keep_replicates"]
        return table


#: The probe's name: its recipe table ``[probes.tangent_energy]`` and its rows' ``probe``.
NAME = "tangent_energy"

#: Interval source: every analysed sequence, from per-sequence sums gathered during capture.
INTERVAL_ALL_SEQUENCES = "all_sequences"
#: Interval source: the reservoir's sampled sequences, rescaled onto the reported value.
INTERVAL_SAMPLE = "reservoir_sample"

#: Relative difference allowed between the per-sequence sums' pooled ratio and the moments'.
_SUMS_RTOL = 1e-8


def seed_key(
    seed: int, step: int, layer: int | None, bin_index: int | None
) -> tuple[int, int, int, int]:
    """The control seed key (without the draw): ``(seed, step, layer + 1, bin + 1)``."""
    return (
        seed,
        step,
        0 if layer is None else layer + 1,
        0 if bin_index is None else bin_index + 1,
    )


def complement_excluded(proxies: Mapping[str, Basis], method: str) -> Basis:
    """What the complement controls of ``proxies[method]`` avoid: ``span(T, m̂)`` (d × (k_T + 1)),
    or ``span(T)`` where m̂ is not excluded (:func:`tangentlens.proxies.exchangeable_excluded`)."""
    excluded = proxy_fits.exchangeable_excluded(proxies, method)
    return metrics.exclusion_basis(proxies[method], excluded)


def exchangeable_frames(
    proxies: Mapping[str, Basis], method: str, draws: int, key: Sequence[int]
) -> torch.Tensor:
    """The exchangeable control frames ``(draws, d, k)`` of ``proxies[method]`` for seed ``key``:
    the frames the headline metrics, the intervals and the anisotropy share score."""
    proxy = proxies[method]
    d, rank = proxy.shape
    excluded = proxy_fits.exchangeable_excluded(proxies, method)
    return metrics.control_frames(d, rank, draws, key, excluded=excluded, device=proxy.device)


def _sampled_gradients(
    site: capture.SiteStatistics, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """The reservoir's gradient rows (float64), their sequence index and frequency bin — read
    once per site for every bootstrap of that site."""
    if site.reservoir is None or not len(site.reservoir) or site.g is None:
        return None
    columns = site.reservoir.columns()
    g = columns["G"].double()
    return g, (site.reservoir.ids // seq_len).to(g.device), columns.get("bin")


def interval_source(data: Capture) -> str | None:
    """Where the step's energy intervals come from: :data:`INTERVAL_ALL_SEQUENCES` when every
    site with gradients kept per-sequence sums, :data:`INTERVAL_SAMPLE` when none did, None when
    there is no site with gradients. (A mix of both raises: it is a wiring error.)"""
    kinds = {
        site.sequence_energy is not None
        for site in data.statistics.sites.values()
        if site.g is not None
    }
    if len(kinds) > 1:
        raise ValueError("some sites kept per-sequence energy sums and some did not")
    if not kinds:
        return None
    return INTERVAL_ALL_SEQUENCES if kinds.pop() else INTERVAL_SAMPLE


def _same_span(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b.to(a.device, torch.float64))


def _checked_sequence_energy(
    site: capture.SiteStatistics, site_name: str, proxies: dict[str, Basis]
) -> capture.SequenceEnergy | None:
    """The site's per-sequence sums, after checking that they were gathered for these proxies
    and this mean direction (None when the capture kept none)."""
    energy = site.sequence_energy
    if energy is None:
        return None
    projectors = energy.projectors
    same = set(projectors.methods) >= set(proxies)
    if same:
        for method, proxy in proxies.items():
            j = projectors.methods.index(method)
            same = same and _same_span(projectors.bases[j], proxy)
            same = same and _same_span(
                projectors.excluded[j], proxy_fits.exchangeable_excluded(proxies, method)
            )
    if not same:
        raise ValueError(
            f"the per-sequence energy sums of {site_name!r} were gathered for other proxies or "
            "another mean direction: build them with tangentlens.proxies."
            "sequence_energy_config from the proxies given here"
        )
    return energy


def _sampled_sums(
    sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None,
    proxy: Basis,
    families: dict[str, Basis | None],
    bin_index: int | None,
    drift: metrics.DriftRegression | None,
) -> capture.EnergySums | None:
    """Per sampled sequence :class:`~tangentlens.capture.EnergySums` over the reservoir's rows:
    ``Σ‖Qᵀr‖²``, ``Σ‖g‖²`` and each family's exact mean energy ``k/(d − r) · Σ(‖r‖² −
    ‖Xᵀr‖²)`` (``families``: metric infix → the span X its controls avoid), with ``r`` the
    drift-regressed gradients ``g − b (m̂ᵀg)`` (``drift``: the measurement's regression, m̂ the
    exchangeable family's X) or the gradients themselves (None), in ``O(n·d·k)``."""
    if sample is None:
        return None
    g, sequences, bins = sample
    if bin_index is not None and bins is not None:
        rows = bins == bin_index
        g, sequences = g[rows], sequences[rows]
    if torch.unique(sequences).numel() < 2:
        return None
    d, k = proxy.shape
    norms = g.pow(2).sum(dim=1)
    r = g
    if drift is not None:
        m = families[""].to(g.device, torch.float64)  # type: ignore[union-attr]
        r = g - (g @ m) * drift.coefficient.to(g.device, torch.float64)
    inside = (r @ proxy.to(g.device, torch.float64)).pow(2).sum(dim=1)
    controls = []
    for excluded in families.values():
        outside = r.pow(2).sum(dim=1)
        rank = 0
        if excluded is not None:
            rank = excluded.shape[1]
            outside = outside - (r @ excluded.to(g.device, torch.float64)).pow(2).sum(dim=1)
        controls.append(k / (d - rank) * outside)
    control, complement = (metrics.group_sums(c, sequences)[0] for c in controls)
    total, _ = metrics.group_sums(norms, sequences)
    return capture.EnergySums(metrics.group_sums(inside, sequences)[0], total, control, complement)


def _intervals(
    sums: capture.EnergySums | None,
    values: dict[str, float],
    config: TangentEnergyConfig,
    seed: int,
    keep: bool = False,
) -> dict[str, metrics.RatioInterval]:
    """Intervals of the energy fraction (``Σ inside / Σ total``) and of the ratios to both
    families' exact means (``Σ inside / Σ control``, ``Σ inside / Σ complement``) from
    per-sequence sums, put on the reported ``values`` (rescaled for a sample; for all sequences
    the rescaling factor is 1 up to rounding); ``keep``: with their replicates."""
    if not config.bootstrap or sums is None:
        return {}
    if sums.inside.numel() < 2 or not float(sums.total.sum()) > 0:
        return {}  # the rows carry no gradient (e.g. MLM sequences without a target)
    kwargs = {
        "replicates": config.bootstrap,
        "seed": seed,
        "method": config.interval,
        "keep_replicates": keep,
    }
    denominators = {
        "energy_fraction": (sums.total, (0.0, 1.0)),
        "energy_ratio": (sums.control, (0.0, math.inf)),
        "energy_complement_ratio": (sums.complement, (0.0, math.inf)),
    }
    out = {}
    for metric, (denominator, bounds) in denominators.items():
        value = values[metric]
        if math.isfinite(value) and float(denominator.sum()) > 0:
            out[metric] = metrics.bootstrap_ratio(
                sums.inside, denominator, centre=value, bounds=bounds, **kwargs
            )
    return out


def _check_sums(sums: capture.EnergySums, values: dict[str, float], site: str) -> None:
    """The per-sequence sums' pooled fraction and ratios must be the reported values."""
    for metric, denominator in (
        ("energy_fraction", sums.total),
        ("energy_ratio", sums.control),
        ("energy_complement_ratio", sums.complement),
    ):
        value = values[metric]
        if not math.isfinite(value) or not float(denominator.sum()) > 0:
            continue
        pooled = float(sums.inside.sum() / denominator.sum())
        if not abs(pooled - value) <= _SUMS_RTOL * max(abs(value), 1e-300):
            raise ValueError(
                f"the per-sequence energy sums of {site!r} give {metric} {pooled!r}, the "
                f"moments {value!r}: they describe different tokens or proxies"
            )


def _energy_rows(
    data: Capture,
    headline: metrics.EnergyComparison,
    complement: metrics.EnergyComparison,
    ci: dict[str, tuple[float, float]],
    common: dict[str, Any],
) -> list[dict[str, Any]]:
    """One measurement's rows: the proxy's energy against both control families."""
    values = [
        ("energy_fraction", headline.energy_fraction),
        ("energy_control_mean", headline.control_mean),
        ("energy_control_std", headline.control_std),
        ("energy_control_min", headline.control_min),
        ("energy_control_max", headline.control_max),
        ("energy_null_mean", headline.null_mean),
        ("energy_enrichment", headline.energy_enrichment),
        ("energy_enrichment_null", headline.enrichment_null),
        ("energy_z", headline.energy_z),
        ("energy_p_value", headline.energy_p_value),
        ("energy_ratio", headline.energy_ratio),
        ("energy_complement_control_mean", complement.control_mean),
        ("energy_complement_null_mean", complement.null_mean),
        ("energy_complement_ratio", complement.energy_ratio),
        ("energy_complement_p_value", complement.energy_p_value),
    ]
    return [
        make_row(data, NAME, metric, value, ci=ci.get(metric), **common) for metric, value in values
    ]


def _data_matched_rows(
    data: Capture,
    moment: torch.Tensor,
    proxy: Basis,
    pca_span: Basis,
    families: dict[str, Basis | None],
    draws: int,
    key: tuple[int, ...],
    common: dict[str, Any],
    total: float | None,
) -> list[dict[str, Any]]:
    """The proxy against frames inside the PCA span, outside each family's excluded subspace
    (``families``: metric infix → excluded basis), both scored on ``moment`` (the
    drift-regressed one where the proxy avoids m̂; ``total``: the gradient energy); the ratio to
    the frames' mean (the closed form of :func:`~tangentlens.metrics.compare_energy` describes
    frames in all of X⊥)."""
    out = []
    for infix, excluded in families.items():
        frames = metrics.data_matched_frames(
            pca_span, proxy.shape[1], draws, key, excluded=excluded
        )
        result = metrics.compare_energy(moment, proxy, frames, excluded, total=total)
        out.append(
            make_row(
                data, NAME, f"data_matched_{infix}energy_ratio", result.sampled_ratio, **common
            )
        )
        out.append(
            make_row(
                data, NAME, f"data_matched_{infix}energy_p_value", result.energy_p_value, **common
            )
        )
    return out


def rows(
    data: Capture,
    proxies: dict[str, dict[str, Basis]],
    config: TangentEnergyConfig,
    replicates: list[dict[str, Any]] | None = None,
    *,
    draws: int = 100,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rows for every site with gradients; ``proxies[site][method]`` are the fitted bases (with
    ``mean_direction``, m̂, where m̂ was projected out of the others: see
    :func:`tangentlens.proxies.exchangeable_excluded`; a basis that overlaps m̂ is refused,
    :func:`tangentlens.proxies.check_mean_direction`), each against ``draws`` control frames
    per measurement drawn from ``seed`` (the proxies stage's ``draws`` and ``seed``).
    ``replicates``: a list that receives, for each row with a bootstrap interval, the row's
    labels (:data:`tangentlens.results.REPLICATE_FIELDS`) and its replicate values
    (``replicates``), in replicate order."""
    out: list[dict[str, Any]] = []
    for site_name, site in data.statistics.sites.items():
        if site.g is None or site_name not in proxies:
            continue
        layer = data.layers.get(site_name)
        by_method = proxies[site_name]
        proxy_fits.check_mean_direction(by_method, site_name)
        energy = _checked_sequence_energy(site, site_name, by_method)
        sample = None
        if config.bootstrap and energy is None:
            sample = _sampled_gradients(site, data.seq_len)
        pca_span = None
        if config.data_matched_m is not None:
            h = site.h
            m = config.data_matched_m
            pca_span = dictionaries.PCA.from_moments(m, h.count, h.sum, h.second_moment).basis()
        regressions: dict[int | None, metrics.DriftRegression] = {}  # per bin: one per m̂
        for method, proxy in by_method.items():
            d, rank = proxy.shape
            families = {
                "": proxy_fits.exchangeable_excluded(by_method, method),
                "complement_": complement_excluded(by_method, method),
            }
            for bin_index in (None, *range(len(site.g_bins))):
                acc = data.gradients(site_kind(site_name), layer, bin_index)
                if acc.count == 0 or acc.second_moment is None:
                    continue
                common = measurement(site_name, method, rank, bin_index, acc.count)
                if not float(torch.diagonal(acc.second_moment).sum()) > 0:
                    # no gradient reached these tokens: the energy fraction is undefined
                    out.append(make_row(data, NAME, "energy_fraction", math.nan, **common))
                    continue
                key = seed_key(seed, data.step, layer, bin_index)
                frames = exchangeable_frames(by_method, method, draws, key)
                drift = None
                moment, total = acc.second_moment, None
                if families[""] is not None:  # the proxy avoids m̂: score beyond the drift
                    if bin_index not in regressions:
                        regressions[bin_index] = metrics.drift_regression(
                            acc.second_moment, families[""][:, 0]
                        )
                    drift = regressions[bin_index]
                    moment, total = drift.moment, drift.total
                headline = metrics.compare_energy(moment, proxy, frames, families[""], total=total)
                excluded = families["complement_"]
                complement = metrics.compare_energy(
                    moment,
                    proxy,
                    metrics.control_frames(d, rank, draws, key, excluded=excluded),
                    excluded,
                    total=total,
                )
                values = {
                    "energy_fraction": headline.energy_fraction,
                    "energy_ratio": headline.energy_ratio,
                    "energy_complement_ratio": complement.energy_ratio,
                }
                coefficient = None if drift is None else drift.coefficient
                if energy is not None:
                    sums = energy.sums(method, bin_index, coefficient)
                    _check_sums(sums, values, site_name)
                elif sample is not None:
                    sums = _sampled_sums(sample, proxy, families, bin_index, drift)
                else:
                    sums = None
                intervals = _intervals(sums, values, config, seed, keep=replicates is not None)
                ci = {m: (i.ci_low, i.ci_high) for m, i in intervals.items()}
                out += _energy_rows(data, headline, complement, ci, common)
                if replicates is not None:
                    replicates += [
                        replicate_record(
                            make_row(data, NAME, m, i.value, **common), i.replicate_values
                        )
                        for m, i in intervals.items()
                    ]
                if pca_span is not None:
                    out += _data_matched_rows(
                        data, moment, proxy, pca_span, families, draws, key, common, total
                    )
    return out


def _excluded_rank(recipe: Any) -> int:
    """The rank r of what the exchangeable controls avoid: 1 with the mean direction m̂ (the
    stage's ``mean_direction``), else 0."""
    return 1 if recipe.proxies.mean_direction else 0


def exchangeable_room(recipe: Any, d: int, probe: str) -> Bound:
    """The range of ``proxies.rank`` k whose exchangeable control frames (Haar k-frames in m̂⊥,
    of dimension ``d − r``) fit: ``k ≤ d − r`` (``probe`` names who draws them)."""
    r = _excluded_rank(recipe)
    why = f"{probe}'s exchangeable controls are k-frames in m̂⊥, of dimension d − {r} = {d - r}"
    return Bound("proxies.rank", recipe.proxies.rank, 1, d - r, why)


def _width_bounds(config: TangentEnergyConfig, recipe: Any, d: int) -> list[Bound]:
    """The rank's room for both control families and the data-matched span's range, as the
    frames are drawn: exchangeable k ≤ d − r; complement (k-frames outside the proxy and m̂, a
    space of dimension d − k − r) k ≤ ⌊(d − r)/2⌋; the data-matched span, a top-m PCA span
    (PCA rank m ≤ d − 1), keeps m − k − r ≥ k dimensions outside the proxy and m̂ (its overlap
    with k + r generic directions has rank k + r), so m ≥ 2k + r."""
    k, r = recipe.proxies.rank, _excluded_rank(recipe)
    complement = (
        f"{NAME}'s complement controls are k-frames outside the proxy and m̂, of dimension "
        f"d − k − {r} (k ≤ ⌊(d − {r})/2⌋ = {(d - r) // 2} at d = {d})"
    )
    out = [
        exchangeable_room(recipe, d, NAME),
        Bound("proxies.rank", k, 1, (d - r) // 2, complement),
    ]
    m = config.data_matched_m
    if m is not None:
        why = (
            f"the data-matched controls are k-frames in a top-m PCA span (m < d = {d}) outside "
            f"the proxy and m̂ (m − k − {r} ≥ k: m ≥ {2 * k + r} at proxies.rank = {k})"
        )
        out.append(Bound(f"probes.{NAME}.data_matched_m", m, 2 * k + r, d - 1, why))
    return out


def _step_rows(inputs: StepInputs, config: TangentEnergyConfig) -> list[dict[str, Any]]:
    stage = inputs.tangent
    return rows(
        inputs.scored,
        inputs.proxies,
        config,
        inputs.replicates,
        draws=stage.draws,
        seed=stage.seed,
    )


def _needs(config: TangentEnergyConfig) -> Needs:
    """Gradients, their per-bin moments and the sampled rows; with a bootstrap, per-sequence
    energy sums (the intervals then resample every analysed sequence where the proxies are
    known before the capture) and, with ``keep_replicates``, the replicates kept."""
    return Needs(
        gradients=True,
        bins=True,
        bin_moments=True,
        reservoir=True,
        sequence_sums=config.bootstrap > 0,
        replicates=config.keep_replicates,
    )


#: How every ratio to a control family is formed (this probe's, the update alignment's).
RATIO_ESTIMATOR = Estimator(
    "energy_ratio",
    "E(T) over the control family's exact mean k/(d − r)·(1 − E(X)) (X = m̂, or span(T, m̂) for "
    "the complement; the update alignment's likewise), not over the frames drawn, whose mean is "
    "reported beside it; the frames give z and p",
    metric_suffix="_ratio",
)


def _interval_note(config: TangentEnergyConfig, recipe: Any) -> str | None:
    """Where the energy intervals come from (None without a bootstrap): per-sequence sums
    gathered during capture when the proxies are known before it (frozen_early), else the
    reservoir's sample."""
    stage = recipe.proxies
    if stage is None or not config.bootstrap:
        return None
    if stage.frozen:
        source = INTERVAL_ALL_SEQUENCES
        how = "every analysed sequence, from per-sequence sums gathered during capture"
    else:
        source = INTERVAL_SAMPLE
        how = "the reservoir's sampled sequences, rescaled onto the reported value"
    ratios = (
        "ratios of per-sequence sums, the controls' at their exact mean projector; quantiles at "
        "the (B + 1)·p-th order statistic"
    )
    return f"{config.interval} bootstrap over {source}: {how}; {ratios}"


#: "Early": at most this share of the tokens the last scored step had seen.
EARLY_SHARE = 0.3
#: What "well above 1" means for the early energy ratio (besides every interval above 1).
WELL_ABOVE = 1.5


def _energy_finding(kind: str, picked: list[dict[str, Any]]) -> Finding:
    """Bernas et al.: the energy ratio well above 1 early, above its baseline, smaller late —
    over the **early** steps (the scored steps after the baseline that had seen at most
    :data:`EARLY_SHARE` of the tokens the last scored step had seen) every step's interval
    lies above 1 and their mean exceeds :data:`WELL_ABOVE`, the early mean lies 2 sd above the
    baseline's and 2 sd above the last step's (every layer and dictionary method of the site
    kind; the rank-1 mean direction reported on its own; not testable without intervals)."""
    claim = (
        "tangent energy ratio (energy_ratio: the proxy over the exchangeable controls' exact "
        f"mean, null 1; read with its bootstrap intervals) well above 1 early, above its "
        f"baseline, smaller late at {kind}"
    )
    tangent = [r for r in picked if r["method"] != MEAN_DIRECTION]
    steps = steps_of(tangent)
    reason = steps.too_few()
    if reason:
        return untestable(claim, reason)
    seen = tokens_seen(tangent)
    unknown = [s for s in steps.steps if seen.get(s) is None]
    if unknown:
        return untestable(
            claim, f'tokens seen unknown at step {unknown[0]}: "early" cannot be defined'
        )
    horizon = EARLY_SHARE * seen[steps.last]  # type: ignore[operator]
    early = [s for s in steps.steps if steps.baseline < s < steps.last and seen[s] <= horizon]
    if not early:
        return untestable(
            claim,
            f"no scored step between the baseline ({steps.baseline_label()}) and step "
            f"{steps.last} within the first {EARLY_SHARE:.0%} of its {seen[steps.last]:,} "
            "tokens seen",
        )
    compared = [steps.baseline, *early, steps.last]
    same, dropped = same_cells(tangent, compared)
    if not same:
        return untestable(claim, "no (method, layer, site) is scored at every compared step")
    if any(r.get("ci_low") is None or r.get("ci_high") is None for r in same):
        return untestable(
            claim,
            f"the energy_ratio rows carry no interval (probes.{NAME}.bootstrap = 0): the "
            "verdict reads the intervals",
        )
    at = {s: Estimate.of([r for r in same if r["step"] == s]) for s in compared}
    early_mean = Estimate.mean([at[s] for s in early])
    base, late = at[steps.baseline], at[steps.last]
    above_one = all(at[s].low > 1 for s in early)
    over_base, over_late = sds_apart(early_mean, base), sds_apart(early_mean, late)
    holds = (
        above_one
        and early_mean.value > WELL_ABOVE
        and over_base >= NULL_SDS
        and over_late >= NULL_SDS
    )
    per_step = ", ".join(f"{s}: {at[s]}" for s in early)
    cells = len({cell(r) for r in same})
    return Finding(
        claim,
        holds,
        f"early steps (≤ {EARLY_SHARE:.0%} of the {seen[steps.last]:,} tokens seen by step "
        f"{steps.last}) {per_step}, mean {early_mean}; at step {steps.last}: {late}; baseline "
        f"{steps.baseline_label()}: {base}; early − baseline {over_base:+.1f} sd, early − late "
        f"{over_late:+.1f} sd; mean over the same {cells} (method, layer, site) at every "
        f"compared step" + left_out(dropped) + _mean_direction_trend(picked),
    )


def _mean_direction_trend(picked: list[dict[str, Any]]) -> str:
    """The rank-1 mean direction's energy ratio at the first and last step (or nothing)."""
    by_step = mean_by([r for r in picked if r["method"] == MEAN_DIRECTION], "step")
    if not by_step:
        return ""
    first, last = min(by_step), max(by_step)
    return (
        f" (mean direction m̂, rank 1: {by_step[first]:.2f} at step {step_label(first)}, "
        f"{by_step[last]:.2f} at step {last})"
    )


def findings(rows: list[dict[str, Any]]) -> list[Finding]:
    """The energy ratio's verdict per site kind (:func:`_energy_finding`)."""
    return per_kind(rows, NAME, "energy_ratio", _energy_finding)


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=TangentEnergyConfig,
    scope="tangent",
    needs=_needs,
    rows=_step_rows,
    width_bounds=_width_bounds,
    metrics={
        "energy_fraction": (
            "`‖RQ‖²_F / ‖G‖²_F`, R the gradients beyond the drift, `g − b(m̂ᵀg)` with `b = "
            "Mm̂/(m̂ᵀMm̂)` (M = GᵀG: what the gradients' drift coordinate explains removed; G "
            "itself for `mean_direction`); `ci_low`/`ci_high`: 95 % studentized bootstrap over "
            "sequences around the reported value (`frozen_early`: every analysed sequence; "
            "`per_checkpoint`: the reservoir's sequences, rescaled onto the value)"
        ),
        "energy_control_mean": (
            "mean energy fraction of the exchangeable controls (k-frames in m̂⊥), of the same R"
        ),
        "energy_control_std": "their standard deviation (ddof 1)",
        "energy_control_min": "their minimum",
        "energy_control_max": "their maximum",
        "energy_null_mean": (
            "their exact mean, `k/(d − 1) · (1 − D)`, `D = ‖Mm̂‖²/(m̂ᵀMm̂ · tr M) ≥ E(m̂)` the "
            "share the drift regression removes (`k/d` for `mean_direction` itself): the "
            "denominator of `energy_ratio`; `energy_control_mean` is its self-check"
        ),
        "energy_ratio": (
            "`E(T) / energy_null_mean`: over the exchangeable controls' exact mean (the "
            "population ratio's estimate, free of the frames' Monte-Carlo error; its null is 1 "
            "whatever m̂'s error); `ci_low`/`ci_high`: 95 % studentized bootstrap over "
            "sequences of `Σ‖rQ‖² / Σ k/(d − 1)·‖r‖²`, as `energy_fraction`'s"
        ),
        "energy_enrichment": (
            "`E(T) / (k/d)`: read against `energy_enrichment_null`, never against 1 "
            "(enrichment over its null is `energy_ratio`)"
        ),
        "energy_enrichment_null": (
            "what `energy_enrichment` reads for a proxy uniform in m̂⊥: `(1 − D) · d/(d − 1)` "
            "(1 for `mean_direction` itself)"
        ),
        "energy_z": "`(E(T) − mean) / std` of the exchangeable controls",
        "energy_p_value": "permutation p-value against the exchangeable controls (calibrated)",
        "energy_complement_control_mean": (
            "mean energy fraction of the complement controls (k-frames in span(T, m̂)⊥)"
        ),
        "energy_complement_null_mean": (
            "their exact mean, `k/(d − 1 − k_T) · (1 − D − E(T))`: the denominator of "
            "`energy_complement_ratio`"
        ),
        "energy_complement_ratio": (
            "`E(T) / energy_complement_null_mean` (the paper's tangent/normal ratio, to the "
            "complement controls' exact mean), with a bootstrap interval as `energy_ratio`'s"
        ),
        "energy_complement_p_value": (
            "permutation p-value against the complement controls (not calibrated)"
        ),
        "data_matched_energy_ratio": (
            "`E(T)` over the mean of the k-frames drawn inside the top-m PCA span and m̂⊥ "
            "(`data_matched_m`)"
        ),
        "data_matched_energy_p_value": "permutation p-value against those frames",
        "data_matched_complement_energy_ratio": (
            "`E(T)` over the mean of k-frames inside the top-m PCA span minus the proxy and m̂"
        ),
        "data_matched_complement_energy_p_value": "permutation p-value against those frames",
    },
    reporting=Reporting(
        tables=(
            Table(
                "energy_ratio",
                "energy ratio [95 % CI], p-value vs the exchangeable controls",
                in_compare=False,
                render="tangentlens.probes.render.tangent_energy:energy_tables",
            ),
            Table("energy_ratio", "tangent/control energy ratio", in_report=False),
            Table("energy_p_value", "tangent energy p-value", in_report=False),
        ),
        figures=(
            Figure(
                "tangent_energy.png",
                "energy_fraction",
                "gradient energy fraction",
                "Tangent energy vs matched-rank controls",
                render="tangentlens.probes.render.tangent_energy:tangent_energy_figure",
            ),
            Figure(
                "energy_ratio.png",
                "energy_ratio",
                "energy ratio (proxy / controls' exact mean)",
                "Tangent energy ratio over training",
                in_report=False,
                in_compare=True,
                render="tangentlens.probes.render.tangent_energy:energy_ratio_figure",
            ),
        ),
        must_match=(
            MustMatch("draws", "proxies.draws"),
            MustMatch(
                "control family",
                "probes.tangent_energy.data_matched_m",
                metric_prefix="data_matched_",
            ),
        ),
        may_differ=("bootstrap", "interval", "keep_replicates"),  # intervals only
        log_scale=(
            "energy_ratio",
            "energy_complement_ratio",
            "data_matched_energy_ratio",
            "data_matched_complement_energy_ratio",
        ),
        findings=(findings,),
        estimators=(
            RATIO_ESTIMATOR,
            Estimator(
                "energy_interval",
                _interval_note,
                metrics=("energy_fraction", "energy_ratio", "energy_complement_ratio"),
            ),
            Estimator(
                "energy_drift",
                "a proxy avoiding m̂ and its controls scored on the gradients beyond the drift, "
                "g − b(m̂ᵀg) with b = Mm̂/(m̂ᵀMm̂) per bin (mean_direction's own row on g); "
                "fractions of tr M",
            ),
        ),
    ),
)
