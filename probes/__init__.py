"""The probe catalogue, installed as ``tangentlens.probes``.

Each probe module declares one :class:`~tangentlens.contract.Probe` (``PROBE``): its name, its
frozen config dataclass (defined in the module: a recipe validates without importing torch), what
it needs captured, its scope and a ``rows`` function turning one step's
:class:`~tangentlens.capture.Capture` (what ``tangentlens.capture_model`` returns, and what a
sweep's step unit builds) into tidy result rows (:mod:`tangentlens.results`); the tangent probes
also read proxies ``{site: {method: basis}}`` (fitted by :mod:`~tangentlens.proxies`, or your
own through :mod:`~tangentlens.user_proxies`). The probe modules are imported on first use.
"""

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    submodules=(
        "anisotropy_share",
        "cosine_drift",
        "frequency_geometry",
        "qk_drift",
        "shape_of_learning",
        "subspace_stability",
        "tangent_energy",
        "untrained_block",
        "update_alignment",
    ),
)
