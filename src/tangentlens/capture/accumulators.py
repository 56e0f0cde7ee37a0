"""Streaming float64 statistics of captured rows: memory does not grow with the number of tokens.
Accumulators live on any device: the capture accumulates on the model's, and the statistics stay
there for the probes (``to`` moves them); ids and token-type indices, the bookkeeping, live on
the CPU.

* :class:`MomentAccumulator` — moments of a stream of rows ``x`` (d,): count, ``Σx``, ``Σ‖x‖``,
  ``Σ‖x‖²``, ``Σ x/‖x‖`` (over nonzero rows) and optionally ``Σ x xᵀ`` (d × d).
* :class:`TypeSums` — per tracked token type: count, ``Σh`` and ``Σ‖h‖²`` (centroids and
  spreads).
* :class:`SiteStatistics` — everything one hook site accumulates: moments of ``H`` and ``G``
  overall and per frequency bin, optional per-type sums, an optional row reservoir and optional
  per-sequence gradient energy sums (:class:`~tangentlens.capture.sequence_energy.SequenceEnergy`).
  :func:`~tangentlens.capture.chunks.statistics_bytes` gives its size without allocating it.
* :class:`AttentionStatistics` — per-head sums of one attention layer: queries, keys and the
  attention entropy of the kept positions.

Every accumulator merges: statistics of two disjoint halves of a stream merge to those of the
whole (exactly, up to float64 summation order).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from tangentlens.capture.batch_rows import BatchRows
from tangentlens.capture.reservoir import Offer, RowReservoir
from tangentlens.capture.sequence_energy import SequenceEnergy, SequenceEnergyConfig
from tangentlens.capture.transfer import upload_many
from tangentlens.checks import check_choice, check_count
from tangentlens.metrics.attention import QKDrift, pattern_entropy_sums, qk_drift_from_means
from tangentlens.typing import TokenMask

__all__ = [
    "ATTENTION_KINDS",
    "AttentionStatistics",
    "MomentAccumulator",
    "SiteStatistics",
    "StatisticsConfig",
    "TypeSums",
]

Rows = Float[torch.Tensor, "n d"]
TokenIds = Int[torch.Tensor, " n"]


def _moved(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; a GPU → CPU copy goes through pinned memory (several times faster
    than a pageable copy for the d × d moments)."""
    if t.is_cuda and torch.device(device).type == "cpu":
        pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        pinned.copy_(t)
        return pinned
    return t.to(device)


def _check_rows(x: torch.Tensor, d: int, name: str) -> None:
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"{name} must be (n, {d}), got shape {tuple(x.shape)}")


#: The tensors of a :class:`MomentAccumulator` (besides the integer ``count``).
_MOMENT_FIELDS = ("_n_nonzero", "sum", "sum_unit", "sum_norms", "sum_sq_norms", "second_moment")


#: The precisions a capture's statistics accumulate in (``capture.precision`` resolved:
#: :mod:`tangentlens.capture.precision`).
RESOLVED_PRECISIONS: tuple[str, ...] = ("float64", "float32")


class MomentAccumulator:
    """Streaming moments of rows of width ``d`` in float64 (on ``device``).

    Attributes: ``count`` rows, ``sum`` (d,), ``sum_norms`` / ``sum_sq_norms`` (floats),
    ``sum_unit`` (d,) and ``n_nonzero`` (rows with a direction), ``second_moment`` (d, d) or None.
    ``precision="float32"``: each batch's ``Σ x xᵀ`` is a float32 Gram matrix of the rows
    shifted by ``shift`` (the mean of the first rows seen, then frozen), added into the float64
    ``second_moment`` with the shift's float64 terms (:meth:`batch_gram`;
    :mod:`tangentlens.capture.precision` states the bound).
    """

    def __init__(
        self,
        d: int,
        *,
        second_moment: bool = True,
        device: torch.device | str = "cpu",
        precision: str = "float64",
    ) -> None:
        check_count(d, "d", minimum=1)
        f64 = {"dtype": torch.float64, "device": device}
        self.d = d
        self.precision = check_choice(precision, "precision", RESOLVED_PRECISIONS)
        self.shift: Float[torch.Tensor, " d"] | None = None
        self.count = 0
        self._n_nonzero = torch.zeros((), dtype=torch.int64, device=device)
        self.sum = torch.zeros(d, **f64)
        self.sum_unit = torch.zeros(d, **f64)
        self.sum_norms = torch.zeros((), **f64)
        self.sum_sq_norms = torch.zeros((), **f64)
        self.second_moment = torch.zeros(d, d, **f64) if second_moment else None

    def update(self, x: Rows, gram: Float[torch.Tensor, "d d"] | None = None) -> None:
        """Add rows ``x`` (n, d) of any float dtype; converted to float64 on this device.

        ``gram``: ``xᵀx`` in float64 when the caller already has it (saves the GEMM).
        """
        _check_rows(x, self.d, "rows")
        x = x.detach().to(self.sum.device, torch.float64)
        norms = torch.linalg.vector_norm(x, dim=1)
        nonzero = norms > 0
        self.count += x.shape[0]
        self._n_nonzero += nonzero.sum()  # stays on the device: no host sync per update
        self.sum += x.sum(dim=0)
        self.sum_norms += norms.sum()
        self.sum_sq_norms += (norms * norms).sum()
        self.sum_unit += torch.where(nonzero, norms, 1.0).reciprocal().mul(nonzero) @ x
        if self.second_moment is not None:
            if gram is not None:
                self.second_moment += gram
            elif self.precision == "float64":
                self.second_moment.addmm_(x.T, x)
            else:
                self.second_moment += self.batch_gram(x)

    def batch_gram(self, x: Float[torch.Tensor, "n d"]) -> Float[torch.Tensor, "d d"]:
        """``Σ x xᵀ`` of float64 rows ``x`` (n, d) at this accumulator's precision: the float64
        product, or (float32) ``Yᵀ Y + c sᵀ + s cᵀ + n c cᵀ`` with ``Y`` the rows shifted by
        the frozen ``c`` (:attr:`shift`, set from the first rows seen) in float32 and ``s = Σ
        (x − c)`` in float64."""
        if self.precision == "float64":
            return x.T @ x
        if self.shift is None and x.shape[0]:
            self.shift = x.mean(dim=0)
        if self.shift is None:
            return x.new_zeros(self.d, self.d)
        y = x - self.shift
        y32 = y.to(torch.float32)
        total = y.sum(dim=0)
        cross = torch.outer(self.shift, total)
        return (
            (y32.T @ y32).to(torch.float64)
            + cross
            + cross.T
            + x.shape[0] * torch.outer(self.shift, self.shift)
        )

    @property
    def n_nonzero(self) -> int:
        """Rows with a direction (nonzero norm): the ``n`` of ``sum_unit``."""
        return int(self._n_nonzero)

    def to(self, device: torch.device | str) -> MomentAccumulator:
        """Move every sum to ``device`` (in place); returns self."""
        for name in (*_MOMENT_FIELDS, "shift"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, _moved(value, device))
        return self

    def state_dict(self) -> dict[str, torch.Tensor | int | None]:
        """Every sum (on the CPU) and the count: what :meth:`from_state_dict` restores."""
        state: dict[str, torch.Tensor | int | None] = {"count": self.count}
        for name in _MOMENT_FIELDS:
            value = getattr(self, name)
            state[name] = None if value is None else value.detach().cpu()
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor | int | None]) -> MomentAccumulator:
        """An accumulator holding exactly the saved sums (on the CPU)."""
        total = state.get("sum")
        if not isinstance(total, torch.Tensor):
            raise ValueError("a saved moment state needs its 'sum' tensor (from state_dict)")
        out = cls(total.shape[0], second_moment=state["second_moment"] is not None)
        out.count = int(state["count"])  # type: ignore[arg-type]
        for name in _MOMENT_FIELDS:
            setattr(out, name, state[name])
        return out

    def merge(self, other: MomentAccumulator) -> None:
        """Add ``other``'s statistics (same ``d`` and the same second-moment setting)."""
        if other.d != self.d or (other.second_moment is None) != (self.second_moment is None):
            raise ValueError("accumulators merge only with equal d and second-moment setting")
        if other.precision != self.precision:
            raise ValueError(
                f"accumulators merge only at one precision, got {self.precision} and "
                f"{other.precision}"
            )
        self.count += other.count
        self._n_nonzero += other._n_nonzero.to(self._n_nonzero.device)
        self.sum += other.sum
        self.sum_unit += other.sum_unit
        self.sum_norms += other.sum_norms
        self.sum_sq_norms += other.sum_sq_norms
        if self.second_moment is not None and other.second_moment is not None:
            self.second_moment += other.second_moment

    @property
    def mean(self) -> Float[torch.Tensor, " d"]:
        if self.count == 0:
            raise ValueError("no rows accumulated: the mean is undefined")
        return self.sum / self.count

    def covariance(self, ddof: int = 1) -> Float[torch.Tensor, "d d"]:
        """Centred covariance ``(Σxxᵀ − Σx Σxᵀ/n) / (n − ddof)`` (needs the second moment)."""
        if self.second_moment is None:
            raise ValueError("this accumulator keeps no second moment (second_moment=False)")
        if self.count <= ddof:
            raise ValueError(f"covariance with ddof={ddof} needs more than {ddof} rows")
        scatter = self.second_moment - torch.outer(self.sum, self.sum) / self.count
        return scatter / (self.count - ddof)


class TypeSums:
    """Per tracked token type: occurrence count, ``Σh`` and ``Σ‖h‖²`` in float64.

    Args:
        type_ids: the vocabulary ids to track (n_types,), strictly increasing; rows of other
            types are skipped.
        d: row width.
        vocab_size: the vocabulary the token ids come from.

    Attributes: ``ids`` (n_types,) int64 on the CPU; ``count`` (n_types,) int64, ``sum``
    (n_types, d) and ``sum_sq_norms`` (n_types,), row ``i`` of type ``ids[i]``. Memory:
    ``n_types × (d + 3) × 8`` bytes plus an int64 index over the vocabulary (on the CPU).
    """

    def __init__(
        self,
        type_ids: Int[torch.Tensor, " n_types"] | Sequence[int],
        d: int,
        *,
        vocab_size: int,
        device: torch.device | str = "cpu",
    ) -> None:
        check_count(d, "d", minimum=1)
        check_count(vocab_size, "vocab_size", minimum=1)
        ids = torch.as_tensor(type_ids, dtype=torch.int64).cpu()
        if ids.ndim != 1 or (ids.numel() and (int(ids[0]) < 0 or int(ids[-1]) >= vocab_size)):
            raise ValueError(
                f"type_ids must be a vector of ids in [0, {vocab_size}), got shape "
                f"{tuple(ids.shape)}"
            )
        if bool((ids[1:] <= ids[:-1]).any()):
            raise ValueError("type_ids must be strictly increasing (sorted, no repeats)")
        self.ids = ids
        self.vocab_size = vocab_size
        self._row = torch.full((vocab_size,), -1, dtype=torch.int64)  # type id → row, or -1
        self._row[ids] = torch.arange(len(ids))
        # names the tracked types: type sums of equal types share a batch's located rows
        self._types = (vocab_size, hashlib.sha256(ids.numpy().tobytes()).hexdigest())
        n = len(ids)
        self.count = torch.zeros(n, dtype=torch.int64, device=device)
        self.sum = torch.zeros(n, d, dtype=torch.float64, device=device)
        self.sum_sq_norms = torch.zeros(n, dtype=torch.float64, device=device)

    def rows_of(self, type_ids: Int[torch.Tensor, " m"]) -> Int[torch.Tensor, " m"]:
        """The rows (m,) of the tracked types ``type_ids`` (m,; CPU), in their order."""
        type_ids = type_ids.cpu().long()
        if type_ids.numel() and (int(type_ids.min()) < 0 or int(type_ids.max()) >= self.vocab_size):
            raise ValueError(f"type ids must lie in [0, {self.vocab_size})")
        rows = self._row[type_ids]
        if bool((rows < 0).any()):
            untracked = type_ids[rows < 0][:5].tolist()
            raise ValueError(f"types {untracked} are not tracked by these type sums")
        return rows

    def update(self, tokens: TokenIds, x: Rows, *, batch: BatchRows | None = None) -> None:
        """Add the rows of ``x`` (n, d) whose token type ``tokens`` (n,; checked on the CPU, so
        pass CPU ids to avoid a device sync) is tracked; ``batch``: the same rows'
        :class:`~tangentlens.capture.batch_rows.BatchRows`, whose located types every site of
        the batch shares (found once)."""
        device = self.sum.device
        if batch is None:
            partial, tracked, rows = self._locate(tokens, device)
        else:
            key = ("types", self._types, device)
            partial, tracked, rows = batch.shared(key, lambda: self._locate(batch.tokens, device))
        x = x.detach()
        if partial:
            x = x[tracked.to(x.device)]
        x = x.to(device, torch.float64)
        self.count.index_add_(0, rows, torch.ones_like(rows))
        self.sum.index_add_(0, rows, x)
        self.sum_sq_norms.index_add_(0, rows, (x * x).sum(dim=1))

    def _locate(
        self, tokens: TokenIds, device: torch.device
    ) -> tuple[bool, torch.Tensor, torch.Tensor]:
        """(whether some rows are untracked, the tracked rows' positions, their type rows), the
        indices made on the host and sent to ``device`` in one copy."""
        tokens = tokens.cpu()
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        rows = self._row[tokens]
        tracked = torch.nonzero(rows >= 0).squeeze(1)
        partial = len(tracked) < len(tokens)
        if partial:
            rows = rows[tracked]
        tracked, rows = upload_many([tracked, rows], device)
        return partial, tracked, rows

    def to(self, device: torch.device | str) -> TypeSums:
        """Move the sums to ``device`` (in place; ids and the index stay on the CPU)."""
        self.count, self.sum = _moved(self.count, device), _moved(self.sum, device)
        self.sum_sq_norms = _moved(self.sum_sq_norms, device)
        return self

    def merge(self, other: TypeSums) -> None:
        """Add the sums of a disjoint part of the stream (the same tracked types and d)."""
        if other.sum.shape != self.sum.shape or other.vocab_size != self.vocab_size:
            raise ValueError("type sums merge only with equal tracked types, vocabulary and d")
        if not torch.equal(other.ids, self.ids):
            raise ValueError("type sums merge only over the same tracked type ids")
        self.count += other.count.to(self.count.device)
        self.sum += other.sum.to(self.sum.device)
        self.sum_sq_norms += other.sum_sq_norms.to(self.sum_sq_norms.device)


@dataclass(frozen=True)
class StatisticsConfig:
    """What a site accumulates besides the overall moments of ``H`` (and ``G``).

    ``n_bins``: frequency bins (0 = none): first moments of ``H`` and ``G`` per bin;
    ``gradient_bin_moments``: also keep the d × d second moment of ``G`` per bin (with
    ``gradients``; 5 matrices per site at 5 bins: 24 MB at d 768); ``type_sums``: per-type
    centroid sums of ``H`` over ``type_ids`` (strictly increasing ids; None = every type of
    ``vocab_size``, which is then required); ``reservoir_size``: rows sampled for point-based
    metrics (0 = none); ``seed``: of the reservoir's priorities; ``sequence_energy``: projectors
    per site for per-sequence energy sums of ``G`` (None = none; needs ``gradients`` and one
    slot per frequency bin plus "all"); ``precision``: ``"float64"`` or ``"float32"`` (the d × d
    second moments from float32 Grams of shifted rows, :mod:`tangentlens.capture.precision`).
    """

    gradients: bool = True
    n_bins: int = 0
    gradient_bin_moments: bool = True
    type_sums: bool = False
    vocab_size: int | None = None
    type_ids: tuple[int, ...] | None = None
    reservoir_size: int = 16384
    seed: int = 0
    sequence_energy: SequenceEnergyConfig | None = None
    precision: str = "float64"

    def __post_init__(self) -> None:
        for name in ("n_bins", "reservoir_size", "seed"):
            check_count(getattr(self, name), name, minimum=0)
        check_choice(self.precision, "precision", RESOLVED_PRECISIONS)
        if self.sequence_energy is not None:
            if not self.gradients:
                raise ValueError("sequence_energy sums gradients: it needs gradients=True")
            if self.sequence_energy.n_bins != self.n_bins:
                raise ValueError(
                    f"sequence_energy sums {self.sequence_energy.n_bins} bins; the statistics "
                    f"keep {self.n_bins}: build it with n_bins = {self.n_bins}"
                )
        if self.type_sums and (not isinstance(self.vocab_size, int) or self.vocab_size < 1):
            raise ValueError(
                f"type_sums needs vocab_size as an integer ≥ 1, got {self.vocab_size!r}"
            )
        if self.type_ids is not None:
            if not self.type_sums:
                raise ValueError("type_ids name the types of type_sums: set type_sums=True")
            ids = tuple(self.type_ids)
            if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
                raise ValueError("type_ids must be integers")
            if any(b <= a for a, b in itertools.pairwise(ids)) or (
                ids and not 0 <= ids[0] <= ids[-1] < self.vocab_size  # type: ignore[operator]
            ):
                raise ValueError(
                    f"type_ids must be strictly increasing ids in [0, {self.vocab_size})"
                )
            object.__setattr__(self, "type_ids", ids)


def _update_binned(
    overall: MomentAccumulator, per_bin: list[MomentAccumulator], x: Rows, edges: list[int]
) -> None:
    """Fold rows ``x`` sorted by bin (bin ``b`` = ``x[edges[b]:edges[b+1]]``, rows before
    ``edges[0]`` have none) into ``per_bin`` and ``overall``; the overall second moment is the sum
    of the bins' Gram matrices, so the d × d products are computed once."""
    slices = [x[lo:hi] for lo, hi in itertools.pairwise(edges)]
    if per_bin[0].second_moment is None:
        overall.update(x)
        for acc, rows in zip(per_bin, slices, strict=True):
            acc.update(rows)
        return
    grams = [acc.batch_gram(rows) for acc, rows in zip(per_bin, slices, strict=True)]
    total = overall.batch_gram(x[: edges[0]])
    for gram in grams:
        total += gram
    overall.update(x, gram=total)
    for acc, rows, gram in zip(per_bin, slices, grams, strict=True):
        acc.update(rows, gram=gram)


def _bin_order(bins: TokenIds, n_bins: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """The rows' order by bin (stable, sorted on the host; on ``device``) and each bin's first
    position in it (``n_bins + 1`` edges)."""
    sorted_bins, order = torch.sort(bins.cpu(), stable=True)
    edges = torch.searchsorted(sorted_bins, torch.arange(n_bins + 1)).tolist()
    return upload_many([order], device)[0], edges


class SiteStatistics:
    """Statistics of one hook site of width ``d``.

    ``h`` / ``g``: overall :class:`MomentAccumulator` of activations / gradients with their
    d × d second moments (``g`` is None without gradients); ``h_bins`` / ``g_bins``: one per
    frequency bin, first moments only (``g_bins`` with d × d moments when
    ``config.gradient_bin_moments``); ``types``: per-type sums of ``H`` (the tracked types) or
    None; ``reservoir``: a :class:`RowReservoir` with columns ``H``, ``G`` (float32), ``token``
    and ``bin`` (int64), or None; ``sequence_energy``: per-sequence energy sums of
    ``G``, kept when ``config.sequence_energy`` has projectors for ``site``, else None.
    """

    def __init__(
        self,
        d: int,
        config: StatisticsConfig,
        device: torch.device | str = "cpu",
        *,
        site: str | None = None,
    ) -> None:
        self.d = d
        self.config = config
        grads = config.gradients
        g_moments = config.gradient_bin_moments
        at = {"device": device, "precision": config.precision}
        self.h = MomentAccumulator(d, **at)
        self.g = MomentAccumulator(d, **at) if grads else None
        self.h_bins = [
            MomentAccumulator(d, second_moment=False, **at) for _ in range(config.n_bins)
        ]
        self.g_bins = (
            [MomentAccumulator(d, second_moment=g_moments, **at) for _ in range(config.n_bins)]
            if grads
            else []
        )
        self.types: TypeSums | None = None
        if config.type_sums:
            vocab = config.vocab_size
            ids = range(vocab) if config.type_ids is None else config.type_ids  # type: ignore[arg-type]
            self.types = TypeSums(ids, d, vocab_size=vocab, device=device)  # type: ignore[arg-type]
        self.reservoir = (
            RowReservoir(config.reservoir_size, config.seed) if config.reservoir_size else None
        )
        self.sequence_energy: SequenceEnergy | None = None
        spec = config.sequence_energy
        if spec is not None and site is not None and site in spec.projectors:
            projectors = spec.projectors[site]
            if projectors.d != d:
                raise ValueError(
                    f"sequence_energy projectors of {site!r} are {projectors.d}-dimensional, "
                    f"the site is {d}-dimensional"
                )
            self.sequence_energy = SequenceEnergy(projectors, spec.seq_len, spec.n_bins + 1, device)

    @property
    def count(self) -> int:
        return self.h.count

    @property
    def device(self) -> torch.device:
        """Where the statistics are (the model's device, for a capture's)."""
        return self.h.sum.device

    def to(self, device: torch.device | str) -> SiteStatistics:
        """Move every accumulator and the reservoir's rows to ``device`` (in place); returns
        self."""
        parts = [self.h, self.g, *self.h_bins, *self.g_bins, self.types, self.sequence_energy]
        for acc in [*parts, self.reservoir]:
            if acc is not None:
                acc.to(device)
        return self

    def update(
        self,
        h: Rows,
        g: Rows | None,
        tokens: TokenIds,
        row_ids: TokenIds,
        bins: TokenIds | None = None,
        *,
        batch: BatchRows | None = None,
    ) -> None:
        """Add kept rows: activations ``h`` (n, d), gradients ``g`` (n, d) or None, their token
        ids, global row ids (for the reservoir) and frequency bins (n,) (needed if ``n_bins``).
        ``batch``: the same rows' :class:`~tangentlens.capture.batch_rows.BatchRows` (their
        ids, row ids and bins), whose bookkeeping every site of the batch shares — the order by
        bin, the tracked types, the sequence groups, the reservoir's selection: made once, sent
        to the device once."""
        _check_rows(h, self.d, "activations")
        if (g is None) != (self.g is None):
            raise ValueError("gradients must be given exactly when the statistics keep them")
        if g is not None:
            _check_rows(g, self.d, "gradients")
        if self.config.n_bins and bins is None:
            raise ValueError(f"bins are required: the statistics keep {self.config.n_bins} bins")
        if batch is None:
            batch = BatchRows.of(tokens, row_ids, bins)
        device = self.h.sum.device
        h64 = h.detach().to(device, torch.float64)
        g64 = None if g is None else g.detach().to(device, torch.float64)
        if self.config.n_bins:  # one sort on the host, then a contiguous slice per bin
            n_bins = self.config.n_bins
            order, edges = batch.shared(
                ("bin order", n_bins, device), lambda: _bin_order(batch.bins, n_bins, device)
            )
            _update_binned(self.h, self.h_bins, h64[order], edges)
            if self.g is not None:
                _update_binned(self.g, self.g_bins, g64[order], edges)  # type: ignore[index]
        else:
            self.h.update(h64)
            if self.g is not None:
                self.g.update(g64)  # type: ignore[arg-type]
        if self.sequence_energy is not None:
            self.sequence_energy.update(g64, batch.row_ids, batch.bins, batch=batch)  # type: ignore[arg-type]
        if self.types is not None:
            self.types.update(batch.tokens, h64, batch=batch)
        if self.reservoir is not None:  # every column where the rows are
            at, seed = h.device, self.reservoir.seed
            ids = [batch.tokens] if batch.bins is None else [batch.tokens, batch.bins]
            sent = batch.shared(("reservoir ids", at), lambda: upload_many(ids, at))
            columns = {"H": h.detach().float(), "token": sent[0]}
            if g is not None:
                columns["G"] = g.detach().float()
            if batch.bins is not None:
                columns["bin"] = sent[1]
            offer = batch.shared(("offer", seed), lambda: Offer(batch.row_ids, seed))
            self.reservoir.offer(offer, columns)

    def merge(self, other: SiteStatistics) -> None:
        """Absorb the statistics of a disjoint part of the stream (same d and config)."""
        if other.d != self.d or other.config != self.config:
            raise ValueError("site statistics merge only with equal d and StatisticsConfig")
        self.h.merge(other.h)
        if self.g is not None and other.g is not None:
            self.g.merge(other.g)
        for mine, theirs in zip(
            self.h_bins + self.g_bins, other.h_bins + other.g_bins, strict=True
        ):
            mine.merge(theirs)
        if self.types is not None and other.types is not None:
            self.types.merge(other.types)
        if self.reservoir is not None and other.reservoir is not None:
            self.reservoir.merge(other.reservoir)
        if (self.sequence_energy is None) != (other.sequence_energy is None):
            raise ValueError(
                "site statistics merge only when both keep sequence energies or neither"
            )
        if self.sequence_energy is not None and other.sequence_energy is not None:
            self.sequence_energy.merge(other.sequence_energy)


#: The attention tensors :class:`AttentionStatistics` sums: queries, keys, the pattern.
ATTENTION_KINDS: tuple[str, ...] = ("q", "k", "pattern")


class AttentionStatistics:
    """Per-head float64 sums of one attention layer (on ``device``): queries ``sum_q`` and keys
    ``sum_k`` (head, d_head) at kept positions, and ``entropy_sum`` (head,) of the kept query
    rows' attention entropy over ``count`` rows (``precision="float32"``: each row's entropy
    summed over its keys in float32, the rows' sums in float64)."""

    def __init__(
        self,
        n_heads: int,
        d_head: int,
        device: torch.device | str = "cpu",
        precision: str = "float64",
    ) -> None:
        f64 = {"dtype": torch.float64, "device": device}
        self.precision = check_choice(precision, "precision", RESOLVED_PRECISIONS)
        self.sum_q = torch.zeros(n_heads, d_head, **f64)
        self.sum_k = torch.zeros(n_heads, d_head, **f64)
        self.entropy_sum = torch.zeros(n_heads, **f64)
        self.count = 0

    def update(
        self,
        kind: str,
        tensor: torch.Tensor,
        keep: TokenMask,
        *,
        kept: Int[torch.Tensor, " n"] | None = None,
        n_kept: int | None = None,
    ) -> None:
        """Add one batch's ``q`` or ``k`` (batch, pos, head, d_head) or attention ``pattern``
        (batch, head, query, key) at the kept positions ``keep`` (batch, pos); ``count`` counts
        the kept query rows of the patterns. ``kept`` (the kept positions' flat indices, on the
        tensor's device) and ``n_kept`` (their number, from the host's mask) spare the device
        the boolean mask's wait."""
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"kind must be one of {ATTENTION_KINDS}, got {kind!r}")
        keep = keep.to(tensor.device)
        if kind == "pattern":
            entropy, n = pattern_entropy_sums(
                tensor, keep, count=n_kept, row_dtype=getattr(torch, self.precision)
            )
            self.entropy_sum += entropy.to(self.entropy_sum.device)
            self.count += n
            return
        total = self.sum_q if kind == "q" else self.sum_k
        rows = tensor[keep] if kept is None else tensor.flatten(0, 1).index_select(0, kept)
        total += rows.to(torch.float64).sum(dim=0).to(total.device)

    def to(self, device: torch.device | str) -> AttentionStatistics:
        """Move the sums to ``device`` (in place); returns self."""
        self.sum_q, self.sum_k = self.sum_q.to(device), self.sum_k.to(device)
        self.entropy_sum = self.entropy_sum.to(device)
        return self

    def merge(self, other: AttentionStatistics) -> None:
        """Add the sums of a disjoint part of the stream."""
        if other.sum_q.shape != self.sum_q.shape or other.sum_k.shape != self.sum_k.shape:
            raise ValueError("attention statistics merge only with equal heads and d_head")
        if other.precision != self.precision:
            raise ValueError("attention statistics merge only at one precision")
        self.sum_q += other.sum_q.to(self.sum_q.device)
        self.sum_k += other.sum_k.to(self.sum_k.device)
        self.entropy_sum += other.entropy_sum.to(self.entropy_sum.device)
        self.count += other.count

    def drift(self) -> QKDrift:
        """Q/K drift per head from the mean query and key."""
        if self.count == 0:
            raise ValueError("no kept positions were accumulated for this layer")
        return qk_drift_from_means(self.sum_q / self.count, self.sum_k / self.count)

    def entropy(self) -> Float[torch.Tensor, " head"]:
        """Mean attention entropy per head (nats), ``(head,)``."""
        if self.count == 0:
            raise ValueError("no kept positions were accumulated for this layer")
        return self.entropy_sum / self.count
