"""Fit policies and update alignment."""

import pytest
import torch

from tangentlens.dictionaries import fit_windows
from tangentlens.metrics import centroid_shift, complement_frames, update_alignment


def test_frozen_early_pools_the_first_30_percent():
    steps = [0, 1, 2, 4, 8, 16, 32, 64, 100, 200]
    windows = fit_windows(steps, "frozen_early")
    assert set(windows) == set(steps)
    assert all(w == (0, 1, 2) for w in windows.values())  # ceil(0.3 × 10) = 3
    assert fit_windows(steps[:2], "frozen_early", early_fraction=0.1)[1] == (0,)
    assert fit_windows(steps, "frozen_early", early_fraction=1.0)[0] == tuple(steps)
    assert fit_windows(steps, "per_checkpoint")[64] == (64,)


def test_fit_policy_bad_input():
    with pytest.raises(
        ValueError, match=r"policy must be one of \('frozen_early', 'per_checkpoint'\)"
    ):
        fit_windows([0, 1], "frozen_late")
    with pytest.raises(ValueError, match="distinct and ascending"):
        fit_windows([4, 1], "per_checkpoint")
    with pytest.raises(ValueError, match="early_fraction"):
        fit_windows([0, 1], "frozen_early", early_fraction=0.0)
    with pytest.raises(ValueError, match="at least one step"):
        fit_windows([], "frozen_early")


def test_centroid_shift_and_update_alignment():
    gen = torch.Generator().manual_seed(0)
    d, k = 20, 3
    proxy = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0]
    count_a = torch.tensor([3, 0, 5, 2])
    count_b = torch.tensor([4, 1, 5, 0])
    sum_a = torch.randn(4, d, generator=gen, dtype=torch.float64) * count_a[:, None]
    moves = torch.randn(4, k, generator=gen, dtype=torch.float64) @ proxy.T  # inside the proxy
    sum_b = (sum_a / count_a.clamp(min=1)[:, None] + moves) * count_b[:, None]
    shift = centroid_shift(count_a, sum_a, count_b, sum_b)
    assert shift.shape == (2, d)  # types 0 and 2 are seen at both steps
    torch.testing.assert_close(shift, moves[[0, 2]])
    result = update_alignment(shift, proxy, complement_frames(proxy, k, 19, (0,)))
    assert result.energy_fraction == pytest.approx(1.0, abs=1e-12)
    assert result.energy_p_value == pytest.approx(1 / 20)
    with pytest.raises(ValueError, match="no token type"):
        centroid_shift(count_a, sum_a, count_b, sum_b, min_count=6)
