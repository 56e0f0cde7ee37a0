"""Untrained block with a common bias (Godey et al. 2024): known answers and the paper's trends.

Small size throughout (d 64, 4 heads, sequences of 64 tokens): every run takes milliseconds.
"""

import dataclasses
import itertools
import math

import pytest
import torch

from tangentlens.models.untrained_block import (
    UntrainedBlockConfig,
    build_untrained_block,
    draw_untrained_inputs,
    run_untrained_block,
)
from tests.numerics import gamma

D, HEADS, SEQ, N_SEQ = 64, 4, 64, 8
N_TOKENS = N_SEQ * SEQ
SIGMA = 0.02
VOCAB = 10**6  # repeated tokens (cosine 1) then add only ~1/VOCAB to the input anisotropy
GRID = (0.0, *(10.0**k for k in range(-2, 6)))


def small(**overrides) -> UntrainedBlockConfig:
    base = UntrainedBlockConfig(
        d_model=D,
        n_heads=HEADS,
        d_mlp=4 * D,
        n_sequences=N_SEQ,
        seq_len=SEQ,
        bias_norms=GRID,
        init_std=0.02,
        embedding_std=SIGMA,
        vocab_size=VOCAB,
    )
    return dataclasses.replace(base, **overrides)


def test_same_seed_same_rows_and_the_global_rng_is_untouched():
    state = torch.random.get_rng_state()
    first = run_untrained_block(small(seed=3))
    assert torch.equal(state, torch.random.get_rng_state())
    assert run_untrained_block(small(seed=3)) == first
    other = run_untrained_block(small(seed=4))
    assert other[0].output_cosine_anisotropy != first[0].output_cosine_anisotropy
    assert [r.bias_norm for r in first] == list(GRID)
    assert all(len(r.attention_entropy_per_head) == HEADS for r in first)


def test_unbiased_input_is_isotropic():
    """Mean cosine of n iid N(0, σ²I_d) rows: mean 0, sd √(2 / (n(n−1)d)) (pairs uncorrelated)."""
    for seed in range(3):
        row = run_untrained_block(small(bias_norms=(0.0,), seed=seed))[0]
        sd = math.sqrt(2 / (N_TOKENS * (N_TOKENS - 1) * D))
        assert abs(row.input_cosine_anisotropy) <= 6 * sd + 1 / VOCAB


def _expected_cosine(N: float, d: int, sigma: float) -> tuple[float, float]:
    """Closed form ``N²/(N² + dσ²)`` for rows ``x + b``, ``‖b‖ = N``, ``x ~ N(0, σ²I)``, and a
    tolerance: the delta method's second-order bias ``c σ²(N² − (d/2 − 1)σ²)/s²`` plus six sd of
    the sample mean over pairs, ``2 √(Var δ / n)`` with the per-row term
    ``Var δ = ((1 − c)² N² σ² + c² d σ⁴ / 2) / s²`` (``s = N² + dσ²``)."""
    s = N**2 + d * sigma**2
    c = N**2 / s
    bias = c * sigma**2 * abs(N**2 - (d / 2 - 1) * sigma**2) / s**2
    var_row = ((1 - c) ** 2 * N**2 * sigma**2 + c**2 * d * sigma**4 / 2) / s**2
    return c, bias + 6 * 2 * math.sqrt(var_row / N_TOKENS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_biased_input_anisotropy_matches_the_closed_form(seed):
    radius = SIGMA * math.sqrt(D)  # typical ‖x‖
    norms = tuple(k * radius for k in (0.3, 1.0, 3.0, 30.0, 1000.0))
    rows = run_untrained_block(small(bias_norms=norms, seed=seed))
    for row in rows:
        expected, tol = _expected_cosine(row.bias_norm, D, SIGMA)
        assert abs(row.input_cosine_anisotropy - expected) <= tol, (row.bias_norm, expected)
    # at N = 30‖x‖ the test resolves 1 − c (≈ 1.1e-3) to better than 10 %
    assert 1 - rows[3].input_cosine_anisotropy == pytest.approx(1 / 901, rel=0.1)
    assert rows[-1].input_cosine_anisotropy > 1 - 1e-6


def test_post_ln_output_has_norm_sqrt_d_and_the_ratio_is_consistent():
    for row in run_untrained_block(small()):
        assert row.output_mean_norm == pytest.approx(math.sqrt(D), rel=1e-6)
        assert row.norm_ratio == pytest.approx(row.output_mean_norm / row.input_mean_norm)
        assert row.input_mean_norm == pytest.approx(
            math.sqrt(row.bias_norm**2 + D * SIGMA**2), rel=0.05
        )


def test_unbiased_attention_is_nearly_uniform():
    """With W ~ N(0, s²) the logit of key j for query i is ``xᵢᵀ M xⱼ``, ``M = W_Q W_Kᵀ/√d_head``,
    whose variance over keys averages ``σ⁴ ‖M‖²_F = σ⁴ d² s⁴``; for small logits the entropy is
    ``log L − Var/2``. At σ = 0.02 that deficit is ~5e-11; at σ = 1 it is ~3.3e-4."""
    log_l = math.log(SEQ)
    for sigma in (SIGMA, 1.0):
        config = small(bias_norms=(0.0,), embedding_std=sigma)
        deficit = sigma**4 * D**2 * config.init_std**4 / 2
        for seed in range(3):
            row = run_untrained_block(dataclasses.replace(config, seed=seed))[0]
            heads = torch.tensor(row.attention_entropy_per_head)
            assert bool((heads > 0).all()) and bool((heads <= log_l + 1e-12).all())
            gap = log_l - row.attention_entropy_mean
            assert 0.75 * deficit <= gap <= 1.33 * deficit, (sigma, gap, deficit)


@pytest.mark.parametrize("causal", [False, True])
def test_bias_sharpens_attention_and_raises_output_anisotropy(causal):
    """The paper's trends, checked on every grid step for several seeds."""
    for seed in range(4):
        rows = run_untrained_block(small(causal=causal, seed=seed))
        entropy = [r.attention_entropy_mean for r in rows]
        output = [r.output_cosine_anisotropy for r in rows]
        assert all(b <= a + 1e-9 for a, b in itertools.pairwise(entropy))
        assert all(b >= a - 1e-9 for a, b in itertools.pairwise(output))
        assert entropy[-1] < entropy[0] - 1.5
        assert output[0] < 0.01 and output[-1] > 0.999


def test_pre_ln_block_ignores_a_huge_bias_in_its_attention():
    """Pre-LN attention reads LN(x + b) → LN(b) for every token as N → ∞: uniform attention."""
    bert, pre_ln = (
        run_untrained_block(small(bias_norms=(1e6,), block=kind))[0] for kind in ("bert", "pre_ln")
    )
    assert pre_ln.attention_entropy_mean == pytest.approx(math.log(SEQ), abs=1e-6)
    assert bert.attention_entropy_mean < math.log(SEQ) - 2.0


def _brute_force_entropy(config: UntrainedBlockConfig, bias_norm: float) -> list[float]:
    """Per-head mean entropy from a pattern recomputed with plain loops over the weights."""
    block = build_untrained_block(config)
    x, direction = draw_untrained_inputs(config)
    inputs = x + bias_norm * direction
    attn = block.attn
    d_head = config.d_model // config.n_heads
    totals = [0.0] * config.n_heads
    for seq in range(config.n_sequences):
        for head in range(config.n_heads):
            q = inputs[seq] @ attn.W_Q[head].double() + attn.b_Q[head].double()
            k = inputs[seq] @ attn.W_K[head].double() + attn.b_K[head].double()
            scores = (q @ k.T / math.sqrt(d_head)).tolist()
            for i in range(config.seq_len):
                keys = range(i + 1) if config.causal else range(config.seq_len)
                top = max(scores[i][j] for j in keys)
                weights = [math.exp(scores[i][j] - top) for j in keys]
                z = sum(weights)
                totals[head] -= sum(w / z * math.log(w / z) for w in weights if w > 0)
    return [t / (config.n_sequences * config.seq_len) for t in totals]


@pytest.mark.parametrize("causal", [False, True])
def test_entropy_matches_a_brute_force_loop(causal):
    config = small(n_sequences=2, embedding_std=1.0, bias_norms=(300.0,), causal=causal)
    row = run_untrained_block(config)[0]
    expected = _brute_force_entropy(config, 300.0)
    assert max(expected) < math.log(SEQ) - 0.2  # a pattern far from uniform
    assert row.attention_entropy_per_head == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert row.attention_entropy_mean == pytest.approx(sum(expected) / HEADS, rel=1e-10)


def _logit_scale(config: UntrainedBlockConfig, bias_norm: float) -> float:
    """``S = max |q|·|k| / √d_head`` over heads, sequences and query–key pairs, with
    ``|q| = |x||W_Q| + |b_Q|`` from the raw input (BERT's block attends before its LayerNorm):
    the magnitude the float32 logits are summed from, in float64."""
    block = build_untrained_block(config)
    x, direction = draw_untrained_inputs(config)
    inputs = (x + bias_norm * direction).abs()
    attn = block.attn
    q = torch.einsum("spd,hde->sphe", inputs, attn.W_Q.double().abs()) + attn.b_Q.double().abs()
    k = torch.einsum("spd,hde->sphe", inputs, attn.W_K.double().abs()) + attn.b_K.double().abs()
    d_head = config.d_model // config.n_heads
    return float(torch.einsum("sihe,sjhe->shij", q, k).max()) / math.sqrt(d_head)


def test_float32_agrees_with_float64():
    """float32 within what float32 rounding allows (Higham's γ_n, :func:`tests.numerics.gamma`;
    the measured differences, ~1e-9, are far inside):

    * attention entropy: a float32 logit ``s = (x W_Q + b_Q)·(x W_K + b_K)/√d_head`` (the input
      rounded to float32, products of d and d_head terms) lies within
      ``(2γ_{d+2} + γ_{d_head+2})·S`` of the exact one (:func:`_logit_scale`); a softmax row then
      moves each probability by at most ``ε = 2 max|Δs| + γ_{L+3}`` relatively (L keys: exp within
      one ulp, the sum, the division) and its entropy — summed in float64 — by at most
      ``ε·(H + 1) ≤ ε·(log L + 1)``, so does their mean;
    * output cosine anisotropy: an output row is the input plus the attention and MLP outputs,
      a chain of at most 8 products or reductions of at most 4d terms (Q/K/V, scores, softmax,
      pattern × V, W_O, two LayerNorms, W_in, W_out), each within γ_n of the magnitudes it sums;
      the LayerNorms' inputs are not dominated by their mean (the bias is a random direction),
      so no step amplifies relative errors beyond O(1) (the stated growth factor): rows within
      ``δ = 8 γ_{4d}`` relative, each pair cosine within ``2δ``, and so their mean."""
    config = small(embedding_std=1.0, bias_norms=(0.0, 30.0))
    rows64 = run_untrained_block(config)
    rows32 = run_untrained_block(dataclasses.replace(config, dtype="float32"))
    d, d_head = config.d_model, config.d_model // config.n_heads
    for a, b in zip(rows64, rows32, strict=True):
        logits = (2 * gamma(d + 2) + gamma(d_head + 2)) * _logit_scale(config, a.bias_norm)
        epsilon = 2 * logits + gamma(config.seq_len + 3)
        entropy_bound = 1.01 * epsilon * (math.log(config.seq_len) + 1)
        assert abs(b.attention_entropy_mean - a.attention_entropy_mean) <= entropy_bound
        cosine_bound = 2 * 8 * gamma(config.d_mlp)
        assert abs(b.output_cosine_anisotropy - a.output_cosine_anisotropy) <= cosine_bound
        # worst cases, yet small against the quantities' ranges (entropies up to log L,
        # cosines in [−1, 1]): a float32 path that computed otherwise would not pass
        assert entropy_bound < 2e-3 * math.log(config.seq_len) and cosine_bound < 1e-3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_heads": 5}, "n_heads must divide d_model"),
        ({"d_model": 0}, "d_model must be an integer"),
        ({"seq_len": 2.5}, "seq_len must be an integer"),
        ({"n_sequences": 1, "seq_len": 1}, "at least 2 tokens"),
        ({"batch_size": 0}, "batch_size"),
        ({"seed": -1}, "seed"),
        ({"init_std": 0.0}, "init_std must be a finite number > 0"),
        ({"embedding_std": float("nan")}, "embedding_std"),
        ({"bias_norms": ()}, "bias_norms must be a non-empty"),
        ({"bias_norms": (1.0, -1.0)}, "bias_norms"),
        ({"bias_norms": (float("inf"),)}, "bias_norms"),
        ({"bias_norms": "1"}, "bias_norms"),
        ({"causal": 1}, "causal must be True or False"),
        ({"block": "gpt"}, "block must be one of"),
        ({"dtype": "float16"}, "dtype must be one of"),
    ],
)
def test_bad_config_raises(overrides, message):
    with pytest.raises(ValueError, match=message):
        small(**overrides)


def test_config_normalises_the_grid_and_rejects_other_objects():
    assert small(bias_norms=[0, 1]).bias_norms == (0.0, 1.0)
    with pytest.raises(ValueError, match="UntrainedBlockConfig"):
        run_untrained_block({"d_model": 64})
