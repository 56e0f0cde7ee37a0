"""tangentlens.capture: activations and per-token gradients at hook sites in one pass, streamed
into float64 accumulators, a seeded row reservoir and (optionally) per-sequence gradient energy
sums for the tangent-energy intervals. Its names are imported on first use."""

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".accumulators": (
            "ATTENTION_KINDS",
            "AttentionStatistics",
            "MomentAccumulator",
            "SiteStatistics",
            "StatisticsConfig",
            "TypeSums",
        ),
        ".captured": ("Capture",),
        ".chunks": ("LOSS_CHUNK_BYTES", "loss_chunk_rows", "statistics_bytes"),
        ".engine": (
            "LOSSES",
            "REDUCTIONS",
            "CaptureConfig",
            "CapturedBatch",
            "capture_batch",
            "frozen_parameters",
        ),
        ".needs": ("Needs",),
        ".reservoir": ("RowReservoir", "row_priorities"),
        ".saving": ("load_statistics", "save_statistics"),
        ".sequence_energy": (
            "EnergyProjectors",
            "EnergySums",
            "SequenceEnergy",
            "SequenceEnergyConfig",
        ),
        ".stream": ("CaptureStatistics", "capture_statistics", "combine_site_passes"),
    },
)
