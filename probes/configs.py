"""The probes' configs: frozen dataclasses validated on construction, one per probe table of a
recipe (``[probes.<name>]``), plus the proxy fit's :class:`ProxyConfig`.

They import neither torch nor any model library, so reading and checking a recipe stays light.
Each probe module re-exports its own config (``from tangentlens.probes.cosine_drift import
CosineDriftConfig``). The untrained-block probe's config is
:class:`tangentlens.models.configs.UntrainedBlockConfig`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tangentlens.checks import check_choice, check_count
from tangentlens.metrics.options import BOOTSTRAP_METHODS, MIN_REPLICATES, TWONN_FITS

__all__ = [
    "METHODS",
    "PROBE_NEEDS",
    "TANGENT_COMPANIONS",
    "AnisotropyShareConfig",
    "CosineDriftConfig",
    "FrequencyGeometryConfig",
    "Needs",
    "ProxyConfig",
    "QKDriftConfig",
    "ShapeOfLearningConfig",
    "SubspaceStabilityConfig",
    "TangentEnergyConfig",
    "UpdateAlignmentConfig",
    "needs_of",
]


@dataclass(frozen=True)
class CosineDriftConfig:
    """No settings: the metrics are exact functions of the streamed sums."""


@dataclass(frozen=True)
class ShapeOfLearningConfig:
    """``singular_anisotropy``: also emit ``centred_singular_anisotropy`` (σ₁/Σσᵢ); TwoNN
    ``twonn_fit``, batch size (``twonn_batch``) and shuffling ``seed``."""

    singular_anisotropy: bool = False
    twonn_fit: str = "razzhigaev"
    twonn_batch: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.singular_anisotropy, bool):
            raise ValueError(
                f"singular_anisotropy must be true or false, got {self.singular_anisotropy!r}"
            )
        check_choice(self.twonn_fit, "twonn_fit", TWONN_FITS)
        check_count(self.twonn_batch, "twonn_batch", minimum=3)


@dataclass(frozen=True)
class QKDriftConfig:
    """No settings: every captured attention layer is reported."""


@dataclass(frozen=True)
class FrequencyGeometryConfig:
    """``min_count`` (≥ 2) occurrences in the capture stream for a type to enter the correlation;
    ``null_draws`` replicates of the Spearman's count-preserving shuffle null (0 = no null
    rows, else ≥ 2 for its standard deviation); curvature patches of ``k`` neighbours, tangent
    dimension ``tangent_dim``, ``n_anchors`` anchors; ``seed`` of the anchors and of the null's
    draws."""

    min_count: int = 5
    null_draws: int = 20
    k: int = 32
    tangent_dim: int = 8
    n_anchors: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        check_count(self.min_count, "frequency_geometry min_count", minimum=2)
        check_count(self.null_draws, "frequency_geometry null_draws", minimum=0)
        if self.null_draws == 1:
            raise ValueError(
                "frequency_geometry null_draws must be 0 (no shuffle null) or ≥ 2 (the null's "
                "standard deviation needs two replicates), got 1"
            )
        check_count(self.seed, "frequency_geometry seed", minimum=0)


@dataclass(frozen=True)
class TangentEnergyConfig:
    """``draws`` controls per measurement (100, ours; the paper used 20); ``bootstrap``
    replicates for the energy interval (0 = none); ``data_matched_m`` the PCA span of the
    data-matched control (None = off); ``interval`` the bootstrap interval (one of
    :data:`tangentlens.metrics.options.BOOTSTRAP_METHODS`; studentized by default: it covered
    best on simulated sequences)."""

    draws: int = 100
    bootstrap: int = 200
    data_matched_m: int | None = None
    seed: int = 0
    interval: str = "studentized"

    def __post_init__(self) -> None:
        check_count(self.draws, "draws", minimum=1)
        check_count(self.bootstrap, "bootstrap", minimum=0)
        if 0 < self.bootstrap < MIN_REPLICATES:
            raise ValueError(
                f"bootstrap must be 0 (no interval) or ≥ {MIN_REPLICATES} replicates, got "
                f"{self.bootstrap}"
            )
        check_count(self.seed, "seed", minimum=0)
        check_choice(self.interval, "interval", BOOTSTRAP_METHODS)
        m = self.data_matched_m
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 2):
            raise ValueError(
                f"data_matched_m must be an integer ≥ 2 (above the proxy rank) or None, got {m!r}"
            )


#: The dictionaries a tangent proxy can be spanned by.
METHODS: tuple[str, ...] = ("seminmf", "pca", "sae")


@dataclass(frozen=True)
class ProxyConfig:
    """Which dictionaries span the proxies, at which rank, with which seed.

    ``sae_samples``: activation rows the SAE trains on (the sample is cycled); ``sae_k``: active
    latents per row of the TopK SAE; ``centre``: fit on activations centred per checkpoint;
    ``mean_direction``: add the rank-1 proxy ``m̂`` and project it out of the other proxies.
    """

    methods: tuple[str, ...] = ("seminmf", "pca")
    rank: int = 16
    seed: int = 0
    seminmf_max_iter: int = 500
    sae_samples: int = 100_000
    sae_k: int = 16
    centre: bool = True
    mean_direction: bool = True

    def __post_init__(self) -> None:
        methods = tuple(self.methods)
        unknown = [m for m in methods if m not in METHODS]
        if not methods or unknown or len(set(methods)) != len(methods):
            raise ValueError(f"methods must be distinct names from {METHODS}, got {methods!r}")
        object.__setattr__(self, "methods", methods)
        check_count(self.rank, "rank", minimum=1)


@dataclass(frozen=True)
class AnisotropyShareConfig:
    """``isoscore_draws`` control frames for ΔIsoScore* (its p-value floor is
    ``1/(isoscore_draws + 1)``); ``zeta`` the IsoScore* shrinkage. The spectral share uses the
    tangent-energy probe's ``draws``; both use its ``seed``."""

    isoscore_draws: int = 20
    zeta: float = 0.2

    def __post_init__(self) -> None:
        check_count(self.isoscore_draws, "isoscore_draws", minimum=1)
        if not 0 <= self.zeta <= 1:
            raise ValueError(f"zeta must be in [0, 1], got {self.zeta!r}")


@dataclass(frozen=True)
class SubspaceStabilityConfig:
    """``seeds``: how many seeds the seeded dictionaries are compared across (1 = none)."""

    seeds: int = 1

    def __post_init__(self) -> None:
        check_count(self.seeds, "seeds", minimum=1)


@dataclass(frozen=True)
class UpdateAlignmentConfig:
    """``draws`` controls, drawn from ``seed``; centroid updates of the ``centroid_types`` most
    frequent types."""

    draws: int = 100
    centroid_types: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("draws", "centroid_types"):
            check_count(getattr(self, name), name, minimum=1)


@dataclass(frozen=True)
class Needs:
    """What a probe needs from the capture of a step.

    ``gradients``: per-token gradients; ``bins``: frequency bins (per-bin first moments and the
    reservoir's bin column); ``bin_moments``: the d × d second moment of the gradients per bin
    (needs ``bins``); ``type_sums``: per-type centroid sums (of the types the probe names, see
    ``tracked_types`` of frequency_geometry and update_alignment); ``reservoir``: sampled rows;
    ``attention``: per-head query, key and attention-entropy sums.
    """

    gradients: bool = False
    bins: bool = False
    bin_moments: bool = False
    type_sums: bool = False
    reservoir: bool = False
    attention: bool = False

    def __post_init__(self) -> None:
        if self.bin_moments and not (self.bins and self.gradients):
            raise ValueError(
                "bin_moments are per-bin gradient moments: they need bins=True and gradients=True"
            )

    def missing(self, wanted: Needs) -> list[str]:
        """The fields ``wanted`` needs and this does not hold."""
        return [f for f in self.__dataclass_fields__ if getattr(wanted, f) and not getattr(self, f)]

    def union(self, other: Needs) -> Needs:
        return Needs(
            **{
                name: getattr(self, name) or getattr(other, name)
                for name in self.__dataclass_fields__
            }
        )


#: What each probe needs from a step's capture (the same whatever its config).
PROBE_NEEDS: dict[str, Needs] = {
    "cosine_drift": Needs(),
    "shape_of_learning": Needs(reservoir=True),
    "qk_drift": Needs(attention=True),
    "frequency_geometry": Needs(bins=True, type_sums=True, reservoir=True),
    "tangent_energy": Needs(gradients=True, bins=True, bin_moments=True, reservoir=True),
    "anisotropy_share": Needs(gradients=True, bins=True, bin_moments=True),
    "subspace_stability": Needs(),
    "update_alignment": Needs(type_sums=True),
    "untrained_block": Needs(),
}


#: Probes that score the tangent_energy probe's proxies: they run only with it.
TANGENT_COMPANIONS: tuple[str, ...] = ("anisotropy_share", "subspace_stability", "update_alignment")


def needs_of(probes: Iterable[str]) -> Needs:
    """What the capture must keep for the named probes together (no torch imported)."""
    needs = Needs()
    for name in probes:
        if name not in PROBE_NEEDS:
            raise ValueError(f"unknown probe {name!r}; allowed: {list(PROBE_NEEDS)}")
        needs = needs.union(PROBE_NEEDS[name])
    return needs
