"""The capture through each loader (``hooked``, ``bridge``) vs a plain training forward+backward.

Ours: :func:`tangentlens.capture.capture_statistics` of a checkpoint loaded by
``load_local_checkpoint(folder, loader=…)`` — ``"hooked"`` (TransformerLens'
``HookedTransformer`` / ``HookedEncoder``, converted weights) or ``"bridge"`` (its
``TransformerBridge`` around the Hugging Face model: raw weights, eager attention) — on 4 batches,
with the statistics of ``bench_capture`` (the embedding and every block's output, activations and
gradients of the model's own loss, 5 frequency bins with per-bin gradient moments, per-type sums,
a 16384-row reservoir). Reference: the Hugging Face model the suite trains (as
:func:`tangentlens.models.training.build_model` makes it, its default attention), in train mode
with every parameter requiring a gradient: summed loss over the same batches (next-token, or the
masked-LM loss at the capture's own corrupted positions), ``loss.backward()``.

Shapes: mini-pythia (GPT-NeoX, 16 × 128 tokens per batch) and mini-bert (BERT masked-LM, 32 × 128),
randomly initialised with the suites' own configs and tokenizers (speed does not depend on the
weights). The loss difference is a check: both loaders compute the reference's loss. Repeats are
interleaved (reference, hooked, bridge, …; best of each), so a slow spell of a shared machine
falls on every side. The two loaders' ratios are one input of
:data:`tangentlens.models.catalog.DEFAULT_LOADERS` (see its comment)::

    python -m benchmarks loaders            # both shapes, both loaders, CPU
    python -m benchmarks loaders --quick    # mini-pythia, 2 batches, one repeat
"""

from __future__ import annotations

import functools
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._timing import best_time, torch_dtype
from benchmarks.bench_capture import N_BINS, RESERVOIR, SHORT_DTYPES, tracked_types
from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.data import FrequencyBins, SpecialTokens, special_tokens_of
from tangentlens.data.mlm import IGNORE_INDEX, mlm_corrupt
from tangentlens.models import LOADERS, lens_model
from tangentlens.models.configs import MINI_SUITE_CONFIGS, MiniSuiteConfig
from tangentlens.models.loading import load_local_checkpoint
from tangentlens.models.training import build_model, training_split, wrap_tokenizer
from tangentlens.seeding import seeded_generator

#: Shapes timed (mini suite → batch rows × tokens): the suites' own training batches.
SHAPES: dict[str, tuple[int, int]] = {"mini-pythia": (16, 128), "mini-bert": (32, 128)}
MLM_PROBABILITY = 0.15


def _checkpoint(config: MiniSuiteConfig, folder: Path) -> torch.nn.Module:
    """A randomly initialised checkpoint of the mini suite ``config`` saved in ``folder`` (model
    and tokenizer, as the suites save them); returns the Hugging Face model."""
    tokenizer = wrap_tokenizer(config, training_split(config)[0].texts())
    model = build_model(config, tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def _zipf_tokens(d_vocab: int, batch: tuple[int, int], special: SpecialTokens, seed: int):
    """Token ids with Zipf frequencies (p ∝ 1/rank) over the non-special ids; encoders' rows
    framed by [CLS] … [SEP] as the packer frames them."""
    first = max(special.all_ids()) + 1
    weights = 1.0 / torch.arange(1, d_vocab - first + 1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(weights, batch[0] * batch[1], replacement=True, generator=gen)
    tokens = (tokens + first).reshape(batch)
    if special.cls_id is not None and special.sep_id is not None:
        tokens[:, 0], tokens[:, -1] = special.cls_id, special.sep_id
    return tokens


def _mlm_batch(
    tokens: torch.Tensor, special: SpecialTokens, d_vocab: int, first_sequence: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The capture's own masked-LM corruption of ``tokens`` (inputs, labels)."""
    pairs = [
        mlm_corrupt(
            row[None],
            special_ids=special.all_ids(),
            mask_id=special.mask_id,
            vocab_size=d_vocab,
            probability=MLM_PROBABILITY,
            generator=seeded_generator(0, first_sequence + i),
        )
        for i, row in enumerate(tokens)
    ]
    return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])


def _next_token_labels(tokens: torch.Tensor) -> torch.Tensor:
    """Position t's target is token t + 1; the last position predicts nothing."""
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def _training_step(
    model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """One plain training forward+backward of the Hugging Face model (every parameter gets its
    gradient); the summed loss at the labelled positions, detached."""
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=inputs).logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    loss.backward()
    return loss.detach()


def bench_loaders(name: str, repeats: int, n_batches: int) -> list[dict[str, Any]]:
    """One row per loader: its capture vs the Hugging Face training step, at shape ``name``."""
    config = MINI_SUITE_CONFIGS[name]
    batch = SHAPES[name]
    with tempfile.TemporaryDirectory(prefix="bench-loaders-") as tmp:
        folder = Path(tmp)
        reference = _checkpoint(config, folder)
        models = {loader: load_local_checkpoint(folder, loader=loader) for loader in LOADERS}
    tokenizer = lens_model(models["hooked"]).tokenizer
    special = special_tokens_of(tokenizer, config.family)
    d_vocab = len(tokenizer)
    batches = [_zipf_tokens(d_vocab, batch, special, seed=i) for i in range(n_batches)]
    if config.family == "encoder":
        pairs = [_mlm_batch(t, special, d_vocab, i * batch[0]) for i, t in enumerate(batches)]
        loss = "mlm"
    else:
        pairs = [(t, _next_token_labels(t)) for t in batches]
        loss = "next_token"
    counts = np.bincount(torch.cat(batches).numpy().ravel(), minlength=d_vocab)
    bins = FrequencyBins.from_counts(counts, N_BINS)
    types = tracked_types(counts)
    statistics = StatisticsConfig(
        n_bins=N_BINS,
        gradient_bin_moments=True,
        type_sums=True,
        vocab_size=d_vocab,
        type_ids=types,
        reservoir_size=RESERVOIR,
    )

    def train() -> float:
        return float(sum(_training_step(reference, x, y) for x, y in pairs))

    captures = {}
    for loader, model in models.items():
        lens = lens_model(model)
        sites = (lens.hook_name("embed"), *lens.residual_sites())
        capture_config = CaptureConfig(sites=sites, loss=loss)
        captures[loader] = functools.partial(
            _capture_loss, lens, batches, capture_config, special, statistics, bins
        )
    # interleaved repeats (reference, then each loader), so a slower spell of a shared machine
    # falls on every side; the best time of each
    times: dict[str, float] = {}
    values: dict[str, float] = {}
    for fn in (train, *captures.values()):  # warm-up
        fn()
    for _ in range(repeats):
        for side, fn in (("reference", train), *captures.items()):
            seconds, values[side] = best_time(fn, 1)
            times[side] = min(times.get(side, math.inf), seconds)
    reference.zero_grad(set_to_none=True)
    rows = []
    for loader in captures:
        rows.append(
            {
                "benchmark": f"capture {len(sites)} sites, {loader} loader",
                "shape": f"{name} {n_batches}×{batch[0]}×{batch[1]} cpu {SHORT_DTYPES['float32']}",
                "reference_name": "HF training fwd+bwd",
                "ours_s": times[loader],
                "reference_s": times["reference"],
                "ours": values[loader],
                "reference": values["reference"],
                "difference": abs(values[loader] - values["reference"]) / abs(values["reference"]),
                "difference_kind": "relative",
                "goal": "loss equal to the reference's; ratio per loader",
            }
        )
    return rows


def _capture_loss(
    lens: Any,
    batches: list[torch.Tensor],
    config: CaptureConfig,
    special: SpecialTokens,
    statistics: StatisticsConfig,
    bins: FrequencyBins,
) -> float:
    """One capture of every batch; its summed loss."""
    return capture_statistics(lens, batches, config, special, statistics, bins=bins).loss_sum


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The loader rows: both mini shapes (quick: mini-pythia only, 2 batches, one repeat)."""
    torch_dtype("float32")
    if quick:
        return bench_loaders("mini-pythia", 1, 2)
    return [row for name in SHAPES for row in bench_loaders(name, 3, 4)]
