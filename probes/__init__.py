"""The probe catalogue, installed as ``tangentlens.probes``.

Each probe module has a frozen ``*Config`` dataclass, ``needs(config)`` (what the capture must
keep) and ``rows(capture, ...)`` turning one step's :class:`~tangentlens.probes.base.Capture`
(what ``tangentlens.capture_model`` returns, and what a sweep's step unit builds) into tidy
result rows; the tangent probes also take proxies ``{site: {method: basis}}`` (fitted by
:mod:`~tangentlens.proxies`, or your own through
:mod:`~tangentlens.user_proxies`). The configs are defined in
:mod:`tangentlens.probes.configs` (plain dataclasses: a recipe validates without importing
torch) and re-exported by each probe module. The probe modules are imported on first use.
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
