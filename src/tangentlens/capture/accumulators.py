"""Streaming float64 statistics of captured rows: memory does not grow with the number of tokens.
Accumulators live on any device (the capture accumulates on the model's, then moves them to the
CPU); the row reservoir always lives on the CPU.

* :class:`MomentAccumulator` — moments of a stream of rows ``x`` (d,): count, ``Σx``, ``Σ‖x‖``,
  ``Σ‖x‖²``, ``Σ x/‖x‖`` (over nonzero rows) and optionally ``Σ x xᵀ`` (d × d).
* :class:`TypeSums` — per token type: count, ``Σh`` and ``Σ‖h‖²`` (centroids and spreads).
* :class:`SiteStatistics` — everything one hook site accumulates: moments of ``H`` and ``G``
  overall and per frequency bin, optional per-type sums, an optional row reservoir and optional
  per-sequence gradient energy sums (:class:`~tangentlens.capture.sequence_energy.SequenceEnergy`).

Every accumulator merges: statistics of two disjoint halves of a stream merge to those of the
whole (exactly, up to float64 summation order).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from tangentlens.capture.reservoir import RowReservoir
from tangentlens.capture.sequence_energy import SequenceEnergy, SequenceEnergyConfig
from tangentlens.checks import check_count

__all__ = ["MomentAccumulator", "SiteStatistics", "StatisticsConfig", "TypeSums"]

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


class MomentAccumulator:
    """Streaming moments of rows of width ``d`` in float64 (on ``device``).

    Attributes: ``count`` rows, ``sum`` (d,), ``sum_norms`` / ``sum_sq_norms`` (floats),
    ``sum_unit`` (d,) and ``n_nonzero`` (rows with a direction), ``second_moment`` (d, d) or None.
    """

    def __init__(
        self, d: int, *, second_moment: bool = True, device: torch.device | str = "cpu"
    ) -> None:
        check_count(d, "d", minimum=1)
        f64 = {"dtype": torch.float64, "device": device}
        self.d = d
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
            if gram is None:
                self.second_moment.addmm_(x.T, x)
            else:
                self.second_moment += gram

    @property
    def n_nonzero(self) -> int:
        """Rows with a direction (nonzero norm): the ``n`` of ``sum_unit``."""
        return int(self._n_nonzero)

    def to(self, device: torch.device | str) -> MomentAccumulator:
        """Move every sum to ``device`` (in place); returns self."""
        for name in _MOMENT_FIELDS:
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
    """Per token type (``vocab_size`` types): occurrence count, ``Σh`` (vocab, d) and ``Σ‖h‖²``,
    in float64. ``vocab_size × d × 8`` bytes: keep it for the sites that need centroids."""

    def __init__(self, vocab_size: int, d: int, device: torch.device | str = "cpu") -> None:
        self.count = torch.zeros(vocab_size, dtype=torch.int64, device=device)
        self.sum = torch.zeros(vocab_size, d, dtype=torch.float64, device=device)
        self.sum_sq_norms = torch.zeros(vocab_size, dtype=torch.float64, device=device)

    def update(self, tokens: TokenIds, x: Rows) -> None:
        """Add rows ``x`` (n, d) of token types ``tokens`` (n,; checked where they are, so pass
        CPU ids to avoid a device sync)."""
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= len(self.count)):
            raise ValueError(f"token ids must lie in [0, {len(self.count)})")
        tokens = tokens.to(self.count.device)
        x = x.detach().to(self.sum.device, torch.float64)
        self.count.index_add_(0, tokens, torch.ones_like(tokens))
        self.sum.index_add_(0, tokens, x)
        self.sum_sq_norms.index_add_(0, tokens, (x * x).sum(dim=1))

    def to(self, device: torch.device | str) -> TypeSums:
        """Move the sums to ``device`` (in place); returns self."""
        self.count, self.sum = _moved(self.count, device), _moved(self.sum, device)
        self.sum_sq_norms = _moved(self.sum_sq_norms, device)
        return self

    def merge(self, other: TypeSums) -> None:
        if other.sum.shape != self.sum.shape:
            raise ValueError("type sums merge only with equal vocabulary size and d")
        self.count += other.count
        self.sum += other.sum
        self.sum_sq_norms += other.sum_sq_norms


@dataclass(frozen=True)
class StatisticsConfig:
    """What a site accumulates besides the overall moments of ``H`` (and ``G``).

    ``n_bins``: frequency bins (0 = none); ``bin_second_moments``: keep d × d moments per bin
    (12 matrices per site at 5 bins: 56 MB at d 768); ``type_sums``: per-type centroid sums of
    ``H`` (needs ``vocab_size``); ``reservoir_size``: rows sampled for point-based metrics
    (0 = none); ``seed``: of the reservoir's priorities; ``sequence_energy``: projectors per site
    for per-sequence energy sums of ``G`` (None = none; needs ``gradients`` and one slot per
    frequency bin plus "all").
    """

    gradients: bool = True
    n_bins: int = 0
    bin_second_moments: bool = True
    type_sums: bool = False
    vocab_size: int | None = None
    reservoir_size: int = 16384
    seed: int = 0
    sequence_energy: SequenceEnergyConfig | None = None

    def __post_init__(self) -> None:
        for name in ("n_bins", "reservoir_size", "seed"):
            check_count(getattr(self, name), name, minimum=0)
        if self.sequence_energy is not None:
            if not self.gradients:
                raise ValueError("sequence_energy sums gradients: it needs gradients=True")
            for site, projectors in self.sequence_energy.projectors.items():
                if projectors.n_slots != self.n_bins + 1:
                    raise ValueError(
                        f"sequence_energy projectors of {site!r} have {projectors.n_slots} slots;"
                        f" the statistics keep {self.n_bins} bins, so {self.n_bins + 1} are needed"
                    )
        if self.type_sums and (not isinstance(self.vocab_size, int) or self.vocab_size < 1):
            raise ValueError(
                f"type_sums needs vocab_size as an integer ≥ 1, got {self.vocab_size!r}"
            )


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
    grams = [rows.T @ rows for rows in slices]
    unbinned = x[: edges[0]]
    total = unbinned.T @ unbinned
    for gram in grams:
        total += gram
    overall.update(x, gram=total)
    for acc, rows, gram in zip(per_bin, slices, grams, strict=True):
        acc.update(rows, gram=gram)


class SiteStatistics:
    """Statistics of one hook site of width ``d``.

    ``h`` / ``g``: overall :class:`MomentAccumulator` of activations / gradients (``g`` is None
    without gradients); ``h_bins`` / ``g_bins``: one per frequency bin; ``types``: per-type sums
    of ``H`` or None; ``reservoir``: a :class:`RowReservoir` with columns ``H``, ``G`` (float32),
    ``token`` and ``bin`` (int64), or None; ``sequence_energy``: per-sequence energy sums of
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
        moments = {"second_moment": config.bin_second_moments, "device": device}
        self.h = MomentAccumulator(d, device=device)
        self.g = MomentAccumulator(d, device=device) if grads else None
        self.h_bins = [MomentAccumulator(d, **moments) for _ in range(config.n_bins)]
        self.g_bins = (
            [MomentAccumulator(d, **moments) for _ in range(config.n_bins)] if grads else []
        )
        self.types = (
            TypeSums(config.vocab_size, d, device) if config.type_sums else None  # type: ignore[arg-type]
        )
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
            self.sequence_energy = SequenceEnergy(projectors, spec.seq_len, device)

    @property
    def count(self) -> int:
        return self.h.count

    def to(self, device: torch.device | str) -> SiteStatistics:
        """Move every accumulator to ``device`` (the reservoir lives on the CPU); returns self."""
        for acc in [self.h, self.g, *self.h_bins, *self.g_bins, self.types, self.sequence_energy]:
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
    ) -> None:
        """Add kept rows: activations ``h`` (n, d), gradients ``g`` (n, d) or None, their token
        ids, global row ids (for the reservoir) and frequency bins (n,) (needed if ``n_bins``)."""
        _check_rows(h, self.d, "activations")
        if (g is None) != (self.g is None):
            raise ValueError("gradients must be given exactly when the statistics keep them")
        if g is not None:
            _check_rows(g, self.d, "gradients")
        if self.config.n_bins and bins is None:
            raise ValueError(f"bins are required: the statistics keep {self.config.n_bins} bins")
        h64 = h.detach().to(self.h.sum.device, torch.float64)
        g64 = None if g is None else g.detach().to(self.h.sum.device, torch.float64)
        if self.config.n_bins:  # one sort on the host, then a contiguous slice per bin
            sorted_bins, order = torch.sort(bins.cpu(), stable=True)  # type: ignore[union-attr]
            edges = torch.searchsorted(sorted_bins, torch.arange(self.config.n_bins + 1)).tolist()
            order = order.to(h64.device)
            _update_binned(self.h, self.h_bins, h64[order], edges)
            if self.g is not None:
                _update_binned(self.g, self.g_bins, g64[order], edges)  # type: ignore[index]
        else:
            self.h.update(h64)
            if self.g is not None:
                self.g.update(g64)  # type: ignore[arg-type]
        if self.sequence_energy is not None:
            self.sequence_energy.update(g64, row_ids, bins)  # type: ignore[arg-type]
        if self.types is not None:
            self.types.update(tokens, h64)
        if self.reservoir is not None:
            columns = {"H": h.detach().float(), "token": tokens.to(torch.int64)}
            if g is not None:
                columns["G"] = g.detach().float()
            if bins is not None:
                columns["bin"] = bins.to(torch.int64)
            self.reservoir.add(row_ids, columns)

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
