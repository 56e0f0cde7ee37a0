"""How often a capture batch makes the host wait for the device, counted on the emulated
accelerator (tangentlens.testing: every wait a CUDA device would make, with where it happened):
at most :data:`BATCH_SYNCS` per batch, whatever the number of sites and attention layers — the
same at 2 and 6 layers, per-sequence energy sums, frequency bins, type sums and the reservoir
included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from tangentlens.capture import (
    CaptureConfig,
    EnergyProjectors,
    SequenceEnergyConfig,
    StatisticsConfig,
    capture_statistics,
)
from tangentlens.data import FrequencyBins, SpecialTokens
from tangentlens.testing import emulated_accelerator

#: What a capture batch may wait for at most: the loss and finiteness flags (one read), and
#: nothing per site or per attention layer.
BATCH_SYNCS = 4
SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
VOCAB, D_MODEL, BATCH, SEQ_LEN, N_BINS = 100, 32, 8, 64, 3


def _model(n_layers: int) -> HookedTransformer:
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(
        n_layers=n_layers, d_model=D_MODEL, n_heads=4, d_head=8, d_mlp=64, d_vocab=VOCAB,
        n_ctx=SEQ_LEN, act_fn="gelu", normalization_type="LN", positional_embedding_type="rotary",
        rotary_dim=4, parallel_attn_mlp=True, dtype=torch.float32, device="cpu",
    )  # fmt: skip
    return HookedTransformer(cfg)


def _batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(2, VOCAB, (BATCH, SEQ_LEN), generator=gen) for _ in range(n)]


def _energy(sites: tuple[str, ...]) -> SequenceEnergyConfig:
    """Per-sequence energy sums of one rank-2 proxy per site (a frozen-early step's)."""
    basis = torch.linalg.qr(torch.randn(D_MODEL, 2, dtype=torch.float64))[0]
    projectors = EnergyProjectors.from_proxies({"pca": basis}, {"pca": None})
    return SequenceEnergyConfig(SEQ_LEN, dict.fromkeys(sites, projectors), N_BINS)


def _syncs(n_layers: int, n_batches: int) -> list:
    """The waits of one capture of ``n_batches`` batches: every residual site and the
    embedding, every layer's attention, binned moments, type sums, a reservoir and
    per-sequence energy sums."""
    batches = _batches(n_batches)
    counts = np.bincount(torch.cat(batches).flatten().numpy(), minlength=VOCAB)
    sites = ("hook_embed", *(f"blocks.{i}.hook_resid_post" for i in range(n_layers)))
    config = CaptureConfig(sites=sites, attention_layers=tuple(range(n_layers)))
    statistics = StatisticsConfig(
        n_bins=N_BINS,
        type_sums=True,
        vocab_size=VOCAB,
        reservoir_size=64,
        sequence_energy=_energy(sites),
    )
    model = _model(n_layers)
    bins = FrequencyBins.from_counts(counts, N_BINS)
    with emulated_accelerator() as accelerator:
        model = model.to(accelerator.device)
        start = len(accelerator.transfers.syncs)
        capture_statistics(model, batches, config, SPECIAL, statistics, bins=bins)
        return accelerator.transfers.syncs[start:]


@pytest.mark.parametrize("n_layers", [2, 6])
def test_a_capture_batch_waits_a_fixed_small_number_of_times(n_layers):
    """The syncs one more batch adds (3 batches against 1) stay within the budget, and do not
    grow with the layers (sites and attention layers)."""
    one, three = _syncs(n_layers, 1), _syncs(n_layers, 3)
    per_batch = (len(three) - len(one)) / 2
    where = sorted({f"{s.kind} at {s.where}" for s in three})
    assert per_batch <= BATCH_SYNCS, where
    assert len(one) <= 2 * BATCH_SYNCS, where  # the first batch's set-up adds little


def test_the_waits_do_not_grow_with_the_layers():
    assert len(_syncs(2, 2)) == len(_syncs(6, 2))
