"""What one accelerator does with tangentlens, part by part: ``python -m benchmarks gpu``.

Random Pythia-architecture models built on the device from the published configs (nothing is
downloaded; speed does not depend on the weights). Every row is printed and appended to the
JSON-lines file (``--rows``) the moment it is measured. The parts, for each model
(``--model``: pythia-160m, pythia-1b), in this order:

* ``capture`` — capture against a training forward+backward over the same batches
  (:func:`benchmarks.bench_capture.bench_capture`: every residual site and the embedding, the
  pythia_1b recipe's statistics, 16 × 512 tokens a batch) in float32 and bfloat16 — goal
  ≤ 0.85× each; then the host synchronisations of one capture batch as CUDA counts them
  (``torch.cuda.set_sync_debug_mode``) against the emulated accelerator's count;
* ``step`` — its recipe's one-step sweep (``pythia_160m`` for pythia-160m, ``pythia_1b`` for
  pythia-1b: every probe, frozen-early proxies) on a random checkpoint saved as a local suite
  (:func:`benchmarks.bench_sweep.measure_step`): the fixed units (data, the window captures,
  the fit: paid once per sweep), the **marginal step** against a training forward+backward
  over the same rows (goal ≤ 2×) and where the step's time goes;
* ``memory`` — the one-step sweep's peak accelerator memory against the memory plan's;
* ``suite`` — the whole suite predicted from those units' times, as ``--plan-only`` predicts
  it (:func:`tangentlens.sweep.timing.predicted_seconds`, 154 revisions) — goal ≤ 30 minutes
  for pythia-160m on one GPU.

``memory`` and ``suite`` read the ``step`` part's one-step sweep when it ran in this process;
alone, they run a one-step sweep without the paired reruns. ``--part`` (repeatable) chooses
parts, ``--model`` models. ``--budget-s`` runs the parts in the order above (capture at
pythia-160m first) while their estimated time fits what is left of the budget, and names each
part it skips with its estimate: each part's estimate is :data:`H100_SECONDS` (seconds on one
H100, estimated from the fourth round's H200 measurements, FIELD_NOTES.md: capture at
pythia-160m 4.1 s and training 3.2 s for 16 batches, at pythia-1b 15.0 s and 16.7 s) scaled by
the first part's measured time over its estimate — so the estimates adapt to the machine at
hand. By those estimates each part takes at most four minutes on an H100.

``python -m benchmarks gpu --device cpu --quick`` runs the parts on the smallest shape
(pythia-14m standing for both models: its rows say ``pythia-14m``, measured once), rows of 128
tokens, 8192 tokens a step, one pair, float32 only where the CPU has no native bfloat16 kernels
(the skipped rows say so): a smoke test of the whole path within minutes on a 2-core machine;
its numbers say nothing of a GPU.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks._parts import RECIPES, Budget, Part, ordered_parts
from benchmarks._rows import Emit, skipped_row
from benchmarks._timing import ratio_row
from benchmarks.bench_capture import (
    bench_capture,
    cuda_syncs_per_batch,
    emulated_syncs_per_batch,
    release_memory,
)
from benchmarks.bench_sweep import STEP_PAIRS, StepMeasurement, measure_step
from tangentlens.runtime import half_precision_slowdown
from tangentlens.sweep.memory import GIB
from tangentlens.sweep.runner import plan_sweep
from tangentlens.sweep.timing import plan_counts, predicted_seconds

#: The capture benchmark's batches (16 of the recipe's 16 × 512 on a GPU; 2 of 8 × 256 quick).
CAPTURE_BATCHES = {False: 16, True: 2}
#: A quick run's token budget per step (the recipes' own otherwise).
QUICK_TOKENS = 8192
#: The moonshot: the whole pythia-160m suite, every probe, within this many seconds.
SUITE_GOAL_S = 30 * 60
#: Slowdown of a half-precision matmul over float32 above which the CPU's half-precision rows
#: are skipped (an AVX2-only CPU runs bfloat16 ~60× slower: minutes for nothing).
HALF_PRECISION_SKIP = 4.0
#: The step part's paired reruns on a GPU (the medians' runs; the CPU's quick run: 1).
GPU_STEP_PAIRS = 2


def _half_precision_note(device: str) -> str | None:
    """Why bfloat16 is not timed on this device (None: it is)."""
    if device.startswith("cuda"):
        return None
    slowdown = half_precision_slowdown("bfloat16")
    if slowdown <= HALF_PRECISION_SKIP:
        return None
    return f"this CPU runs bfloat16 matmuls {slowdown:.0f}× slower than float32 (no native kernels)"


def _capture_part(part: Part, device: str, quick: bool, emit: Emit) -> None:
    skip = _half_precision_note(device)
    for dtype in ("float32", "bfloat16"):
        if dtype != "float32" and skip is not None:
            emit(skipped_row(f"capture {part.shape} {dtype}", skip))
            continue
        emit(bench_capture(part.shape, 1 if quick else 2, device, CAPTURE_BATCHES[quick], dtype))
        release_memory()
    emulated = emulated_syncs_per_batch()
    if device.startswith("cuda"):
        counted = cuda_syncs_per_batch(part.shape, device)
        goal = "equal: the emulator counts what CUDA waits for"
    else:
        counted, goal = float("nan"), "CUDA's count on a GPU only"
    row = ratio_row(
        "host syncs per capture batch", f"{part.shape} (CUDA) / micro model (emulated)",
        "the emulator's count", counted, emulated, goal,
    )  # fmt: skip
    emit({**row, "unit": "syncs"})


def _suite_seconds(m: StepMeasurement, model: str) -> float | None:
    """The whole suite of ``model`` (every revision of its hub suite), from the one-step
    sweep's unit times: the recipe's plan with ``suite.steps="all"``."""
    recipe = dataclasses.replace(
        m.recipe, suite=dataclasses.replace(m.recipe.suite, name=f"EleutherAI/{model}", steps="all")
    )
    counts = plan_counts(plan_sweep(recipe))
    if "across" not in m.cost.seconds:  # a one-step sweep compares no steps
        counts.pop("across", None)
    return predicted_seconds(m.cost, counts, 1)


def _step_rows(part: Part, m: StepMeasurement) -> list[dict[str, Any]]:
    """The fixed units, the marginal step and its parts."""
    if m.marginal is None:
        raise ValueError("the step part's rows need its paired reruns (pairs ≥ 1)")
    ref = m.marginal.reference
    runs = ", ".join(f"{s:.1f}" for s in m.marginal.steps)
    refs = ", ".join(f"{s:.2f}" for s in m.marginal.references)
    windows = m.cost.counts.get("window", 0)
    recipe = RECIPES[part.model]
    rows = [
        ratio_row(
            f"{recipe} fixed: data, {windows} windows, fit", m.shape, "training fwd+bwd",
            m.cost.fixed, ref, "recorded: paid once per sweep",
        ),
        ratio_row(
            f"{recipe} marginal step, {len(m.recipe.probes)} probes", m.shape, "training fwd+bwd",
            m.marginal.step, ref, f"≤ 2×; medians of steps {runs} s, training {refs} s",
        ),
    ]  # fmt: skip
    for name, seconds in m.parts.items():
        share = seconds / m.marginal.step if m.marginal.step else float("nan")
        rows.append(
            ratio_row(
                f"  step: {name}", m.shape, "training fwd+bwd", seconds, ref,
                f"{share:.0%} of the step",
            )
        )  # fmt: skip
    return rows


def _memory_row(part: Part, m: StepMeasurement) -> dict[str, Any]:
    recipe = RECIPES[part.model]
    if m.peak_bytes is None:  # the plan's host peak, for the record
        peak, planned = float("nan"), m.plan.host_peak
        goal = "not measured on the CPU (tests/integration/test_memory_peaks.py measures it)"
    else:
        peak, planned, goal = m.peak_bytes, m.plan.accelerator_peak, "≤ 1× the plan"
    row = ratio_row(
        f"{recipe} peak memory", m.shape, "memory plan", peak / GIB, planned / GIB, goal
    )
    return {**row, "unit": "GiB"}


def _prediction_row(part: Part, m: StepMeasurement, device: str) -> dict[str, Any]:
    seconds = _suite_seconds(m, part.model)
    goal = "≤ 30 min on one GPU" if part.model == "pythia-160m" else "recorded"
    if not device.startswith("cuda"):
        goal += f" (measured on {part.shape} on the CPU: not a GPU's)"
    row = ratio_row(
        f"whole suite predicted: {part.model}, 154 revisions", m.shape, "the goal",
        (seconds if seconds is not None else float("nan")) / 60, SUITE_GOAL_S / 60, goal,
    )  # fmt: skip
    return {**row, "unit": "min"}


def render(rows: list[dict[str, Any]], console: Console) -> None:
    """The GPU's table: what was timed, on what, ours against its reference, the ratio and
    the goal; skipped parts with the reason."""
    table = Table(title="tangentlens on one accelerator", caption=_caption())
    for column in ("measurement", "shape", "ours", "reference", "ours/ref", "goal"):
        table.add_column(column, justify="right" if column in ("ours", "ours/ref") else "left")
    for r in rows:
        if "skipped" in r:
            table.add_row(r["benchmark"], "", "", "", "", f"skipped: {r['skipped']}")
            continue
        unit = r.get("unit", "s")
        table.add_row(
            r["benchmark"],
            r["shape"],
            f"{r['ours_s']:.3g} {unit}",
            f"{r['reference_name']} {r['reference_s']:.3g} {unit}",
            f"{r['ours_s'] / r['reference_s']:.3f}",
            r["goal"],
        )
    console.print(table)


def _caption() -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"torch {torch.__version__} ({device}), {torch.get_num_threads()} CPU threads"


def run(
    quick: bool = False,
    device: str = "cuda",
    emit: Emit | None = None,
    parts: tuple[str, ...] | None = None,
    models: tuple[str, ...] | None = None,
    budget_s: float | None = None,
) -> list[dict[str, Any]]:
    """The GPU's rows (see the module docstring), each passed to ``emit`` as it is measured;
    ``device="cpu"`` with ``quick`` is its smoke test on the smallest shape."""
    rows: list[dict[str, Any]] = []

    def report(row: dict[str, Any]) -> None:
        rows.append(row)
        if emit is not None:
            emit(row)

    budget = Budget(budget_s)
    measured: dict[str, StepMeasurement] = {}
    pairs = 1 if quick else (GPU_STEP_PAIRS if device.startswith("cuda") else STEP_PAIRS)
    tokens = QUICK_TOKENS if quick else None

    def sweep(part: Part, with_pairs: int) -> StepMeasurement:
        m = measure_step(part.shape, RECIPES[part.model], tokens, with_pairs, device, "float32")
        measured[part.shape] = m
        release_memory()
        return m

    runners: dict[str, Callable[[Part], None]] = {
        "capture": lambda part: _capture_part(part, device, quick, report),
        "step": lambda part: [report(r) for r in _step_rows(part, sweep(part, pairs))],
        "memory": lambda part: report(
            _memory_row(part, measured.get(part.shape) or sweep(part, 0))
        ),
        "suite": lambda part: report(
            _prediction_row(part, measured.get(part.shape) or sweep(part, 0), device)
        ),
    }  # type: ignore[dict-item]
    for part in ordered_parts(parts, models, device):
        reused = part.name in ("memory", "suite") and part.shape in measured
        refusal = budget.refusal(part, reused)
        if refusal is not None:
            report(skipped_row(f"part {part.label}", refusal))
            continue
        start = time.perf_counter()
        runners[part.name](part)
        budget.record(part, reused, time.perf_counter() - start)
    return rows
