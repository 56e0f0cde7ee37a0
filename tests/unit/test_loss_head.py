"""The written-out loss head (``capture.engine._written_loss``) on logits with closed forms: at
zero input every logit is the bias, so the loss and ``∂L/∂x = (p − y) W_Uᵀ`` are known."""

import math

import pytest
import torch

from tangentlens.capture import engine


class _Head:
    """The two things the written-out head reads of a model: its unembedding and logits."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        self.weight, self.bias = weight, bias

    def unembedding(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.weight, self.bias

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight)


def _head(d: int, vocab: int, bias: torch.Tensor) -> _Head:
    weight = torch.randn(d, vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return _Head(weight, bias)


def test_uniform_logits_give_log_vocab_per_row_and_the_mean_direction_minus_the_target():
    """Null: equal logits carry no preference — loss n·log V, ∂L/∂x = mean_v W_v − W_target."""
    d, vocab, n = 6, 11, 5
    head = _head(d, vocab, torch.zeros(vocab, dtype=torch.float64))
    targets = torch.tensor([0, 3, 3, 10, 7])
    loss, grad = engine._written_loss(head, torch.zeros(n, d, dtype=torch.float64), targets)
    assert float(loss) == pytest.approx(n * math.log(vocab), rel=1e-12)
    expected = head.weight.mean(dim=1)[None, :] - head.weight[:, targets].T
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


def test_a_planted_target_margin_gives_the_closed_form_loss_and_gradient():
    """Planted: the target's logit c above the others' (0) — loss log(e^c + V − 1) − c per row,
    target probability e^c / (e^c + V − 1); the loss falls as c grows (its sign)."""
    d, vocab, target, c = 4, 9, 2, 3.0
    bias = torch.zeros(vocab, dtype=torch.float64)
    bias[target] = c
    head = _head(d, vocab, bias)
    targets = torch.full((3,), target)
    loss, grad = engine._written_loss(head, torch.zeros(3, d, dtype=torch.float64), targets)
    per_row = math.log(math.exp(c) + vocab - 1) - c
    assert float(loss) == pytest.approx(3 * per_row, rel=1e-12)
    p = torch.full((vocab,), 1 / (math.exp(c) + vocab - 1), dtype=torch.float64)
    p[target] = math.exp(c) / (math.exp(c) + vocab - 1)
    y = torch.zeros(vocab, dtype=torch.float64)
    y[target] = 1
    expected = ((p - y) @ head.weight.T).expand(3, d)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    bias[target] = c + 1
    assert float(
        engine._written_loss(head, torch.zeros(3, d, dtype=torch.float64), targets)[0]
    ) < float(loss)
