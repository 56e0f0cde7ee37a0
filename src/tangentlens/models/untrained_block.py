"""Untrained block with a common bias (Godey, de la Clergerie & Sagot 2024; METHODS.md §3).

One freshly initialised transformer block reads ``n_sequences`` random sequences of length
``seq_len`` whose token vectors are rows of a random embedding table plus one common bias
vector ``b`` of norm ``N``: input rows ``xᵢ + b``. For each ``N`` of a grid we report the input's
and the output's exact cosine anisotropy, the mean norms and their ratio, and the mean attention
entropy ``−Σⱼ aᵢⱼ log aᵢⱼ`` (nats; per head, averaged over query positions and sequences).

The block is TransformerLens' own :class:`~transformer_lens.components.BertBlock` (post-LN, as
in BERT and in the analysed encoders), built from a ``HookedTransformerConfig``; the attention
pattern is read at ``attn.hook_pattern``. ``block="pre_ln"`` swaps in TL's pre-LN
``TransformerBlock`` for comparison.

Initialisation is BERT's (``BertPreTrainedModel._init_weights``): every weight matrix
(``W_Q, W_K, W_V, W_O, W_in, W_out``) ~ N(0, init_std²) with ``init_std = 0.02``, every bias 0,
LayerNorm weight 1 and bias 0; GELU (exact, ``act_fn="gelu"``); LayerNorm eps 1e-12; no dropout.

The paper text we hold (a summary) fixes one block, BERT-style init, 16 × 512 random inputs, a
common bias of norm ``N``, and reports cosine similarity, ``E‖xᵢ + b‖`` against ``E‖T(xᵢ + b)‖``
and attention entropy; it gives no σ, vocabulary, grid or block variant. Our choices (settable):

* embedding table rows ~ N(0, σ² I) with ``σ = embedding_std = 0.02``, BERT's initialisation of
  its word embeddings; table size ``vocab_size = 30522`` (BERT's), token ids uniform with
  replacement. Only the rows actually used are drawn (same distribution as a full table). No
  position embeddings and no embedding LayerNorm: the block reads ``xᵢ + b`` directly;
* ``b = N u`` with one seeded uniformly random unit direction ``u`` shared by every ``N``, and
  the same token vectors for every ``N``, so a sweep varies only ``N``;
* the grid: 0 and decades 10⁻² … 10⁴. The varying part of an attention logit has standard
  deviation ≈ init_std² · σ√d · ‖x + b‖, so for BERT-base sizes attention only sharpens once
  ``N`` approaches 1/(init_std² σ √d) ≈ 4.5·10³: 10⁴ is included for that reason;
* bidirectional attention (BERT); ``causal=True`` masks the future (then row ``i`` has ``i + 1``
  keys and its entropy is at most ``log(i + 1)``);
* the forward pass in float64 (``dtype``); ``float32`` is ~1.2× faster on 2 CPU cores and
  agrees to ~1e-4 relative (default size, every N).

Reading the numbers: the post-LN block ends in a LayerNorm (weight 1, bias 0), so every output
row has norm ≈ √d and ``norm_ratio`` ≈ √d / mean‖x + b‖ whatever the block does.

Random draws come from local generators, one per stream (weights, tokens, bias direction),
seeded from ``(seed, stream)``; the global RNG is never touched. Same config → identical rows.

:class:`UntrainedBlockConfig` is defined in :mod:`tangentlens.models.configs` (no torch needed to
build and validate one) and re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from transformer_lens.components import BertBlock, TransformerBlock
from transformer_lens.config.hooked_transformer_config import HookedTransformerConfig
from transformer_lens.hook_points import HookPoint

from tangentlens.metrics import attention_entropy_sums, cosine_anisotropy
from tangentlens.models.configs import BLOCKS, DEFAULT_BIAS_NORMS, DTYPES, UntrainedBlockConfig
from tangentlens.seeding import seeded_generator

__all__ = [
    "BLOCKS",
    "DEFAULT_BIAS_NORMS",
    "DTYPES",
    "UntrainedBlockConfig",
    "UntrainedBlockRow",
    "build_untrained_block",
    "draw_untrained_inputs",
    "run_untrained_block",
]

BERT_LAYER_NORM_EPS = 1e-12

_STREAM_WEIGHTS, _STREAM_TOKENS, _STREAM_BIAS = 0, 1, 2

Inputs = Float[torch.Tensor, "seq pos d_model"]
Direction = Float[torch.Tensor, "d_model"]


@dataclass(frozen=True)
class UntrainedBlockRow:
    """One bias norm ``N`` of the sweep. Norms are mean Euclidean norms of token vectors;
    ``norm_ratio = output_mean_norm / input_mean_norm``; entropies are in nats."""

    bias_norm: float
    input_cosine_anisotropy: float
    output_cosine_anisotropy: float
    input_mean_norm: float
    output_mean_norm: float
    norm_ratio: float
    attention_entropy_mean: float
    attention_entropy_per_head: tuple[float, ...]


def _tl_config(config: UntrainedBlockConfig) -> HookedTransformerConfig:
    return HookedTransformerConfig(
        n_layers=1,
        d_model=config.d_model,
        d_head=config.d_model // config.n_heads,
        n_heads=config.n_heads,
        d_mlp=config.d_mlp,
        n_ctx=config.seq_len,
        d_vocab=config.vocab_size,
        act_fn="gelu",
        normalization_type="LN",
        eps=BERT_LAYER_NORM_EPS,
        attention_dir="causal" if config.causal else "bidirectional",
        positional_embedding_type="standard",
        dtype=getattr(torch, config.dtype),
        device="cpu",
    )


def build_untrained_block(config: UntrainedBlockConfig) -> torch.nn.Module:
    """A TL block (``BertBlock`` or pre-LN ``TransformerBlock``) with BERT's initialisation.

    Weights are drawn in float64 from the ``(seed, weights)`` stream in sorted parameter-name
    order, then cast, so both dtypes hold the same weights. Eval mode, gradients off.
    Forward: ``(batch, pos, d_model) → (batch, pos, d_model)``.
    """
    cfg = _tl_config(config)
    block = BertBlock(cfg) if config.block == "bert" else TransformerBlock(cfg, block_index=0)
    gen = seeded_generator(config.seed, _STREAM_WEIGHTS)
    with torch.no_grad():
        for name, param in sorted(block.named_parameters()):
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("W_"):
                draw = torch.empty(param.shape, dtype=torch.float64)
                param.copy_(draw.normal_(0.0, config.init_std, generator=gen))
            elif leaf == "w":  # LayerNorm weight
                param.fill_(1.0)
            elif leaf.startswith("b"):  # linear biases and LayerNorm bias
                param.zero_()
            else:
                raise ValueError(f"unexpected parameter {name!r} in TL's {type(block).__name__}")
            param.requires_grad_(False)
    return block.eval()


def draw_untrained_inputs(config: UntrainedBlockConfig) -> tuple[Inputs, Direction]:
    """Token vectors ``x`` (n_sequences, seq_len, d_model) and the unit bias direction ``u``
    (d_model,), float64. Row ``t`` of ``x`` is the table row of a uniformly drawn token id."""
    gen = seeded_generator(config.seed, _STREAM_TOKENS)
    ids = torch.randint(config.vocab_size, (config.n_sequences, config.seq_len), generator=gen)
    used, where = torch.unique(ids, return_inverse=True)
    rows = torch.randn(used.numel(), config.d_model, generator=gen, dtype=torch.float64)
    x = (rows * config.embedding_std)[where]
    direction = torch.randn(
        config.d_model, generator=seeded_generator(config.seed, _STREAM_BIAS), dtype=torch.float64
    )
    return x, direction / torch.linalg.vector_norm(direction)


def _pattern_hook(block: torch.nn.Module) -> HookPoint:
    hook = block.attn.hook_pattern
    if not isinstance(hook, HookPoint):
        raise ValueError(f"TL's {type(block).__name__} has no attn.hook_pattern HookPoint")
    return hook


def _sweep_point(
    block: torch.nn.Module,
    config: UntrainedBlockConfig,
    inputs: Inputs,
    direction: Direction,
    bias_norm: float,
) -> UntrainedBlockRow:
    """Forward all sequences (``batch_size`` at a time, no grad) at one bias norm ``N``."""
    dtype = getattr(torch, config.dtype)
    biased = inputs + bias_norm * direction  # (seq, pos, d) float64
    entropy_sum = torch.zeros(config.n_heads, dtype=torch.float64)

    def record(pattern: torch.Tensor, hook: HookPoint) -> None:  # (batch, head, q, k)
        entropy_sum.add_(attention_entropy_sums(pattern)[0])

    hook_point = _pattern_hook(block)
    hook_point.add_hook(record)
    try:
        with torch.inference_mode():
            outputs = [
                block(biased[start : start + config.batch_size].to(dtype)).to(torch.float64)
                for start in range(0, config.n_sequences, config.batch_size)
            ]
    finally:
        hook_point.remove_hooks("fwd")
    out = torch.cat(outputs).reshape(-1, config.d_model)
    inp = biased.reshape(-1, config.d_model)
    per_head = entropy_sum / (config.n_sequences * config.seq_len)
    in_norm = float(torch.linalg.vector_norm(inp, dim=1).mean())
    out_norm = float(torch.linalg.vector_norm(out, dim=1).mean())
    return UntrainedBlockRow(
        bias_norm=bias_norm,
        input_cosine_anisotropy=cosine_anisotropy(inp),
        output_cosine_anisotropy=cosine_anisotropy(out),
        input_mean_norm=in_norm,
        output_mean_norm=out_norm,
        norm_ratio=out_norm / in_norm,
        attention_entropy_mean=float(per_head.mean()),
        attention_entropy_per_head=tuple(float(h) for h in per_head),
    )


def run_untrained_block(config: UntrainedBlockConfig) -> list[UntrainedBlockRow]:
    """Sweep ``config.bias_norms``: one :class:`UntrainedBlockRow` per ``N``, in grid order.

    One block and one draw of token vectors and bias direction serve the whole grid.
    """
    if not isinstance(config, UntrainedBlockConfig):
        raise ValueError(f"config must be an UntrainedBlockConfig, got {type(config).__name__}")
    block = build_untrained_block(config)
    inputs, direction = draw_untrained_inputs(config)
    return [_sweep_point(block, config, inputs, direction, n) for n in config.bias_norms]
