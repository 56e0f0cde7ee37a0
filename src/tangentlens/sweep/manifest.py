"""The run's manifest: the resolved recipe, the loader, the plan's steps and fit window, the
estimators behind the metrics, versions, executor and thread count, the statistics' precision
(with its bound when float32) and whether the run is bit-reproducible on its device; completed
with weights hashes and exclusion counts when every unit is done."""

from __future__ import annotations

import functools
import platform
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from tangentlens.capture.precision import relative_bound, resolve_precision
from tangentlens.core.recipe import Recipe
from tangentlens.data import ANALYSIS_EXCLUSION_REASONS
from tangentlens.models.catalog import suite_loader
from tangentlens.models.shapes import suite_shape
from tangentlens.registry import ENTRY_POINT_GROUP, builtin_probes
from tangentlens.sweep.plan import Plan
from tangentlens.sweep.store import RunStore, read_results

__all__ = [
    "ESTIMATORS",
    "finished_manifest",
    "initial_manifest",
    "probe_estimators",
    "reproducibility",
    "statistics_precision",
]

#: The core's estimator choices behind the metrics, recorded in every run's manifest beside
#: each probe's own (:func:`probe_estimators`).
ESTIMATORS: dict[str, str] = {
    "fit_window": "frozen_early: the suite's checkpoints with step ≤ early_fraction × final step, "
    "at most window_checkpoints, evenly spaced in step",
    "controls": "exchangeable (headline metrics): Haar k-frames in span(m̂)⊥, m̂ the mean "
    "direction projected out of the proxy (ℝ^d for mean_direction itself), p calibrated under a "
    "proxy uniform in span(m̂)⊥; complement (*_complement_*): Haar k-frames in span(T, m̂)⊥; "
    "Gaussian d × k draws projected onto the allowed subspace, so frames depend on spans only",
    "energy_ratio": "E(T) over the control family's exact mean k/(d − r)·(1 − E(X)) (X = m̂, or "
    "span(T, m̂) for the complement; the update alignment's likewise), not over the frames "
    "drawn, whose mean is reported beside it; the frames give z and p",
    "proxies": "every method fitted on activations centred per checkpoint (window checkpoints "
    "centred before pooling), with the mean direction m̂ projected out; mean_direction = m̂ as a "
    "rank-1 proxy, following the fit policy (pooled window mean or the step's mean); held_out: "
    "fitted on the first half of a step's sequences, energies scored on the second",
    "pretrained_sae": "published SAEs (SAELens registry): the rank latents most often active "
    "(code > 0; ties: larger mean activation) on the raw sampled rows of one step (select_step, "
    "default the first selected; held_out: its fitting half), chosen once; the proxy is the "
    "orthonormalised span of their decoder rows, m̂ projected out as for every method",
    "positions": "one kept-position set for every statistic and the token frequencies; masked-LM: "
    "every non-special original position ([MASK] inputs included), binned by the original token, "
    "gradients at every kept row; analysis text tokenised and packed as in training",
}


def probe_estimators(recipe: Recipe) -> dict[str, str]:
    """The estimator notes the probes declare (``Reporting.estimators``): every built-in
    probe's and those of the recipe's probes."""
    probes = [*builtin_probes().values(), *(e.probe for e in recipe.probes.values())]
    return {e.key: e.text for probe in probes for e in probe.reporting.estimators}


def _interval_estimator(recipe: Recipe) -> dict[str, str]:
    """Where the energy intervals come from: per-sequence sums gathered during capture when the
    proxies are known before it (frozen_early), else the reservoir's sample."""
    from tangentlens.probes import tangent_energy

    energy, stage = recipe.config(tangent_energy.NAME), recipe.proxies
    if energy is None or stage is None or not energy.bootstrap:
        return {}
    if stage.frozen:
        source = tangent_energy.INTERVAL_ALL_SEQUENCES
        how = "every analysed sequence, from per-sequence sums gathered during capture"
    else:
        source = tangent_energy.INTERVAL_SAMPLE
        how = "the reservoir's sampled sequences, rescaled onto the reported value"
    ratios = (
        "ratios of per-sequence sums, the controls' at their exact mean projector; quantiles at "
        "the (B + 1)·p-th order statistic"
    )
    return {"energy_interval": f"{energy.interval} bootstrap over {source}: {how}; {ratios}"}


def _git_hash() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _versions() -> dict[str, str]:
    names = ("tangentlens", "torch", "transformer-lens", "sae-lens", "transformers", "numpy")
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@functools.cache
def _owners() -> Mapping[str, list[str]]:
    """Top-level package → the installed distributions that ship it (one scan of every
    distribution's file list: seconds with many packages installed, so done once)."""
    return metadata.packages_distributions()


def _distribution(module: str, key: str) -> tuple[str, str]:
    """(distribution, version) that ships ``module``: the one that registers the entry point
    ``key``, else the installed one owning the module's top-level package, else unknown."""
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP, name=key):
        if entry.dist is not None:
            return entry.dist.name, entry.dist.version
    top = module.split(".")[0]
    names = ["tangentlens"] if top == "tangentlens" else _owners().get(top, [])
    try:
        return (names[0], metadata.version(names[0])) if names else ("unknown", "unknown")
    except metadata.PackageNotFoundError:
        return names[0], "unknown"


def _probe_sources(recipe: Recipe) -> dict[str, dict[str, str]]:
    """Recipe key → the probe's name, the module that declares it and the distribution (with
    its version) that ships it: what a reader needs to find a user's probe again."""
    out = {}
    for key, entry in recipe.probes.items():
        probe = entry.probe
        distribution, version = _distribution(probe.module, key)
        out[key] = {
            "name": probe.name,
            "module": probe.module,
            "distribution": distribution,
            "version": version,
        }
    return out


def statistics_precision(recipe: Recipe, device: str) -> dict[str, Any]:
    """``statistics_dtype``: ``capture.precision`` resolved on ``device`` (the precision every
    unit accumulates at); when float32, ``statistics_bound``: the bound on the second moments'
    error per unit of ``Σ‖x − c‖²`` at the recipe's batch rows and how to read it
    (:mod:`tangentlens.capture.precision`)."""
    resolved = resolve_precision(recipe.capture.precision, device)
    out: dict[str, Any] = {"statistics_dtype": resolved}
    if resolved == "float32":
        rows = recipe.data.batch_size * recipe.data.seq_len
        out["statistics_bound"] = {
            "relative": relative_bound(rows),
            "batch_rows": rows,
            "reads": "‖ΔM‖₂ ≤ relative · Σ‖x − c‖² (c: each accumulator's frozen shift); "
            "eigenvalues move by at most that; an energy fraction of rank k by (k + 1)·ε/(tr M "
            "− ε)",
        }
    return out


def reproducibility(device: str) -> dict[str, Any]:
    """Whether a run on ``device`` gives the same table bit for bit when run again there:
    ``bit_reproducible`` and why (``reproducibility``)."""
    if device.startswith("cuda"):
        return {
            "bit_reproducible": False,
            "reproducibility": "not bit for bit on CUDA: float64 index_add_ (per-type and "
            "per-sequence sums) and scatter reductions use atomics, so their last bits vary "
            "from run to run; values agree within float64 rounding of the summation order",
        }
    return {
        "bit_reproducible": True,
        "reproducibility": "bit for bit on this device type: deterministic kernels, threads "
        "pinned by capture.threads, seeded draws",
    }


def initial_manifest(recipe: Recipe, plan: Plan, device: str) -> dict[str, Any]:
    """What is known before any unit runs (``recipe`` is the identity ``--resume`` checks);
    ``loader`` is the loader every unit loads checkpoints with (``suite.loader`` resolved for
    the suite's family: ``"hooked"`` or ``"bridge"``); ``n_layers`` the suite's blocks (what
    ``tangentlens compare`` reads relative depth against)."""
    return {
        "recipe": recipe.to_dict(),
        "suite": {"name": recipe.suite.name},
        "n_layers": suite_shape(recipe.suite.name).n_layers,
        "loader": suite_loader(recipe.suite.name, recipe.suite.loader),
        "steps": list(plan.steps),
        "fit_window": list(plan.window),
        "units": len(plan.units),
        "estimators": {**ESTIMATORS, **probe_estimators(recipe), **_interval_estimator(recipe)},
        "versions": _versions(),
        "probes": _probe_sources(recipe),
        "git_hash": _git_hash(),
        "python": platform.python_version(),
        "device": device,
        "dtype": recipe.suite.dtype,
        **statistics_precision(recipe, device),
        **reproducibility(device),
        "threads": recipe.capture.threads,
        "loss_reduction": recipe.capture.reduction,
        "seeds": {"capture": recipe.capture.seed},
        "finished": False,
    }


def finished_manifest(
    store: RunStore, suite: Any, plan: Plan, executor: dict[str, Any], data_sha256: str
) -> dict[str, Any]:
    """The manifest once every unit is done: the suite's kind and family, weights hashes, the
    analysis data's hash, masked-position counts, the executor of this (last) invocation."""
    manifest = store.read_manifest()
    manifest["finished"] = True
    manifest["suite"] = {"kind": suite.kind, "name": suite.name, "family": suite.family}
    manifest["weights_hashes"] = {str(s): suite.weights_hash(s) for s in plan.steps}
    manifest["data_sha256"] = data_sha256
    manifest["executor"] = executor
    manifest["excluded_policy"] = ", ".join(ANALYSIS_EXCLUSION_REASONS)
    manifest["masked_tokens"] = _masked_counts(store)
    return manifest


def _masked_counts(store: RunStore) -> dict[str, dict[str, int]]:
    """Positions excluded per reason at every step, from the capture rows of the parts."""
    counts: dict[str, dict[str, int]] = {}
    for r in read_results(store.root).to_pylist():
        if r["probe"] == "capture" and r["metric"].startswith("excluded_"):
            reason = r["metric"].removeprefix("excluded_")
            counts.setdefault(str(r["step"]), {})[reason] = int(r["value"])
    return counts
