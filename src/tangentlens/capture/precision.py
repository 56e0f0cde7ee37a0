"""The precision of the capture's statistics (``capture.precision``) and its stated bound.

* ``"float64"`` (the default): every sum in float64, as METHODS.md asks;
* ``"float32"``: the d × d second moments of activations and gradients — overall and per
  frequency bin — are built from float32 Gram matrices of each batch's rows **shifted by a frozen
  mean** (the mean of the first rows an accumulator sees), added into float64 with the shift's
  exact float64 terms, ``Σ x xᵀ = Σ y yᵀ + c Σyᵀ + Σy cᵀ + n c cᵀ`` (``y = x − c``); the
  attention entropy's ``−Σⱼ a log a`` runs over each pattern row in float32, the rows' sums in
  float64. First moments, norms, per-type sums, the per-sequence energy sums (smaller: each
  row's coordinates in the proxies) and every eigen-decomposition stay float64. Plain float32
  sums of rows with a large mean lose the lower spectrum (METHODS.md §1.3); shifted Grams keep
  it;
* ``"auto"``: float64 on the CPU and on GPUs with full-rate float64 (compute capability in
  :data:`FULL_RATE_FLOAT64`: P100, V100, A100, H100/H200, B100/B200), float32 elsewhere
  (consumer and workstation GPUs run float64 at 1/32–1/64 of float32).

The bound (``float32``): a batch of ``n_b`` rows, shifted in float64 and rounded to float32
(relative error ≤ u = 2⁻²⁴ each), then multiplied in float32 in any summation order, has every
entry of its Gram within ``(n_b + 2)·u·(1 + n_b·u)²`` of ``|Y|ᵀ|Y|`` (the standard bound for
inner products, γ_{n_b} = n_b·u/(1 − n_b·u), and the two roundings of the operands). Summed over
batches, and since ``‖Σ|y||y|ᵀ‖₂ ≤ Σ‖y‖²``, the accumulated second moment ``M`` is within
``ε = bound(n_b) · Σᵢ‖xᵢ − c‖²`` of float64's in spectral norm (:func:`gram_error_bound`), so:
every eigenvalue of ``M`` and of the scatter ``M − s sᵀ/n`` moves by at most ``ε`` (Weyl); an
energy fraction ``tr(QᵀMQ)/tr M`` (rank k) by at most ``(k + 1)·ε / (tr M − ε)``; a ratio of two
fractions by the sum of their relative bounds. ``n_b`` is the batch's kept rows (at most
``data.batch_size × data.seq_len``): the manifest records the bound per unit of
``Σ‖x − c‖²`` (:func:`relative_bound`). It is a worst case; typical errors are ~√n_b smaller.
"""

from __future__ import annotations

from typing import Any

from tangentlens.checks import check_choice

__all__ = [
    "FULL_RATE_FLOAT64",
    "PRECISIONS",
    "UNIT_ROUNDOFF",
    "check_precision",
    "gram_error_bound",
    "relative_bound",
    "resolve_precision",
]

#: ``capture.precision`` choices.
PRECISIONS: tuple[str, ...] = ("float64", "float32", "auto")
#: float32's unit roundoff u = 2⁻²⁴.
UNIT_ROUNDOFF = 2.0**-24
#: CUDA compute capabilities whose float64 runs at half the float32 rate or better: P100 (6.0),
#: V100 (7.0), A100 (8.0), H100/H200 (9.0), B100/B200 (10.0). Every other (consumer,
#: workstation, embedded, the B300's 10.3) runs float64 at 1/32–1/64 of float32.
FULL_RATE_FLOAT64: frozenset[tuple[int, int]] = frozenset({(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)})


def check_precision(value: object, name: str = "capture.precision") -> str:
    """``value`` when it is one of :data:`PRECISIONS`, else a ``ValueError`` naming them."""
    return check_choice(value, name, PRECISIONS)


def resolve_precision(setting: str, device: Any) -> str:
    """``"float64"`` or ``"float32"``: ``setting`` itself, or for ``"auto"`` float64 on the
    CPU (and any non-CUDA device) and on CUDA devices of :data:`FULL_RATE_FLOAT64`, float32 on
    other CUDA devices."""
    check_precision(setting)
    if setting != "auto":
        return setting
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return "float64"
    capability = torch.cuda.get_device_capability(device)
    return "float64" if tuple(capability) in FULL_RATE_FLOAT64 else "float32"


def relative_bound(batch_rows: int) -> float:
    """The float32 Gram's bound per unit of ``Σ‖x − c‖²`` for batches of at most
    ``batch_rows`` rows: ``(n_b + 2)·u·(1 + n_b·u)²`` (see the module docstring)."""
    n = int(batch_rows)
    if n < 1 or n * UNIT_ROUNDOFF >= 1:
        raise ValueError(f"batch_rows must be in [1, 2²⁴), got {batch_rows!r}")
    return (n + 2) * UNIT_ROUNDOFF * (1 + n * UNIT_ROUNDOFF) ** 2 / (1 - n * UNIT_ROUNDOFF)


def gram_error_bound(batch_rows: int, shifted_sq_norms: float) -> float:
    """``ε``: how far (spectral norm) float32 accumulation may move a second moment built from
    batches of at most ``batch_rows`` rows whose shifted rows' squared norms sum to
    ``shifted_sq_norms`` (``Σ‖xᵢ − c‖²``)."""
    return relative_bound(batch_rows) * float(shifted_sq_norms)
