"""Pure tensor → number metrics (no model library); inputs are tensors or arrays (n × d)."""

from tangentlens.metrics.attention import (
    QKDrift,
    attention_entropy,
    attention_entropy_sums,
    qk_drift,
    qk_drift_from_means,
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
from tangentlens.metrics.twonn import TwoNNEstimate, twonn_dimension, twonn_estimate

__all__ = [
    "Correlation",
    "QKDrift",
    "TwoNNEstimate",
    "attention_entropy",
    "attention_entropy_sums",
    "centred_anisotropy",
    "centred_anisotropy_from_moments",
    "correlations",
    "cosine_anisotropy",
    "cosine_anisotropy_from_sums",
    "cosine_anisotropy_sampled",
    "covariance",
    "drift_norm",
    "drift_norm_from_sums",
    "isoscore",
    "isoscore_from_covariance",
    "isoscore_star",
    "isoscore_star_from_covariance",
    "qk_drift",
    "qk_drift_from_means",
    "relative_drift",
    "relative_drift_from_sums",
    "twonn_dimension",
    "twonn_estimate",
]
