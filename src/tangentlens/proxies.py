"""Fitting the tangent proxies of a site: concept dictionaries on its activations.

Every method is fitted on **centred** activations by default (METHODS.md §1.1: a tangent space is
spanned by differences, and PCA, semi-NMF and SAEs are only comparable on the same data); over a
window of checkpoints each checkpoint is centred on its own mean before pooling, so the change of
the mean between checkpoints does not become "variance" that PCA's top component would chase.
PCA comes from the (pooled, centred) streamed moments of every kept token; semi-NMF and SAEs from
the sampled activation rows (the capture's reservoir). ``centre = False`` fits everything on the
raw activations instead.

The mean direction ``m̂ = mean(H) / ‖mean(H)‖`` is its own rank-1 proxy (method
``mean_direction``, scored against rank-1 controls) and is projected out of every other proxy
(``Q ← orth((I − m̂m̂ᵀ) Q)``, same rank unless m̂ lies inside ``span(Q)``), so energy along the
drift is reported as such and not credited to whichever method happens to contain it; how much
of m̂ a method's span held is its ``mean_direction_overlap`` ``‖Qᵀm̂‖²``. m̂ follows the fit
policy: the pooled window mean under ``frozen_early``, the step's mean under ``per_checkpoint``.

A proxy fixed beforehand rather than fitted on these activations — a published SAE's
(:func:`add_fixed_proxy`) — is treated the same way: m̂ projected out, its overlap reported.

Each proxy is an orthonormal basis (d × rank, float64); :class:`FittedProxies` also carries the
fit diagnostics that tell whether a proxy is a good fit (:func:`fit_rows`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float

from tangentlens.capture import MomentAccumulator, SiteStatistics
from tangentlens.capture.captured import Capture
from tangentlens.capture.sequence_energy import EnergyProjectors, SequenceEnergyConfig
from tangentlens.checks import check_count
from tangentlens.contract import FIT_PROBE
from tangentlens.dictionaries import PCA, SAE, SemiNMF, span_basis
from tangentlens.dictionaries.proxy_config import MEAN_DIRECTION, METHODS, ProxyConfig
from tangentlens.results import make_row
from tangentlens.typing import Basis

__all__ = [
    "MEAN_DIRECTION",
    "METHODS",
    "ActivationPool",
    "FittedProxies",
    "FixedProxy",
    "ProxyConfig",
    "add_fixed_proxy",
    "check_mean_direction",
    "exchangeable_excluded",
    "fit_proxies",
    "fit_rows",
    "sequence_energy_config",
]


@dataclass(frozen=True)
class FittedProxies:
    """``bases[method]`` (d × rank, orthonormal, float64) and ``diagnostics[method][metric]``."""

    bases: dict[str, Basis]
    diagnostics: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class FixedProxy:
    """A proxy known before a step's own fit (a published or user SAE, a user basis): ``basis``
    (d × k orthonormal, float64) and the fit diagnostics reported with it."""

    basis: Basis
    diagnostics: dict[str, float] = field(default_factory=dict)


class ActivationPool:
    """Activations of one site pooled over checkpoints, each centred on its own mean when the
    fit is centred: moments (for PCA and the mean direction) and sampled rows (semi-NMF, SAE)."""

    def __init__(self) -> None:
        self._parts: list[tuple[MomentAccumulator, torch.Tensor | None]] = []

    def add(self, moments: MomentAccumulator, sample: torch.Tensor | None) -> None:
        """One checkpoint's activation moments (with a second moment) and sampled rows (n × d)."""
        if moments.second_moment is None or moments.count < 2:
            raise ValueError("a checkpoint's activations need a second moment over ≥ 2 rows")
        self._parts.append((moments, sample))

    def fit(self, config: ProxyConfig, device: torch.device | str | None = None) -> FittedProxies:
        """Fit every method of ``config`` on the pooled activations, on ``device`` (default:
        where the first checkpoint's moments are); the bases are on that device."""
        if not self._parts:
            raise ValueError("no checkpoint's activations were added to the pool")
        at = torch.device(device) if device is not None else self._parts[0][0].sum.device
        n = sum(m.count for m, _ in self._parts)
        total = sum(m.sum.to(at) for m, _ in self._parts)
        d = total.shape[0]
        second = torch.zeros(d, d, dtype=torch.float64, device=at)
        rows: list[torch.Tensor] = []
        for m, sample in self._parts:
            mean = (m.sum / m.count).to(at)
            raw = m.second_moment.to(at)  # type: ignore[union-attr]
            second += raw - m.count * torch.outer(mean, mean) if config.centre else raw
            if sample is not None:
                sample = sample.to(at).double()
                rows.append(sample - mean if config.centre else sample)
        sample = torch.cat(rows) if rows else None
        if sample is None and any(m in ("seminmf", "sae") for m in config.methods):
            raise ValueError(
                "semi-NMF and SAE proxies need sampled activation rows (the reservoir)"
            )
        out = FittedProxies({}, {})
        for method in config.methods:
            if method == "pca":
                zero = torch.zeros(d, dtype=torch.float64, device=at)
                pca = PCA.from_moments(config.rank, n, zero, second)
                out.bases[method] = pca.basis()
                out.diagnostics[method] = {
                    "pca_explained_variance": float(pca.explained_variance_ratio_.sum())
                }
            elif method == "seminmf":
                nmf, restarts = _seminmf(sample, config)  # type: ignore[arg-type]
                out.bases[method] = nmf.basis()
                out.diagnostics[method] = {
                    "seminmf_relative_error": nmf.relative_error_,
                    "seminmf_svd_bound": nmf.svd_bound_,
                    "seminmf_converged": float(nmf.converged_),
                }
                if restarts:
                    out.diagnostics[method]["seminmf_restarts"] = float(restarts)
            else:
                sae = SAE(
                    config.rank,
                    k=config.sae_k,
                    training_samples=config.sae_samples,
                    batch_size=min(1024, sample.shape[0]),  # type: ignore[union-attr]
                    seed=config.seed,
                ).fit(sample)
                out.bases[method] = sae.basis()
                out.diagnostics[method] = {
                    "sae_explained_variance": sae.explained_variance_,
                    "sae_l0": sae.l0_,
                }
        if config.mean_direction:
            mean = (total / n).double()
            norm = float(mean.norm())
            if not norm > 0:
                raise ValueError("the mean activation is zero: the mean direction is undefined")
            m = mean / norm
            for method, basis in out.bases.items():
                out.bases[method], overlap = _without_mean(basis, m)
                out.diagnostics[method]["mean_direction_overlap"] = overlap
            out.bases[MEAN_DIRECTION] = m[:, None]
        return out


#: How many times a semi-NMF fit whose directions collapsed is fitted again from the next seed.
SEMINMF_RESTARTS = 2


def _seminmf(sample: torch.Tensor, config: ProxyConfig) -> tuple[SemiNMF, int]:
    """The semi-NMF fit of ``sample`` at the config's seed, and how many restarts it took: a
    fit whose directions span fewer than ``rank`` dimensions (codes died: rare, on small or
    degenerate samples, and where it happens depends on the last bits of the arithmetic) is
    fitted again from the next seed, up to :data:`SEMINMF_RESTARTS` times, rather than ending
    the sweep; the diagnostics say so (``seminmf_restarts``). After that its own error stands."""
    for restart in range(SEMINMF_RESTARTS + 1):
        seed = config.seed + restart
        nmf = SemiNMF(config.rank, seed=seed, max_iter=config.seminmf_max_iter).fit(sample)
        if nmf.effective_rank_ >= config.rank:
            return nmf, restart
    return nmf, SEMINMF_RESTARTS


def _without_mean(basis: Basis, m: Float[torch.Tensor, " d"]) -> tuple[Basis, float]:
    """``orth((I − m̂m̂ᵀ) Q)`` and ``‖Qᵀm̂‖²`` (how much of the unit ``m`` the span held)."""
    overlap = basis.T @ m
    return span_basis((basis - torch.outer(m, overlap)).T), float(overlap.pow(2).sum())


def add_fixed_proxy(
    fitted: FittedProxies,
    method: str,
    basis: Basis,
    diagnostics: dict[str, float] | None = None,
) -> FittedProxies:
    """``fitted`` with a proxy fixed beforehand (``basis``, d × k orthonormal; its fit
    ``diagnostics``, e.g. an SAE's explained variance) added as ``method``: where ``fitted`` has
    the mean direction m̂, it is projected out of ``basis`` as out of every fitted proxy, and
    ``mean_direction_overlap`` recorded."""
    if method in fitted.bases:
        raise ValueError(f"the proxies already hold a method named {method!r}")
    all_diagnostics = dict(fitted.diagnostics)
    all_diagnostics[method] = dict(diagnostics or {})
    if MEAN_DIRECTION in fitted.bases:
        m = fitted.bases[MEAN_DIRECTION][:, 0]
        basis, overlap = _without_mean(basis.to(m.device, torch.float64), m)
        all_diagnostics[method]["mean_direction_overlap"] = overlap
    bases = next(iter(fitted.bases.values()), basis)  # the fitted proxies' device
    return FittedProxies(
        {**fitted.bases, method: basis.to(bases.device, torch.float64)}, all_diagnostics
    )


def fit_proxies(site: SiteStatistics, config: ProxyConfig) -> FittedProxies:
    """Proxies of one step's site: PCA from its moments, semi-NMF / SAE on its reservoir."""
    pool = ActivationPool()
    sample = None
    if site.reservoir is not None and len(site.reservoir):
        sample = site.reservoir.columns()["H"]
    pool.add(site.h, sample)
    return pool.fit(config)


def fit_rows(
    data: Capture, proxies: dict[str, dict[str, Basis]], diagnostics: dict[str, Any]
) -> list[dict[str, Any]]:
    """Fit-quality rows (probe ``proxy_fit``) for every site of the step:

    * ``explained_variance`` — the share of this step's centred activation variance inside each
      scored proxy, ``tr(Qᵀ C Q) / tr(C)``; under ``frozen_early`` it tells how much of a later
      step's variance the frozen proxy still explains;
    * the fit's own diagnostics where this step's activations were fitted (``diagnostics[site]
      [method][metric]``): ``pca_explained_variance``, ``seminmf_relative_error`` and
      ``seminmf_svd_bound`` (the truncated-SVD error at the same rank, a floor),
      ``seminmf_converged`` (1/0), ``seminmf_restarts`` (only for a fit that collapsed and was
      fitted again from the next seeds), ``sae_explained_variance``, ``sae_l0``, and
      ``mean_direction_overlap`` ``‖Qᵀm̂‖²`` (before m̂ was projected out of the proxy);
    * where the proxies hold m̂, ``mean_direction_rho`` ``ρ = ‖μ‖ / √tr Σ_H`` of this step's
      activations (method ``mean_direction``): the mean's size against the spread — m̂ errs by
      an angle of about ``1/(ρ√n)`` over n independent tokens, mostly along the high-variance
      directions the proxies span (METHODS.md §1.3), so a small ρ (at initialisation, after a
      LayerNorm) says how far m̂ can be from the drift the energies are read beyond.
    """
    out: list[dict[str, Any]] = []
    for site, by_method in proxies.items():
        stats = data.statistics.sites.get(site)
        if stats is None or stats.h.count < 2:
            continue
        cov = stats.h.covariance()
        trace = float(torch.diagonal(cov).sum())
        if MEAN_DIRECTION in by_method and trace > 0:
            mean = stats.h.sum / stats.h.count
            rho = float(mean.norm()) / trace**0.5
            common = {"site": site, "method": MEAN_DIRECTION, "rank": 1}
            out.append(make_row(data, FIT_PROBE, "mean_direction_rho", rho, **common))
        for method, basis in by_method.items():
            common = {"site": site, "method": method, "rank": basis.shape[1]}
            if trace > 0:
                inside = float(torch.einsum("dk,de,ek->", basis, cov, basis))
                out.append(
                    make_row(data, FIT_PROBE, "explained_variance", inside / trace, **common)
                )
            for metric, value in diagnostics.get(site, {}).get(method, {}).items():
                out.append(make_row(data, FIT_PROBE, metric, value, **common))
    return out


#: ``‖Qᵀm̂‖`` above which a proxy counts as holding part of m̂ (the basis tolerance).
_MEAN_OVERLAP_ATOL = 1e-6


def exchangeable_excluded(proxies: Mapping[str, Basis], method: str) -> Basis | None:
    """What the exchangeable (headline) controls of ``proxies[method]`` avoid: the mean
    direction m̂ that was projected out of it (``proxies["mean_direction"]``, d × 1); None for
    m̂'s own proxy and when the proxies hold no m̂ (nothing was projected out)."""
    return None if method == MEAN_DIRECTION else proxies.get(MEAN_DIRECTION)


def check_mean_direction(proxies: Mapping[str, Basis], site: str = "") -> None:
    """Refuse proxies whose controls avoid m̂ while they hold part of it: where ``proxies``
    has ``mean_direction`` (m̂, d × 1), every other basis must be orthogonal to it
    (``‖Qᵀm̂‖ ≤ 1e-6``, the basis tolerance). A ``ValueError`` names the site, the method, its
    ``mean_direction_overlap`` ``‖Qᵀm̂‖²`` and how to project m̂ out."""
    m = proxies.get(MEAN_DIRECTION)
    if m is None:
        return
    for method, basis in proxies.items():
        if method == MEAN_DIRECTION:
            continue
        overlap = float((basis.T.to(m.device, torch.float64) @ m.double()).norm())
        if overlap > _MEAN_OVERLAP_ATOL:
            where = f"{site!r}, " if site else ""
            raise ValueError(
                f"proxy {where}{method!r} holds part of the mean direction m̂ "
                f"(mean_direction_overlap ‖Qᵀm̂‖² = {overlap**2:.3g}) while its controls avoid "
                "m̂: it would be credited with the drift's energy. Project m̂ out first "
                "(tangentlens.proxies.add_fixed_proxy, or measure(..., proxies=...), which "
                "record the overlap), or leave mean_direction out of the proxies"
            )


def _projectors(proxies: Mapping[str, Basis]) -> EnergyProjectors:
    """Per method ``P_Q`` and the span its exchangeable controls avoid (m̂, whose drift sums
    the capture gathers, or None)."""
    return EnergyProjectors.from_proxies(
        proxies, {m: exchangeable_excluded(proxies, m) for m in proxies}
    )


def sequence_energy_config(
    proxies: dict[str, dict[str, Basis]], n_bins: int, seq_len: int
) -> SequenceEnergyConfig:
    """What a capture needs to gather per-sequence energy sums of ``proxies`` (``{site:
    {method: basis}}``) known before it (``frozen_early``; for the probes whose needs ask for
    ``sequence_sums``): per site, ``P_Q`` of each proxy and m̂, whose drift sums give the
    energies of the drift-regressed gradients and the controls' exact means (nothing is drawn).
    Pass it as ``StatisticsConfig(sequence_energy=...)``; ``n_bins`` and ``seq_len`` must be the
    capture's. A proxy holding part of m̂ is refused (:func:`check_mean_direction`)."""
    check_count(n_bins, "n_bins", minimum=0)
    projectors = {}
    for site, methods in proxies.items():
        check_mean_direction(methods, site)
        projectors[site] = _projectors(methods)
    return SequenceEnergyConfig(seq_len=seq_len, projectors=projectors, n_bins=n_bins)
