"""The ``tangentlens`` command line: ``sweep``, ``report``, ``compare``, ``suite``,
``train-suite``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from tangentlens.core.recipe import EXECUTOR_KINDS, Recipe
from tangentlens.report.console import fail
from tangentlens.sweep.plan import Plan


def _suite(args: argparse.Namespace) -> None:
    from tangentlens.models.suites import MINI_SUITE_CONFIGS, ensure_mini_suite, open_suite
    from tangentlens.report.progress import training_progress
    from tangentlens.report.suite_summary import render_suite

    if args.name in MINI_SUITE_CONFIGS:
        with training_progress(args.name) as progress:
            suite = ensure_mini_suite(args.name, progress=progress)
    else:
        suite = open_suite(args.name, offline=True if args.offline else None)
    render_suite(suite, suite.select(args.steps), verify=args.verify)


def _train_suite(args: argparse.Namespace) -> None:
    from tangentlens.models.suites import MINI_SUITE_CONFIGS

    if args.name not in MINI_SUITE_CONFIGS:
        raise ValueError(
            f"only built-in mini suites can be trained, got {args.name!r}; allowed: "
            f"{', '.join(MINI_SUITE_CONFIGS)}"
        )
    _suite(args)


def _memory_lines(recipe: Recipe) -> str:
    """The memory plan, and whether it fits this machine's memory (a GPU is checked when the
    sweep starts: asking torch about it here would make planning heavy)."""
    from tangentlens.sweep.memory import host_budget, plan_recipe

    memory = plan_recipe(recipe)
    host = host_budget(recipe)
    problem = memory.problem(accelerator=None, host=host)
    verdict = problem or (
        "fits this machine's memory" if host else "host memory not checked (units run elsewhere)"
    )
    return f"{memory.render()}\n{verdict}"


def _sweep(args: argparse.Namespace) -> None:
    from tangentlens.report.console import console
    from tangentlens.runtime import passive_when_busy

    # before torch is imported: its threads read the wait policy once
    busy = None if args.plan_only else passive_when_busy()
    if busy is not None:
        console.print(busy, soft_wrap=True, markup=False)
    # validation and planning import no model library: a typo is reported at once (published
    # SAEs are checked against SAELens' registry and the suite's model, with SAELens imported)
    from tangentlens.core.recipe import load_recipe
    from tangentlens.sweep.executors import check_executor
    from tangentlens.sweep.runner import check_pretrained_sae, plan_sweep
    from tangentlens.sweep.store import check_run_dir

    overrides = [*(args.set or ()), *([f"executor.kind={args.executor}"] if args.executor else [])]
    recipe = load_recipe(args.recipe, overrides)
    out = args.out or f"runs/{recipe.name}"
    if not args.plan_only:
        check_run_dir(out)  # a file or a read-only folder: refused before anything is planned
    plan = plan_sweep(recipe)
    check_pretrained_sae(recipe)  # before a suite is trained or --out is made
    if args.timings and not args.plan_only:
        raise ValueError("--timings goes with --plan-only (a run reports its own time)")
    if args.plan_only:
        same = _same_run(out, recipe)
        console.print(plan.render(same), soft_wrap=True, markup=False)
        console.print(_memory_lines(recipe), soft_wrap=True, markup=False)
        console.print(_time_line(plan, recipe, args.timings, same), soft_wrap=True, markup=False)
        return

    check_executor(recipe, detach=args.detach)  # before a suite is trained or --out is made

    from tangentlens.models.suites import MINI_SUITE_CONFIGS, ensure_mini_suite
    from tangentlens.report.progress import sweep_progress, training_progress
    from tangentlens.sweep.runner import run_sweep
    from tangentlens.sweep.stops import stop_signals

    try:
        with stop_signals():  # SIGTERM, SIGHUP, SIGUSR1: Ctrl-C's path
            if recipe.suite.name in MINI_SUITE_CONFIGS:
                with training_progress(recipe.suite.name) as progress:
                    ensure_mini_suite(recipe.suite.name, progress=progress)
            with sweep_progress(plan, out) as on_event:
                run_sweep(recipe, out, resume=args.resume, detach=args.detach, on_event=on_event)
    except KeyboardInterrupt as stop:
        stop.args = (f"{stop.args[0] if stop.args else 'interrupted'}: {_kept(out, plan)}",)
        raise
    pending = plan.pending(out)
    if pending:  # detached: the jobs run on
        console.print(
            f"{len(pending)} units submitted to Slurm; `tangentlens sweep --recipe {args.recipe} "
            f"--out {out} --resume` (same --set) collects them and writes the report"
        )
        return
    _render_all(out)


def _kept(out: str, plan: Plan) -> str:
    """What an interrupted sweep left in ``out`` and how to continue it."""
    if not Path(out, "manifest.json").exists():
        return "no checkpoint had been measured, so nothing was kept; run the same command again"
    done = len(plan.units) - len(plan.pending(out))
    return (
        f"{out} keeps {done} of {len(plan.units)} units, its lock released; continue with "
        "--resume (same --set), from this or any host"
    )


def _time_line(plan: Plan, recipe: Recipe, timings: str | None, same: str | None) -> str:
    """The plan's predicted time from the unit times of ``timings``, else of ``same`` (``--out``
    holding a run of this recipe), else how to measure them."""
    from tangentlens.sweep.timing import TIMINGS_DIR, plan_time_line

    if timings is not None:
        if not Path(timings, TIMINGS_DIR).is_dir():
            raise ValueError(f"--timings {timings}: no run directory with unit timings there")
        return plan_time_line(plan, recipe, timings, same)
    if same is not None and Path(same, TIMINGS_DIR).is_dir():
        return plan_time_line(plan, recipe, same, same)
    return (
        "time: not measured yet — run one step (--set suite.steps=last --out DIR) and plan with "
        "--timings DIR to predict this sweep's time from its units"
    )


def _same_run(out: str, recipe: Recipe) -> str | None:
    """``out`` when it holds a run of this very recipe (its outputs count as done), else None;
    a run of another recipe is said so."""
    import json

    from tangentlens.report.console import console

    manifest = Path(out, "manifest.json")
    if not manifest.exists():
        return None
    if not recipe.same_identity(json.loads(manifest.read_text()).get("recipe")):
        console.print(
            f"{out} holds a run of another recipe (or other --set values): not counted",
            soft_wrap=True,
            markup=False,
        )
        return None
    return out


def _render_all(run_dir: str) -> None:
    from tangentlens.report.console import console
    from tangentlens.report.figures import write_figures
    from tangentlens.report.sweep_report import render_report

    render_report(run_dir, console)
    figures = write_figures(run_dir)
    console.print(f"results: {run_dir}/results/*.parquet · manifest: {run_dir}/manifest.json")
    console.print(f"figures: {', '.join(str(f) for f in figures)}")


def _report(args: argparse.Namespace) -> None:
    _render_all(args.run_dir)


def _step_choice(text: str) -> int | str:
    """``--step``: "last" or a checkpoint step."""
    if text == "last":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be 'last' or a checkpoint step (an integer), got {text!r}"
        ) from None


def _compare(args: argparse.Namespace) -> None:
    from tangentlens.comparison import compare
    from tangentlens.report.compare_report import render_comparison, write_comparison
    from tangentlens.report.console import console

    comparison = compare(args.runs, step=args.step)
    out = args.out or "runs/compare-" + "-vs-".join(run.root.name for run in comparison.runs)
    render_comparison(comparison, console)
    table, *figures = write_comparison(comparison, out)
    console.print(f"table: {table} ({len(comparison)} rows)")
    console.print(f"figures: {', '.join(str(f) for f in figures) or 'none (no rows to draw)'}")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep's options (shared by ``tangentlens sweep`` and scripts/sweep_checkpoints.py)."""
    parser.add_argument(
        "--recipe", default="quickstart", help="a built-in recipe name or a TOML file"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe value, e.g. --set proxies.rank=32 (repeatable)",
    )
    parser.add_argument("--out", help="run directory (default runs/<recipe>)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue a run: only units whose output is missing run (on any executor)",
    )
    parser.add_argument(
        "--executor",
        choices=EXECUTOR_KINDS,
        help="where units run (default: the recipe's [executor] kind, else local)",
    )
    parser.add_argument(
        "--plan-only",
        action="store_true",
        help="print the plan of units (with --out of an existing run: what is done), its memory "
        "plan and its predicted time, and exit",
    )
    parser.add_argument(
        "--timings",
        metavar="RUN_DIR",
        help="with --plan-only: predict the time from the units of this run (e.g. one step of the "
        "same recipe: --set suite.steps=last); default: --out when it holds a run of the recipe",
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="slurm: submit the units as dependent jobs and return; --resume collects them",
    )
    parser.set_defaults(handler=_sweep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tangentlens", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)
    add_sweep_arguments(
        commands.add_parser("sweep", help="run a probe recipe over a suite's checkpoints")
    )
    report = commands.add_parser("report", help="re-render the report of a run directory")
    report.add_argument("run_dir", help="a run directory written by `tangentlens sweep`")
    report.set_defaults(handler=_report)
    compare = commands.add_parser(
        "compare",
        help="compare run directories side by side (metrics per relative depth, differences, "
        "settings that differ, figures)",
    )
    compare.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="two or more run directories (the first is "
        "the reference the differences are taken against)",
    )
    compare.add_argument(
        "--out",
        help="folder for compare.parquet and the figures (default "
        "runs/compare-<RUN_A>-vs-<RUN_B>…, from the run folders' names)",
    )
    compare.add_argument(
        "--step",
        type=_step_choice,
        default="last",
        help="the step compared: 'last' (each run's last scored step with rows, the default) "
        "or a step every run has",
    )
    compare.set_defaults(handler=_compare)
    show = commands.add_parser(
        "suite", help="show a checkpoint suite (training a mini suite on first use)"
    )
    show.add_argument(
        "name",
        help="mini-pythia, mini-bert, a Pythia model (EleutherAI/pythia-160m), a hub suite "
        "(allenai/OLMo-1B-hf or olmo-1b, smollm2-360m, eurobert-210m, …) or a folder",
    )
    show.add_argument("--offline", action="store_true", help="use only the local caches")
    show.add_argument(
        "--verify",
        action="store_true",
        help="check the shown checkpoints and the final one: identical weights (any pair), "
        "damaged weight files, config fields that differ",
    )
    show.set_defaults(handler=_suite)
    train = commands.add_parser(
        "train-suite", help="train a built-in mini suite into the cache (no-op when cached)"
    )
    train.add_argument("name", help="mini-pythia, mini-bert (or micro-pythia, micro-bert)")
    train.set_defaults(handler=_train_suite, offline=True, verify=False)
    for sub in (show, train):
        sub.add_argument("--steps", default="all", help="step selection: all, log:N, A..B, 0,1000")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        args.handler(args)
    except (ValueError, OSError) as error:  # bad input, unusable paths: one red line
        from tangentlens.sweep.store import DiskFullError, disk_full

        full = disk_full(error) and not isinstance(error, DiskFullError)
        fail(f"the disk is full: {error}" if full else str(error))
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C, or a stop signal (tangentlens.sweep.stops)
        fail(str(stop) or "interrupted")
        return getattr(stop, "exit_code", 130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
