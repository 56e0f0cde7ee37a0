"""``group_grams``: the Gram matrix of each group of consecutive rows, batched by size class."""

import torch

from tangentlens.capture.sequence_energy import group_grams
from tests.numerics import assert_reordered_sums


def test_each_group_gram_equals_its_own_product():
    """Groups of 1, 2, 3, 5, 16, 17 and 100 rows (every size class, a size just over a power of
    two): each Gram matrix equals ``XᵢᵀXᵢ`` of its rows alone, none of its neighbours' rows."""
    gen = torch.Generator().manual_seed(0)
    sizes = torch.tensor([3, 1, 100, 2, 17, 5, 16, 1])
    x = torch.randn(int(sizes.sum()), 7, generator=gen, dtype=torch.float64)
    got = group_grams(x, sizes)
    assert got.shape == (8, 7, 7)
    for i, part in enumerate(torch.split(x, sizes.tolist())):  # the same sums, other orders
        magnitudes = part.abs().T @ part.abs()
        assert_reordered_sums(got[i], part.T @ part, magnitudes, len(part), f"group {i}")
    # the whole stream's Gram matrix is their sum (at most 100 + 8 roundings per term)
    assert_reordered_sums(got.sum(0), x.T @ x, x.abs().T @ x.abs(), len(x) + 8, "whole")


def test_a_single_row_group_is_its_outer_product():
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    got = group_grams(x, torch.tensor([1, 1]))
    assert torch.equal(got[0], torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64))
    assert torch.equal(got[1], torch.tensor([[9.0, -3.0], [-3.0, 1.0]], dtype=torch.float64))
