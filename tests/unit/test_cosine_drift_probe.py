"""cosine_drift probe on planted sites: drift ‖mean(H)‖ and cosine anisotropy set independently
(the correlation must read no relation), or tied (it must read the tie); across steps too."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from tangentlens.capture import MomentAccumulator
from tangentlens.capture.captured import Capture
from tangentlens.probes import cosine_drift

N, D = 200, 16


def _site(drift: float, concentration: float, gen: torch.Generator) -> torch.Tensor:
    """Rows of equal norm around one direction; scaled so that ‖mean‖ = ``drift``."""
    u = torch.zeros(D, dtype=torch.float64)
    u[0] = 1.0
    x = concentration * u + torch.randn(N, D, generator=gen, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True)
    return x * drift / float(x.mean(dim=0).norm())


def _brute_force(rows: torch.Tensor) -> tuple[float, float]:
    """‖mean‖ and the mean cosine over all distinct pairs, by explicit pairs (numpy)."""
    x = rows.numpy()
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = unit @ unit.T
    return float(np.linalg.norm(x.mean(axis=0))), float(
        (cos.sum() - np.trace(cos)) / (len(x) * (len(x) - 1))
    )


def _step(sites: list[torch.Tensor], step: int = 5) -> Capture:
    accumulated = {}
    for i, rows in enumerate(sites):
        acc = MomentAccumulator(D)
        acc.update(rows)
        accumulated[f"blocks.{i}.hook_resid_post"] = SimpleNamespace(h=acc)
    layers = {name: i for i, name in enumerate(accumulated)}
    return Capture("s", step, 10 * step, SimpleNamespace(sites=accumulated), layers, seq_len=8)


def _correlation(rows: list[dict], method: str) -> dict[str, float]:
    return {
        r["metric"]: r["value"]
        for r in rows
        if r["metric"].startswith("drift_cosine") and r["method"] == method
    }


def test_unrelated_drift_and_anisotropy_read_no_relation():
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    drifts = rng.lognormal(0.0, 1.0, 40)  # independent of the concentration below
    concentrations = rng.uniform(0.2, 4.0, 40)
    sites = [_site(dr, c, gen) for dr, c in zip(drifts, concentrations, strict=True)]
    rows = cosine_drift.rows(_step(sites), cosine_drift.CosineDriftConfig())
    got = _correlation(rows, "across_layers")
    reference = np.array([_brute_force(s) for s in sites])
    assert got["drift_cosine_spearman"] == pytest.approx(
        stats.spearmanr(reference[:, 0], reference[:, 1]).statistic, abs=1e-12
    )
    assert got["drift_cosine_pearson"] == pytest.approx(
        stats.pearsonr(reference[:, 0], reference[:, 1]).statistic, abs=1e-9
    )
    # inside the 95 % band of a permutation null (relative drift would give Spearman = 1 here:
    # equal-norm rows make it a monotone function of the cosine)
    null = [
        stats.spearmanr(rng.permutation(reference[:, 0]), reference[:, 1]).statistic
        for _ in range(1000)
    ]
    low, high = np.quantile(null, [0.025, 0.975])
    assert low < got["drift_cosine_spearman"] < high
    relative = [r["value"] for r in rows if r["metric"] == "relative_drift"]
    cosines = [r["value"] for r in rows if r["metric"] == "cosine_anisotropy"]
    assert stats.spearmanr(relative, cosines).statistic == pytest.approx(1.0)
    assert {r["n_tokens"] for r in rows if r["metric"].startswith("drift_cosine")} == {40}


def test_tied_drift_and_anisotropy_read_the_tie():
    gen = torch.Generator().manual_seed(1)
    unit_drift = [_site(1.0, c, gen) for c in np.linspace(0.2, 4.0, 12)]
    cosines = [_brute_force(s)[1] for s in unit_drift]
    for tie, sign in ((lambda c: 1.0 + 3 * c, 1.0), (lambda c: 5.0 - 3 * c, -1.0)):
        sites = [s * tie(c) for s, c in zip(unit_drift, cosines, strict=True)]  # ‖mean‖ = tie(c)
        rows = cosine_drift.rows(_step(sites), cosine_drift.CosineDriftConfig())
        got = _correlation(rows, "across_layers")
        assert got["drift_cosine_spearman"] == pytest.approx(sign)
        assert got["drift_cosine_pearson"] == pytest.approx(sign)  # linear tie


def test_across_steps_rows_per_site():
    gen = torch.Generator().manual_seed(2)
    table = []
    drifts = [1.0, 3.0, 2.0, 5.0, 4.0]
    for step, (drift, c) in enumerate(zip(drifts, [0.5, 1.5, 1.0, 3.0, 2.0], strict=True)):
        table += cosine_drift.rows(
            _step([_site(drift, c, gen), _site(6.0 - drift, c, gen), _site(1.0, c, gen)], step),
            cosine_drift.CosineDriftConfig(),
        )
    rows = cosine_drift.across_steps_rows(reversed(table))  # any order
    by_site = {(r["site"], r["metric"]): r for r in rows}
    assert {r["method"] for r in rows} == {"across_steps"}
    assert {(r["step"], r["tokens_seen"], r["n_tokens"]) for r in rows} == {(4, 40, 5)}
    assert by_site[("blocks.0.hook_resid_post", "drift_cosine_spearman")]["value"] == pytest.approx(
        1
    )
    assert by_site[("blocks.0.hook_resid_post", "drift_cosine_spearman")]["layer"] == 0
    assert by_site[("blocks.1.hook_resid_post", "drift_cosine_spearman")]["value"] == pytest.approx(
        -1
    )
    # the third site's drift never moves: Spearman is undefined, so it reads NaN or 0, never ±1
    flat = by_site[("blocks.2.hook_resid_post", "drift_cosine_spearman")]["value"]
    assert not abs(flat) > 0.5
    assert cosine_drift.across_steps_rows(table[: len(table) * 2 // 5]) == []  # 2 steps < 3
