"""One checkpoint's capture as the probes read it: the streamed statistics with the labels of the
rows they become, saved and reloaded whole."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tangentlens.capture.needs import Needs

if TYPE_CHECKING:
    import torch

    from tangentlens.capture.accumulators import MomentAccumulator
    from tangentlens.capture.stream import CaptureStatistics
    from tangentlens.data import FrequencyTable

__all__ = ["Capture"]


@dataclass(frozen=True)
class Capture:
    """One checkpoint's captured statistics, what every per-step probe reads.

    ``statistics`` are the streamed moments, bins, type sums, reservoir and attention sums of
    one capture (:func:`tangentlens.capture.capture_statistics`); ``layers`` maps each captured
    site to its block index (None for the embedding); ``seq_len`` is the width of the token
    rows (row id // seq_len = sequence index); ``frequencies`` the token frequency table the
    bins come from. ``suite``, ``step`` and ``tokens_seen`` label the rows (the step also seeds
    the controls). ``kept``: what the capture kept for the probes, as its request said
    (:attr:`~tangentlens.capture.request.CaptureRequest.kept`; None: not recorded, see
    :attr:`holds`). :meth:`save`
    and :meth:`load` keep it for later, every probe giving the same numbers on the reloaded
    capture.
    """

    suite: str
    step: int
    tokens_seen: int | None
    statistics: CaptureStatistics
    layers: dict[str, int | None]
    seq_len: int
    frequencies: FrequencyTable | None = None
    kept: Needs | None = None

    def site(self, kind: str = "resid_post", layer: int | None = None) -> str:
        """The name of the captured site of ``kind`` at block ``layer`` (``kind="embed"``, layer
        None: the embedding), e.g. ``capture.site("resid_post", 3)`` →
        ``"blocks.3.hook_resid_post"``; a ``KeyError`` naming the captured sites otherwise."""
        from tangentlens.models.sites import site_kind

        for name, block in self.layers.items():
            if site_kind(name) == kind and block == layer:
                return name
        captured = ", ".join(f"{site_kind(n)}@{b}" for n, b in self.layers.items())
        raise KeyError(f"no {kind!r} site at layer {layer} in this capture; captured: {captured}")

    def activations(
        self, kind: str = "resid_post", layer: int | None = None, freq_bin: int | None = None
    ) -> MomentAccumulator:
        """The streamed moments of the activations at the site of ``kind`` and ``layer``
        (:meth:`site`): over every kept token, or over the tokens of frequency bin ``freq_bin``
        (0 = the rarest). ``count``, ``sum`` (d,), ``sum_sq_norms``, ``second_moment``
        (d, d), … (:class:`~tangentlens.capture.MomentAccumulator`)."""
        return self._moments(kind, layer, freq_bin, gradients=False)

    def gradients(
        self, kind: str = "resid_post", layer: int | None = None, freq_bin: int | None = None
    ) -> MomentAccumulator:
        """The streamed moments of the per-token loss gradients at that site, as
        :meth:`activations`; a ``ValueError`` when the capture kept no gradients."""
        return self._moments(kind, layer, freq_bin, gradients=True)

    def _moments(
        self, kind: str, layer: int | None, freq_bin: int | None, gradients: bool
    ) -> MomentAccumulator:
        stats = self.statistics.sites[self.site(kind, layer)]
        what = "gradients" if gradients else "activations"
        if gradients and stats.g is None:
            raise ValueError("this capture kept no gradients (Needs(gradients=True) keeps them)")
        if freq_bin is None:
            return stats.g if gradients else stats.h
        bins = stats.g_bins if gradients else stats.h_bins
        if not 0 <= freq_bin < len(bins):
            raise ValueError(
                f"freq_bin must be in 0..{len(bins) - 1} for the {what} of this capture "
                f"({len(bins)} frequency bins kept), got {freq_bin}"
            )
        return bins[freq_bin]

    def to(self, device: torch.device | str) -> Capture:
        """This capture with its statistics moved to ``device`` (in place; the probes compute
        where the statistics are); returns self."""
        self.statistics.to(device)
        return self

    def save(self, path: str | Path) -> Path:
        """Write the capture to ``path`` (a torch file, read back with ``weights_only=True``);
        written atomically. Returns the path."""
        from tangentlens.capture.saving import save_statistics

        extra = {
            "suite": self.suite,
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "layers": dict(self.layers),
            "seq_len": self.seq_len,
            "counts": None if self.frequencies is None else self.frequencies.counts,
            "kept": None if self.kept is None else dataclasses.asdict(self.kept),
        }
        save_statistics(self.statistics, path, extra)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> Capture:
        """A capture written by :meth:`save`."""
        from tangentlens.capture.saving import load_statistics
        from tangentlens.data import FrequencyTable

        statistics, extra = load_statistics(path)
        missing = {"suite", "step", "tokens_seen", "layers", "seq_len", "counts"} - set(extra)
        if missing:
            raise ValueError(
                f"{str(path)!r} holds capture statistics but not a tangentlens Capture (missing "
                f"{sorted(missing)}); save one with Capture.save"
            )
        counts, kept = extra["counts"], extra.get("kept")
        return cls(
            suite=extra["suite"],
            step=int(extra["step"]),
            tokens_seen=None if extra["tokens_seen"] is None else int(extra["tokens_seen"]),
            statistics=statistics,
            layers=dict(extra["layers"]),
            seq_len=int(extra["seq_len"]),
            frequencies=None if counts is None else FrequencyTable(np.asarray(counts)),
            kept=None if kept is None else Needs(**kept),
        )

    @property
    def holds(self) -> Needs:
        """What the capture holds for the probes: :attr:`kept`, or — for a capture that did not
        record it (built by hand, or saved by an earlier version) — what its statistics'
        settings and attention sums show."""
        return self.kept if self.kept is not None else _kept_of(self.statistics)


def _kept_of(statistics: CaptureStatistics) -> Needs:
    """What the statistics' settings and attention sums show a capture kept."""
    config = statistics.statistics
    bins = config.n_bins > 0
    return Needs(
        gradients=config.gradients,
        bins=bins,
        bin_moments=bins and config.gradients and config.gradient_bin_moments,
        type_sums=config.type_sums,
        reservoir=config.reservoir_size > 0,
        attention=bool(statistics.attention),
    )
