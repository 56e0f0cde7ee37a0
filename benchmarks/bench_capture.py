"""Capture of every residual site with accumulators vs a plain training forward+backward.

Ours: :func:`tangentlens.capture.capture_statistics` on a few batches (4 on the CPU, 16 on a
GPU, as in a sweep step, so the final copy of the moments to the CPU is paid once) — activations
and per-token gradients at the embedding and after every block, folded into float64 moments
overall and per frequency bin (5 bins) and a 16384-row reservoir. Reference: the same model
and batches in train mode with every parameter requiring a gradient, summed next-token loss,
``loss.backward()``.
Goal: ≤ 0.85× the reference time (frozen parameters skip every weight gradient). Both compute
the same loss; its difference is reported as a check.

Models are random Pythia-architecture decoders built from configs (speed does not depend on the
weights): mini-pythia and pythia-70m shapes on the CPU, pythia-70m and pythia-160m on a GPU
(``python -m benchmarks capture --device cuda``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from benchmarks._timing import best_time
from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.data import FrequencyBins, SpecialTokens

SHAPES: dict[str, dict[str, Any]] = {
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
    "pythia-160m": {
        "n_layers": 12,
        "d_model": 768,
        "n_heads": 12,
        "d_vocab": 50304,
        "batch": (16, 512),
    },
}
#: Shapes timed per device: the CPU runs stay within minutes on 2 cores.
DEVICE_SHAPES = {"cpu": ("mini-pythia", "pythia-70m"), "cuda": ("pythia-70m", "pythia-160m")}
SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)


def _model(shape: dict[str, Any], device: str = "cpu") -> HookedTransformer:
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
    return HookedTransformer(cfg).to(device)


def _zipf_tokens(shape: dict[str, Any], seed: int = 1) -> torch.Tensor:
    """Token ids with Zipf frequencies (p ∝ 1/rank), as in text; ids 0 and 1 are special."""
    weights = 1.0 / torch.arange(1, shape["d_vocab"] - 1, dtype=torch.float64)
    n = shape["batch"][0] * shape["batch"][1]
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(weights, n, replacement=True, generator=gen)
    return (draws + 2).reshape(shape["batch"])


def _training_step(model: HookedTransformer, tokens: torch.Tensor) -> float:
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(tokens, return_type="logits")
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="sum"
    )
    loss.backward()
    return float(loss.detach())


def bench_capture(
    name: str, repeats: int, device: str = "cpu", n_batches: int = 4
) -> dict[str, Any]:
    shape = SHAPES[name]
    model = _model(shape, device)
    batches = [_zipf_tokens(shape, seed=i).to(device) for i in range(n_batches)]
    counts = np.bincount(torch.cat(batches).cpu().numpy().ravel(), minlength=shape["d_vocab"])
    bins = FrequencyBins.from_counts(counts, 5)
    sites = (
        "hook_embed",
        *(f"blocks.{layer}.hook_resid_post" for layer in range(shape["n_layers"])),
    )
    config = CaptureConfig(sites=sites, loss="next_token")
    statistics = StatisticsConfig(n_bins=5)

    def capture() -> float:
        stats = capture_statistics(model, batches, config, SPECIAL, statistics, bins=bins)
        return stats.loss_sum

    def train() -> float:
        return sum(_training_step(model, tokens) for tokens in batches)

    _training_step(model, batches[0])  # warm-up both paths once
    capture()
    ref_s, ref = best_time(train, repeats)
    ours_s, ours = best_time(capture, repeats)
    model.zero_grad(set_to_none=True)
    return {
        "benchmark": f"capture {len(sites)} sites",
        "shape": f"{name} {n_batches}×{shape['batch'][0]}×{shape['batch'][1]} {device}",
        "reference_name": "training fwd+bwd",
        "ours_s": ours_s,
        "reference_s": ref_s,
        "ours": ours,
        "reference": ref,
        "difference": abs(ours - ref) / abs(ref),
        "difference_kind": "relative",
        "goal": "≤ 0.85× the time",
    }


def run(quick: bool = False, device: str = "cpu") -> list[dict[str, Any]]:
    """The capture benchmark rows (quick: the first shape only, one repeat)."""
    cuda = device.startswith("cuda")
    names = DEVICE_SHAPES["cuda" if cuda else "cpu"]
    if quick:
        return [bench_capture(names[0], 1, device, n_batches=2)]
    return [bench_capture(name, 3, device, n_batches=16 if cuda else 4) for name in names]
