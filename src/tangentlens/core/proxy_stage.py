"""The proxies stage: the recipe's ``[proxies]`` section, which says how each step's tangent
proxies are made — which dictionaries span them at which rank, on which checkpoints' activations
they are fitted (the fit policy and its window, held out or not), which published SAEs join them —
and how many seeded control frames every ``tangent`` probe scores them against. One ``seed`` seeds
the fits and the control frames.

The ``tangent`` probes (``tangent_energy``, ``anisotropy_share``, ``subspace_stability``,
``update_alignment``, a user's) score what this stage produces; a recipe that enables one without
a ``[proxies]`` section gets the stage's defaults. The plan, the units, the memory plan, the
runner, the manifest and :func:`tangentlens.measure` ask the stage, never a probe.

Recipes written before the stage kept these keys under ``[probes.tangent_energy]``: they are moved
here (:func:`move_legacy_keys`), with one warning line naming where they live now. Light: no
torch is imported.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from tangentlens.checks import check_count
from tangentlens.dictionaries.policy import FitConfig
from tangentlens.dictionaries.proxy_config import PretrainedSAESpec, ProxyConfig

__all__ = ["LEGACY_PROBE", "PROXIES", "ProxiesSpec", "move_legacy_keys"]

logger = logging.getLogger(__name__)

#: The recipe section of the stage.
PROXIES = "proxies"
#: The probe table that held the stage's keys before the stage existed.
LEGACY_PROBE = "tangent_energy"


@dataclass(frozen=True)
class ProxiesSpec:
    """The proxies every ``tangent`` probe scores (``[proxies]``).

    ``methods``: the dictionaries that span them (``seminmf``, ``pca``, ``sae``); ``rank``: their
    rank k; ``seed``: seeds the fits and the control frames; ``seminmf_max_iter``: semi-NMF
    iterations; ``sae_samples``: activation rows the SAE trains on (the sample is cycled);
    ``sae_k``: active latents per row of the TopK SAE; ``centre``: fit on activations centred per
    checkpoint; ``mean_direction``: add the rank-1 proxy m̂ and project it out of the others.
    ``fit_policy``: ``frozen_early`` (fit once on the suite's early checkpoints) or
    ``per_checkpoint`` (each step's own fit); ``early_fraction`` and ``window_checkpoints``: the
    frozen-early window (the checkpoints with step ≤ early_fraction × final step, at most
    window_checkpoints of them); ``held_out``: fit each step's proxy on the first half of its
    sequences and score the second (``per_checkpoint`` only). ``draws``: seeded control frames
    per measurement, drawn from ``(seed, step, layer + 1, bin + 1, draw)`` and shared by every
    tangent probe (100, ours; the paper used 20). ``pretrained_sae``: a
    ``[proxies.pretrained_sae]`` table adds published SAEs as proxies (release, ids,
    select_step).

    >>> ProxiesSpec(rank=8).proxy_config().rank
    8
    """

    # the fit's and the policy's keys, with their defaults (one source: ProxyConfig, FitConfig)
    methods: tuple[str, ...] = ProxyConfig.methods
    rank: int = ProxyConfig.rank
    seed: int = ProxyConfig.seed
    seminmf_max_iter: int = ProxyConfig.seminmf_max_iter
    sae_samples: int = ProxyConfig.sae_samples
    sae_k: int = ProxyConfig.sae_k
    centre: bool = ProxyConfig.centre
    mean_direction: bool = ProxyConfig.mean_direction
    fit_policy: str = FitConfig.fit_policy
    early_fraction: float = FitConfig.early_fraction
    window_checkpoints: int = FitConfig.window_checkpoints
    held_out: bool = FitConfig.held_out
    draws: int = 100
    pretrained_sae: PretrainedSAESpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", self.proxy_config().methods)  # checks them all
        FitConfig(self.fit_policy, self.early_fraction, self.window_checkpoints, self.held_out)
        check_count(self.draws, "draws", minimum=1)

    def proxy_config(self) -> ProxyConfig:
        """What the dictionaries are fitted with (:class:`ProxyConfig`)."""
        names = {f.name for f in dataclasses.fields(ProxyConfig)}
        return ProxyConfig(**{n: getattr(self, n) for n in names})

    @property
    def frozen(self) -> bool:
        """Whether the scored proxies are fitted once on the early window (``frozen_early``)."""
        return self.fit_policy == "frozen_early"


def _stage_keys() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(ProxiesSpec))


def move_legacy_keys(
    data: dict[str, Any], where: str = "the recipe", *, notice: bool = True
) -> dict[str, Any]:
    """``data`` (a recipe's tables, or a manifest's recorded recipe) with the stage's keys found
    under ``probes.tangent_energy`` moved to ``proxies``, as recipes wrote them before the stage;
    with ``notice``, one warning line names the keys and where they live now. A key given in
    both places with different values is refused. ``data`` itself is not changed."""
    probes = data.get("probes")
    table = probes.get(LEGACY_PROBE) if isinstance(probes, dict) else None  # else refused later
    if not isinstance(table, dict):
        return data
    moved = [key for key in table if key in _stage_keys()]
    if not moved:
        return data
    stage = dict(data.get(PROXIES) or {})
    for key in moved:
        if key in stage and stage[key] != table[key]:
            raise ValueError(
                f"{where} sets {key} twice: probes.{LEGACY_PROBE}.{key} = {table[key]!r} and "
                f"{PROXIES}.{key} = {stage[key]!r}; keep {PROXIES}.{key} only"
            )
        stage[key] = table[key]
    kept = {k: v for k, v in table.items() if k not in moved}
    if notice:
        logger.warning(
            "%s: probes.%s.{%s} now live in [%s] (read from there; move them to silence this)",
            where,
            LEGACY_PROBE,
            ", ".join(moved),
            PROXIES,
        )
    return {**data, "probes": {**data["probes"], LEGACY_PROBE: kept}, PROXIES: stage}
