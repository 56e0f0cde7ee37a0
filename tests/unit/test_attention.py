"""Attention entropy and query/key drift against numpy loops and closed forms."""

import math

import numpy as np
import pytest
import torch

from tangentlens.metrics import (
    attention_entropy,
    attention_entropy_sums,
    pattern_entropy_sums,
    qk_drift,
    qk_drift_from_means,
)


def _random_pattern(rng: np.random.Generator, batch=3, heads=4, n=7) -> np.ndarray:
    logits = rng.normal(size=(batch, heads, n, n)) * 2
    logits = logits + np.triu(np.full((n, n), -np.inf), k=1)  # causal
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_entropy_matches_numpy_loop_with_query_mask():
    rng = np.random.default_rng(0)
    p = _random_pattern(rng)
    mask = rng.random((3, 7)) < 0.6
    expected = np.zeros(4)
    for b in range(3):
        for h in range(4):
            for i in range(7):
                if mask[b, i]:
                    row = p[b, h, i][p[b, h, i] > 0]
                    expected[h] -= (row * np.log(row)).sum()
    got, n = attention_entropy_sums(p, torch.from_numpy(mask))
    assert n == mask.sum()
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    trusted, n_trusted = pattern_entropy_sums(torch.from_numpy(p), torch.from_numpy(mask))
    assert n_trusted == n and torch.equal(trusted, got)  # the capture's unvalidated path
    np.testing.assert_allclose(
        attention_entropy(p, torch.from_numpy(mask)).numpy(), expected / mask.sum(), rtol=1e-12
    )


def test_entropy_known_answers():
    uniform = torch.full((2, 3, 5, 8), 1 / 8)
    np.testing.assert_allclose(attention_entropy(uniform).numpy(), math.log(8), rtol=1e-12)
    one_hot = torch.zeros(1, 2, 4, 4)
    one_hot[..., 0] = 1
    assert attention_entropy(one_hot).abs().max() == 0
    # causal uniform attention: row i spreads over i + 1 keys
    causal = torch.tril(torch.ones(6, 6, dtype=torch.float64))
    causal = (causal / causal.sum(dim=1, keepdim=True))[None, None]
    expected = sum(math.log(i + 1) for i in range(6)) / 6
    assert attention_entropy(causal).item() == pytest.approx(expected, rel=1e-12)


def test_qk_drift_against_closed_form():
    rng = np.random.default_rng(1)
    n, heads, d_head = 4000, 3, 16
    direction = rng.normal(size=(heads, d_head))
    signs = np.array([1.0, -1.0, 1.0])[:, None]
    q = rng.normal(size=(n, heads, d_head)) * 0.1 + 3 * direction
    k = rng.normal(size=(n, heads, d_head)) * 0.1 + 2 * signs * direction
    drift = qk_drift(q, k)
    mq, mk = q.mean(axis=0), k.mean(axis=0)
    np.testing.assert_allclose(drift.query_norm.numpy(), np.linalg.norm(mq, axis=1), rtol=1e-12)
    np.testing.assert_allclose(drift.key_norm.numpy(), np.linalg.norm(mk, axis=1), rtol=1e-12)
    dots = (mq * mk).sum(axis=1)
    np.testing.assert_allclose(drift.mean_logit.numpy(), dots / 4.0, rtol=1e-12)
    # planted parallel drift with a head-dependent sign
    np.testing.assert_allclose(drift.cosine.numpy(), signs[:, 0], atol=1e-3)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="4-D"):
        attention_entropy(torch.ones(3, 3))
    with pytest.raises(ValueError, match="sum to 1"):
        attention_entropy(torch.ones(1, 1, 2, 2))
    with pytest.raises(ValueError, match="NaN"):
        attention_entropy(torch.full((1, 1, 1, 1), float("nan")))
    with pytest.raises(ValueError, match="query_mask"):
        attention_entropy(torch.ones(1, 1, 2, 1), torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="keeps no query"):
        attention_entropy(torch.ones(1, 1, 2, 1), torch.zeros(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="zero mean"):
        qk_drift_from_means(torch.zeros(2, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match="head, d_head"):
        qk_drift_from_means(torch.ones(2, 4), torch.ones(2, 5))
