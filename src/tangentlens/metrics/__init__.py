"""Pure tensor → number metrics (no model library); inputs are tensors or arrays (n × d).

The names are imported on first use; :mod:`~tangentlens.metrics.options` (the option values
configs validate against) loads without torch.
"""

import sys
from types import ModuleType

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".alignment": ("centroid_shift", "update_alignment"),
        ".attention": (
            "QKDrift",
            "attention_entropy",
            "attention_entropy_sums",
            "pattern_entropy_sums",
            "qk_drift",
            "qk_drift_from_means",
        ),
        ".attribution": (
            "ControlComparison",
            "EnergyComparison",
            "anisotropy_share_spectral",
            "anisotropy_shares_spectral",
            "compare_anisotropy_share",
            "compare_anisotropy_shares",
            "compare_delta_isoscore_star",
            "compare_delta_isoscores_star",
            "compare_energy",
            "delta_isoscore_star",
            "delta_isoscores_star",
            "DriftRegression",
            "drift_regression",
            "energy_fraction",
            "energy_fraction_from_moment",
            "energy_fractions_from_moment",
            "enrichment_null",
            "null_energy_mean",
        ),
        ".bootstrap": ("RatioInterval", "bootstrap_ratio", "group_sums"),
        ".controls": (
            "REUSED_DRAWS_BYTES",
            "control_frames",
            "data_matched_frames",
            "draw_generator",
            "exclusion_basis",
            "expected_projector",
            "reused_draws",
        ),
        ".curvature": ("LocalSpectra", "local_spectra", "pooled_visibility"),
        ".frequency": (
            "SpearmanNull",
            "centroid_residuals",
            "centroid_spread_from_sums",
            "centroids_from_sums",
            "frequency_distance_correlation",
            "frequency_spearman_null",
            "shuffled_spreads",
        ),
        ".geometry": (
            "Correlation",
            "centred_anisotropy",
            "centred_anisotropy_from_moments",
            "centred_singular_anisotropy",
            "centred_singular_anisotropy_from_moments",
            "correlations",
            "cosine_anisotropy",
            "cosine_anisotropy_from_sums",
            "cosine_anisotropy_sampled",
            "covariance",
            "drift_norm",
            "drift_norm_from_sums",
            "relative_drift",
            "relative_drift_from_sums",
        ),
        ".isoscore": (
            "isoscore",
            "isoscore_from_covariance",
            "isoscore_star",
            "isoscore_star_from_covariance",
        ),
        ".subspace": (
            "check_basis",
            "principal_angles",
            "projector",
            "random_principal_angles",
            "span_basis",
        ),
        ".twonn": ("TwoNNEstimate", "twonn_dimension", "twonn_estimate"),
    },
)


class _Metrics(ModuleType):
    """The package's module type. Importing a submodule binds it on its package: the module
    ``tangentlens.metrics.isoscore`` would hide the exported function of the same name, so the
    function keeps the name (``tangentlens.metrics.isoscore`` is always the function)."""

    def __setattr__(self, name: str, value: object) -> None:
        if not (name == "isoscore" and isinstance(value, ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Metrics
