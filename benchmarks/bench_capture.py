"""Capture of every residual site with accumulators vs a plain training forward+backward.

Ours: :func:`tangentlens.capture.capture_statistics` on one batch — activations and per-token
gradients at the embedding and after every block, folded into float64 moments overall and per
frequency bin (5 bins) and a 16384-row reservoir. Reference: the same model and batch in train
mode with every parameter requiring a gradient, summed next-token loss, ``loss.backward()``.
Goal: ≤ 0.85× the reference time (frozen parameters skip every weight gradient). Both compute
the same loss; its difference is reported as a check.

Models are random Pythia-architecture decoders built from configs (speed does not depend on the
weights): the default mini-pythia shape, and (full run) a pythia-70m shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.data import FrequencyBins, SpecialTokens

SHAPES = {
    "mini-pythia": {
        "n_layers": 4,
        "d_model": 128,
        "n_heads": 4,
        "d_vocab": 4096,
        "batch": (16, 128),
    },
    "pythia-70m": {
        "n_layers": 6,
        "d_model": 512,
        "n_heads": 8,
        "d_vocab": 50304,
        "batch": (8, 256),
    },
}
SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)


def _model(shape: dict[str, Any]) -> HookedTransformer:
    torch.manual_seed(0)
    d = shape["d_model"]
    cfg = HookedTransformerConfig(
        n_layers=shape["n_layers"],
        d_model=d,
        n_heads=shape["n_heads"],
        d_head=d // shape["n_heads"],
        d_mlp=4 * d,
        d_vocab=shape["d_vocab"],
        n_ctx=shape["batch"][1],
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=d // shape["n_heads"] // 4,
        parallel_attn_mlp=True,
        device="cpu",
    )
    return HookedTransformer(cfg)


def _zipf_tokens(shape: dict[str, Any], seed: int = 1) -> torch.Tensor:
    """Token ids with Zipf frequencies (p ∝ 1/rank), as in text; ids 0 and 1 are special."""
    weights = 1.0 / torch.arange(1, shape["d_vocab"] - 1, dtype=torch.float64)
    n = shape["batch"][0] * shape["batch"][1]
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(weights, n, replacement=True, generator=gen)
    return (draws + 2).reshape(shape["batch"])


def _best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def _training_step(model: HookedTransformer, tokens: torch.Tensor) -> float:
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(tokens, return_type="logits")
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="sum"
    )
    loss.backward()
    return float(loss.detach())


def bench_capture(name: str, repeats: int) -> dict[str, Any]:
    shape = SHAPES[name]
    model = _model(shape)
    tokens = _zipf_tokens(shape)
    counts = np.bincount(tokens.numpy().ravel(), minlength=shape["d_vocab"])
    bins = FrequencyBins.from_counts(counts, 5)
    sites = (
        "hook_embed",
        *(f"blocks.{layer}.hook_resid_post" for layer in range(shape["n_layers"])),
    )
    config = CaptureConfig(sites=sites, loss="next_token")
    statistics = StatisticsConfig(n_bins=5)

    def capture() -> float:
        stats = capture_statistics(model, [tokens], config, SPECIAL, statistics, bins=bins)
        return stats.loss_sum

    _training_step(model, tokens)  # warm-up both paths once
    capture()
    ref_s, ref = _best_time(lambda: _training_step(model, tokens), repeats)
    ours_s, ours = _best_time(capture, repeats)
    model.zero_grad(set_to_none=True)
    return {
        "benchmark": f"capture {len(sites)} sites",
        "shape": f"{name} {shape['batch'][0]}×{shape['batch'][1]}",
        "reference_name": "training fwd+bwd",
        "ours_s": ours_s,
        "reference_s": ref_s,
        "ours": ours,
        "reference": ref,
        "difference": abs(ours - ref) / abs(ref),
        "difference_kind": "relative",
        "goal": "≤ 0.85× the time",
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The capture benchmark rows (quick: the mini-pythia shape only, one repeat)."""
    if quick:
        return [bench_capture("mini-pythia", 1)]
    return [bench_capture(name, 3) for name in SHAPES]
