"""One checkpoint's capture as the probes read it: the streamed statistics with the labels of the
rows they become, saved and reloaded whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

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
    the controls). :meth:`save` and :meth:`load` keep it for later, every probe giving the same
    numbers on the reloaded capture.
    """

    suite: str
    step: int
    tokens_seen: int | None
    statistics: CaptureStatistics
    layers: dict[str, int | None]
    seq_len: int
    frequencies: FrequencyTable | None = None

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
        counts = extra["counts"]
        return cls(
            suite=extra["suite"],
            step=int(extra["step"]),
            tokens_seen=None if extra["tokens_seen"] is None else int(extra["tokens_seen"]),
            statistics=statistics,
            layers=dict(extra["layers"]),
            seq_len=int(extra["seq_len"]),
            frequencies=None if counts is None else FrequencyTable(np.asarray(counts)),
        )
