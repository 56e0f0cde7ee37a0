"""What one accelerator does with tangentlens, in one table: ``python -m benchmarks gpu``.

Random Pythia-architecture models built on the device from the published configs (nothing is
downloaded; speed does not depend on the weights). Rows:

* **capture** against a training forward+backward over the same batches
  (:func:`benchmarks.bench_capture.bench_capture`: every residual site and the embedding, the
  pythia_1b recipe's statistics, 16 × 512 tokens a batch) at pythia-160m and pythia-1b, in
  float32 and bfloat16 — goal ≤ 0.85× each;
* per model, **its recipe's one-step sweep** (``pythia_160m`` for pythia-160m, ``pythia_1b`` for
  pythia-1b: every probe, frozen-early proxies, their token budgets) on a random checkpoint
  saved as a local suite (:func:`benchmarks.bench_sweep.measure_step`): the fixed units (data,
  the 8 window captures, the fit: paid once per sweep), and the **marginal step** against a
  training forward+backward over the same rows, the medians of 3 pairs — goal ≤ 2× — followed
  by where the step's time goes (the step unit's parts: load, capture, each probe, the refit
  run beside them, the state and the part written), each against the same training pass;
* the step's **peak accelerator memory** (the one-step sweep's, no reference model resident)
  against the memory plan's accelerator peak;
* **the whole suite predicted** from those units' times, as ``--plan-only`` predicts it
  (:func:`tangentlens.sweep.timing.predicted_seconds` over the recipe's plan with every
  revision: 154 for Pythia, weights cached) — goal ≤ 30 minutes for pythia-160m on one GPU.

``python -m benchmarks gpu --device cpu --quick`` prints the same table on the smallest shapes
(pythia-14m for both models, rows of 128 tokens, 8192 tokens a step, one pair), a smoke test of
the whole path within minutes on a 2-core machine; its numbers say nothing of a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks._timing import ratio_row
from benchmarks.bench_capture import bench_capture, release_memory
from benchmarks.bench_sweep import STEP_PAIRS, StepMeasurement, measure_step
from tangentlens.sweep.memory import GIB
from tangentlens.sweep.runner import plan_sweep
from tangentlens.sweep.timing import plan_counts, predicted_seconds

#: Model → the recipe its sweep runs and the hub suite its prediction is for.
RECIPES = {"pythia-160m": "pythia_160m", "pythia-1b": "pythia_1b"}
#: The smallest shape, standing for both models on the CPU (``--device cpu --quick``).
SMALLEST = "pythia-14m"
#: The capture benchmark's batches (16 of the recipe's 16 × 512 on a GPU; 2 of 8 × 256 quick).
CAPTURE_BATCHES = {False: 16, True: 2}
#: A quick run's token budget per step (the recipes' own otherwise).
QUICK_TOKENS = 8192
#: The moonshot: the whole pythia-160m suite, every probe, within this many seconds.
SUITE_GOAL_S = 30 * 60


def _models(device: str, quick: bool) -> dict[str, str]:
    """Model timed → the shape that stands for it (itself on a GPU; the smallest on the CPU)."""
    on_gpu = device.startswith("cuda")
    return {model: model if on_gpu else SMALLEST for model in RECIPES}


def _capture_rows(shapes: dict[str, str], device: str, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for shape in dict.fromkeys(shapes.values()):
        for dtype in ("float32", "bfloat16"):
            rows.append(
                bench_capture(shape, 1 if quick else 2, device, CAPTURE_BATCHES[quick], dtype)
            )
            release_memory()
    return rows


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


def _step_rows(model: str, m: StepMeasurement) -> list[dict[str, Any]]:
    """The fixed units, the marginal step, its parts and its peak memory."""
    ref = m.marginal.reference
    runs = ", ".join(f"{s:.1f}" for s in m.marginal.steps)
    refs = ", ".join(f"{s:.2f}" for s in m.marginal.references)
    windows = m.cost.counts.get("window", 0)
    recipe = RECIPES[model]
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
    for part, seconds in m.parts.items():
        share = seconds / m.marginal.step if m.marginal.step else float("nan")
        rows.append(
            ratio_row(
                f"  step: {part}", m.shape, "training fwd+bwd", seconds, ref,
                f"{share:.0%} of the step",
            )
        )  # fmt: skip
    if m.peak_bytes is None:  # the plan's host peak, for the record
        goal = "not measured on the CPU (tests/integration/test_memory_peaks.py measures it)"
        rows.append(_memory_row(recipe, m.shape, float("nan"), m.plan.host_peak, goal))
    else:
        planned = m.plan.accelerator_peak
        rows.append(_memory_row(recipe, m.shape, m.peak_bytes, planned, "≤ 1× the plan"))
    return rows


def _memory_row(recipe: str, shape: str, peak: float, planned: int, goal: str) -> dict[str, Any]:
    row = ratio_row(f"{recipe} peak memory", shape, "memory plan", peak / GIB, planned / GIB, goal)
    return {**row, "unit": "GiB"}


def _prediction_row(model: str, m: StepMeasurement, device: str) -> dict[str, Any]:
    seconds = _suite_seconds(m, model)
    goal = "≤ 30 min on one GPU" if model == "pythia-160m" else "recorded"
    if not device.startswith("cuda"):
        goal += f" (measured on {m.shape.split(',')[0]} on the CPU: not a GPU's)"
    row = ratio_row(
        f"whole suite predicted: {model}, 154 revisions", m.shape, "the goal",
        (seconds if seconds is not None else float("nan")) / 60, SUITE_GOAL_S / 60, goal,
    )  # fmt: skip
    return {**row, "unit": "min"}


def render(rows: list[dict[str, Any]], console: Console) -> None:
    """The GPU's table: what was timed, on what, ours against its reference, the ratio and
    the goal."""
    table = Table(title="tangentlens on one accelerator", caption=_caption())
    for column in ("measurement", "shape", "ours", "reference", "ours/ref", "goal"):
        table.add_column(column, justify="right" if column in ("ours", "ours/ref") else "left")
    for r in rows:
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


def run(quick: bool = False, device: str = "cuda") -> list[dict[str, Any]]:
    """The GPU table (see the module docstring); ``device="cpu"`` with ``quick`` is its smoke
    test on the smallest shapes."""
    shapes = _models(device, quick)
    rows = _capture_rows(shapes, device, quick)
    for model, shape in shapes.items():
        budget = QUICK_TOKENS if quick else None
        pairs = 1 if quick else STEP_PAIRS
        m = measure_step(shape, RECIPES[model], budget, pairs, device, "float32")
        rows += _step_rows(model, m)
        rows.append(_prediction_row(model, m, device))
        release_memory()
    return rows
