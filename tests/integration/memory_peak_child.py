"""Child process of ``test_memory_peaks.py``: build a random Pythia-architecture model of the
shape given as JSON (argv[1]), capture one step's statistics as a sweep step does (embedding
and every block's output, activations and gradients, frequency bins with gradient moments,
type sums, reservoir), print JSON ``{"measured": bytes, "planned": bytes}``.

Measured: on the CPU, the process's peak resident memory (``VmHWM``) above its resident
memory once every library is imported (the plan counts the model too); on a GPU,
``torch.cuda.max_memory_allocated``. Planned: :func:`tangentlens.core.memory.memory_plan`'s
host (CPU) or accelerator (GPU) peak.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

import numpy as np
import torch
from peak_memory import peak_resident, resident
from transformer_lens import HookedTransformer, HookedTransformerConfig

from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.core.memory import PlanInputs, memory_plan
from tangentlens.data import FrequencyBins, SpecialTokens
from tangentlens.models.shapes import ModelShape


def main(spec: dict) -> dict:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(2)
    device = spec["device"]
    baseline = resident()
    d, heads, batch, seq_len = spec["d"], spec["heads"], spec["batch"], spec["seq_len"]
    shape = ModelShape(
        family="gpt_neox",
        n_layers=spec["layers"],
        d_model=d,
        n_heads=heads,
        n_kv_heads=heads,
        d_mlp=4 * d,
        d_vocab=spec["vocab"],
        n_ctx=seq_len,
        rotary_dim=d // heads // 4,
    )
    cfg = HookedTransformerConfig(
        n_layers=shape.n_layers,
        d_model=d,
        n_heads=heads,
        d_head=shape.d_head,
        d_mlp=shape.d_mlp,
        d_vocab=shape.d_vocab,
        n_ctx=seq_len,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=shape.rotary_dim,
        parallel_attn_mlp=True,
        original_architecture="GPTNeoXForCausalLM",
        dtype=getattr(torch, spec["dtype"]),
        device=device,
    )
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats()
    model = HookedTransformer(cfg, move_to_device=False).to(device)
    generator = torch.Generator().manual_seed(0)
    zipf = 1.0 / torch.arange(1, shape.d_vocab - 1, dtype=torch.float64)
    batches = [
        (torch.multinomial(zipf, batch * seq_len, True, generator=generator) + 2).reshape(
            batch, seq_len
        )
        for _ in range(spec["batches"])
    ]
    counts = np.bincount(torch.cat(batches).numpy().ravel(), minlength=shape.d_vocab)
    frequent = np.sort(np.argsort(-counts, kind="stable")[: spec["types"]])
    statistics = StatisticsConfig(
        n_bins=spec["bins"],
        gradient_bin_moments=True,
        type_sums=True,
        vocab_size=shape.d_vocab,
        type_ids=tuple(int(i) for i in frequent),
        reservoir_size=spec["reservoir"],
    )
    sites = ("hook_embed", *(f"blocks.{b}.hook_resid_post" for b in range(shape.n_layers)))
    capture_statistics(
        model,
        [tokens.to(device) for tokens in batches],
        CaptureConfig(sites=sites),
        SpecialTokens(bos_id=0, eos_id=0, pad_id=1),
        statistics,
        bins=FrequencyBins.from_counts(counts, spec["bins"]),
    )
    inputs = PlanInputs(
        shape=shape,
        dtype=spec["dtype"],
        device=device,
        batch=batch,
        seq_len=seq_len,
        sites=(("embed", None), *(("resid_post", b) for b in range(shape.n_layers))),
        gradients=True,
        bins=spec["bins"],
        bin_moments=True,
        n_types=spec["types"],
        reservoir=spec["reservoir"],
        energy_methods=0,
        n_sequences=batch * spec["batches"],
    )
    plan = memory_plan(inputs)
    if device == "cpu":
        measured = peak_resident() - baseline
        return {"measured": measured, "planned": plan.host_peak}
    return {"measured": torch.cuda.max_memory_allocated(), "planned": plan.accelerator_peak}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
