"""tangentlens.capture: activations and per-token gradients at hook sites in one pass, streamed
into float64 accumulators, a seeded row reservoir and (optionally) per-sequence gradient energy
sums for the tangent-energy intervals. Its names are imported on first use."""

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".accumulators": ("MomentAccumulator", "SiteStatistics", "StatisticsConfig", "TypeSums"),
        ".engine": (
            "LOSSES",
            "REDUCTIONS",
            "AttentionTensors",
            "CaptureConfig",
            "CapturedBatch",
            "capture_batch",
            "frozen_parameters",
        ),
        ".reservoir": ("RowReservoir", "row_priorities"),
        ".sequence_energy": ("EnergyProjectors", "SequenceEnergy", "SequenceEnergyConfig"),
        ".stream": ("AttentionStatistics", "CaptureStatistics", "capture_statistics"),
    },
)
