"""What each unit of a sweep plan does (see :mod:`tangentlens.sweep.plan` for the graph).

:func:`run_unit` runs one unit in the calling process, on any machine that shares the run
directory's filesystem: it reads only files earlier units wrote, pins torch's thread count from
the recipe while it runs (so reductions happen in the same order wherever it runs; the caller's
count is restored after), and writes its output
atomically. While it runs, ``units/<unit>.json`` names its host, pid (and Slurm job); a
failure leaves the traceback in ``logs/<unit>.log``, a success its time in
``timings/<unit>.json`` (:mod:`tangentlens.sweep.timing`). A unit runs with full float32 (no
TF32: :func:`~tangentlens.runtime.exact_float32`, the caller's settings restored after) and its
statistics at the precision the manifest records (``statistics_dtype``); one that runs out of
GPU memory fails in one line (:class:`UnitOutOfMemoryError`: the plan's peak and a
``data.batch_size`` that fits) and is not retried unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tangentlens.capture import (
    MomentAccumulator,
)
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.capture.precision import resolve_precision
from tangentlens.core.bounds import check_width
from tangentlens.core.data import (
    DATA_FILE,
    AnalysisData,
    load_analysis_data,
    prepare_analysis_data,
    save_analysis_data,
)
from tangentlens.core.recipe import Recipe
from tangentlens.core.step import (
    Proxies,
    Status,
    capture_scored,
    capture_sites,
    capture_step,
    step_rows,
    with_fixed,
)
from tangentlens.dictionaries import SAE, in_window
from tangentlens.dictionaries.proxy_config import PRETRAINED_SAE
from tangentlens.models import lens_model, open_suite
from tangentlens.models.hub import hf_offline_mode, offline_requested
from tangentlens.models.shapes import suite_shape
from tangentlens.models.suites import CheckpointSuite
from tangentlens.probes import tangent_energy
from tangentlens.proxies import ActivationPool, FixedProxy
from tangentlens.registry import (
    FIT_PROBE,
    AcrossInputs,
    ModelFreeInputs,
    StateInputs,
    Transition,
)
from tangentlens.results import StepLabel, make_row, row
from tangentlens.runtime import Phases, exact_float32, threads
from tangentlens.sweep.memory import (
    headroom_bytes,
    host_budget,
    out_of_memory_line,
    plan_recipe,
    recipe_inputs,
)
from tangentlens.sweep.plan import PRETRAINED_UNIT, Unit, gathers_sequence_sums
from tangentlens.sweep.states import own_view
from tangentlens.sweep.store import DiskFullError, RunStore, disk_full, read_parts
from tangentlens.sweep.timing import TIMINGS_DIR, timing_record

__all__ = [
    "NOT_RETRIED",
    "UnitOutOfMemoryError",
    "UnitReport",
    "accelerator_budget",
    "failure_log",
    "read_failure",
    "retryable",
    "run_unit",
    "unit_log",
]


@dataclass(frozen=True)
class UnitReport:
    """Where and how long a unit ran."""

    unit: str
    host: str
    pid: int
    seconds: float


def unit_log(root: str | Path, unit: str) -> Path:
    """Where a failed unit's traceback is written."""
    return Path(root) / "logs" / f"{unit}.log"


def failure_log(root: str | Path, unit: str) -> str:
    """The failed unit's log when it was written ("" when it could not be: a full disk)."""
    log = unit_log(root, unit)
    return str(log) if log.exists() else ""


#: Errors a retry cannot change: the same recipe, inputs and files give the same error (a
#: configuration error, a missing file or module, a type or key the code does not know).
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    NotImplementedError,
    ImportError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)
#: The first line of the log of a unit whose error a retry cannot change.
NOT_RETRIED = "# not retried: a retry cannot change this error (same recipe, same inputs)"


class UnitOutOfMemoryError(ValueError):
    """A unit ran out of memory: one line naming it, what it needed, the plan's peak and a
    ``data.batch_size`` that fits (:func:`~tangentlens.sweep.memory.out_of_memory_line`). A
    configuration error (not retried: the same batch runs out again)."""


_ALLOCATION = re.compile(r"Tried to allocate ([0-9.]+) ([KMGT]i?B)")
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _requested(message: str) -> int:
    """Bytes the failed allocation asked for, read from CUDA's message (0 when not said)."""
    found = _ALLOCATION.search(message)
    if found is None:
        return 0
    return int(float(found.group(1)) * _UNITS.get(found.group(2), 1))


def _out_of_memory(
    recipe: Recipe, unit: Unit, error: BaseException, budget: int | None
) -> UnitOutOfMemoryError:
    """The one-line error of ``unit`` out of memory: it needed at least what it held at its
    peak (the GPU's peak allocation; the plan's on the host) plus what it asked for."""
    inputs = recipe_inputs(recipe, suite_shape(recipe.suite.name))
    device = recipe.suite.resolved_device()
    held = torch.cuda.max_memory_allocated(device) if device.startswith("cuda") else 0
    if not held:
        plan = plan_recipe(recipe)
        held = plan.host_peak if device == "cpu" else plan.accelerator_peak
    if budget is None and device == "cpu":
        budget = host_budget(recipe)
    line = out_of_memory_line(unit.name, inputs, held + _requested(str(error)), budget)
    return UnitOutOfMemoryError(line)


def retryable(error: BaseException) -> bool:
    """Whether running the unit again could end otherwise: not for :data:`PERMANENT_ERRORS`
    (configuration errors, missing files) nor a full disk; yes for the rest (a lost worker,
    memory, I/O, the network)."""
    return not (isinstance(error, PERMANENT_ERRORS) or disk_full(error))


def read_failure(log: str | Path) -> tuple[str, bool] | None:
    """``(error line, retryable)`` from a failed unit's log (the traceback's last line; not
    retryable when the log starts with :data:`NOT_RETRIED`); None when there is no log."""
    try:
        lines = [line for line in Path(log).read_text().splitlines() if line.strip()]
    except OSError:
        return None
    if not lines:
        return None
    return lines[-1], lines[0] != NOT_RETRIED


def run_unit(
    recipe: Recipe, root: str | Path, unit: Unit, status: Status | None = None
) -> UnitReport:
    """Run ``unit`` of ``recipe``'s plan in the run directory ``root`` (in this process)."""
    store = RunStore(Path(root))
    started = time.perf_counter()
    host, pid = socket.gethostname(), os.getpid()
    marker = store.root / "units" / f"{unit.name}.json"
    marker_text = {"host": host, "pid": pid, "started": time.time()}
    if "SLURM_JOB_ID" in os.environ:  # the Slurm job (array task) running the unit
        marker_text["job"] = os.environ["SLURM_JOB_ID"]
    store.write_file(f"units/{unit.name}.json", json.dumps(marker_text))
    device = recipe.suite.resolved_device()
    budget = accelerator_budget(device) if unit.kind in _ON_MODEL_DEVICE else None
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    try:
        # the caller's thread count and float32 settings are restored after
        with threads(recipe.capture.threads), exact_float32():
            try:
                parts = _RUNNERS[unit.kind](recipe, store, unit, status or (lambda text: None))
            except torch.OutOfMemoryError as error:
                raise _out_of_memory(recipe, unit, error, budget) from error
    except KeyboardInterrupt:  # Ctrl-C or a stop signal: abandoned, not failed
        raise
    except BaseException as error:
        if disk_full(error):
            raise DiskFullError(store.root, error) from error
        header = "" if retryable(error) else f"{NOT_RETRIED}\n"
        store.write_file(f"logs/{unit.name}.log", header + traceback.format_exc())
        raise
    finally:
        marker.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    record = timing_record(unit.kind, unit.step, seconds, host, parts)
    store.write_file(f"{TIMINGS_DIR}/{unit.name}.json", record)
    return UnitReport(unit.name, host, pid, seconds)


# ---------------------------------------------------------------------------- inputs


@functools.lru_cache(maxsize=4)
def _open_suite(name: str, offline: bool) -> CheckpointSuite:
    # workers never train a mini suite: the coordinator has (into a cache they share)
    return open_suite(name, offline=offline or None, train=False)


def _suite(recipe: Recipe) -> CheckpointSuite:
    return _open_suite(recipe.suite.name, recipe.suite.offline)


@functools.lru_cache(maxsize=4)
def _load_data(path: Path, n_bins: int, stamp: tuple[int, int]) -> AnalysisData:
    return load_analysis_data(path, n_bins)


def _data(recipe: Recipe, store: RunStore) -> AnalysisData:
    path = store.root / DATA_FILE
    if not path.exists():
        raise ValueError(f"{path} is missing: the data unit has not run in this run directory")
    info = path.stat()
    return _load_data(path, recipe.data.n_bins, (info.st_mtime_ns, info.st_size))


def _device(recipe: Recipe) -> torch.device:
    """Where a unit computes: the recipe's device, where its model runs (a unit without a model
    — the fit — computes there too)."""
    return torch.device(recipe.suite.resolved_device())


def _on_host(tensors: Any) -> Any:
    """``tensors`` (nested dicts and tuples of tensors) on the CPU: what a unit saves is read
    by units that may run on any machine."""
    if isinstance(tensors, torch.Tensor):
        return tensors.cpu()
    if isinstance(tensors, dict):
        return {key: _on_host(value) for key, value in tensors.items()}
    if isinstance(tensors, tuple | list):
        return type(tensors)(_on_host(value) for value in tensors)
    return tensors


def _precision(recipe: Recipe, store: RunStore) -> str:
    """The statistics' precision: the manifest's (``capture.precision`` resolved once, by the
    coordinator, for every unit), else resolved on this unit's device."""
    try:
        recorded = store.read_manifest().get("statistics_dtype")
    except OSError:  # a unit run outside a sweep's directory
        recorded = None
    if recorded in ("float64", "float32"):
        return recorded
    return resolve_precision(recipe.capture.precision, _device(recipe))


def _load_frozen(store: RunStore, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The frozen-early fit: ``{"bases", "diagnostics", "layers"}``, the bases on ``device``."""
    path = store.state / "proxies.pt"
    saved = torch.load(path, weights_only=True)
    if not (isinstance(saved, dict) and {"bases", "diagnostics", "layers"} <= set(saved)):
        raise ValueError(
            f"--resume: {path} was written by another tangentlens version; start a new run "
            "directory"
        )
    bases = saved["bases"]
    saved["bases"] = {s: {m: b.to(device) for m, b in by.items()} for s, by in bases.items()}
    return saved


def _load_model(recipe: Recipe, suite: CheckpointSuite, step: int) -> Any:
    """The checkpoint at ``step`` on the recipe's device, in its dtype, through its loader
    (``"auto"``: the suite's default for its family)."""
    loader = {} if recipe.suite.loader == "auto" else {"loader": recipe.suite.loader}
    return suite.load(
        step, device=recipe.suite.resolved_device(), dtype=recipe.suite.torch_dtype(), **loader
    )


def _check_width(recipe: Recipe, model: Any, step: int) -> None:
    """Refuse, before the capture, what the loaded model's width rules out (the planning check,
    for a suite whose shape was not known offline)."""
    d = lens_model(model).d_model
    check_width(recipe, d, f"the checkpoint at step {step} (d_model = {d})")


def accelerator_budget(device: str) -> int | None:
    """Memory a unit may use on the GPU ``device`` names: what is free on it now
    (``torch.cuda.mem_get_info``: the CUDA context, other processes and what is allocated
    already deducted) less the headroom for kernel workspaces and the allocator's
    fragmentation (:func:`~tangentlens.sweep.memory.headroom_bytes`); None on the CPU."""
    if not device.startswith("cuda"):
        return None
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return max(free - headroom_bytes(total), 0)


def _capture_passes(recipe: Recipe) -> int:
    """Capture passes of a step unit: ``capture.passes``, or (0) the fewest that fit this
    machine's GPU (its host memory on the CPU). A plan that does not fit is refused here too:
    the coordinator checks only the GPUs of its own machine."""
    accelerator = accelerator_budget(recipe.suite.resolved_device())
    host = host_budget(recipe) if accelerator is None else None
    return plan_recipe(recipe, accelerator=accelerator, host=host).passes


# ---------------------------------------------------------------------------- the units


def _step(unit: Unit) -> int:
    """The checkpoint step a window, fit or step unit concerns."""
    if unit.step is None:
        raise ValueError(f"unit {unit.name!r} ({unit.kind}) names no checkpoint step")
    return unit.step


def _data_unit(recipe: Recipe, store: RunStore, unit: Unit, status: Status) -> None:
    status("tokenising and packing the analysis corpus")
    data = prepare_analysis_data(_suite(recipe), recipe)
    store.write_state(Path(DATA_FILE).name, lambda tmp: save_analysis_data(data, tmp))


def _window_unit(recipe: Recipe, store: RunStore, unit: Unit, status: Status) -> None:
    """Forward-only capture of one fit-window checkpoint: moments and sampled rows per site."""
    step, data = _step(unit), _data(recipe, store)
    status(f"window step {step}: capture (activations)")
    model = _load_model(recipe, _suite(recipe), step)
    _check_width(recipe, model, step)
    sites = capture_sites(model, recipe)
    stats = capture_step(
        model,
        sites,
        data,
        recipe,
        Needs(reservoir=True),
        step,
        gradients=False,
        score_loss=False,
        precision=_precision(recipe, store),
    )
    saved = {
        "layers": sites,
        "moments": {name: s.h.state_dict() for name, s in stats.sites.items()},
        "samples": _on_host(
            {
                name: s.reservoir.columns()["H"]
                for name, s in stats.sites.items()
                if s.reservoir is not None
            }
        ),
    }
    store.write_state(Path(unit.output).name, lambda tmp: torch.save(saved, tmp))


def _fit_unit(recipe: Recipe, store: RunStore, unit: Unit, status: Status) -> None:
    """Pool the window's checkpoints (each centred on its own mean) and fit the frozen proxies."""
    stage = recipe.proxies
    status(f"fitting the frozen proxies ({', '.join(stage.methods)})")
    pools: dict[str, ActivationPool] = {}
    layers: dict[str, int | None] = {}
    for name in (d for d in unit.deps if d != PRETRAINED_UNIT):  # the window, in order
        saved = torch.load(store.root / f"state/{name}.pt", weights_only=True)
        layers = saved["layers"]
        for site, state in saved["moments"].items():
            moments = MomentAccumulator.from_state_dict(state)
            pools.setdefault(site, ActivationPool()).add(moments, saved["samples"].get(site))
    device, config = _device(recipe), stage.proxy_config()
    fitted = with_fixed(
        {site: pool.fit(config, device) for site, pool in pools.items()},
        _load_pretrained(store) if PRETRAINED_UNIT in unit.deps else {},
    )
    diagnostics = {site: f.diagnostics for site, f in fitted.items()}
    bases = _on_host({site: f.bases for site, f in fitted.items()})
    frozen = {"bases": bases, "diagnostics": diagnostics, "layers": layers}
    store.write_state("proxies.pt", lambda tmp: torch.save(frozen, tmp))
    step = _step(unit)
    tokens = _suite(recipe).tokens_seen(step) or 0
    rows = _diagnostic_rows(recipe, step, tokens, layers, diagnostics, bases)
    store.write_part(unit.name, rows)


def _diagnostic_rows(
    recipe: Recipe,
    step: int,
    tokens: int,
    layers: dict[str, int | None],
    diagnostics: dict[str, dict[str, dict[str, float]]],
    bases: Proxies,
) -> list[dict[str, Any]]:
    """Fit-diagnostic rows (probe ``proxy_fit``) from ``diagnostics[site][method][metric]``;
    ``rank`` is the width of the method's basis (``bases[site][method]``), as in every row."""
    return [
        row(
            recipe.suite.name,
            step,
            tokens,
            FIT_PROBE,
            metric,
            value,
            site=site,
            layer=layers[site],
            method=method,
            rank=bases[site][method].shape[1],
        )
        for site, by_method in diagnostics.items()
        for method, metrics in by_method.items()
        for metric, value in metrics.items()
    ]


def _pretrained_unit(recipe: Recipe, store: RunStore, unit: Unit, status: Status) -> None:
    """The published SAEs as proxies: each loaded through SAELens and checked against the suite
    (model name, hook = a captured site, d_in = its width); its ``rank`` most frequently active
    latents on the selection step's sampled rows (raw activations, as the SAE reads them; the
    fitting half under ``held_out``) span its proxy, saved once for every step."""
    stage = recipe.proxies
    chosen = stage.pretrained_sae
    step, data, suite = _step(unit), _data(recipe, store), _suite(recipe)
    status(f"loading {len(chosen.ids)} SAE(s) of {chosen.release} through SAELens")
    offline = offline_requested(recipe.suite.offline or None)
    with hf_offline_mode() if offline else contextlib.nullcontext():
        saes = {
            sae_id: SAE.from_pretrained(chosen.release, sae_id, stage.rank, _device(recipe))
            for sae_id in chosen.ids
        }
    model = _load_model(recipe, suite, step)
    sites = capture_sites(model, recipe)
    width = lens_model(model).d_model
    widths = {site: width for site in sites}  # every capture site is d_model wide
    by_site: dict[str, str] = {}
    for sae_id, sae in saes.items():
        site = sae.check_target(widths, suite.model_name)
        if site in by_site:
            raise ValueError(
                f"SAEs {by_site[site]!r} and {sae_id!r} of release {chosen.release!r} both read "
                f"{site!r}: list one SAE per site in proxies.{PRETRAINED_SAE}.ids"
            )
        by_site[site] = sae_id
    status(f"step {step}: capture (activations) to choose the SAEs' latents")
    part = slice(0, len(data.rows) // 2) if stage.held_out else slice(None)
    stats = capture_step(
        model,
        {site: sites[site] for site in by_site},
        data,
        recipe,
        Needs(reservoir=True),
        step,
        gradients=False,
        score_loss=False,
        part=part,
        precision=_precision(recipe, store),
    )
    saved: dict[str, Any] = {"step": step, "release": chosen.release, "ids": by_site}
    for key in ("bases", "latents", "frequency", "diagnostics"):
        saved[key] = {}
    for site, sae_id in by_site.items():
        sae = saes[sae_id].measure(stats.sites[site].reservoir.columns()["H"])
        saved["bases"][site] = sae.basis()
        saved["latents"][site] = sae.latents_
        saved["frequency"][site] = sae.latent_frequency_[sae.latents_]
        saved["diagnostics"][site] = {
            "sae_explained_variance": sae.explained_variance_,
            "sae_l0": sae.l0_,
        }
    saved = _on_host(saved)
    store.write_state(f"{PRETRAINED_UNIT}.pt", lambda tmp: torch.save(saved, tmp))
    tokens = suite.tokens_seen(step) or 0
    diagnostics = {site: {PRETRAINED_SAE: m} for site, m in saved["diagnostics"].items()}
    bases = {site: {PRETRAINED_SAE: basis} for site, basis in saved["bases"].items()}
    rows = _diagnostic_rows(recipe, step, tokens, sites, diagnostics, bases)
    store.write_part(unit.name, rows)


def _load_pretrained(store: RunStore) -> dict[str, dict[str, FixedProxy]]:
    """The published SAEs' proxies by site (``pretrained-sae`` unit; their diagnostics are that
    unit's rows)."""
    bases = torch.load(store.state / f"{PRETRAINED_UNIT}.pt", weights_only=True)["bases"]
    return {site: {PRETRAINED_SAE: FixedProxy(basis)} for site, basis in bases.items()}


def _duplicate_rows(capture: Capture, store: RunStore) -> list[dict[str, Any]]:
    """A step whose weights are identical to another checkpoint's (the coordinator's check, in
    the manifest) names that step (``duplicate_weights_of``)."""
    out = []
    for pair in store.read_manifest().get("integrity", {}).get("duplicates", []):
        if capture.step in pair:
            other = pair[1] if pair[0] == capture.step else pair[0]
            out.append(make_row(capture, "capture", "duplicate_weights_of", other))
    return out


def _step_unit(recipe: Recipe, store: RunStore, unit: Unit, status: Status) -> dict[str, float]:
    """Capture step N once and write every per-step probe's rows; save the state the
    across-steps unit reads. Returns where its time went (:class:`Phases`)."""
    step, data, suite = _step(unit), _data(recipe, store), _suite(recipe)
    needs = recipe.needs
    passes = _capture_passes(recipe)
    phases = Phases(_device(recipe))
    status("loading")
    with phases.phase("load"):
        model = _load_model(recipe, suite, step)
    _check_width(recipe, model, step)
    sites = capture_sites(model, recipe)
    gradients = needs.gradients
    status(f"capture ({'activations and gradients' if gradients else 'activations'})")
    # the probes compute where the statistics stay: the model's device, or the host after
    # several capture passes (the frozen proxies, and the frames drawn from them, go there)
    probes_at = _device(recipe) if passes == 1 else torch.device("cpu")
    frozen_fit = _load_frozen(store, probes_at) if "fit-proxies" in unit.deps else None
    frozen = frozen_fit["bases"] if frozen_fit is not None else None
    pretrained = _load_pretrained(store) if PRETRAINED_UNIT in unit.deps else {}
    energy_sums = None
    if frozen is not None and gathers_sequence_sums(recipe):
        # the proxies are known before the capture: gather per-sequence energy sums so the
        # intervals resample every analysed sequence
        with phases.phase("energy projectors"):
            energy_sums = tangent_energy.sequence_energy_config(
                frozen, recipe.data.n_bins if needs.bins else 0, recipe.data.seq_len
            )
    with phases.phase("capture"):
        stats, scored, fitted = capture_scored(
            model,
            sites,
            data,
            recipe,
            step,
            passes=passes,
            sequence_energy=energy_sums,
            fixed=pretrained,
            status=status,
            precision=_precision(recipe, store),
        )
    capture = Capture(
        suite=recipe.suite.name,
        step=step,
        tokens_seen=suite.tokens_seen(step) or 0,
        statistics=stats,
        layers=sites,
        seq_len=recipe.data.seq_len,
        frequencies=data.frequencies,
    )
    energy = recipe.config(tangent_energy.NAME)
    replicates = [] if energy is not None and energy.keep_replicates else None
    rows, own = step_rows(
        recipe,
        capture,
        scored=scored,
        fitted=fitted,
        frozen=frozen,
        fixed=pretrained,
        status=status,
        replicates=replicates,
        phases=phases,
    )
    rows += _duplicate_rows(capture, store)
    with phases.phase("state"):
        saved: dict[str, Any] = {"step": step, "layers": sites, "tokens_seen": capture.tokens_seen}
        if recipe.proxies is not None:
            saved["proxies"] = own
        saved["states"] = {}  # each probe's own namespace
        for entry in recipe.probes.values():
            if entry.probe.state is not None:
                kept = entry.probe.state(StateInputs(model, capture, data), entry.config)
                saved["states"][entry.probe.name] = entry.probe.check_state(kept)
        saved = _on_host(saved)
    with phases.phase("write"):
        # the state and replicates first, the part last: the part marks the unit done
        store.write_state(f"{unit.name}.pt", lambda tmp: torch.save(saved, tmp))
        if replicates is not None:
            store.write_replicates(unit.name, replicates)
        store.write_part(unit.name, rows)
    return phases.seconds


def _across_unit(recipe: Recipe, store: RunStore, unit: Unit, status: Status) -> None:
    """What compares steps, from every step's saved state and rows: each probe's ``across``
    rows over the transitions from one selected step to the next and every step's rows."""
    probes = {k: e for k, e in recipe.probes.items() if e.probe.across is not None}
    transitions: list[Transition] = []
    if probes:  # every across probe reads the transitions (the saved states, the proxies)
        frozen = recipe.proxies is not None and recipe.proxies.frozen
        scoring = _load_frozen(store)["bases"] if frozen else None
        window = tuple(store.read_manifest()["fit_window"]) if frozen else ()
        before = torch.load(store.state / f"{unit.deps[0]}.pt", weights_only=True)
        for name in unit.deps[1:]:
            now = torch.load(store.state / f"{name}.pt", weights_only=True)
            label = StepLabel(recipe.suite.name, now["step"], now["tokens_seen"], now["layers"])
            transitions.append(
                Transition(label, before, now, scoring, in_window(before["step"], window))
            )
            before = now
    step_rows = read_parts([store.part_path(name) for name in unit.deps]).to_pylist()
    rows: list[dict[str, Any]] = []
    for key, entry in probes.items():
        status(f"{key} across steps")
        views = tuple(own_view(t, entry.probe.name) for t in transitions)
        found = entry.probe.across(AcrossInputs(step_rows, views), entry.config)
        entry.probe.check_rows(found, f"unit {unit.name!r}")
        rows += found
    store.write_part(unit.name, rows)


def _model_free_unit(recipe: Recipe, store: RunStore, unit: Unit, status: Status) -> None:
    """The model-free probes' rows (they read no checkpoint)."""
    rows: list[dict[str, Any]] = []
    for entry in recipe.scoped("model_free"):
        status(entry.key)
        found = entry.probe.rows(ModelFreeInputs(recipe.suite.name), entry.config)
        entry.probe.check_rows(found, f"unit {unit.name!r}")
        rows += found
    store.write_part(unit.name, rows)


#: The kinds of unit that compute on the recipe's device (the GPU's budget concerns them).
_ON_MODEL_DEVICE = frozenset({"pretrained", "window", "fit", "step"})

#: Each kind's runner; a step's returns where its time went (phase → seconds).
_RUNNERS: dict[str, Callable[[Recipe, RunStore, Unit, Status], dict[str, float] | None]] = {
    "data": _data_unit,
    "pretrained": _pretrained_unit,
    "window": _window_unit,
    "fit": _fit_unit,
    "step": _step_unit,
    "across": _across_unit,
    "untrained": _model_free_unit,
}
