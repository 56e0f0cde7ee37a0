"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from tangentlens.core.recipe import WEIGHT_DTYPES

__all__ = ["best_time", "ratio_row", "synchronize", "torch_dtype"]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--dtype`` name (one of ``suite.dtype``'s); another name is a
    ``ValueError`` listing them."""
    if name not in WEIGHT_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {list(WEIGHT_DTYPES)}")
    return getattr(torch, name)


def ratio_row(
    name: str, shape: str, reference: str, ours_s: float, ref_s: float, goal: str
) -> dict[str, Any]:
    """A table row whose value is the time ratio ours / reference."""
    return {
        "benchmark": name,
        "shape": shape,
        "reference_name": reference,
        "ours_s": ours_s,
        "reference_s": ref_s,
        "ours": ours_s / ref_s,
        "reference": 1.0,
        "difference": ours_s / ref_s,
        "difference_kind": "relative",
        "goal": goal,
    }


def synchronize() -> None:
    """Wait for every queued CUDA kernel on every GPU when CUDA is in use (no-op otherwise), so
    a wall-clock interval ends when the GPU work it launched has finished."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall time of ``repeats`` calls of ``fn`` (seconds) and the last call's result.
    CUDA is synchronised before and after each call when it is in use: work queued before the
    call is not counted, and the call's own kernels are."""
    best, value = float("inf"), None
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        value = fn()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return best, value
