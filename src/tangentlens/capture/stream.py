"""Stream token batches through :func:`capture_batch` into per-site accumulators.

Each batch is captured, its kept rows are folded into the statistics, and the batch is dropped:
memory is that of one batch plus the accumulators, whatever the number of tokens. Rows are
identified by ``sequence index × seq_len + position`` (sequence index counted over the whole
stream), which makes the row reservoir independent of the batch size. A batch's kept rows —
their ids, bins and what is derived from them — are one
:class:`~tangentlens.capture.batch_rows.BatchRows` shared by every site.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from tangentlens.capture.accumulators import AttentionStatistics, SiteStatistics, StatisticsConfig
from tangentlens.capture.batch_rows import BatchRows
from tangentlens.capture.engine import CaptureConfig, capture_batch
from tangentlens.data.frequency import FrequencyBins
from tangentlens.data.packing import SpecialTokens
from tangentlens.typing import Tokens

if TYPE_CHECKING:  # the capture reads models through the adapter of tangentlens.models
    from tangentlens.models.adapter import LensModel

__all__ = ["CaptureStatistics", "capture_statistics", "combine_site_passes"]


@dataclass
class CaptureStatistics:
    """Everything a capture stream accumulated.

    ``sites``: :class:`SiteStatistics` per hook name; ``attention``: per layer; ``excluded``:
    positions excluded per reason (see :class:`CapturedBatch`); ``n_positions`` and
    ``n_sequences`` read; ``loss_sum`` the summed token loss over ``n_scored`` scored tokens
    (NaN and 0 for loss ``none``).
    """

    config: CaptureConfig
    statistics: StatisticsConfig
    sites: dict[str, SiteStatistics] = field(default_factory=dict)
    attention: dict[int, AttentionStatistics] = field(default_factory=dict)
    excluded: Counter[str] = field(default_factory=Counter)
    n_positions: int = 0
    n_sequences: int = 0
    loss_sum: float = 0.0
    n_scored: int = 0

    @property
    def n_tokens(self) -> int:
        """Positions kept for the statistics."""
        return self.n_positions - self.excluded["total"]

    @property
    def mean_loss(self) -> float:
        """Loss per scored token; NaN for loss ``none`` (nothing is scored)."""
        if self.config.loss == "none":
            return math.nan
        if self.n_scored == 0:
            raise ValueError("no token was scored: the mean loss is undefined")
        return self.loss_sum / self.n_scored

    @property
    def device(self) -> torch.device:
        """Where the statistics are (the model's device, or the host after several capture
        passes)."""
        for stats in self.sites.values():
            return stats.device
        for attention in self.attention.values():
            return attention.entropy_sum.device
        return torch.device("cpu")

    def to(self, device: torch.device | str) -> CaptureStatistics:
        """Move every site's and attention layer's statistics to ``device`` (in place);
        returns self."""
        for stats in [*self.sites.values(), *self.attention.values()]:
            stats.to(device)
        return self

    def merge(self, other: CaptureStatistics) -> None:
        """Absorb the statistics of a disjoint part of the stream (same configs and sites)."""
        if (other.config, other.statistics) != (self.config, self.statistics):
            raise ValueError("capture statistics merge only with equal capture configs")
        for site, stats in other.sites.items():
            if site in self.sites:
                self.sites[site].merge(stats)
            else:
                self.sites[site] = stats
        for layer, stats in other.attention.items():
            if layer in self.attention:
                self.attention[layer].merge(stats)
            else:
                self.attention[layer] = stats
        self.excluded.update(other.excluded)
        self.n_positions += other.n_positions
        self.n_sequences += other.n_sequences
        self.loss_sum += other.loss_sum
        self.n_scored += other.n_scored


def combine_site_passes(passes: Sequence[CaptureStatistics]) -> CaptureStatistics:
    """One capture's statistics from several passes over the same token stream, each over a
    disjoint group of sites (the memory plan splits sites into passes when one pass would not
    fit): the sites and attention layers of every pass, the stream's counts once. Passes that
    read different streams (counts or loss differ) are refused."""
    if not passes:
        raise ValueError("no capture pass to combine")
    first = passes[0]
    combined = CaptureStatistics(
        config=first.config,
        statistics=first.statistics,
        excluded=Counter(first.excluded),
        n_positions=first.n_positions,
        n_sequences=first.n_sequences,
        loss_sum=first.loss_sum,
        n_scored=first.n_scored,
    )
    for part in passes:
        same_stream = (part.n_positions, part.n_sequences, part.n_scored, part.excluded) == (
            first.n_positions,
            first.n_sequences,
            first.n_scored,
            first.excluded,
        )
        same_loss = math.isclose(part.loss_sum, first.loss_sum, rel_tol=1e-6) or (
            math.isnan(part.loss_sum) and math.isnan(first.loss_sum)
        )
        if not (same_stream and same_loss) or part.statistics != first.statistics:
            raise ValueError(
                "capture passes combine only over the same token stream and statistics config"
            )
        overlap = (set(part.sites) & set(combined.sites)) | (
            set(part.attention) & set(combined.attention)
        )
        if overlap:
            raise ValueError(f"capture passes must cover disjoint sites; both hold {overlap}")
        combined.sites.update(part.sites)
        combined.attention.update(part.attention)
    combined.config = dataclasses.replace(
        first.config,
        sites=tuple(combined.sites),
        attention_layers=tuple(sorted(combined.attention)),
    )
    return combined


def _ids(rows: BatchRows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    return rows.tokens, rows.row_ids, rows.bins


def capture_statistics(
    model: torch.nn.Module | LensModel,
    batches: Iterable[Tokens],
    config: CaptureConfig,
    special: SpecialTokens,
    statistics: StatisticsConfig,
    *,
    bins: FrequencyBins | None = None,
    first_sequence: int = 0,
    step: int | None = None,
) -> CaptureStatistics:
    """Capture every batch of ``batches`` ((batch, pos) token tensors of one width) and
    accumulate the kept rows on the model's device, where the returned statistics stay (the
    probes compute there; :meth:`CaptureStatistics.to` moves them).
    ``model``: a ``HookedTransformer``, ``HookedEncoder`` or ``TransformerBridge`` (or its
    :class:`~tangentlens.models.adapter.LensModel`).

    Args:
        bins: token-frequency bins (required when ``statistics.n_bins > 0``, same number).
        first_sequence: stream index of the first sequence (for row ids and masked-LM seeds).
        step: the checkpoint step, named in error messages.
    """
    if statistics.gradients and not config.gradients:
        raise ValueError("statistics keep gradients but the capture config computes none")
    if statistics.n_bins and (bins is None or bins.n_bins != statistics.n_bins):
        raise ValueError(
            f"statistics keep {statistics.n_bins} frequency bins: give FrequencyBins with "
            f"n_bins={statistics.n_bins}, got {None if bins is None else bins.n_bins}"
        )
    from tangentlens.models.lens import lens_model

    model = lens_model(model)  # once: every batch reads the same adapter
    out = CaptureStatistics(config=config, statistics=statistics)
    sequence = first_sequence
    seq_len: int | None = None
    for tokens in batches:
        if seq_len is None:
            seq_len = tokens.shape[1]
        elif tokens.shape[1] != seq_len:
            raise ValueError(f"every batch must have {seq_len} positions, got {tokens.shape[1]}")
        batch = capture_batch(
            model,
            tokens,
            config,
            special,
            first_sequence=sequence,
            step=step,
            precision=statistics.precision,
        )
        n_rows, n_pos = tokens.shape
        keep = batch.host_keep  # ids, tokens and bins: the bookkeeping lives on the CPU
        row_ids = (
            torch.arange(sequence, sequence + n_rows)[:, None] * n_pos + torch.arange(n_pos)
        )[keep]
        kept_tokens = tokens.cpu()[keep]
        kept_bins = bins.assign(kept_tokens) if statistics.n_bins else None  # type: ignore[union-attr]
        rows = BatchRows.of(kept_tokens, row_ids, kept_bins)  # every site's, made once
        for site in config.sites:
            h, g = batch.rows(site)
            if site not in out.sites:  # accumulate where the activations are
                out.sites[site] = SiteStatistics(h.shape[1], statistics, device=h.device, site=site)
            out.sites[site].update(h, g if statistics.gradients else None, *_ids(rows), batch=rows)
        for layer, attention in batch.attention.items():
            if layer in out.attention:
                out.attention[layer].merge(attention)
            else:
                out.attention[layer] = attention
        out.excluded.update(batch.excluded)
        out.n_positions += n_rows * n_pos
        out.n_sequences += n_rows
        out.loss_sum += batch.loss
        out.n_scored += batch.n_scored
        sequence += n_rows
    if out.n_sequences == 0:
        raise ValueError("no token batch was given: the capture stream is empty")
    return out
