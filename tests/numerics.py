"""What a test's tolerance rests on when it compares two numeric paths (issue 40).

A tolerance measured on one machine is not a bound: another CPU runs other kernels (vector
widths, BLAS blocking, fused multiply-adds, thread counts), so float32 results move in their
last bits, and anything that amplifies those bits (an iterative fit's stopping point, a
nearest-neighbour near-tie) moves by more. Every comparison of two paths rests on one of:

* **the same arithmetic** on both sides (the same loop, library and summation order): equal,
  or equal up to float64 sums taken in another order;
* **a bound**: Higham's ``γ_n`` (:func:`gamma`) for float32 sums and products, a perturbation
  bound for what is computed from them, a binomial or normal standard error for a Monte-Carlo
  proportion;
* **float64 on both sides** (:func:`assert_float64_parity`): two implementations of one
  function, run in float64, differ by float64 rounding in another operation order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

#: Unit roundoff (round to nearest) of float32 and float64: 2⁻²⁴ ≈ 6.0e-8, 2⁻⁵³ ≈ 1.1e-16.
U32, U64 = 2.0**-24, 2.0**-53

#: Two float64 computations of one network (another library's modules, another attention
#: kernel, another summation order) agree to float64 rounding: each product of n terms within
#: ``γ_n |W||x| ≈ n · 1.1e-16`` of its scale (n ≤ 1536 in these tests: ≤ 1.7e-13), carried
#: through at most a few layers whose LayerNorms and softmaxes are well conditioned at these
#: random or trained micro weights — about 1e-12 of the tensor's scale at worst. 1e-9 leaves
#: three orders of magnitude and is still 10⁴ × below float32's own rounding (6e-8), so a path
#: that silently computes in float32 fails it.
FLOAT64_PARITY = 1e-9


def gamma(n: int, u: float = U32) -> float:
    """Higham's ``γ_n = n·u / (1 − n·u)`` (Accuracy and Stability of Numerical Algorithms,
    §3.1): a dot product of ``n`` terms computed in floating point, in any order, with or
    without fused multiply-adds, satisfies ``|fl(xᵀy) − xᵀy| ≤ γ_n |x|ᵀ|y|`` — so does every
    entry of a matrix product, whatever the BLAS, its blocking and the CPU."""
    if n * u >= 1:
        raise ValueError(f"γ_n is defined for n·u < 1, got n = {n}")
    return n * u / (1 - n * u)


def assert_float64_parity(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """``actual`` equals ``expected`` (both float64) to :data:`FLOAT64_PARITY` of the tensor's
    scale (its largest magnitude): rounding in a network is relative to the scale of what it
    sums, not to each entry, so an entry near zero carries the same absolute error."""
    assert actual.dtype == expected.dtype == torch.float64, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = float(expected.detach().abs().max())
    error = float((actual.detach() - expected.detach()).abs().max())
    assert error <= FLOAT64_PARITY * scale, f"{what}: |Δ| {error:.3g} > 1e-9 × scale {scale:.3g}"


def share_rotary_tables(hooked: torch.nn.Module, rotary_emb: torch.nn.Module, n: int) -> None:
    """Give a float64 TransformerLens model the rotary tables of a Hugging Face model, after
    checking that its own are those tables up to their float32 rounding.

    Hugging Face computes rotary tables in float32 whatever the model's dtype (``inv_freq`` and
    the angles ``θ = p·f`` in float32, then cos and sin), TransformerLens in the model's dtype:
    in float64 the two differ by float32 rounding of the tables, not by the float64 rounding
    :func:`assert_float64_parity` allows. That rounding is bounded: ``f`` carries at most 4u
    (a division, a power within one ulp, a reciprocal), ``θ`` 5u·θ with its product, and cos
    and sin within one ulp (2u) of the rounded angle, so each entry lies within
    ``(5θ + 2)·u ≤ (5(n − 1) + 2)·u`` (f ≤ 1, positions p < n) of the exact value — a wrong
    base, rotary width or pairing moves entries by O(1). The rest of the two models is then
    compared in float64."""
    positions = torch.arange(n)[None]
    cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float64), positions)
    bound = (5 * (n - 1) + 2) * U32
    for block in hooked.blocks:
        attn = block.attn
        width = attn.rotary_cos.shape[1]
        for ours, theirs in ((attn.rotary_cos, cos), (attn.rotary_sin, sin)):
            theirs = theirs[0, :, :width].to(ours.dtype)
            assert float((ours[:n] - theirs).abs().max()) <= bound
            ours[:n] = theirs


#: Hugging Face RMSNorms that compute in float32 whatever their input's dtype (``x.to(float32)``,
#: meant to widen half precision, narrows float64).
_FLOAT32_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "EuroBertRMSNorm")


def _rms_norm_in_its_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``LlamaRMSNorm.forward`` without the casts to float32 and back."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@contextlib.contextmanager
def hugging_face_in_float64(*models: torch.nn.Module) -> Iterator[None]:
    """Run the Hugging Face modules of ``models`` in float64 throughout.

    A Hugging Face model loaded in float64 still computes parts in float32: eager attention's
    softmax (``softmax(..., dtype=torch.float32)``) and the RMSNorms of Llama-like models (cast
    to float32 and back) — upcasts meant for half precision that narrow float64 — so it sits
    float32's rounding (~1e-8 here) away from a true float64 evaluation. Inside this block such
    a softmax keeps float64 and those RMSNorms compute Hugging Face's formula in their input's
    dtype; each replaced forward is first checked to give Hugging Face's own output in float32,
    bit for bit. (Rotary tables are float32 too: :func:`share_rotary_tables`.)"""
    softmax = torch.nn.functional.softmax

    def softmax_keeping_float64(input, dim=None, _stacklevel=3, dtype=None):
        if dtype == torch.float32 and input.dtype == torch.float64:
            dtype = None
        return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    norms = {
        type(m): m
        for model in models
        for m in model.modules()
        if type(m).__name__ in _FLOAT32_RMS_NORMS
    }
    with pytest.MonkeyPatch.context() as patch:
        for cls, module in norms.items():
            x = torch.randn(3, module.weight.shape[0], generator=torch.Generator().manual_seed(0))
            weight = module.weight
            try:
                module.weight = torch.nn.Parameter(weight.detach().float())
                with torch.no_grad():
                    assert torch.equal(_rms_norm_in_its_dtype(module, x), cls.forward(module, x))
            finally:
                module.weight = weight
            patch.setattr(cls, "forward", _rms_norm_in_its_dtype)
        patch.setattr(torch.nn.functional, "softmax", softmax_keeping_float64)
        yield


def assert_reordered_sums(
    actual: torch.Tensor, expected: torch.Tensor, magnitudes: torch.Tensor, n: int, what: str = ""
) -> None:
    """``actual`` and ``expected`` are float64 computations of the same sums of at most ``n``
    terms each (entry by entry), in other orders — another library, batching, merge or vector
    width: each lies within ``γ_n · Σ|terms|`` of the exact sum (Higham), so they lie within
    ``2γ_n · Σ|terms|`` of each other. ``magnitudes``: ``Σ|terms|`` per entry (float64), with
    ``n`` counting every rounding a term carries before it is summed."""
    bound = 2 * gamma(n, U64) * magnitudes.double()
    error = (actual.double() - expected.double()).abs()
    assert bool((error <= bound).all()), f"{what}: |Δ| {float((error - bound).max()):.3g} over"
