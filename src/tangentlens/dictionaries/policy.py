"""Fit policies: which checkpoints' activations a step's tangent proxy is fitted on.

* ``frozen_early`` — fit once on activations pooled over the suite's early checkpoints and hold
  that proxy fixed for every scored step, as Bernas et al. do. The window is defined by training
  progress over the **suite's own checkpoints**, not by which steps a sweep scores: the
  checkpoints with ``step ≤ early_fraction × final step`` (default 0.3), at most
  ``max_checkpoints`` of them (default 8), chosen evenly spaced in step (:func:`early_window`);
* ``per_checkpoint`` — fit at each step on that step's own activations.

An update ``s → s′`` is scored inside the window (:func:`in_window`) when ``s`` is before the
window's last step: the frozen proxy was fitted on data from after ``s`` — the update itself when
``s′`` is in the window too, part of it when the transition straddles the window's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tangentlens.checks import check_count, check_fraction, suggest

__all__ = ["FIT_POLICIES", "FitConfig", "early_window", "in_window"]

#: The fit policies (``proxies.fit_policy``), defined above.
FIT_POLICIES: tuple[str, ...] = ("frozen_early", "per_checkpoint")


@dataclass(frozen=True)
class FitConfig:
    """Which activations a step's proxy is fitted on: ``fit_policy`` (one of
    :data:`FIT_POLICIES`); ``early_fraction`` and ``window_checkpoints``, the frozen-early window
    (the checkpoints with step ≤ early_fraction × final step, at most window_checkpoints of them,
    :func:`early_window`); ``held_out``: fit each step's proxy on the first half of its sequences
    and score the second (per_checkpoint only)."""

    fit_policy: str = "per_checkpoint"
    early_fraction: float = 0.3
    window_checkpoints: int = 8
    held_out: bool = False

    def __post_init__(self) -> None:
        if self.fit_policy not in FIT_POLICIES:
            raise ValueError(
                f"fit_policy must be one of {FIT_POLICIES}, got {self.fit_policy!r}"
                f"{suggest(self.fit_policy, FIT_POLICIES)}"
            )
        if self.held_out and self.fit_policy != "per_checkpoint":
            raise ValueError(
                "held_out = true fits each step's proxy on half of its sequences and scores the "
                "other half: it needs fit_policy = 'per_checkpoint' (frozen_early proxies are "
                "fitted on other checkpoints already)"
            )
        check_fraction(self.early_fraction, "early_fraction", low_open=True)
        check_count(self.window_checkpoints, "window_checkpoints", minimum=1)


def early_window(
    checkpoints: Sequence[int], early_fraction: float = 0.3, max_checkpoints: int = 8
) -> tuple[int, ...]:
    """The frozen-early fit window of a suite whose checkpoints are ``checkpoints``.

    Candidates are the checkpoints with ``step ≤ early_fraction × max(checkpoints)``. When there
    are more than ``max_checkpoints``, the window is the ascending choice of candidates closest
    to ``max_checkpoints`` evenly spaced targets between the first and last candidate (least
    total distance, by dynamic programming), so a log-spaced schedule does not crowd it with
    barely trained models. With ``max_checkpoints = 1`` it is the last candidate.

    >>> early_window([0, 1, 2, 4, 8, 16, 32, 64, 100, 200, 300, 400, 1200])
    (0, 8, 16, 32, 64, 100, 200, 300)
    >>> early_window(range(0, 1001, 50), max_checkpoints=3)
    (0, 150, 300)
    """
    fraction = check_fraction(early_fraction, "early_fraction", low_open=True)
    limit = check_count(max_checkpoints, "max_checkpoints", minimum=1)
    ordered = sorted(set(int(s) for s in checkpoints))
    if not ordered:
        raise ValueError("the suite has no checkpoints: a fit window needs at least one")
    candidates = [s for s in ordered if s <= fraction * ordered[-1]] or ordered[:1]
    if len(candidates) <= limit:
        return tuple(candidates)
    if limit == 1:
        return (candidates[-1],)
    return tuple(_closest_increasing(candidates, limit))


def _closest_increasing(candidates: list[int], n: int) -> list[int]:
    """``n`` ascending candidates minimising ``Σ |cᵢ − tᵢ|`` against ``n`` evenly spaced
    targets from the first to the last candidate."""
    first, last = candidates[0], candidates[-1]
    targets = [first + (last - first) * i / (n - 1) for i in range(n)]
    m = len(candidates)
    inf = float("inf")
    cost = [[abs(c - targets[0]) for c in candidates]]
    back: list[list[int]] = [[-1] * m]
    for i in range(1, n):
        row, links = [inf] * m, [-1] * m
        best, best_at = inf, -1
        for j in range(m):
            if j >= 1 and cost[i - 1][j - 1] < best:
                best, best_at = cost[i - 1][j - 1], j - 1
            if best < inf:
                row[j], links[j] = best + abs(candidates[j] - targets[i]), best_at
        cost.append(row)
        back.append(links)
    j = min(range(m), key=lambda c: (cost[-1][c], -c))
    chosen = []
    for i in range(n - 1, -1, -1):
        chosen.append(candidates[j])
        j = back[i][j]
    return chosen[::-1]


def in_window(start: int, window: Sequence[int]) -> bool:
    """Whether the update that starts at step ``start`` (s of ``s → s′``) is inside the fit
    ``window``: ``start <`` its last checkpoint, so a proxy fitted on that window has seen data
    from after ``start`` (the update, or the part of it before the window's end). An update
    starting at the window's last checkpoint is not inside: the fit saw nothing after it.

    >>> window = (0, 100, 200, 300)
    >>> in_window(200, window), in_window(300, window)  # 200 → 400 straddles the end; 300 → 400
    (True, False)
    """
    return bool(window) and start < max(window)
