"""Capture of every residual site with all statistics vs a plain training forward+backward.

Ours: :func:`tangentlens.capture.capture_statistics` on a few batches (4 on the CPU, 16 on a
GPU, as in a sweep step, so the final copy of the moments to the CPU is paid once) — activations
and per-token gradients at the embedding and after every block, folded into float64 moments
overall and per frequency bin (5 bins, with the per-bin gradient second moments), per-type sums
over the types a sweep tracks (those seen ≥ 5 times in the tokens, for frequency_geometry, plus
the 2048 most frequent, for update_alignment) and a 16384-row reservoir: what the pythia_1b
recipe keeps. Reference: the same model, batches and dtype in train mode with every parameter
requiring a gradient, summed next-token loss (logits in float32 at least, as the capture's),
``loss.backward()``. CUDA is synchronised around every timed call.
Goal: ≤ 0.85× the reference time (frozen parameters skip every weight gradient). Both compute
the same loss; its difference is reported as a check.

Models are random Pythia-architecture decoders built from the published configs
(:data:`tangentlens.models.shapes.PYTHIA_CONFIGS`, the mini suite's for mini-pythia) through
TransformerLens' own GPT-NeoX conversion (speed does not depend on the weights): mini-pythia
(16 × 128) and pythia-70m (8 × 256) on the CPU; pythia-160m and pythia-1b at the pythia_1b
recipe's batch (16 × 512) on a GPU::

    python -m benchmarks capture --device cuda                    # float32, the recipe's dtype
    python -m benchmarks capture --device cuda --dtype bfloat16

``--shape NAME`` (repeatable: ``mini-pythia`` or ``pythia-<size>``) times other shapes, e.g. a
smoke run of the GPU path on the CPU: ``python -m benchmarks capture --quick --shape
pythia-14m``. Pythia shapes from pythia-160m up run at the recipe's batch, smaller ones at 8 × 256.
"""

from __future__ import annotations

import gc
import json
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.loading_from_pretrained import convert_hf_model_config

from benchmarks._timing import best_time, synchronize, torch_dtype
from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.core.recipe import load_recipe
from tangentlens.data import FrequencyBins, SpecialTokens
from tangentlens.models.configs import MINI_SUITE_CONFIGS
from tangentlens.models.hub import hf_offline_mode
from tangentlens.models.shapes import PYTHIA_CONFIGS, pythia_config
from tangentlens.probes import frequency_geometry, update_alignment
from tangentlens.probes.frequency_geometry import FrequencyGeometryConfig
from tangentlens.probes.update_alignment import UpdateAlignmentConfig

#: The pythia_1b recipe's batch (rows × tokens): the GPU shapes run at it.
_RECIPE = load_recipe("pythia_1b")
RECIPE_BATCH: tuple[int, int] = (_RECIPE.data.batch_size, _RECIPE.data.seq_len)
#: The statistics the pythia_1b recipe keeps.
N_BINS = _RECIPE.data.n_bins
RESERVOIR = _RECIPE.capture.reservoir
#: Pythia sizes timed at 8 × 256 (CPU-sized); the larger ones at the recipe's batch.
_SMALL = ("14m", "31m", "70m")


def _mini_config() -> dict[str, Any]:
    """The mini-pythia suite's model as Pythia-style ``config.json`` fields."""
    mini = MINI_SUITE_CONFIGS["mini-pythia"]
    return {
        **pythia_config("EleutherAI/pythia-70m"),
        "hidden_size": mini.d_model,
        "num_hidden_layers": mini.n_layers,
        "num_attention_heads": mini.n_heads,
        "intermediate_size": mini.d_mlp,
        "vocab_size": mini.vocab_size,
        "max_position_embeddings": mini.seq_len,
    }


def _shape(config: dict[str, Any], batch: tuple[int, int]) -> dict[str, Any]:
    return {
        "config": config,
        "n_layers": config["num_hidden_layers"],
        "d_model": config["hidden_size"],
        "n_heads": config["num_attention_heads"],
        "d_vocab": config["vocab_size"],
        "batch": batch,
    }


#: Benchmark shapes: a Hugging Face config (``config``), its main sizes and the batch timed.
SHAPES: dict[str, dict[str, Any]] = {
    "mini-pythia": _shape(_mini_config(), (16, 128)),
    **{
        name.removeprefix("EleutherAI/"): _shape(
            config, (8, 256) if name.removeprefix("EleutherAI/pythia-") in _SMALL else RECIPE_BATCH
        )
        for name, config in PYTHIA_CONFIGS.items()
        if not name.endswith("-deduped")
    },
}
#: Shapes timed per device: the CPU runs stay within minutes on 2 cores.
DEVICE_SHAPES = {"cpu": ("mini-pythia", "pythia-70m"), "cuda": ("pythia-160m", "pythia-1b")}
SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)


def check_shapes(names: tuple[str, ...]) -> None:
    """A ``ValueError`` naming the known shapes when one of ``names`` is not one."""
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise ValueError(f"unknown shape(s) {unknown}; allowed: {list(SHAPES)}")


def _model(
    shape: dict[str, Any], device: str = "cpu", dtype: torch.dtype = torch.float32
) -> HookedTransformer:
    """A randomly initialised (seeded) TransformerLens model of ``shape``'s config, in
    ``dtype`` on ``device``, configured as tangentlens loads a GPT-NeoX checkpoint."""
    with tempfile.TemporaryDirectory(prefix="bench-config-") as folder, hf_offline_mode():
        (Path(folder) / "config.json").write_text(json.dumps(shape["config"]))
        cfg = convert_hf_model_config(folder)
    cfg.pop("tokenizer_name", None)  # the temporary folder holds no tokenizer
    if shape["batch"][1] > cfg["n_ctx"]:
        raise ValueError(f"batch {shape['batch']} is longer than the context ({cfg['n_ctx']})")
    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(**cfg, device="cpu", dtype=dtype))
    return model.to(device)


def _zipf_tokens(shape: dict[str, Any], seed: int = 1) -> torch.Tensor:
    """Token ids with Zipf frequencies (p ∝ 1/rank), as in text; ids 0 and 1 are special."""
    weights = 1.0 / torch.arange(1, shape["d_vocab"] - 1, dtype=torch.float64)
    n = shape["batch"][0] * shape["batch"][1]
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(weights, n, replacement=True, generator=gen)
    return (draws + 2).reshape(shape["batch"])


def tracked_types(counts: np.ndarray) -> tuple[int, ...]:
    """The types a sweep keeps per-type sums of, for the frequency table ``counts``: those of
    frequency_geometry (seen ≥ ``min_count`` times) and update_alignment (the
    ``centroid_types`` most frequent), at their default settings."""
    wanted = np.zeros(counts.shape, dtype=bool)
    wanted[frequency_geometry.tracked_types(FrequencyGeometryConfig(), counts)] = True
    wanted[update_alignment.tracked_types(UpdateAlignmentConfig(), counts)] = True
    return tuple(np.flatnonzero(wanted).tolist())


def _training_step(model: HookedTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """One plain training forward+backward (every parameter gets its gradient); the summed
    next-token loss, detached, on the model's device (no host sync)."""
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(tokens, return_type="logits")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # the loss in float32, as the capture's and mixed precision's
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="sum"
    )
    loss.backward()
    return loss.detach()


def _setup(
    shape: dict[str, Any], batches: list[torch.Tensor]
) -> tuple[CaptureConfig, StatisticsConfig, FrequencyBins, int]:
    """The capture of every residual site and the embedding with the pythia_1b recipe's
    statistics over ``batches``: (config, statistics, bins, tracked types)."""
    counts = np.bincount(torch.cat(batches).cpu().numpy().ravel(), minlength=shape["d_vocab"])
    bins = FrequencyBins.from_counts(counts, N_BINS)
    types = tracked_types(counts)
    sites = (
        "hook_embed",
        *(f"blocks.{layer}.hook_resid_post" for layer in range(shape["n_layers"])),
    )
    config = CaptureConfig(sites=sites, loss="next_token")
    statistics = StatisticsConfig(
        n_bins=N_BINS,
        gradient_bin_moments=True,
        type_sums=True,
        vocab_size=shape["d_vocab"],
        type_ids=types,
        reservoir_size=RESERVOIR,
    )
    return config, statistics, bins, len(types)


def bench_capture(
    name: str, repeats: int, device: str = "cpu", n_batches: int = 4, dtype: str = "float32"
) -> dict[str, Any]:
    check_shapes((name,))
    shape = SHAPES[name]
    model = _model(shape, device, torch_dtype(dtype))
    batches = [_zipf_tokens(shape, seed=i).to(device) for i in range(n_batches)]
    config, statistics, bins, n_types = _setup(shape, batches)
    sites = config.sites

    def capture() -> float:
        stats = capture_statistics(model, batches, config, SPECIAL, statistics, bins=bins)
        return stats.loss_sum

    def train() -> float:
        return float(sum(_training_step(model, tokens) for tokens in batches))

    _training_step(model, batches[0])  # warm-up both paths once
    model.zero_grad(set_to_none=True)
    capture()
    ref_s, ref = best_time(train, repeats)
    model.zero_grad(set_to_none=True)
    ours_s, ours = best_time(capture, repeats)
    b, s = shape["batch"]
    return {
        "benchmark": f"capture {len(sites)} sites",
        "shape": f"{name} {n_batches}×{b}×{s} {device} {SHORT_DTYPES[dtype]}",
        "reference_name": "training fwd+bwd",
        "ours_s": ours_s,
        "reference_s": ref_s,
        "ours": ours,
        "reference": ref,
        "difference": abs(ours - ref) / abs(ref),
        "difference_kind": "relative",
        "goal": f"≤ 0.85× ({N_BINS} bins, {n_types} types, {RESERVOIR} rows)",
    }


def _batch_syncs(count: Callable[[list[torch.Tensor]], int], shape: dict[str, Any]) -> float:
    """Syncs one more capture batch makes: ``count`` over three batches less over one, halved."""
    batches = [_zipf_tokens(shape, seed=i) for i in range(3)]
    return (count(batches) - count(batches[:1])) / 2


def cuda_syncs_per_batch(name: str, device: str) -> float:
    """Host synchronisations per capture batch of shape ``name`` on the CUDA ``device``, as
    CUDA's sync debug mode reports them (one warning each)."""
    shape = SHAPES[name]
    model = _model(shape, device)

    def count(batches: list[torch.Tensor]) -> int:
        config, statistics, bins, _ = _setup(shape, batches)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                capture_statistics(model, batches, config, SPECIAL, statistics, bins=bins)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchronizing" in str(w.message) for w in caught)

    return _batch_syncs(count, shape)


#: The micro decoder the emulated count runs (the count does not depend on the layers).
_MICRO = _shape({**pythia_config("EleutherAI/pythia-14m"), "num_hidden_layers": 2}, (2, 64))


def emulated_syncs_per_batch() -> float:
    """Host synchronisations per capture batch counted on the emulated accelerator
    (:mod:`tangentlens.testing`) on a 2-layer pythia-14m-wide decoder, 2 × 64 tokens a batch,
    the benchmark's statistics: three batches' syncs less one batch's, halved."""
    from tangentlens.testing import emulated_accelerator

    batches = [_zipf_tokens(_MICRO, seed=i) for i in range(3)]
    config, statistics, bins, _ = _setup(_MICRO, batches)
    with emulated_accelerator() as accelerator:
        model = _model(_MICRO).to(accelerator.device)
        counts = []
        for stream in (batches[:1], batches):
            start = len(accelerator.transfers.syncs)
            capture_statistics(model, stream, config, SPECIAL, statistics, bins=bins)
            counts.append(len(accelerator.transfers.syncs) - start)
    return (counts[1] - counts[0]) / 2


def run(
    quick: bool = False,
    device: str = "cpu",
    dtype: str = "float32",
    shapes: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """The capture benchmark rows: the device's shapes, or ``shapes`` (quick: the first shape
    only unless ``shapes`` are named, 2 batches, one repeat)."""
    torch_dtype(dtype)
    cuda = device.startswith("cuda")
    names = tuple(shapes) if shapes else DEVICE_SHAPES["cuda" if cuda else "cpu"]
    check_shapes(names)
    if quick and not shapes:
        names = names[:1]
    rows = []
    for name in names:
        if quick:
            rows.append(bench_capture(name, 1, device, 2, dtype))
        else:
            rows.append(bench_capture(name, 3, device, 16 if cuda else 4, dtype))
        release_memory()
    return rows


def release_memory() -> None:
    """Hand the memory of the last benchmark's model back (to the next one on a GPU)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        synchronize()
        torch.cuda.empty_cache()
