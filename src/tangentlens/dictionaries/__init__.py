"""tangentlens.dictionaries: concept dictionaries fitted on activations (semi-NMF, PCA, SAEs via
SAELens) whose span is the tangent proxy, and float64 subspace tools.

Its names are imported on first use: the fit policies (:mod:`~tangentlens.dictionaries.policy`)
load without torch.
"""

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".base": ("ConceptDictionary", "check_fitted", "check_rank"),
        ".pca": ("PCA",),
        ".policy": ("FIT_POLICIES", "FitConfig", "early_window", "in_window"),
        ".proxy_config": (
            "MEAN_DIRECTION",
            "METHODS",
            "PRETRAINED_SAE",
            "PretrainedSAESpec",
            "ProxyConfig",
        ),
        ".sae": (
            "SAE",
            "SAE_ARCHITECTURES",
            "check_pretrained",
            "pretrained_location",
            "pretrained_models",
        ),
        ".seminmf": ("ROUNDING_SCALE", "SOLVERS", "SemiNMF", "rounding_angles"),
        "tangentlens.metrics.subspace": (
            "DEFAULT_RANK_RTOL",
            "check_basis",
            "principal_angles",
            "projector",
            "span_basis",
        ),
    },
)
