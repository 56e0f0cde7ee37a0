"""Fit policies and update alignment."""

import pytest
import torch

from tangentlens.dictionaries import early_window, in_window
from tangentlens.metrics import centroid_shift, control_frames, update_alignment
from tangentlens.models.schedule import PYTHIA_STEPS, log_spaced_schedule


def test_frozen_early_window_follows_training_progress_not_the_selection():
    mini = log_spaced_schedule(1200, 100)  # 0, 1, 2, …, 64, 100, 200, …, 1200
    # step ≤ 0.3 × 1200 = 360: eleven candidates, thinned to 8 evenly spaced in step
    assert early_window(mini) == (0, 8, 16, 32, 64, 100, 200, 300)
    # Pythia: ≤ 42900, 53 candidates → every 6000 steps (the old window of a log:12
    # selection was steps 0, 2, 8, 32)
    assert early_window(PYTHIA_STEPS) == tuple(range(0, 42_001, 6000))
    assert early_window(mini, max_checkpoints=20) == (0, 1, 2, 4, 8, 16, 32, 64, 100, 200, 300)
    assert early_window(mini, early_fraction=1.0, max_checkpoints=2) == (0, 1200)
    assert early_window(mini, max_checkpoints=1) == (300,)
    assert early_window([500, 1000]) == (500,)  # nothing ≤ 300: the first checkpoint


def test_transitions_inside_the_window():
    """A transition s → s′ is in-window when s < the window's last checkpoint: the frozen proxy
    saw data after s (METHODS §1.7) — also when s′ lies past the window's end."""
    window = (0, 8, 16, 300)
    assert in_window(16, window)  # 16 → 300: both inside
    assert in_window(200, window)  # 200 → 400 straddles the end: the fit saw step 300
    assert in_window(299, window)
    assert not in_window(300, window)  # 300 → 400: the fit saw nothing after 300 (boundary)
    assert not in_window(400, window)
    assert not in_window(0, ())


def test_fit_window_bad_input():
    with pytest.raises(ValueError, match="early_fraction"):
        early_window([0, 1], early_fraction=0.0)
    with pytest.raises(ValueError, match="max_checkpoints"):
        early_window([0, 1], max_checkpoints=0)
    with pytest.raises(ValueError, match="no checkpoints"):
        early_window([])


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
    frames = control_frames(d, k, 19, (0,), excluded=proxy)
    result = update_alignment(shift, proxy, frames, proxy)
    assert result.energy_fraction == pytest.approx(1.0, abs=1e-12)
    assert result.energy_p_value == pytest.approx(1 / 20)
    with pytest.raises(ValueError, match="no token type"):
        centroid_shift(count_a, sum_a, count_b, sum_b, min_count=6)


def _alignment_rows(delta, proxy, in_window=False):
    from tangentlens.probes import update_alignment as probe
    from tangentlens.results import StepLabel

    data = StepLabel("s", 8, 0, layers={"site": 1})
    config = probe.UpdateAlignmentConfig(draws=99)
    rows = probe.rows(
        data, {"site": {"pca": proxy}}, None, {"site": delta}, config, in_window=in_window
    )
    return {r["metric"]: r["value"] for r in rows}


def test_update_alignment_reads_chance_for_random_updates_and_high_for_planted_ones():
    gen = torch.Generator().manual_seed(3)
    d, k, m = 64, 4, 300
    proxy = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0]
    random_update = torch.randn(m, d, generator=gen, dtype=torch.float64)
    got = _alignment_rows(random_update, proxy)
    # chance: E = k/d up to sampling; ratio ≈ 1; p far from its floor 1/100
    assert got["centroid_update_energy_fraction"] == pytest.approx(k / d, rel=0.15)
    assert got["centroid_update_energy_ratio"] == pytest.approx(1.0, abs=0.15)
    assert got["centroid_update_energy_p_value"] > 0.05
    planted = torch.randn(m, k, generator=gen, dtype=torch.float64) @ proxy.T
    planted = planted + 0.05 * random_update  # mostly inside the proxy of s
    got = _alignment_rows(planted, proxy)
    inside = float((planted @ proxy).pow(2).sum() / planted.pow(2).sum())
    assert got["centroid_update_energy_fraction"] == pytest.approx(inside, rel=1e-10)
    assert inside > 0.9
    assert got["centroid_update_energy_p_value"] == pytest.approx(1 / 100)
    marked = _alignment_rows(planted, proxy, in_window=True)
    assert set(marked) == {
        "centroid_update_in_window_energy_fraction",
        "centroid_update_in_window_energy_ratio",
        "centroid_update_in_window_energy_p_value",
    }


def test_update_alignment_controls_avoid_the_mean_direction():
    """Updates with 70 % of their energy along m̂ (the drift) and a proxy uniform in m̂⊥ (the
    null): against controls in m̂⊥ the ratio reads 1 on average; controls free to fall along m̂
    would read (1 − f)(d − k)/((d − 1) − k(1 − f)) ≈ 0.35 (the flipped conclusion of issue 20)."""
    from tangentlens.probes import update_alignment as probe
    from tangentlens.results import StepLabel

    gen = torch.Generator().manual_seed(8)
    d, k, f = 32, 4, 0.7
    m = torch.linalg.qr(torch.randn(d, 1, generator=gen, dtype=torch.float64))[0]
    config = probe.UpdateAlignmentConfig(draws=99)
    ratios, leaky = [], []
    for trial in range(60):
        noise = torch.randn(200, d, generator=gen, dtype=torch.float64)
        noise = noise - noise @ m @ m.T
        along = torch.randn(200, 1, generator=gen, dtype=torch.float64) @ m.T
        delta = (
            along * (f / float(along.pow(2).sum())) ** 0.5
            + noise * ((1 - f) / float(noise.pow(2).sum())) ** 0.5
        )
        proxy = torch.randn(d, k, generator=gen, dtype=torch.float64)
        proxy = torch.linalg.qr(proxy - m @ (m.T @ proxy))[0]
        data = StepLabel("s", trial, 0, layers={"site": 1})
        proxies = {"site": {"pca": proxy, "mean_direction": m}}
        rows = probe.rows(data, proxies, None, {"site": delta}, config)
        got = {(r["method"], r["metric"]): r["value"] for r in rows}
        ratios.append(got[("pca", "centroid_update_energy_ratio")])
        frames = control_frames(d, k, 99, (trial,), excluded=proxy)
        leaky.append(update_alignment(delta, proxy, frames, proxy).energy_ratio)
    ratios = torch.tensor(ratios)
    assert abs(float(ratios.mean()) - 1) < 4 * float(ratios.std()) / 60**0.5
    assert float(torch.tensor(leaky).mean()) == pytest.approx(
        (1 - f) * (d - k) / ((d - 1) - k * (1 - f)), abs=0.05
    )


def test_tracked_types_are_the_most_frequent_seen_types_ties_by_id():
    from tangentlens.probes import update_alignment as probe

    counts = [0, 5, 1, 5, 0, 9, 1, 2]
    config = probe.UpdateAlignmentConfig(centroid_types=6)
    # 9 (id 5), 5 (ids 1, 3: by id), 2 (id 7), 1 (ids 2, 6): a type seen once is tracked
    assert probe.tracked_types(config, counts).tolist() == [5, 1, 3, 7, 2, 6]
    every = probe.UpdateAlignmentConfig(centroid_types=20)
    assert probe.tracked_types(every, counts).tolist() == [5, 1, 3, 7, 2, 6]  # unseen: never
    assert probe.tracked_types(every, [0.0, 2.0, 1.0]).tolist() == [1, 2]


def test_update_rows_equal_an_independent_recomputation_with_their_seed_key():
    """A one-row update at layer 3 of step 12: its ratio and p-value are those of the frames
    drawn from (seed, 12, 4, 0) in m̂⊥; its labels are the site's."""
    from tangentlens.probes import update_alignment as probe
    from tangentlens.results import StepLabel

    gen = torch.Generator().manual_seed(9)
    d, k = 16, 3
    m = torch.linalg.qr(torch.randn(d, 1, generator=gen, dtype=torch.float64))[0]
    proxy = torch.randn(d, k, generator=gen, dtype=torch.float64)
    proxy = torch.linalg.qr(proxy - m @ (m.T @ proxy))[0]
    delta = torch.randn(1, d, generator=gen, dtype=torch.float64)
    config = probe.UpdateAlignmentConfig(draws=30, seed=2)
    data = StepLabel("s", 12, 1200, layers={"site": 3})
    rows = probe.rows(data, {"site": {"pca": proxy, "mean_direction": m}}, None,
                      {"site": delta}, config)  # fmt: skip
    got = {(r["method"], r["metric"]): r for r in rows}
    frames = control_frames(d, k, 30, (2, 12, 4, 0), excluded=m)
    e_t = float((delta @ proxy).pow(2).sum() / delta.pow(2).sum())
    e_n = (delta @ frames).pow(2).sum(dim=(1, 2)) / delta.pow(2).sum()
    row = got[("pca", "centroid_update_energy_ratio")]
    # the ratio is to the controls' exact mean k/(d − 1) · (1 − E(m̂)) (issue 33), not the
    # frames' mean (which gives the p-value)
    e_m = float((delta @ m).pow(2).sum() / delta.pow(2).sum())
    assert row["value"] == pytest.approx(e_t / (k / (d - 1) * (1 - e_m)), rel=1e-10)
    assert got[("pca", "centroid_update_energy_p_value")]["value"] == pytest.approx(
        (1 + int((e_n >= e_t).sum())) / 31
    )
    assert row["probe"] == "update_alignment" and row["layer"] == 3 and row["n_tokens"] == 1
    assert row["rank"] == k and row["step"] == 12 and row["tokens_seen"] == 1200
    assert probe.rows(data, {"site": {"pca": proxy}}, None, {"site": 0 * delta}, config) == []
