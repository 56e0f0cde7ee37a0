"""tangentlens.dictionaries: concept dictionaries fitted on activations (semi-NMF, PCA, SAEs via
SAELens) whose span is the tangent proxy, and float64 subspace tools."""

from tangentlens.dictionaries.base import ConceptDictionary, check_rank
from tangentlens.dictionaries.pca import PCA
from tangentlens.dictionaries.policy import FIT_POLICIES, early_window, in_window
from tangentlens.dictionaries.sae import SAE, SAE_ARCHITECTURES
from tangentlens.dictionaries.seminmf import SOLVERS, SemiNMF
from tangentlens.metrics.subspace import (
    DEFAULT_RANK_RTOL,
    check_basis,
    principal_angles,
    projector,
    span_basis,
)

__all__ = [
    "DEFAULT_RANK_RTOL",
    "FIT_POLICIES",
    "PCA",
    "SAE",
    "SAE_ARCHITECTURES",
    "SOLVERS",
    "ConceptDictionary",
    "SemiNMF",
    "check_basis",
    "check_rank",
    "early_window",
    "in_window",
    "principal_angles",
    "projector",
    "span_basis",
]
