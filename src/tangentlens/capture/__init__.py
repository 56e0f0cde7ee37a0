"""tangentlens.capture: activations and per-token gradients at hook sites in one pass, streamed
into float64 accumulators, a seeded row reservoir and (optionally) per-sequence gradient energy
sums for the tangent-energy intervals."""

from tangentlens.capture.accumulators import (
    MomentAccumulator,
    SiteStatistics,
    StatisticsConfig,
    TypeSums,
)
from tangentlens.capture.engine import (
    LOSSES,
    REDUCTIONS,
    AttentionTensors,
    CaptureConfig,
    CapturedBatch,
    capture_batch,
    frozen_parameters,
)
from tangentlens.capture.reservoir import RowReservoir, row_priorities
from tangentlens.capture.sequence_energy import (
    EnergyProjectors,
    SequenceEnergy,
    SequenceEnergyConfig,
)
from tangentlens.capture.stream import AttentionStatistics, CaptureStatistics, capture_statistics

__all__ = [
    "LOSSES",
    "REDUCTIONS",
    "AttentionStatistics",
    "AttentionTensors",
    "CaptureConfig",
    "CaptureStatistics",
    "CapturedBatch",
    "EnergyProjectors",
    "MomentAccumulator",
    "RowReservoir",
    "SequenceEnergy",
    "SequenceEnergyConfig",
    "SiteStatistics",
    "StatisticsConfig",
    "TypeSums",
    "capture_batch",
    "capture_statistics",
    "frozen_parameters",
    "row_priorities",
]
