"""Pure tensor → number metrics (no model library); inputs are tensors or arrays (n × d)."""

from tangentlens.metrics.alignment import centroid_shift, update_alignment
from tangentlens.metrics.attention import (
    QKDrift,
    attention_entropy,
    attention_entropy_sums,
    qk_drift,
    qk_drift_from_means,
)
from tangentlens.metrics.attribution import (
    EnergyComparison,
    anisotropy_share_spectral,
    anisotropy_shares_spectral,
    compare_energy,
    delta_isoscore_star,
    delta_isoscores_star,
    energy_fraction,
    energy_fraction_from_moment,
    energy_fractions_from_moment,
    null_energy_mean,
)
from tangentlens.metrics.bootstrap import RatioInterval, bootstrap_ratio, group_sums
from tangentlens.metrics.controls import complement_frames, data_matched_frames, draw_generator
from tangentlens.metrics.curvature import LocalSpectra, local_spectra, pooled_visibility
from tangentlens.metrics.frequency import (
    centroid_distance_sums,
    centroids_from_sums,
    frequency_distance_correlation,
    rms_centroid_distance_from_sums,
)
from tangentlens.metrics.geometry import (
    Correlation,
    centred_anisotropy,
    centred_anisotropy_from_moments,
    correlations,
    cosine_anisotropy,
    cosine_anisotropy_from_sums,
    cosine_anisotropy_sampled,
    covariance,
    drift_norm,
    drift_norm_from_sums,
    relative_drift,
    relative_drift_from_sums,
)
from tangentlens.metrics.isoscore import (
    isoscore,
    isoscore_from_covariance,
    isoscore_star,
    isoscore_star_from_covariance,
)
from tangentlens.metrics.subspace import (
    check_basis,
    principal_angles,
    projector,
    span_basis,
)
from tangentlens.metrics.twonn import TwoNNEstimate, twonn_dimension, twonn_estimate

__all__ = [
    "Correlation",
    "EnergyComparison",
    "LocalSpectra",
    "QKDrift",
    "RatioInterval",
    "TwoNNEstimate",
    "anisotropy_share_spectral",
    "anisotropy_shares_spectral",
    "attention_entropy",
    "attention_entropy_sums",
    "bootstrap_ratio",
    "centred_anisotropy",
    "centred_anisotropy_from_moments",
    "centroid_distance_sums",
    "centroid_shift",
    "centroids_from_sums",
    "check_basis",
    "compare_energy",
    "complement_frames",
    "correlations",
    "cosine_anisotropy",
    "cosine_anisotropy_from_sums",
    "cosine_anisotropy_sampled",
    "covariance",
    "data_matched_frames",
    "delta_isoscore_star",
    "delta_isoscores_star",
    "draw_generator",
    "drift_norm",
    "drift_norm_from_sums",
    "energy_fraction",
    "energy_fraction_from_moment",
    "energy_fractions_from_moment",
    "frequency_distance_correlation",
    "group_sums",
    "isoscore",
    "isoscore_from_covariance",
    "isoscore_star",
    "isoscore_star_from_covariance",
    "local_spectra",
    "null_energy_mean",
    "pooled_visibility",
    "principal_angles",
    "projector",
    "qk_drift",
    "qk_drift_from_means",
    "relative_drift",
    "relative_drift_from_sums",
    "rms_centroid_distance_from_sums",
    "span_basis",
    "twonn_dimension",
    "twonn_estimate",
    "update_alignment",
]
