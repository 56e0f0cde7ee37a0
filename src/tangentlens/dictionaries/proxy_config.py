"""The tangent proxies' settings: which dictionaries span them, at which rank
(:class:`ProxyConfig`), and published SAEs as proxies (:class:`PretrainedSAESpec`). Light: a
recipe validates them without torch."""

from __future__ import annotations

from dataclasses import dataclass

from tangentlens.checks import check_count, suggest

__all__ = ["MEAN_DIRECTION", "METHODS", "PRETRAINED_SAE", "PretrainedSAESpec", "ProxyConfig"]


#: The dictionaries a tangent proxy can be spanned by.
METHODS: tuple[str, ...] = ("seminmf", "pca", "sae")
#: The method name of the rank-1 proxy m̂, the mean direction (``ProxyConfig.mean_direction``).
MEAN_DIRECTION = "mean_direction"


@dataclass(frozen=True)
class ProxyConfig:
    """Which dictionaries span the proxies, at which rank, with which seed.

    ``methods``: the dictionaries that span them (from :data:`METHODS`); ``rank``: their rank k;
    ``seed``: the seed of the seeded fits (the ``[proxies]`` stage's ``seed`` seeds the controls
    too);
    ``seminmf_max_iter``: semi-NMF iterations;
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
        for method in methods:
            if method == PRETRAINED_SAE:
                raise ValueError(
                    f"methods: {PRETRAINED_SAE!r} is not fitted; enable it with a "
                    f"[proxies.{PRETRAINED_SAE}] table (release, ids)"
                )
            if method not in METHODS:
                raise ValueError(
                    f"methods: unknown method {method!r}; allowed: {METHODS}"
                    f"{suggest(method, METHODS)}"
                )
        if not methods or len(set(methods)) != len(methods):
            raise ValueError(f"methods must be distinct names from {METHODS}, got {methods!r}")
        object.__setattr__(self, "methods", methods)
        check_count(self.rank, "rank", minimum=1)
        check_count(self.seed, "seed", minimum=0)
        check_count(self.seminmf_max_iter, "seminmf_max_iter", minimum=1)
        check_count(self.sae_samples, "sae_samples", minimum=1)
        check_count(self.sae_k, "sae_k", minimum=1)
        for name in ("centre", "mean_direction"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")


#: The method name of the proxies spanned by published SAEs (:class:`PretrainedSAESpec`).
PRETRAINED_SAE = "pretrained_sae"


@dataclass(frozen=True)
class PretrainedSAESpec:
    """Published SAEs as tangent proxies (``[proxies.pretrained_sae]``, method
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
        path = f"proxies.{PRETRAINED_SAE}"
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
