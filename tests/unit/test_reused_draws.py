"""``reused_draws``: the same control frames, drawn once per key within a block."""

import torch

from tangentlens.metrics import control_frames, reused_draws
from tangentlens.metrics import controls as controls_module


def _count_draws(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = controls_module.draw_generator

    def counting(seed_key, draw):
        calls.append(draw)
        return real(seed_key, draw)

    monkeypatch.setattr(controls_module, "draw_generator", counting)
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
