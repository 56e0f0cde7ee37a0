"""``capture.precision = "float32"``: second moments from float32 Grams of rows shifted by a
frozen mean, added into float64, against float64 on anisotropic rows whose mean is 30 times
their spread (ρ = ‖μ‖/√tr Σ) — moments, every eigenvalue, energy fractions and their ratios
within the bound :mod:`tangentlens.capture.precision` states (a worst case derived from
float32's unit roundoff, not a measured number); plain float32 Grams of unshifted rows break
it. The attention entropy's float32 rows within their own bound; ``auto`` by device."""

from __future__ import annotations

import math

import pytest
import torch

from tangentlens.capture import MomentAccumulator, StatisticsConfig
from tangentlens.capture.precision import (
    FULL_RATE_FLOAT64,
    UNIT_ROUNDOFF,
    gram_error_bound,
    relative_bound,
    resolve_precision,
)
from tangentlens.metrics.attention import pattern_entropy_sums

D, BATCH, N_BATCHES, K = 48, 2000, 10, 6
#: float64's own rounding of a sum of n terms (γ_n of u = 2⁻⁵³), the same on both paths.
U64 = 2.0**-53


def _rows(seed: int = 0, rho: float = 30.0) -> list[torch.Tensor]:
    """Batches of float32-representable rows: an anisotropic Gaussian (variances spanning three
    decades) around a mean of norm ``rho`` times the spread (ρ = ‖μ‖/√tr Σ)."""
    gen = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    spread = 10.0 ** torch.linspace(0, -1.5, D, dtype=torch.float64)  # std: 1 to 0.03
    direction = torch.randn(D, generator=gen, dtype=torch.float64)
    centre = rho * math.sqrt(float(spread.pow(2).sum())) * direction / direction.norm()
    out = []
    for _ in range(N_BATCHES):
        z = torch.randn(BATCH, D, generator=gen, dtype=torch.float64)
        out.append(((z * spread) @ basis.T + centre).float().double())
    return out


def _accumulated(batches: list[torch.Tensor], precision: str) -> MomentAccumulator:
    acc = MomentAccumulator(D, precision=precision)
    for x in batches:
        acc.update(x)
    return acc


def _scatter(acc: MomentAccumulator) -> torch.Tensor:
    return acc.second_moment - torch.outer(acc.sum, acc.sum) / acc.count


def _bounds(batches: list[torch.Tensor], shift: torch.Tensor) -> tuple[float, float]:
    """(ε, float64's slack): the float32 bound on the second moment's spectral error and the
    float64 rounding both paths share (γ_n of u₆₄ on the unshifted rows' squared norms)."""
    x = torch.cat(batches)
    eps = gram_error_bound(BATCH, float((x - shift).pow(2).sum()))
    slack = 2 * x.shape[0] * U64 * float(x.pow(2).sum())
    return eps, slack


@pytest.mark.parametrize("rho", [30.0, 1e4])
def test_float32_moments_keep_every_eigenvalue_within_the_bound(rho):
    batches = _rows(rho=rho)
    exact, fast = _accumulated(batches, "float64"), _accumulated(batches, "float32")
    assert fast.shift is not None and torch.equal(fast.sum, exact.sum)  # first moments: float64
    eps, slack = _bounds(batches, fast.shift)
    difference = fast.second_moment - exact.second_moment
    assert float(torch.linalg.matrix_norm(difference, 2)) <= eps + slack
    # Weyl: each eigenvalue of the scatter (and the uncentred moment) moves by at most ε
    moved = torch.linalg.eigvalsh(_scatter(fast)) - torch.linalg.eigvalsh(_scatter(exact))
    assert float(moved.abs().max()) <= eps + slack
    assert float(torch.linalg.eigvalsh(_scatter(fast)).min()) > 0  # the lower spectrum kept


def test_plain_float32_grams_of_unshifted_rows_break_the_bound():
    """Rows whose mean is 10⁴ times their spread, float32 Grams without the shift: the error
    scales with the mean, not the spread, and breaks the bound the shifted Grams keep — the
    test above can fail. (At a mean 30× the spread, per-batch float32 Grams added into float64
    stay within this worst case at this size; plain float32 running sums lose the lower
    spectrum at 10⁶ rows, METHODS.md §1.3.)"""
    batches = _rows(rho=1e4)
    exact, fast = _accumulated(batches, "float64"), _accumulated(batches, "float32")
    plain = torch.zeros(D, D, dtype=torch.float64)
    for x in batches:
        x32 = x.float()
        plain += (x32.T @ x32).double()
    eps, _ = _bounds(batches, fast.shift)
    scatter = plain - torch.outer(exact.sum, exact.sum) / exact.count
    moved = torch.linalg.eigvalsh(scatter) - torch.linalg.eigvalsh(_scatter(exact))
    assert float(moved.abs().max()) > eps


def test_energy_fractions_and_ratios_within_the_bound():
    batches = _rows(seed=1)
    exact, fast = _accumulated(batches, "float64"), _accumulated(batches, "float32")
    eps, slack = _bounds(batches, fast.shift)
    eps += slack
    gen = torch.Generator().manual_seed(2)
    frames = [torch.linalg.qr(torch.randn(D, K, generator=gen, dtype=torch.float64))[0]]
    frames.append(torch.linalg.eigh(_scatter(exact)).eigenvectors[:, -K:])  # the top span
    fractions = []
    for M in (exact.second_moment, fast.second_moment):
        trace = float(torch.diagonal(M).sum())
        fractions.append([float(torch.trace(Q.T @ M @ Q)) / trace for Q in frames])
    trace = float(torch.diagonal(exact.second_moment).sum())
    bound = (K + 1) * eps / (trace - eps)
    for e64, e32 in zip(*fractions, strict=True):
        assert abs(e32 - e64) <= bound
    ratio64, ratio32 = fractions[0][1] / fractions[0][0], fractions[1][1] / fractions[1][0]
    relative = sum(bound / e for e in fractions[0])
    assert abs(ratio32 / ratio64 - 1) <= relative * (1 + relative)


def test_float32_entropy_rows_within_their_bound():
    """Each row's ``−Σⱼ a log a`` over T keys in float32: within (T + 4)·u of the float64
    sum of the (non-negative) terms."""
    gen = torch.Generator().manual_seed(3)
    pattern = torch.softmax(4 * torch.randn(3, 2, 64, 64, generator=gen), dim=-1)
    keep = torch.rand(3, 64, generator=gen) > 0.2
    exact, n = pattern_entropy_sums(pattern, keep)
    fast, m = pattern_entropy_sums(pattern, keep, count=int(keep.sum()), row_dtype=torch.float32)
    assert n == m
    assert torch.all((fast - exact).abs() <= (64 + 4) * UNIT_ROUNDOFF * exact)


def test_the_bound_and_auto_by_device():
    assert relative_bound(1) == pytest.approx(3 * UNIT_ROUNDOFF, rel=1e-6)
    assert relative_bound(2048) > 2050 * UNIT_ROUNDOFF
    with pytest.raises(ValueError, match="batch_rows"):
        relative_bound(0)
    assert resolve_precision("auto", "cpu") == "float64"
    assert resolve_precision("float32", "cpu") == "float32"
    assert (9, 0) in FULL_RATE_FLOAT64 and (8, 9) not in FULL_RATE_FLOAT64  # H100; RTX 4090
    with pytest.raises(ValueError, match=r"precision must be one of .*float64.*float32.*auto"):
        resolve_precision("half", "cpu")
    with pytest.raises(ValueError, match="precision must be one of"):
        StatisticsConfig(precision="auto")  # resolved before the statistics are made


def test_auto_reads_the_gpus_compute_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert resolve_precision("auto", "cuda:0") == "float32"  # an RTX 4090: float64 at 1/64
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_precision("auto", "cuda:0") == "float64"


def test_accumulators_of_two_precisions_do_not_merge():
    with pytest.raises(ValueError, match="one precision"):
        MomentAccumulator(4).merge(MomentAccumulator(4, precision="float32"))
