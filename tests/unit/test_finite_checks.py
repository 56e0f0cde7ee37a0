"""``finite_flags``: the sum-first finiteness check agrees with an element-wise ``isfinite`` on
NaN, ±inf, sums that overflow while every value is finite, and low-precision dtypes."""

from __future__ import annotations

import pytest
import torch

from tangentlens.checks import CHUNK_ROWS, check_matrix, finite_flags


def _reference(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_flags_match_elementwise_isfinite(dtype: torch.dtype) -> None:
    big = torch.finfo(dtype).max
    tensors = [
        torch.randn(5, 7, dtype=dtype),
        torch.tensor([1.0, float("nan"), 2.0], dtype=dtype),
        torch.tensor([float("inf"), 0.0], dtype=dtype),
        torch.tensor([float("-inf"), float("inf")], dtype=dtype),  # the sum is NaN
        torch.full((4, 3), big, dtype=dtype),  # every value finite, the plain sum overflows
        torch.tensor([big, -big, big], dtype=dtype),
        torch.empty(0, 3, dtype=dtype),
        torch.tensor(float("nan"), dtype=dtype),  # 0-d
    ]
    assert finite_flags(tensors) == [_reference(t) for t in tensors]
    assert finite_flags(tensors) == [True, False, False, False, True, True, True, False]


def test_one_bad_value_past_the_first_chunk_is_found() -> None:
    x = torch.full((CHUNK_ROWS + 3, 2), torch.finfo(torch.float32).max)  # the sum overflows
    assert finite_flags([x]) == [True]
    x[CHUNK_ROWS + 1, 1] = float("inf")
    assert finite_flags([x]) == [False]
    with pytest.raises(ValueError, match="H contains NaN or inf"):
        check_matrix(x, "H")


def test_integer_tensors_and_no_tensors() -> None:
    assert finite_flags([torch.arange(6)]) == [True]
    assert finite_flags([]) == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_non_finite_activations_name_the_site_and_a_half_precision_dtype(dtype) -> None:
    """A capture's non-finite activations name the site and step and, in float16 / bfloat16
    (whose range a model overflows easily), the dtype as a likely cause."""
    from tangentlens.capture.engine import _finite_or_raise

    tensor = torch.tensor([[1.0, float("inf")]], dtype=dtype)
    with pytest.raises(ValueError) as error:
        _finite_or_raise({"blocks.2.hook_resid_post": tensor}, [float("inf")], "activations", 40)
    message = str(error.value)
    assert (
        "non-finite activations (NaN or inf) at site 'blocks.2.hook_resid_post' at step 40"
        in message
    )
    half = f"the model runs in {str(dtype)[6:]}, whose range overflows easily: a likely cause"
    assert (half in message) == (dtype != torch.float32), message
