"""``reused_draws``: the same control frames, drawn once per key within a block."""

import dataclasses

import torch

from tangentlens.metrics import control_frames, reused_draws
from tangentlens.metrics import controls as controls_module
from tangentlens.proxies import sequence_energy_config


def _count_draws(monkeypatch) -> list[int]:
    """Every draw's generator made from now on (its draw index)."""
    calls: list[int] = []
    real = controls_module.seeded_generators

    def counting(*prefix: int, count: int, device=None):
        calls.extend(range(count))
        return real(*prefix, count=count, device=device)

    monkeypatch.setattr(controls_module, "seeded_generators", counting)
    return calls


def test_frames_within_the_block_equal_fresh_ones_and_are_drawn_once(monkeypatch):
    excluded = torch.nn.functional.normalize(torch.ones(12, 1, dtype=torch.float64), dim=0)
    fresh = control_frames(12, 3, 5, (1, 2, 3), excluded=excluded)
    fresh_everywhere = control_frames(12, 3, 5, (1, 2, 3))
    calls = _count_draws(monkeypatch)
    with reused_draws():
        first = control_frames(12, 3, 5, (1, 2, 3), excluded=excluded)
        again = control_frames(12, 3, 5, (1, 2, 3))  # the other family of the same key
        with reused_draws():  # nested: the outer block's draws
            third = control_frames(12, 3, 5, (1, 2, 3), excluded=excluded)
        other_key = control_frames(12, 3, 5, (1, 2, 4), excluded=excluded)
    assert torch.equal(first, fresh) and torch.equal(third, fresh)
    assert torch.equal(again, fresh_everywhere)
    assert not torch.allclose(other_key, fresh)
    assert len(calls) == 10  # 5 draws of key (1, 2, 3), 5 of (1, 2, 4)
    control_frames(12, 3, 5, (1, 2, 3), excluded=excluded)  # after the block: drawn again
    assert len(calls) == 15


def test_draws_beyond_the_byte_budget_are_drawn_each_time(monkeypatch):
    calls = _count_draws(monkeypatch)
    one_key = 4 * 8 * 2 * 8  # draws × d × k float64 bytes
    with reused_draws(max_bytes=one_key):
        for _ in range(3):
            control_frames(8, 2, 4, (0,))  # kept: fits the budget
            control_frames(8, 2, 4, (1,))  # over the budget: drawn every time
    assert len(calls) == 4 + 3 * 4


def _orthonormal(d: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0]


def test_frames_of_one_basis_are_made_once(monkeypatch):
    """Frames are kept by the excluded basis itself (no copy of it to the host to hash it): the
    same tensor again is a hit (no new QR); a copy of it is drawn again, to the same frames;
    another span is a miss, and a basis changed in place is another basis."""
    excluded = _orthonormal(10, 2, 0)
    qr_calls: list[int] = []
    real = controls_module._orthonormalise
    monkeypatch.setattr(controls_module, "_orthonormalise", lambda g: qr_calls.append(1) or real(g))
    with reused_draws():
        first = control_frames(10, 3, 4, (5,), excluded=excluded)
        again = control_frames(10, 3, 4, (5,), excluded=excluded)
        copy = control_frames(10, 3, 4, (5,), excluded=excluded.clone())
        other = control_frames(10, 3, 4, (5,), excluded=_orthonormal(10, 2, 1))
        assert again is first and len(qr_calls) == 3
        excluded.neg_()  # the same span, another basis: drawn again, the same frames
        flipped = control_frames(10, 3, 4, (5,), excluded=excluded)
    assert len(qr_calls) == 4 and flipped is not first
    assert torch.allclose(copy, first, atol=1e-14) and torch.allclose(flipped, first, atol=1e-12)
    assert not torch.allclose(other, first)


def _planted_capture(sites: dict[str, int | None], d: int, n_bins: int):
    """A capture of random gradients at ``sites`` with every frequency bin filled."""
    from tangentlens.capture import (
        CaptureConfig,
        CaptureStatistics,
        SiteStatistics,
        StatisticsConfig,
    )
    from tangentlens.capture.captured import Capture

    statistics = StatisticsConfig(n_bins=n_bins, reservoir_size=0)
    stats = {}
    for i, site in enumerate(sites):
        gen = torch.Generator().manual_seed(i)
        h, g = (torch.randn(64, d, generator=gen, dtype=torch.float64) for _ in range(2))
        stats[site] = SiteStatistics(d, statistics, site=site)
        ids = torch.arange(64)
        stats[site].update(h, g, torch.zeros(64, dtype=torch.int64), ids, ids % n_bins)
    config = CaptureConfig(sites=tuple(sites))
    return Capture("planted", 7, 0, CaptureStatistics(config, statistics, stats), sites, 16)


def test_the_memory_plan_counts_the_draws_a_step_keeps_for_its_probes():
    """What ``tangent_energy.rows`` leaves in the step's ``reused_draws`` block (kept while the
    probes run, reused by anisotropy_share) is the plan's ``control draws`` term, and the plan's
    cap is the block's. Nothing is drawn before the capture: ``sequence_energy_config`` keeps
    nothing."""
    from tangentlens import metrics
    from tangentlens.core import memory
    from tangentlens.models.shapes import ModelShape
    from tangentlens.probes import tangent_energy

    assert memory.REUSED_DRAWS_BYTES == metrics.REUSED_DRAWS_BYTES
    d, draws, n_bins = 12, 5, 2
    sites = {"hook_embed": None, "blocks.0.hook_resid_post": 0}
    data = _planted_capture(sites, d, n_bins)
    for rank, mean_direction, methods in [(3, True, 2), (1, True, 2), (3, False, 2), (2, True, 3)]:
        proxies = {}
        for i, site in enumerate(sites):
            m = _orthonormal(d, 1, 20 + i)
            proxies[site] = {}
            for j in range(methods):
                q = _orthonormal(d, rank, 9 + j)
                if mean_direction:
                    q = torch.linalg.qr(q - m @ (m.T @ q))[0]
                proxies[site][f"method{j}"] = q
            if mean_direction:
                proxies[site]["mean_direction"] = m
        config = tangent_energy.TangentEnergyConfig(bootstrap=0)
        with reused_draws():
            sequence_energy_config(proxies, n_bins, 16)
            assert controls_module._REUSED.get()[1][0] == metrics.REUSED_DRAWS_BYTES
            tangent_energy.rows(data, proxies, config, draws=draws, seed=3)
            kept = metrics.REUSED_DRAWS_BYTES - controls_module._REUSED.get()[1][0]
        shape = ModelShape("gpt_neox", 1, d, 2, 2, 48, 50, 16, 0)
        columns = memory.control_draw_columns(rank, mean_direction, methods)
        inputs = memory.PlanInputs(
            shape=shape, dtype="float32", device="cpu", batch=2, seq_len=16,
            sites=(("embed", None), ("resid_post", 0)), gradients=True, bins=n_bins,
            bin_moments=True, n_types=0, reservoir=0, energy_methods=2, n_sequences=4,
            draws=draws, draw_columns=columns,
        )  # fmt: skip
        assert memory.held_draws_bytes(inputs) == kept, (rank, mean_direction, methods)
    capped = dataclasses.replace(inputs, draws=10**6)
    assert memory.held_draws_bytes(capped) == memory.REUSED_DRAWS_BYTES
