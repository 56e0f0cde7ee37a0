"""The probes' configs: frozen dataclasses validated on construction, one per probe table of a
recipe (``[probes.<name>]``), plus the proxy fit's :class:`ProxyConfig`.

They import neither torch nor any model library, so reading and checking a recipe stays light.
Each probe module re-exports its own config (``from tangentlens.probes.cosine_drift import
CosineDriftConfig``). The untrained-block probe's config is
:class:`tangentlens.models.configs.UntrainedBlockConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangentlens.checks import check_choice, check_count, check_fraction, suggest
from tangentlens.dictionaries.policy import FIT_POLICIES
from tangentlens.metrics.options import BOOTSTRAP_METHODS, MIN_REPLICATES, TWONN_FITS

__all__ = [
    "MEAN_DIRECTION",
    "METHODS",
    "PRETRAINED_SAE",
    "AnisotropyShareConfig",
    "CosineDriftConfig",
    "FrequencyGeometryConfig",
    "Needs",
    "PretrainedSAESpec",
    "ProxyConfig",
    "QKDriftConfig",
    "ShapeOfLearningConfig",
    "SubspaceStabilityConfig",
    "TangentEnergyConfig",
    "TangentSpec",
    "UpdateAlignmentConfig",
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
#: The method name of the rank-1 proxy m̂, the mean direction (``ProxyConfig.mean_direction``).
MEAN_DIRECTION = "mean_direction"


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


#: The method name of the proxies spanned by published SAEs (:class:`PretrainedSAESpec`).
PRETRAINED_SAE = "pretrained_sae"


@dataclass(frozen=True)
class PretrainedSAESpec:
    """Published SAEs as tangent proxies (``[probes.tangent_energy.pretrained_sae]``, method
    ``pretrained_sae``): the SAEs ``ids`` of the SAELens pretrained-registry ``release``, loaded
    through ``sae_lens.SAE.from_pretrained``, one per captured site (the site is the SAE's hook
    name, e.g. ``blocks.3.hook_resid_post``).

    Each proxy is the orthonormalised span of the decoder rows of the ``rank`` latents that fire
    most often (ties: larger mean activation) on the sampled activation rows of ``select_step``
    (default: the sweep's first selected step; it may not be later), raw as the SAE reads them;
    chosen once and held fixed for every step. The release and ids are checked against the
    registry, the release's model against the suite's (``check_pretrained_sae``) when the sweep
    is planned; each SAE's model, hook and width against the suite when it is loaded.
    """

    release: str = ""
    ids: tuple[str, ...] = ()
    select_step: int | None = None

    def __post_init__(self) -> None:
        path = f"probes.tangent_energy.{PRETRAINED_SAE}"
        if not isinstance(self.release, str) or not self.release.strip():
            raise ValueError(
                f"{path}.release must name a release of SAELens' pretrained registry (e.g. "
                f"'pythia-70m-deduped-res-sm'), got {self.release!r}"
            )
        ids = tuple(self.ids)
        if (
            not ids
            or not all(isinstance(i, str) and i.strip() for i in ids)
            or len(set(ids)) != len(ids)
        ):
            raise ValueError(
                f"{path}.ids must list distinct SAE ids of release {self.release!r} (e.g. "
                f"['blocks.3.hook_resid_post']), got {self.ids!r}"
            )
        object.__setattr__(self, "ids", ids)
        if self.select_step is not None:
            check_count(self.select_step, f"{path}.select_step", minimum=0)


@dataclass(frozen=True)
class TangentSpec:
    """The tangent account's dictionaries, fit policy and controls (``[probes.tangent_energy]``).

    Proxies (:class:`ProxyConfig`): ``methods``, the dictionaries that span them (from
    :data:`METHODS`); ``rank``, their rank k; ``seminmf_max_iter``, semi-NMF iterations;
    ``sae_samples`` and ``sae_k``, the SAE's training rows and active latents per row;
    ``centre``: fit on activations centred per checkpoint; ``mean_direction``: add the rank-1
    proxy m̂ and project it out of the others. Fit (:mod:`~tangentlens.dictionaries.policy`):
    ``fit_policy``, "per_checkpoint" or "frozen_early"; ``early_fraction`` and
    ``window_checkpoints``, the frozen-early window (the checkpoints with step ≤ early_fraction ×
    final step, at most window_checkpoints of them); ``held_out``: fit each step's proxy on the
    first half of its sequences and score the second (per_checkpoint only). Controls
    (:class:`TangentEnergyConfig`): ``draws`` per measurement; ``bootstrap`` replicates for the
    intervals (0 = none) and their ``interval`` method; ``data_matched_m``, the PCA span of the
    data-matched controls (unset = off); ``seed`` of the fits and the controls.
    ``pretrained_sae`` adds published SAEs as proxies (:class:`PretrainedSAESpec`)."""

    methods: tuple[str, ...] = ("seminmf", "pca")
    rank: int = 16
    fit_policy: str = "per_checkpoint"
    early_fraction: float = 0.3
    window_checkpoints: int = 8
    draws: int = 100
    bootstrap: int = 200
    interval: str = "studentized"
    data_matched_m: int | None = None
    seminmf_max_iter: int = 500
    sae_samples: int = 100_000
    sae_k: int = 16
    centre: bool = True
    mean_direction: bool = True
    held_out: bool = False
    seed: int = 0
    pretrained_sae: PretrainedSAESpec | None = None

    def __post_init__(self) -> None:
        if self.fit_policy not in FIT_POLICIES:
            raise ValueError(
                f"probes.tangent_energy.fit_policy must be one of {FIT_POLICIES}, got "
                f"{self.fit_policy!r}{suggest(self.fit_policy, FIT_POLICIES)}"
            )
        for method in self.methods:
            if method == PRETRAINED_SAE:
                raise ValueError(
                    f"probes.tangent_energy.methods: {PRETRAINED_SAE!r} is not fitted; enable it "
                    f"with a [probes.tangent_energy.{PRETRAINED_SAE}] table (release, ids)"
                )
            if method not in METHODS:
                raise ValueError(
                    f"probes.tangent_energy.methods: unknown method {method!r}; allowed: "
                    f"{METHODS}{suggest(method, METHODS)}"
                )
        if self.held_out and self.fit_policy != "per_checkpoint":
            raise ValueError(
                "probes.tangent_energy.held_out = true fits each step's proxy on half of its "
                "sequences and scores the other half: it needs fit_policy = 'per_checkpoint' "
                "(frozen_early proxies are fitted on other checkpoints already)"
            )
        check_fraction(self.early_fraction, "probes.tangent_energy.early_fraction", low_open=True)
        check_count(self.window_checkpoints, "probes.tangent_energy.window_checkpoints", minimum=1)
        self.proxy_config()
        self.energy_config()

    def proxy_config(self) -> ProxyConfig:
        return ProxyConfig(
            methods=self.methods,
            rank=self.rank,
            seed=self.seed,
            seminmf_max_iter=self.seminmf_max_iter,
            sae_samples=self.sae_samples,
            sae_k=self.sae_k,
            centre=self.centre,
            mean_direction=self.mean_direction,
        )

    def energy_config(self) -> TangentEnergyConfig:
        return TangentEnergyConfig(
            draws=self.draws,
            bootstrap=self.bootstrap,
            interval=self.interval,
            data_matched_m=self.data_matched_m,
            seed=self.seed,
        )
