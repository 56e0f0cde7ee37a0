"""Memory arithmetic of a capture, without torch: what the sweep's memory plan reads.

* :data:`LOSS_CHUNK_BYTES` / :func:`loss_chunk_rows` — the loss head (unembedding and
  cross-entropy) runs on at most this many bytes of float32 logits at a time;
* :func:`statistics_bytes` — the bytes of the float64 / int64 accumulators one
  :class:`~tangentlens.capture.SiteStatistics` keeps on the model's device.
"""

from __future__ import annotations

from tangentlens.checks import check_count

__all__ = ["LOSS_CHUNK_BYTES", "loss_chunk_rows", "statistics_bytes"]

#: Float32 logits of one loss chunk (256 MiB); the cross-entropy's softmax and the logits'
#: gradient add about as much again each.
LOSS_CHUNK_BYTES = 2**28

_WORD = 8  # float64 and int64


def loss_chunk_rows(d_vocab: int) -> int:
    """Positions per loss chunk: as many rows of ``d_vocab`` float32 logits as fit in
    :data:`LOSS_CHUNK_BYTES` (at least 1)."""
    check_count(d_vocab, "d_vocab", minimum=1)
    return max(1, LOSS_CHUNK_BYTES // (4 * d_vocab))


def _moment_bytes(d: int, second_moment: bool) -> int:
    """A ``MomentAccumulator``: ``sum`` and ``sum_unit`` (d,), three scalars, ``d × d``."""
    return _WORD * (2 * d + 3 + (d * d if second_moment else 0))


def statistics_bytes(
    d: int,
    *,
    gradients: bool,
    n_bins: int,
    bin_moments: bool,
    n_types: int = 0,
    vocab_size: int = 0,
) -> int:
    """Exact bytes of the float64 / int64 buffers of one ``SiteStatistics`` of width ``d``
    (allocates nothing).

    Counts the overall moments of ``H`` (and ``G`` with ``gradients``), one first-moment
    accumulator of ``H`` per frequency bin, one of ``G`` per bin (with its ``d × d`` moment when
    ``bin_moments``), and ``TypeSums`` over ``n_types`` tracked types of a ``vocab_size``
    vocabulary (``vocab_size`` 0: no per-type sums). Not counted: the row reservoir (fixed, on
    the CPU) and per-sequence energy sums (their projectors, ``3M × d²`` float64).
    """
    check_count(d, "d", minimum=1)
    check_count(n_bins, "n_bins", minimum=0)
    check_count(n_types, "n_types", minimum=0)
    check_count(vocab_size, "vocab_size", minimum=0)
    if n_types > vocab_size:
        raise ValueError(
            f"n_types ({n_types}) tracked types need a vocabulary at least as large, got "
            f"vocab_size={vocab_size} (0 = no per-type sums)"
        )
    total = _moment_bytes(d, True) + n_bins * _moment_bytes(d, False)
    if gradients:
        total += _moment_bytes(d, True) + n_bins * _moment_bytes(d, bin_moments)
    if vocab_size:  # ids, count, Σ‖h‖² and Σh per type; the vocabulary's index map
        total += _WORD * (n_types * (3 + d) + vocab_size)
    return total
