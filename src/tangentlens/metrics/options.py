"""The option values some metrics accept, importable without torch, so that configs (a recipe's
probe tables) reject a bad value when they are built rather than when the metric runs."""

from __future__ import annotations

__all__ = ["BOOTSTRAP_METHODS", "MIN_REPLICATES", "TWONN_FITS"]

#: Interval constructions offered by :func:`tangentlens.metrics.bootstrap.bootstrap_ratio`.
BOOTSTRAP_METHODS: tuple[str, ...] = ("percentile", "bca", "studentized")
#: The fewest bootstrap replicates :func:`tangentlens.metrics.bootstrap.bootstrap_ratio` takes.
MIN_REPLICATES = 10
#: Fit conventions of :func:`tangentlens.metrics.twonn.twonn_estimate`.
TWONN_FITS: tuple[str, ...] = ("facco", "razzhigaev")
