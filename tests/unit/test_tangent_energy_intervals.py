"""Known answers for the tangent-energy intervals (issue 11, item 8; METHODS.md §1.3).

Simulated gradients of independent sequences with a known population energy fraction go
through the probe exactly as a capture would deliver them (site statistics with per-sequence
energy sums gathered for a proxy known in advance, plus a small row reservoir). The interval of
``energy_fraction`` must describe the reported estimator — the pooled fraction over every token
— so it shrinks like 1/√(sequences analysed), covers the truth at its nominal level, and contains
its own point value.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tangentlens.capture import CaptureConfig, CaptureStatistics, SiteStatistics, StatisticsConfig
from tangentlens.capture.captured import Capture
from tangentlens.metrics import bootstrap_ratio
from tangentlens.probes import tangent_energy
from tangentlens.proxies import sequence_energy_config

D, K, SEQ_LEN, STEP, SITE = 8, 2, 64, 7, "blocks.0.hook_resid_post"
VAR = np.array([2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # token noise variance per coordinate
TAU = 0.5  # per-sequence mean offset: tokens of one sequence are correlated
#: E[Σ‖gQ‖²] / E[Σ‖g‖²] with Q the first K coordinates (scales and lengths cancel)
TRUTH = (VAR[:K].sum() + K * TAU**2) / (VAR.sum() + D * TAU**2)
PROXY = torch.eye(D, dtype=torch.float64)[:, :K]
CONFIG = tangent_energy.TangentEnergyConfig(bootstrap=400)
#: The proxies stage's control frames per measurement and their seed.
CONTROLS = {"draws": 20, "seed": 3}
SPEC = sequence_energy_config({SITE: {"pca": PROXY}}, 0, SEQ_LEN)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Hundreds of tiny tensor operations: one thread avoids thread hand-off costs on a loaded
    machine (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _simulate(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient rows of ``n`` independent sequences: length 1 + Poisson(15), a log-normal scale
    and a Gaussian mean offset per sequence, Gaussian token noise; and their row ids."""
    lengths = np.minimum(1 + rng.poisson(15, n), SEQ_LEN)
    scale = np.exp(rng.normal(0.0, 0.3, n))
    offset = rng.normal(0.0, TAU, (n, D))
    sequence = np.repeat(np.arange(n), lengths)
    position = np.arange(len(sequence)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    noise = rng.normal(size=(len(sequence), D)) * np.sqrt(VAR)
    g = scale[sequence, None] * (offset[sequence] + noise)
    return torch.from_numpy(g), torch.from_numpy(sequence * SEQ_LEN + position)


def _step_data(g: torch.Tensor, ids: torch.Tensor, *, sequence_energy: bool = True) -> Capture:
    statistics = StatisticsConfig(
        reservoir_size=256, sequence_energy=SPEC if sequence_energy else None
    )
    site = SiteStatistics(D, statistics, site=SITE)
    site.update(g, g, torch.zeros(len(ids), dtype=torch.int64), ids)
    capture = CaptureStatistics(
        config=CaptureConfig(sites=(SITE,)), statistics=statistics, sites={SITE: site}
    )
    return Capture("simulated", STEP, 0, capture, {SITE: 0}, SEQ_LEN)


def _fraction_row(data: Capture) -> dict:
    rows = tangent_energy.rows(data, {SITE: {"pca": PROXY}}, CONFIG, **CONTROLS)
    return next(r for r in rows if r["metric"] == "energy_fraction" and r["freq_bin"] == "all")


def test_interval_width_shrinks_like_one_over_sqrt_sequences():
    rng = np.random.default_rng(1)
    widths = {}
    for n in (100, 400):
        rows = [_fraction_row(_step_data(*_simulate(rng, n))) for _ in range(20)]
        widths[n] = np.mean([r["ci_high"] - r["ci_low"] for r in rows])
    assert widths[100] / widths[400] == pytest.approx(2.0, rel=0.15)


def test_interval_covers_the_true_fraction_at_its_level():
    rng = np.random.default_rng(2024)
    covered = 0
    for _ in range(400):
        row = _fraction_row(_step_data(*_simulate(rng, 100)))
        assert row["ci_low"] <= row["value"] <= row["ci_high"]
        covered += row["ci_low"] <= TRUTH <= row["ci_high"]
    assert 0.92 <= covered / 400 <= 0.98


def test_interval_point_is_the_reported_value_and_the_source_is_named():
    g, ids = _simulate(np.random.default_rng(5), 80)
    data = _step_data(g, ids)
    assert tangent_energy.interval_source(data) == tangent_energy.INTERVAL_ALL_SEQUENCES
    rows = tangent_energy.rows(data, {SITE: {"pca": PROXY}}, CONFIG, **CONTROLS)
    table = {r["metric"]: r for r in rows}
    energy = data.statistics.sites[SITE].sequence_energy
    assert energy.n_sequences == 80
    inside, total, control, complement = energy.sums("pca")
    direct = float(((g @ PROXY) ** 2).sum() / (g**2).sum())
    # no m̂ among these proxies: the exchangeable controls' exact mean is k/d of the energy,
    # the complement's k/(d − k) of what lies outside the proxy
    np.testing.assert_allclose(control.numpy(), K / D * total.numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        complement.numpy(), K / (D - K) * (total - inside).numpy(), rtol=1e-11
    )
    for metric, den in (
        ("energy_fraction", total),
        ("energy_ratio", control),
        ("energy_complement_ratio", complement),
    ):
        boot = bootstrap_ratio(
            inside, den, replicates=400, seed=CONTROLS["seed"], method="studentized"
        )
        assert boot.sample_value == pytest.approx(table[metric]["value"], rel=1e-12)
        assert (boot.ci_low, boot.ci_high) == pytest.approx(
            (table[metric]["ci_low"], table[metric]["ci_high"]), rel=1e-12
        )
    assert table["energy_fraction"]["value"] == pytest.approx(direct, rel=1e-12)
    # without per-sequence sums the interval comes from the reservoir, put on the same value
    sampled = _step_data(g, ids, sequence_energy=False)
    assert tangent_energy.interval_source(sampled) == tangent_energy.INTERVAL_SAMPLE
    row = _fraction_row(sampled)
    assert row["value"] == table["energy_fraction"]["value"]
    assert row["ci_low"] <= row["value"] <= row["ci_high"] <= 1


def test_sums_for_other_proxies_or_mean_direction_are_refused():
    g, ids = _simulate(np.random.default_rng(6), 10)
    data = _step_data(g, ids)
    other = torch.eye(D, dtype=torch.float64)[:, 1 : K + 1]
    with pytest.raises(ValueError, match="gathered for other proxies or another mean direction"):
        tangent_energy.rows(data, {SITE: {"pca": other}}, CONFIG, **CONTROLS)
    # the sums were gathered without m̂: scoring against controls in m̂⊥ needs other sums
    m = torch.eye(D, dtype=torch.float64)[:, -1:]
    with pytest.raises(ValueError, match="gathered for other proxies or another mean direction"):
        tangent_energy.rows(data, {SITE: {"pca": PROXY, "mean_direction": m}}, CONFIG, **CONTROLS)
    # the sums do not depend on the control frames: another seed or draw count reads them
    rows = tangent_energy.rows(data, {SITE: {"pca": PROXY}}, CONFIG, draws=30, seed=4)
    assert {r["metric"] for r in rows if r["ci_low"] is not None} == {
        "energy_fraction",
        "energy_ratio",
        "energy_complement_ratio",
    }
    with pytest.raises(ValueError, match="interval must be one of"):
        tangent_energy.TangentEnergyConfig(interval="normal")


def test_without_bootstrap_or_gradients_there_is_no_interval():
    g, ids = _simulate(np.random.default_rng(7), 10)
    config = tangent_energy.TangentEnergyConfig(bootstrap=0)
    rows = tangent_energy.rows(_step_data(g, ids), {SITE: {"pca": PROXY}}, config, **CONTROLS)
    assert all(r["ci_low"] is None for r in rows)
    zero = _step_data(torch.zeros_like(g), ids)
    (row,) = tangent_energy.rows(zero, {SITE: {"pca": PROXY}}, CONFIG, **CONTROLS)
    assert math.isnan(row["value"]) and row["ci_low"] is None
