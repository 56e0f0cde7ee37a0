"""Subspace stability (METHODS.md §1.8): principal angles between tangent proxies.

Every comparison is between proxies fitted on each step's own activations (its *refit*): under
``frozen_early`` the frozen proxy compared with itself would read 0° by construction. Per site and
step: between every pair of methods (``method = "pca~seminmf"``), between this step's refit and
the previous selected step's (``method = "<m>@prev"``), under ``frozen_early`` between this
step's refit and the frozen proxy (``method = "<m>@frozen"``: is the frozen proxy still valid?),
and, with ``seeds > 1``, between the seeded dictionaries (semi-NMF, SAE) refitted on this step's
sample with other seeds and the same refit at the recipe's seed (``method = "<m>~seed<s>"``; same
data, so only the seed differs). Metrics: ``principal_angle_mean`` and ``principal_angle_max``
(degrees), each beside its random-subspace baseline (``principal_angle_mean_random``,
``principal_angle_max_random``: the same over pairs of Haar-random subspaces of ℝ^d of the two
ranks, :func:`~tangentlens.metrics.random_principal_angles`). Random subspaces are already far
apart — about 63°, 72° and 76° on average at (d, k) = (64, 16), (128, 16), (768, 64) — so an
angle reads as "stable" only well below its baseline, not merely below 90°.

Semi-NMF fits move with the last bits of the arithmetic (METHODS.md §1.8: 0.5°–3.8° on another
CPU's BLAS, numpy against torch), so each step's semi-NMF refit reports its **rounding floor**
(``method = "seminmf"``: ``rounding_angle_mean``, ``rounding_angle_max``, the angles between the
refit and a refit of the same rows scaled by 1 + 2⁻²⁰ — one span in exact arithmetic,
:func:`~tangentlens.dictionaries.rounding_angles`), and every angle between proxies where a
semi-NMF fit is involved carries ``principal_angle_max_floor``: the sum of the endpoints'
``rounding_angle_max`` (a PCA fit's is 0: an eigen-solver in float64; ``<m>@frozen`` counts this
step's refit only, the frozen fit's own floor is not measured). The largest principal angle is a
metric between subspaces, so rounding alone moves an angle by at most that sum: an angle, or a
change of one, within its floor is not a change of geometry."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tangentlens import dictionaries, metrics  # lazy packages
from tangentlens._lazy import LazyModule
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.checks import check_count
from tangentlens.contract import AcrossInputs, Probe, StepInputs
from tangentlens.reporting import Estimator, Reporting
from tangentlens.results import StepLabel, make_row

if TYPE_CHECKING:
    import torch

    from tangentlens.typing import Basis

fitting = LazyModule("tangentlens.proxies")
logger = logging.getLogger(__name__)

__all__ = [
    "NAME",
    "PROBE",
    "SubspaceStabilityConfig",
    "floor_rows",
    "reseeded_proxies",
    "rounding_floors",
    "rows",
    "transition_rows",
]


@dataclass(frozen=True)
class SubspaceStabilityConfig:
    """``seeds``: how many seeds the seeded dictionaries are compared across (1 = none);
    ``rounding_floor``: measure each step's semi-NMF rounding floor (two more semi-NMF fits per
    site and step, about as long as the step's own refit twice over; ``false`` leaves the floor
    rows out)."""

    seeds: int = 1
    rounding_floor: bool = True

    def __post_init__(self) -> None:
        check_count(self.seeds, "seeds", minimum=1)
        if not isinstance(self.rounding_floor, bool):
            raise ValueError(f"rounding_floor must be true or false, got {self.rounding_floor!r}")

    def to_table(self) -> dict[str, Any]:
        """The recipe table: ``rounding_floor`` only when false (a run from before that key,
        without floor rows, resumes; its new steps add them)."""
        table = dataclasses.asdict(self)
        if self.rounding_floor:
            del table["rounding_floor"]
        return table


#: The probe's name: its recipe table ``[probes.subspace_stability]`` and its rows' ``probe``.
NAME = "subspace_stability"


#: Floors ``{site: {method: rounding_angle_max}}`` (degrees) of the fits a step compares.
Floors = dict[str, dict[str, float]]
#: Methods whose fit has no rounding floor worth measuring: an eigen-solver in float64.
_EXACT = ("pca", "mean_direction")


def _angle_rows(
    data: StepLabel | Capture,
    site: str,
    method: str,
    a: Basis,
    b: Basis,
    floor: float | None = None,
) -> list[dict[str, Any]]:
    degrees = metrics.principal_angles(a, b) * 180 / math.pi
    common = {"site": site, "method": method, "rank": min(a.shape[1], b.shape[1])}
    random_mean, random_max = metrics.random_principal_angles(a.shape[0], a.shape[1], b.shape[1])
    out = [
        make_row(data, NAME, "principal_angle_mean", float(degrees.mean()), **common),
        make_row(data, NAME, "principal_angle_mean_random", random_mean, **common),
        make_row(data, NAME, "principal_angle_max", float(degrees.max()), **common),
        make_row(data, NAME, "principal_angle_max_random", random_max, **common),
    ]
    if floor is not None:
        out.append(make_row(data, NAME, "principal_angle_max_floor", floor, **common))
    return out


def _floor(floors: dict[str, float], *methods: str) -> float | None:
    """The floor of an angle between fits of ``methods``: the sum of their floors; None when a
    semi-NMF fit is not among them (nothing to report) or one floor is unknown (an SAE)."""
    if not any(m in floors for m in methods):
        return None
    known = [0.0 if m in _EXACT else floors.get(m) for m in methods]
    return None if None in known else sum(known)  # type: ignore[arg-type]


def rounding_floors(stats: Any, stage: Any) -> dict[str, dict[str, torch.Tensor]]:
    """The rounding floor of each step's semi-NMF refit (the proxies ``stage``'s methods, a
    :class:`~tangentlens.core.proxy_stage.ProxiesSpec`): ``{site: {"seminmf": angles}}``, the
    principal angles (degrees) between a fit of the site's sampled rows — centred as the stage
    centres them — and a fit of the same rows scaled by 1 + 2⁻²⁰
    (:func:`~tangentlens.dictionaries.rounding_angles`); empty without semi-NMF."""
    if stage is None or "seminmf" not in stage.methods:
        return {}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for site, site_stats in stats.sites.items():
        if site_stats.reservoir is None or len(site_stats.reservoir) <= stage.rank:
            continue
        rows = site_stats.reservoir.columns()["H"].double()
        if stage.centre:
            rows = rows - (site_stats.h.sum / site_stats.h.count).to(rows.device)
        try:
            angles = dictionaries.rounding_angles(
                rows, stage.rank, seed=stage.seed, max_iter=stage.seminmf_max_iter
            )
        except ValueError as error:  # a fit collapsed: no floor for it
            logger.warning("%s: no semi-NMF rounding floor: %s", site, error)
            continue
        out[site] = {"seminmf": angles}
    return out


def floor_rows(data: Capture, floors: dict[str, dict[str, torch.Tensor]]) -> list[dict[str, Any]]:
    """``rounding_angle_mean`` / ``rounding_angle_max`` of each fit in ``floors``."""
    out: list[dict[str, Any]] = []
    for site, by_method in floors.items():
        for method, angles in sorted(by_method.items()):
            common = {"site": site, "method": method, "rank": angles.numel()}
            out += [
                make_row(data, NAME, "rounding_angle_mean", float(angles.mean()), **common),
                make_row(data, NAME, "rounding_angle_max", float(angles.max()), **common),
            ]
    return out


def rows(
    data: Capture,
    proxies: dict[str, dict[str, Basis]],
    reseeded: dict[str, dict[str, dict[int, Basis]]],
    config: SubspaceStabilityConfig,
    frozen: dict[str, dict[str, Basis]] | None = None,
    floors: Floors | None = None,
) -> list[dict[str, Any]]:
    """Angles within one step. ``proxies``: this step's refits ``{site: {method: basis}}``;
    ``reseeded[site][method][seed]`` the dictionary refitted on this step's sample at the
    recipe's seed (the smallest) and at other seeds (empty when ``seeds == 1``); ``frozen`` the
    frozen-early proxies (None otherwise); ``floors`` the refits' rounding floors (degrees), for
    ``principal_angle_max_floor`` beside the angles that involve them (seeds are compared
    without: the other seeds' fits have no floor measured)."""
    out: list[dict[str, Any]] = []
    floors = floors or {}
    for site, by_method in proxies.items():
        known = floors.get(site, {})
        for (m1, q1), (m2, q2) in itertools.combinations(sorted(by_method.items()), 2):
            out += _angle_rows(data, site, f"{m1}~{m2}", q1, q2, _floor(known, m1, m2))
        for method, by_seed in sorted(reseeded.get(site, {}).items()):
            base_seed, *others = sorted(by_seed)
            for seed in others:
                label = f"{method}~seed{seed}"
                out += _angle_rows(data, site, label, by_seed[base_seed], by_seed[seed])
        if frozen is not None:
            out += _paired_rows(data, site, by_method, frozen, "frozen", known, {})
    return out


def transition_rows(
    data: StepLabel,
    proxies: dict[str, dict[str, Basis]],
    previous: dict[str, dict[str, Basis]],
    floors: Floors | None = None,
    previous_floors: Floors | None = None,
) -> list[dict[str, Any]]:
    """Angles between this step's refits ``proxies`` and the previous selected step's
    (``method = "<m>@prev"``), keyed at this step; ``floors`` / ``previous_floors`` the two
    steps' rounding floors (``principal_angle_max_floor``: their sum)."""
    out: list[dict[str, Any]] = []
    floors, previous_floors = floors or {}, previous_floors or {}
    for site, by_method in proxies.items():
        out += _paired_rows(
            data, site, by_method, previous, "prev", floors.get(site, {}),
            previous_floors.get(site, {}),
        )  # fmt: skip
    return out


def _paired_rows(
    data: StepLabel | Capture,
    site: str,
    by_method: dict[str, Basis],
    other: dict[str, dict[str, Basis]],
    label: str,
    floors: dict[str, float],
    other_floors: dict[str, float],
) -> list[dict[str, Any]]:
    """``<m>@label`` angles; the floor sums this fit's and, where measured, the other's (the
    frozen fit's is not)."""
    out: list[dict[str, Any]] = []
    for method, basis in sorted(by_method.items()):
        if method in other.get(site, {}):
            floor = _floor(floors, method)
            if floor is not None and method in other_floors:
                floor += other_floors[method]
            out += _angle_rows(data, site, f"{method}@{label}", basis, other[site][method], floor)
    return out


def _step_floors(step_rows: Any, step: int) -> Floors:
    """The ``rounding_angle_max`` rows of ``step`` among ``step_rows``, as :data:`Floors`."""
    out: Floors = {}
    for r in step_rows:
        if r["probe"] == NAME and r["step"] == step and r["metric"] == "rounding_angle_max":
            out.setdefault(r["site"], {})[r["method"]] = r["value"]
    return out


def reseeded_proxies(stats: Any, stage: Any, seeds: int) -> dict[str, dict[str, dict[int, Basis]]]:
    """The seeded dictionaries (the proxies ``stage``'s methods but PCA; a
    :class:`~tangentlens.core.proxy_stage.ProxiesSpec`) refitted on a step's statistics
    ``stats`` with seeds ``seed, seed + 1, …`` (the recipe's seed included, so seeds are
    compared on the same data): ``{site: {method: {seed: basis}}}``, empty when ``seeds``
    is 1 or no method is seeded. A seed whose fit collapsed (fewer than ``rank`` dimensions:
    refitted from another seed, or refused) is left out: its angle would not be that seed's."""
    seeded = tuple(m for m in stage.methods if m != "pca")
    if seeds < 2 or not seeded:
        return {}
    out: dict[str, dict[str, dict[int, Basis]]] = {}
    fitted = stage.proxy_config()
    for offset in range(seeds):
        seed = stage.seed + offset
        config = dataclasses.replace(fitted, methods=seeded, seed=seed, mean_direction=False)
        for site, site_stats in stats.sites.items():
            try:
                fit = fitting.fit_proxies(site_stats, config)
            except ValueError as error:  # collapsed from every seed it tried
                logger.warning("%s: the seed-%d refit is left out: %s", site, seed, error)
                continue
            for method, basis in fit.bases.items():
                if not fit.diagnostics.get(method, {}).get("seminmf_restarts"):
                    out.setdefault(site, {}).setdefault(method, {})[seed] = basis
    # the other seeds are compared with the recipe's: without it, nothing to compare
    return {
        site: {m: by for m, by in methods.items() if stage.seed in by}
        for site, methods in out.items()
    }


def _step_rows(inputs: StepInputs, config: SubspaceStabilityConfig) -> list[dict[str, Any]]:
    stats = inputs.capture.statistics
    reseeded = reseeded_proxies(stats, inputs.tangent, config.seeds)
    floors = rounding_floors(stats, inputs.tangent) if config.rounding_floor else {}
    maxima = {s: {m: float(a.max()) for m, a in by.items()} for s, by in floors.items()}
    own = inputs.own or {}
    return floor_rows(inputs.capture, floors) + rows(
        inputs.capture, own, reseeded, config, inputs.frozen, maxima
    )


def _across_rows(inputs: AcrossInputs, config: SubspaceStabilityConfig) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in inputs.transitions:
        floors = _step_floors(inputs.step_rows, t.now["step"])
        before = _step_floors(inputs.step_rows, t.before["step"])
        out += transition_rows(t.label, t.now["proxies"], t.before["proxies"], floors, before)
    return out


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=SubspaceStabilityConfig,
    scope="tangent",
    needs=Needs(),
    rows=_step_rows,
    across=_across_rows,
    refits=True,
    metrics={
        "principal_angle_mean": (
            "mean principal angle (degrees) between two proxies: `a~b` methods, `<m>@prev` "
            "previous step, `<m>@frozen` the frozen proxy, `<m>~seed<s>` seeds (each step's own "
            "refits)"
        ),
        "principal_angle_mean_random": (
            "its random baseline: the mean principal angle of Haar-random subspaces of ℝ^d of "
            "the two ranks, averaged over 200 seeded pairs (≈ 63° at d = 64, k = 16): an angle "
            "reads as stable only well below it"
        ),
        "principal_angle_max": "the largest principal angle (degrees)",
        "principal_angle_max_random": "its random baseline, likewise",
        "principal_angle_max_floor": (
            "its rounding floor where a semi-NMF fit is compared: the sum of the two fits' "
            "`rounding_angle_max` (PCA's is 0; `<m>@frozen` counts this step's refit only): "
            "rounding alone moves the angle by up to this"
        ),
        "rounding_angle_mean": (
            "a step's semi-NMF refit against a refit of the same rows scaled by 1 + 2⁻²⁰ (one "
            "span in exact arithmetic): the mean principal angle (degrees), rounding alone"
        ),
        "rounding_angle_max": "likewise, the largest principal angle (degrees)",
    },
    reporting=Reporting(
        tables=(),
        figures=(),
        estimators=(
            Estimator(
                "subspace_stability",
                "angles between each step's own refits; <m>@frozen = refit vs frozen; "
                "principal_angle_max_floor: what rounding alone moves a semi-NMF angle by",
            ),
        ),
    ),
)
