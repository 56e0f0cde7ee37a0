"""The probe catalogue, installed as ``tangentlens.probes``.

Each probe module has a frozen ``*Config`` dataclass, ``needs(config)`` (what the capture must
keep) and ``rows(...)`` turning one step's captured statistics into tidy result rows
(:mod:`tangentlens.probes.base`).
"""

from tangentlens.probes import (
    anisotropy_share,
    cosine_drift,
    frequency_geometry,
    qk_drift,
    shape_of_learning,
    subspace_stability,
    tangent_energy,
    untrained_block,
    update_alignment,
)

__all__ = [
    "anisotropy_share",
    "cosine_drift",
    "frequency_geometry",
    "qk_drift",
    "shape_of_learning",
    "subspace_stability",
    "tangent_energy",
    "untrained_block",
    "update_alignment",
]
