"""Checkpoint schedules and step selection (pure logic, no model library).

Pythia saves step 0, the powers of two 1 … 512, then every 1000 steps up to 143000 — 154 revisions,
2,097,152 tokens per step. The mini suites reuse that shape: powers of two below ``every``, then
every multiple of ``every`` up to the last step.

A step *selection* is one of:

* ``"all"`` — every step of the suite;
* ``"first"`` / ``"last"``;
* ``"log:N"`` — N steps log-spaced in ``1 + step`` between the first and the last (both included),
  each snapped to a distinct available step;
* ``"A..B"`` — every available step with A ≤ step ≤ B (``"A.."`` and ``"..B"`` are open-ended);
* an integer, a comma-separated list of any of the above (``"0,1000..5000,last"``), or a list
  of integers.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence

#: Pythia's 154 checkpoint steps: 0, log-spaced 1 … 512, then every 1000 to 143,000.
PYTHIA_STEPS: tuple[int, ...] = (0, *(2**i for i in range(10)), *range(1000, 143_001, 1000))
#: Tokens per Pythia training step (1024 sequences × 2048 tokens).
PYTHIA_TOKENS_PER_STEP = 2_097_152

SELECTION_FORMS = (
    '"all", "first", "last", "log:N", "A..B", "A..", "..B", an integer step, '
    "a comma-separated list of those, or a list of integers"
)

_RANGE = re.compile(r"^(\d*)\.\.(\d*)$")
_LOG = re.compile(r"^log:(\d+)$")


def log_spaced_schedule(total_steps: int, every: int) -> tuple[int, ...]:
    """Pythia-shaped schedule: 0, the powers of two below ``every``, then every multiple of
    ``every`` up to ``total_steps`` (always included).

    >>> log_spaced_schedule(500, 100)
    (0, 1, 2, 4, 8, 16, 32, 64, 100, 200, 300, 400, 500)
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be a positive integer, got {total_steps}")
    if not 1 <= every <= total_steps:
        raise ValueError(f"every must be between 1 and total_steps={total_steps}, got {every}")
    powers = [2**i for i in range(every.bit_length()) if 2**i < every]
    evenly = list(range(every, total_steps + 1, every))
    if evenly[-1] != total_steps:
        evenly.append(total_steps)
    return (0, *powers, *evenly)


def nearest_steps(available: Sequence[int], step: int, k: int = 3) -> list[int]:
    """The ``k`` available steps closest to ``step`` (for error messages)."""
    return sorted(sorted(available, key=lambda s: (abs(s - step), s))[:k])


def _log_spaced(available: Sequence[int], n: int) -> list[int]:
    if n < 1:
        raise ValueError(f"log:N needs N ≥ 1, got log:{n}")
    if n >= len(available):
        return list(available)
    if n == 1:
        return [available[-1]]
    coords = [math.log1p(s) for s in available]
    lo, hi = coords[0], coords[-1]
    chosen: set[int] = {0, len(available) - 1}
    for i in range(1, n - 1):
        target = lo + (hi - lo) * i / (n - 1)
        free = [j for j in range(len(available)) if j not in chosen]
        chosen.add(min(free, key=lambda j: (abs(coords[j] - target), j)))
    return [available[j] for j in sorted(chosen)]


def _parse_term(term: str, available: Sequence[int]) -> list[int]:
    if term == "all":
        return list(available)
    if term == "first":
        return [available[0]]
    if term == "last":
        return [available[-1]]
    if match := _LOG.match(term):
        return _log_spaced(available, int(match.group(1)))
    if match := _RANGE.match(term):
        start = int(match.group(1)) if match.group(1) else available[0]
        stop = int(match.group(2)) if match.group(2) else available[-1]
        if start > stop:
            raise ValueError(f"step range {term!r} is empty: start {start} > end {stop}")
        lo, hi = bisect.bisect_left(available, start), bisect.bisect_right(available, stop)
        picked = available[lo:hi]
        if not picked:
            raise ValueError(
                f"step range {term!r} holds no checkpoint; the suite's steps run from "
                f"{available[0]} to {available[-1]}"
            )
        return list(picked)
    if term.lstrip("-").isdigit():
        return [_check_step(int(term), available)]
    raise ValueError(f"cannot read step selection {term!r}; allowed: {SELECTION_FORMS}")


def _check_step(step: int, available: Sequence[int]) -> int:
    index = bisect.bisect_left(available, step)
    if index == len(available) or available[index] != step:
        raise ValueError(
            f"step {step} is not a checkpoint of this suite; nearest: "
            f"{nearest_steps(available, step)} (the suite has {len(available)} steps from "
            f"{available[0]} to {available[-1]})"
        )
    return step


def select_steps(available: Sequence[int], selection: str | int | Sequence[int]) -> list[int]:
    """Resolve a step selection against a suite's sorted steps; returns sorted unique steps."""
    available = sorted(set(available))
    if not available:
        raise ValueError("the suite has no checkpoints to select from")
    if isinstance(selection, bool):
        raise ValueError(f"cannot read step selection {selection!r}; allowed: {SELECTION_FORMS}")
    if isinstance(selection, int):
        return [_check_step(selection, available)]
    if isinstance(selection, str):
        terms = [t.strip() for t in selection.split(",")]
        if not all(terms):
            raise ValueError(
                f"empty term in step selection {selection!r}; allowed: {SELECTION_FORMS}"
            )
        picked = {s for term in terms for s in _parse_term(term, available)}
    else:
        steps = list(selection)
        if not steps or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
            raise ValueError(
                f"a list step selection must hold integer steps, got {selection!r}; "
                f"allowed: {SELECTION_FORMS}"
            )
        picked = {_check_step(s, available) for s in steps}
    return sorted(picked)
