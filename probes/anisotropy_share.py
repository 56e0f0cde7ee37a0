"""Share of gradient anisotropy held by the tangent proxy (METHODS.md §1.4), per site, method and
frequency bin, against the tangent-energy probe's own control frames.

Two views, each reported for the proxy and its matched-rank controls like the energy is (value,
control mean and std with ddof 1, ``z = (x_T − mean) / std``, permutation p-value
``(1 + #{x_N ≥ x_T}) / (1 + draws)``):

* spectral share **(ours)**, ``anisotropy_share_spectral(_control_mean, _control_std, _z,
  _p_value)`` — with the *uncentred* gradient second moment ``C = GᵀG/n`` (the accumulator's
  ``second_moment / count``, the same matrix the energy fraction reads) and the excess
  ``A = C − (tr C/d) I``: ``tr(Qᵀ A₊ Q) / tr(A₊)``. A mean gradient inside the proxy counts as
  captured anisotropy. One eigen-decomposition scores any number of frames, so it uses all of
  the proxies stage's ``draws`` frames (p ≥ ``1/(draws + 1)``, 1/101 by default);
* ``delta_isoscore_star(_control_mean, _control_std, _z, _p_value)`` —
  ``IsoScore*(G(I − P_Q)) − IsoScore*(G)`` from the bin's gradient *covariance* (IsoScore is
  defined on centred variances). Each frame costs a d × d eigen-decomposition, so only the first
  ``isoscore_draws`` frames (default 20) are scored: **p ≥ 1/(isoscore_draws + 1)** (1/21 by
  default) — a p-value at that floor means "no control reached the proxy", not "p = 0.048".
  The shrinkage covariance C0 is the site's gradient covariance over all tokens (for the "all"
  bin this makes IsoScore* plain IsoScore); ``zeta`` as Rudman & Eickhoff (0.2).

Control frames: frame ``j`` is the exchangeable Haar draw the tangent-energy probe scores as its
headline control ``j`` (``tangent_energy.exchangeable_frames``: k-frames in ``span(m̂)⊥``, seeded
from ``seed_key(seed, step, layer, bin)`` with the proxies stage's ``seed``), so both
p-values are calibrated under "the proxy is a random set of directions in ``span(m̂)⊥``"
(METHODS.md §1.2): the spectral share uses frames ``0 … draws − 1``, ΔIsoScore* frames
``0 … isoscore_draws − 1`` (a prefix of the same seeded sequence, extended past ``draws`` when
``isoscore_draws > draws``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tangentlens import metrics  # lazy packages
from tangentlens._lazy import LazyModule
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.checks import check_count
from tangentlens.contract import Probe, StepInputs
from tangentlens.models.sites import site_kind
from tangentlens.probes.tangent_energy import (
    check_mean_direction,
    exchangeable_frames,
    exchangeable_room,
    seed_key,
)
from tangentlens.reporting import Estimator, MustMatch, Reporting, Table
from tangentlens.results import make_row, measurement

if TYPE_CHECKING:
    from tangentlens.typing import Basis

torch = LazyModule("torch")

__all__ = ["NAME", "PROBE", "AnisotropyShareConfig", "rows"]


@dataclass(frozen=True)
class AnisotropyShareConfig:
    """``isoscore_draws`` control frames for ΔIsoScore* (its p-value floor is
    ``1/(isoscore_draws + 1)``); ``zeta`` the IsoScore* shrinkage. The spectral share uses the
    proxies stage's ``draws`` (the frames ``tangent_energy`` scores); both use its ``seed``."""

    isoscore_draws: int = 20
    zeta: float = 0.2

    def __post_init__(self) -> None:
        check_count(self.isoscore_draws, "isoscore_draws", minimum=1)
        if not 0 <= self.zeta <= 1:
            raise ValueError(f"zeta must be in [0, 1], got {self.zeta!r}")


#: The probe's name: its recipe table ``[probes.anisotropy_share]`` and its rows' ``probe``.
NAME = "anisotropy_share"


def rows(
    data: Capture,
    proxies: dict[str, dict[str, Basis]],
    config: AnisotropyShareConfig,
    *,
    draws: int = 100,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rows for every site with gradients; ``proxies[site][method]`` are the fitted bases, scored
    against ``draws`` control frames from ``seed`` (the proxies stage's ``draws`` and ``seed``:
    the frames ``tangent_energy`` scores)."""
    out: list[dict[str, Any]] = []
    n_frames = max(draws, config.isoscore_draws)
    for site_name, site in data.statistics.sites.items():
        if site.g is None or site_name not in proxies or site.g.count < 3:
            continue
        layer = data.layers.get(site_name)
        c0 = site.g.covariance()
        methods = proxies[site_name]
        check_mean_direction(methods, site_name)
        scored = []  # (bin, its accumulator, spectral and ΔIsoScore* results by method)
        kind = site_kind(site_name)
        for bin_index in (None, *range(len(site.g_bins))):
            acc = data.gradients(kind, layer, bin_index)
            if acc.count < 3 or acc.second_moment is None:
                continue
            if not float(torch.diagonal(acc.second_moment).sum()) > 0:
                continue  # no gradient here; tangent_energy reports the NaN
            key = seed_key(seed, data.step, layer, bin_index)
            frames = {m: exchangeable_frames(methods, m, n_frames, key) for m in methods}
            # every method against the same moments: one eigen-decomposition of each
            spectral = metrics.compare_anisotropy_shares(
                acc.second_moment / acc.count,
                {m: (q, frames[m][:draws]) for m, q in methods.items()},
            )
            delta = metrics.compare_delta_isoscores_star(
                acc.covariance(),
                {m: (q, frames[m][: config.isoscore_draws]) for m, q in methods.items()},
                c0,
                config.zeta,
            )
            scored.append((bin_index, acc, spectral, delta))
        for method, proxy in methods.items():
            for bin_index, acc, spectral, delta in scored:
                common = measurement(site_name, method, proxy.shape[1], bin_index, acc.count)
                for prefix, result in (
                    ("anisotropy_share_spectral", spectral[method]),
                    ("delta_isoscore_star", delta[method]),
                ):
                    for suffix, value in (
                        ("", result.value),
                        ("_control_mean", result.control_mean),
                        ("_control_std", result.control_std),
                        ("_z", result.z),
                        ("_p_value", result.p_value),
                    ):
                        out.append(make_row(data, NAME, prefix + suffix, value, **common))
    return out


def _step_rows(inputs: StepInputs, config: AnisotropyShareConfig) -> list[dict[str, Any]]:
    stage = inputs.tangent
    return rows(inputs.scored, inputs.proxies, config, draws=stage.draws, seed=stage.seed)


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=AnisotropyShareConfig,
    scope="tangent",
    needs=Needs(gradients=True, bins=True, bin_moments=True),
    rows=_step_rows,
    width_bounds=lambda config, recipe, d: [exchangeable_room(recipe, d, NAME)],
    metrics={
        "anisotropy_share_spectral": (
            "`tr(QᵀA₊Q) / tr(A₊)`, `A = C − (tr C/d) I`, `C = GᵀG/n` uncentred: 0 isotropic, 1 "
            "the proxy holds all excess directions"
        ),
        "anisotropy_share_spectral_control_mean": (
            "its mean over tangent_energy's exchangeable control frames"
        ),
        "anisotropy_share_spectral_control_std": "their standard deviation (ddof 1)",
        "anisotropy_share_spectral_z": "z-score against the controls",
        "anisotropy_share_spectral_p_value": "permutation p-value (floor `1/(draws + 1)`)",
        "delta_isoscore_star": "`IsoScore*(G(I − P_Q)) − IsoScore*(G)` on the gradient covariance",
        "delta_isoscore_star_control_mean": (
            "its mean over the first `isoscore_draws` of the same frames"
        ),
        "delta_isoscore_star_control_std": "their standard deviation (ddof 1)",
        "delta_isoscore_star_z": "z-score against those controls",
        "delta_isoscore_star_p_value": (
            "permutation p-value (floor `1/(isoscore_draws + 1)`: 1/21 by default)"
        ),
    },
    reporting=Reporting(
        tables=(
            Table(
                "anisotropy_share_spectral",
                "spectral share of gradient anisotropy",
                in_report=False,
            ),
        ),
        figures=(),
        must_match=(
            MustMatch("draws", "proxies.draws"),  # its controls are those frames
            MustMatch("draws", "probes.anisotropy_share.isoscore_draws"),
        ),
        estimators=(
            Estimator(
                "anisotropy_share",
                (
                    "spectral share on the uncentred gradient second moment GᵀG/n; ΔIsoScore* on "
                    "the covariance; controls = tangent_energy's exchangeable frames"
                ),
            ),
        ),
    ),
)
