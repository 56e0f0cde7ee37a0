"""One rule for the mean direction m̂ wherever a basis is scored (issue 33, item 2; METHODS.md
§1.1–1.2): controls that avoid m̂ must face a proxy that avoids it too. ``measure`` projects m̂
out of a user's proxy and records ``mean_direction_overlap`` (tests/integration/
test_notebook.py); ``metrics.compare_energy`` refuses a proxy that reaches into the span its
controls exclude; the probes' ``rows`` (tangent_energy, anisotropy_share, update_alignment) and
``tangentlens.proxies.sequence_energy_config`` refuse a basis that overlaps m̂.

The null: gradients whose second moment is exactly ``0.3 m̂m̂ᵀ + 0.7/15 (I − m̂m̂ᵀ)`` (d = 16,
E(m̂) = 0.3, isotropic in m̂⊥), so any proxy in m̂⊥ reads ``energy_ratio`` exactly 1. A proxy
``[m̂, u]`` holding m̂ read 0.347 / (2/15 · 0.7) = 3.71 before the rule, without a word."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from tangentlens.capture import SiteStatistics, StatisticsConfig
from tangentlens.capture.captured import Capture
from tangentlens.metrics import compare_energy, control_frames, exclusion_basis
from tangentlens.probes import anisotropy_share, tangent_energy, update_alignment
from tangentlens.proxies import FittedProxies, add_fixed_proxy, sequence_energy_config
from tangentlens.results import StepLabel

D, SHARE, SITE = 16, 0.3, "b.0"
GEN = torch.Generator().manual_seed(33)
M_HAT = torch.linalg.qr(torch.randn(D, 1, generator=GEN, dtype=torch.float64))[0]
_REST = torch.linalg.svd(torch.eye(D, dtype=torch.float64) - M_HAT @ M_HAT.T)[0][:, : D - 1]
U = _REST[:, :1]  # a direction in m̂⊥
HOLDS_M = torch.cat([M_HAT, U], dim=1)  # a proxy holding m̂ entirely: ‖Qᵀm̂‖² = 1
#: one gradient row per direction: √0.3 m̂ and √(0.7/15) bᵢ for an orthonormal basis of m̂⊥
ROWS = torch.cat([SHARE**0.5 * M_HAT.T, ((1 - SHARE) / (D - 1)) ** 0.5 * _REST.T])
MOMENT = ROWS.T @ ROWS
CONFIG = tangent_energy.TangentEnergyConfig(bootstrap=0)
#: The proxies stage's control frames: draws per measurement and their seed.
CONTROLS = {"draws": 20, "seed": 1}
REFUSED = re.escape(
    f"proxy '{SITE}', 'mine' holds part of the mean direction m̂ (mean_direction_overlap ‖Qᵀm̂‖² = 1)"
)


def _capture() -> Capture:
    n = ROWS.shape[0]
    site = SiteStatistics(D, StatisticsConfig(n_bins=0, reservoir_size=0))
    ids = torch.arange(n)
    site.update(ROWS, ROWS, torch.zeros(n, dtype=torch.int64), ids)
    statistics = SimpleNamespace(sites={SITE: site}, attention={})
    return Capture("null", 4, 40, statistics, {SITE: 0}, seq_len=1)


def _value(rows: list[dict], method: str, metric: str) -> float:
    (row,) = [r for r in rows if r["method"] == method and r["metric"] == metric]
    return row["value"]


def test_compare_energy_refuses_a_proxy_reaching_into_the_excluded_span():
    frames = control_frames(D, 2, 20, (1,), excluded=M_HAT)
    with pytest.raises(ValueError, match=re.escape("(‖XᵀQ‖²_F = 1 of rank 2)")):
        compare_energy(MOMENT, HOLDS_M, frames, M_HAT)
    # inside the excluded span (the complement family) and orthogonal to it are both allowed
    outside = exclusion_basis(HOLDS_M, M_HAT)
    complement = control_frames(D, 2, 20, (1,), excluded=outside)
    assert compare_energy(MOMENT, HOLDS_M, complement, outside).null_mean == pytest.approx(
        2 / (D - 2) * (1 - SHARE - (1 - SHARE) / (D - 1)), rel=1e-12
    )
    null = compare_energy(MOMENT, U, control_frames(D, 1, 20, (1,), excluded=M_HAT), M_HAT)
    assert null.energy_ratio == pytest.approx(1.0, rel=1e-12)


def test_rows_refuse_a_basis_holding_the_mean_direction_and_score_it_once_projected_out():
    data = _capture()
    with pytest.raises(ValueError, match=REFUSED):
        tangent_energy.rows(
            data, {SITE: {"mine": HOLDS_M, "mean_direction": M_HAT}}, CONFIG, **CONTROLS
        )
    # m̂ projected out (as measure does): a proxy uniform in m̂⊥ under the null reads exactly 1
    fitted = add_fixed_proxy(FittedProxies({"mean_direction": M_HAT}, {}), "mine", HOLDS_M)
    assert fitted.diagnostics["mine"]["mean_direction_overlap"] == pytest.approx(1.0, rel=1e-12)
    rows = tangent_energy.rows(data, {SITE: fitted.bases}, CONFIG, **CONTROLS)
    assert _value(rows, "mine", "energy_ratio") == pytest.approx(1.0, rel=1e-12)
    assert _value(rows, "mine", "energy_fraction") == pytest.approx(0.7 / 15, rel=1e-12)
    # without m̂ among the proxies nothing was projected out: controls in ℝ^d, the proxy's
    # share of the drift is its own (mean_direction = false)
    rows = tangent_energy.rows(data, {SITE: {"mine": HOLDS_M}}, CONFIG, **CONTROLS)
    assert _value(rows, "mine", "energy_ratio") == pytest.approx((0.3 + 0.7 / 15) / (2 / 16))


def test_every_other_entry_point_refuses_the_same_basis():
    data = _capture()
    proxies = {SITE: {"mine": HOLDS_M, "mean_direction": M_HAT}}
    with pytest.raises(ValueError, match=REFUSED):
        sequence_energy_config(proxies, 0, 1)
    with pytest.raises(ValueError, match=REFUSED):
        anisotropy_share.rows(data, proxies, anisotropy_share.AnisotropyShareConfig(), **CONTROLS)
    label = StepLabel("null", 4, 40, layers={SITE: 0})
    with pytest.raises(ValueError, match=REFUSED):
        update_alignment.rows(
            label, proxies, None, {SITE: ROWS}, update_alignment.UpdateAlignmentConfig()
        )


def test_the_enrichment_reads_its_null_not_one_and_over_it_is_the_ratio():
    """issue 33, item 5: ``E(T)/(k/d)`` of a proxy uniform in m̂⊥ is ``(1 − E(m̂)) · d/(d − 1)``
    (0.747 here, E(m̂) = 0.3), not 1; a proxy holding 3× its share reads 3× that null."""
    frames = control_frames(D, 1, 20, (1,), excluded=M_HAT)
    null = compare_energy(MOMENT, U, frames, M_HAT)
    assert null.enrichment_null == pytest.approx(0.7 * 16 / 15, rel=1e-12)
    assert null.energy_enrichment == pytest.approx(null.enrichment_null, rel=1e-12)
    planted = MOMENT + 2 * (1 - SHARE) / (D - 1) * U @ U.T  # u now holds 3 × its share
    result = compare_energy(planted, U, frames, M_HAT)
    assert result.energy_enrichment / result.enrichment_null == pytest.approx(
        result.energy_ratio, rel=1e-12
    )
    # u holds 3 · 0.7/15 of the energy, m̂⊥ holds 0.7 + 2 · 0.7/15: the ratio is 2.1 / 0.793
    assert result.energy_ratio == pytest.approx(2.1 / (0.7 + 1.4 / 15), rel=1e-12)
