"""Sweep throughput with every probe on, against a plain training forward+backward.

Ours: one sweep step run by :func:`run_sweep` into a temporary directory — data preparation,
checkpoint checks and loads, capture, proxy fitting, controls, bootstrap, TwoNN, curvature and the
parquet write included (the untrained block, which reads no checkpoint, left out). Reference:
training forward+backward passes (:func:`benchmarks.bench_capture._training_step`) of the same
model, loaded the same way (device, ``suite.dtype``), over the same token rows and batch size.
CUDA is synchronised around both timings. The marginal step is measured side by side with the
reference: after the one-step sweep, :data:`STEP_PAIRS` times a training pass, then the step unit
again (its output removed, the sweep resumed); the medians are compared, every run listed.
Three rows each: the one-step sweep's wall time, its **fixed** units (data, the fit window's
captures, the fit: paid once per sweep) and its **step** unit (the marginal cost of a
checkpoint: load, capture, every probe, the part write; goal ≤ 2×), from the units' own timings
(:mod:`tangentlens.sweep.timing`).

* On the CPU (shape ``mini-pythia``): one step of the quickstart recipe (``suite.steps=last``)
  on the mini-pythia suite (trained into the cache on first use, ~4 min). The sweep and
  fixed ratios are recorded, the marginal step's goal is ≤ 2×.
* On a GPU (shape ``pythia-1b``): one step of the pythia_1b recipe (every probe, frozen-early
  proxies, every residual site and the embedding, reservoir 16384, rows of 512, batches of 16,
  ``suite.dtype`` float32 unless ``--dtype``) on a randomly initialised pythia-1b
  (:data:`~tangentlens.models.shapes.PYTHIA_CONFIGS`) saved as a one-checkpoint local suite
  (``<tmp>/suite/step0/``) with the mini-pythia tokenizer (4096 of the 50304 ids: speed does not
  depend on which ids occur), over 131072 tokens of Shakespeare (32768 with ``--quick``) so the
  run stays within a few minutes. The checkpoint's load time is reported in the goal column
  (it is paid inside ours, not by the reference)::

      python -m benchmarks sweep --device cuda
      python -m benchmarks sweep --device cuda --dtype bfloat16

``--shape pythia-<size>`` runs the GPU path at another size, e.g. a smoke run on the CPU:
``python -m benchmarks sweep --quick --device cpu --shape pythia-14m`` (rows of 128 tokens).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from benchmarks._timing import best_time, ratio_row, synchronize, torch_dtype
from benchmarks.bench_capture import SHORT_DTYPES, _training_step, release_memory
from tangentlens.core.data import prepare_analysis_data
from tangentlens.core.recipe import Recipe, load_recipe
from tangentlens.models.configs import MINI_SUITE_CONFIGS
from tangentlens.models.shapes import PYTHIA_CONFIGS
from tangentlens.models.suites import LocalSuite, ensure_mini_suite
from tangentlens.sweep.memory import MemoryPlan, plan_recipe
from tangentlens.sweep.runner import plan_sweep, run_sweep
from tangentlens.sweep.timing import (
    TIMINGS_DIR,
    SweepCost,
    read_unit_times,
    step_parts,
    sweep_cost,
)

#: Token budgets (quick, full): the quickstart's on the CPU, the pythia_1b recipe's on a GPU.
QUICKSTART_TOKENS = (8192, 32768)
PYTHIA_TOKENS = (32768, 131072)
#: Shapes timed per device: ``mini-pythia`` is the quickstart, ``pythia-<size>`` the pythia_1b
#: recipe on a random model of that size.
DEVICE_SHAPES = {"cpu": ("mini-pythia",), "cuda": ("pythia-1b",)}
#: The GPU path on the CPU (a smoke run) uses rows of this many tokens.
CPU_SEQ_LEN = 128


#: Paired (training pass, step unit again) runs behind the marginal step's medians; 1 with
#: ``--quick``. The two move with the machine's state on a shared host (training fwd+bwd
#: 5.2–7.5 s on the same CPU within a day), so one pair is not a measurement.
STEP_PAIRS = 3


@dataclass(frozen=True)
class Marginal:
    """The marginal step's median seconds (``step``) and training's (``reference``), and every
    run of each."""

    step: float
    reference: float
    steps: list[float]
    references: list[float]


def _pairs(quick: bool) -> int:
    return 1 if quick else STEP_PAIRS


def check_shapes(names: tuple[str, ...]) -> None:
    """A ``ValueError`` naming the sweep's shapes when one of ``names`` is not one."""
    allowed = ["mini-pythia"] + [
        m.removeprefix("EleutherAI/") for m in PYTHIA_CONFIGS if not m.endswith("-deduped")
    ]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"unknown sweep shape(s) {unknown}; allowed: {allowed}")


def _without_untrained_block(recipe: Recipe) -> Recipe:
    probes = {k: v for k, v in recipe.probes.items() if k != "untrained_block"}
    return dataclasses.replace(recipe, probes=probes)


def _mini_tokenizer() -> PreTrainedTokenizerBase:
    """The mini-pythia suite's tokenizer: from its cached checkpoints when trained, else
    trained here the same way (seconds; the suite's model is not trained)."""
    try:
        return ensure_mini_suite("mini-pythia", train=False).tokenizer()
    except ValueError:
        from tangentlens.models.training import training_split, wrap_tokenizer

        config = MINI_SUITE_CONFIGS["mini-pythia"]
        return wrap_tokenizer(config, training_split(config)[0].texts())


def write_random_suite(root: Path, model: str, device: str) -> Path:
    """A one-checkpoint local suite ``root/step0/`` of a randomly initialised (seeded)
    ``model`` (a :data:`PYTHIA_CONFIGS` name) in float32, with the mini-pythia tokenizer."""
    folder = root / "step0"
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    with torch.device(device):  # the initialisation runs where the model will
        weights = GPTNeoXForCausalLM(GPTNeoXConfig(**PYTHIA_CONFIGS[model]))
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        weights.save_pretrained(folder, safe_serialization=True)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    del weights
    _mini_tokenizer().save_pretrained(folder)
    release_memory()
    return root


def _time_sweep(recipe: Recipe, out: Path, *, resume: bool = False) -> tuple[float, SweepCost]:
    """Seconds of ``run_sweep(recipe, out, resume=resume)`` and its units' cost (fixed units,
    the step unit); torch's thread count (which the units pin to ``capture.threads``) is
    restored after."""
    threads = torch.get_num_threads()
    try:
        synchronize()
        start = time.perf_counter()
        run_sweep(recipe, out, resume=resume)
        synchronize()
        return time.perf_counter() - start, sweep_cost(read_unit_times(out))
    finally:
        torch.set_num_threads(threads)
        release_memory()


def _reference(suite: Any, recipe: Recipe) -> tuple[Callable[[], float], torch.Tensor, float]:
    """(one timed pass of training fwd+bwd over the recipe's rows → its seconds, the rows,
    seconds of one checkpoint load) for the suite's last step, loaded as the sweep does; the
    model is warmed up by one batch first."""
    device, dtype = recipe.suite.device, recipe.suite.torch_dtype()
    synchronize()
    start = time.perf_counter()
    model = suite.load(suite.steps[-1], device=device, dtype=dtype)
    synchronize()
    load_s = time.perf_counter() - start
    rows = torch.from_numpy(prepare_analysis_data(suite, recipe).rows)
    batches = [b.to(device) for b in rows.split(recipe.data.batch_size)]
    _training_step(model, batches[0])  # warm-up
    model.zero_grad(set_to_none=True)

    def train() -> float:
        seconds, _ = best_time(lambda: float(sum(_training_step(model, b) for b in batches)), 1)
        model.zero_grad(set_to_none=True)
        return seconds

    return train, rows, load_s


def _rerun_step(recipe: Recipe, out: Path) -> float:
    """Seconds of the step unit run again in the finished one-step sweep ``out``: its output,
    the across-steps unit's (which reads it) and their timings are removed, and the sweep
    resumes, which runs exactly those units."""
    for unit in plan_sweep(recipe).units:
        if unit.kind in ("step", "across"):
            path = out / unit.output
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
            (out / TIMINGS_DIR / f"{unit.name}.json").unlink(missing_ok=True)
    step = _time_sweep(recipe, out, resume=True)[1].step
    if step is None:
        raise RuntimeError(f"the resumed sweep in {out} recorded no step unit's time")
    return step


def _paired(
    recipe: Recipe, out: Path, cost: SweepCost, train: Callable[[], float], pairs: int
) -> Marginal:
    """The marginal step against training, side by side: ``pairs`` times a training pass then
    the step unit run again (the first sweep's step counts too); medians of each."""
    steps = [cost.step if cost.step is not None else math.nan]
    refs = []
    for _ in range(pairs):
        refs.append(train())
        steps.append(_rerun_step(recipe, out))
    return Marginal(statistics.median(steps), statistics.median(refs), steps, refs)


def bench_quickstart(quick: bool, device: str, dtype: str) -> list[dict[str, Any]]:
    """One quickstart step (mini-pythia) against training over its rows."""
    budget = QUICKSTART_TOKENS[0 if quick else 1]
    suite = ensure_mini_suite("mini-pythia")
    overrides = [
        "suite.steps=last",
        f'suite.device="{device}"',
        f'suite.dtype="{dtype}"',
        f"data.max_tokens={budget}",
    ]
    recipe = _without_untrained_block(load_recipe("quickstart", overrides))
    with tempfile.TemporaryDirectory() as tmp:
        ours_s, cost = _time_sweep(recipe, Path(tmp) / "run")
        train, rows, _ = _reference(suite, recipe)  # after the sweep, as it is measured alone
        marginal = _paired(recipe, Path(tmp) / "run", cost, train, _pairs(quick))
    shape = f"mini-pythia, {rows.numel()} tokens"
    return _sweep_rows(recipe, shape, ours_s, cost, marginal, "")


@dataclass(frozen=True)
class StepMeasurement:
    """A one-step sweep of a recipe on a random model and its reference: the recipe run,
    ``shape`` (what ran, in words), the one-step sweep's seconds (``ours_s``) and its units'
    cost, the marginal step against training (None when no pair was run), one checkpoint
    load's seconds (None likewise), the step unit's parts (name → seconds: load, capture, each
    probe, the refit beside them, the write), the accelerator's peak bytes over the one-step
    sweep (None on the CPU) and the recipe's memory plan."""

    recipe: Recipe
    shape: str
    ours_s: float
    cost: SweepCost
    marginal: Marginal | None
    load_s: float | None
    parts: dict[str, float]
    peak_bytes: int | None
    plan: MemoryPlan


def measure_step(
    name: str, recipe_name: str, budget: int | None, pairs: int, device: str, dtype: str
) -> StepMeasurement:
    """One step of ``recipe_name`` (its token budget, or ``budget``) on a random ``name``
    (``pythia-<size>``) saved as a one-checkpoint local suite, then ``pairs`` paired runs of
    training and the step unit again (0: the one-step sweep alone, no reference). On the CPU,
    rows of :data:`CPU_SEQ_LEN` tokens."""
    check_shapes((name,))
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        root = write_random_suite(tmp / "suite", f"EleutherAI/{name}", device)
        overrides = [
            "suite.steps=last",
            f'suite.name="local:{root}"',
            f'suite.device="{device}"',
            f'suite.dtype="{dtype}"',
            'data.corpus="shakespeare"',
        ]
        if budget is not None:
            overrides.append(f"data.max_tokens={budget}")
        if not device.startswith("cuda"):
            overrides.append(f"data.seq_len={CPU_SEQ_LEN}")
        recipe = _without_untrained_block(load_recipe(recipe_name, overrides))
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        ours_s, cost = _time_sweep(recipe, tmp / "run")
        peak = torch.cuda.max_memory_allocated() if cuda else None
        marginal, load_s, tokens = None, None, recipe.data.max_tokens
        if pairs:
            train, rows, load_s = _reference(LocalSuite(root), recipe)
            marginal = _paired(recipe, tmp / "run", cost, train, pairs)
            tokens = rows.numel()
        parts = step_parts(read_unit_times(tmp / "run"))
        plan = plan_recipe(recipe)  # from the suite's config.json, while it exists
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shape = f"random {name}, {tokens} tokens, {device} {SHORT_DTYPES[dtype]}"
    return StepMeasurement(recipe, shape, ours_s, cost, marginal, load_s, parts, peak, plan)


def bench_pythia(name: str, quick: bool, device: str, dtype: str) -> list[dict[str, Any]]:
    """One pythia_1b-recipe step on a random ``name`` (``pythia-<size>``) against training
    over its rows."""
    budget = PYTHIA_TOKENS[0 if quick else 1]
    m = measure_step(name, "pythia_1b", budget, _pairs(quick), device, dtype)
    note = f"; a load: {m.load_s:.1f} s"
    return _sweep_rows(m.recipe, m.shape, m.ours_s, m.cost, m.marginal, note)  # type: ignore[arg-type]


def _sweep_rows(
    recipe: Recipe,
    shape: str,
    ours_s: float,
    cost: SweepCost,
    marginal: Marginal,
    note: str,
) -> list[dict[str, Any]]:
    """Three ratios to training fwd+bwd over the same rows (the median pass): the one-step sweep
    (wall), its fixed units (data, window captures, fit: paid once per sweep) and its step
    unit (the marginal cost of a checkpoint: load, capture, every probe, the part write; the
    median of the paired runs, each run listed in the goal column)."""
    probes = f"{len(recipe.probes)} probes"
    windows = cost.counts.get("window", 0)
    ref_s = marginal.reference
    runs = ", ".join(f"{s:.1f}" for s in marginal.steps)
    refs = ", ".join(f"{s:.2f}" for s in marginal.references)
    return [
        ratio_row(
            f"sweep, one step, {probes}", shape, "training fwd+bwd", ours_s, ref_s,
            f"recorded (units {cost.fixed + (cost.step or 0):.1f} s of it){note}",
        ),
        ratio_row(
            f"sweep fixed: data, {windows} window captures, fit", shape, "training fwd+bwd",
            cost.fixed, ref_s, "recorded: paid once per sweep",
        ),
        ratio_row(
            f"sweep marginal step, {probes}", shape, "training fwd+bwd", marginal.step,
            ref_s, f"≤ 2×; medians of steps {runs} s, training {refs} s",
        ),
    ]  # fmt: skip


def run(
    quick: bool = False,
    device: str = "cpu",
    dtype: str = "float32",
    shapes: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """The sweep-step rows: the device's shape, or ``shapes`` (``mini-pythia`` = the
    quickstart, ``pythia-<size>`` = the pythia_1b recipe on a random model of that size)."""
    torch_dtype(dtype)
    names = (
        tuple(shapes) if shapes else DEVICE_SHAPES["cuda" if device.startswith("cuda") else "cpu"]
    )
    check_shapes(names)
    rows = []
    for name in names:
        if name == "mini-pythia":
            rows += bench_quickstart(quick, device, dtype)
        else:
            rows += bench_pythia(name, quick, device, dtype)
        release_memory()  # the reference's model
    return rows
