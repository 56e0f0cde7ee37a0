"""Run every ``benchmarks/bench_*.py`` (or the named ones) and print one table of ratios.

``python -m benchmarks [--quick] [--device cuda] [--dtype bfloat16] [--shape NAME ...]
[geometry capture ...]``. Each module exposes ``run(quick: bool) -> list[dict]`` (plus
``device``, ``dtype`` and ``shapes`` where it takes them) whose rows carry: ``benchmark``,
``shape``, ``reference_name``, ``ours_s``, ``reference_s``, ``ours``, ``reference``,
``difference``, ``difference_kind`` ("absolute" / "relative") and ``goal``.

Every row is printed and appended to a JSON-lines file (``--rows``, default
``benchmark-rows.jsonl``) the moment it is measured — by the ``gpu`` benchmark row by row, by
the others when each finishes — and the table of every row is printed at the end.

On a GPU (each part within minutes; ``scripts/gpu_check.sh`` runs the whole check)::

    python -m benchmarks gpu --budget-s 420        # the GPU's parts that fit 7 minutes
    python -m benchmarks gpu --part capture --model pythia-1b
    python -m benchmarks capture --device cuda     # pythia-160m, pythia-1b at 16 × 512
    python -m benchmarks sweep --device cuda       # one pythia_1b-recipe sweep step

``gpu`` runs only when named (its device defaults to ``cuda``; ``--part``, ``--model`` and
``--budget-s`` are its); ``python -m benchmarks gpu --device cpu --quick`` is its smoke test on
the smallest shape.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks._rows import RowSink
from tangentlens.core.recipe import WEIGHT_DTYPES

MODULES = sorted(
    m.name.removeprefix("bench_")
    for m in pkgutil.iter_modules([str(Path(__file__).parent)])
    if m.name.startswith("bench_")
)
#: Run only when named: the GPU's table.
ON_REQUEST = ("gpu", "precision")


def render(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(
        title="tangentlens vs references",
        caption=f"torch {torch.__version__}, {torch.get_num_threads()} threads; best of repeats",
    )
    for col in ("benchmark", "shape", "reference", "ours", "ref", "ours/ref", "speedup"):
        table.add_column(col, justify="left" if col in ("benchmark", "reference") else "right")
    for col in ("ours value", "ref value", "difference", "goal"):
        table.add_column(col, justify="left" if col == "goal" else "right")
    for r in rows:
        if "skipped" in r:
            table.add_row(r["benchmark"], *[""] * 9, f"skipped: {r['skipped']}")
            continue
        unit = r.get("unit", "s")
        table.add_row(
            r["benchmark"],
            r["shape"],
            r["reference_name"],
            f"{r['ours_s']:.3f} {unit}",
            f"{r['reference_s']:.3f} {unit}",
            f"{r['ours_s'] / r['reference_s']:.3f}",
            f"{r['reference_s'] / r['ours_s']:.1f}×",
            f"{r['ours']:.8g}",
            f"{r['reference']:.8g}",
            f"{r['difference']:.1e} {r['difference_kind'][:3]}.",
            r["goal"],
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {MODULES}")
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument(
        "--device",
        help="device for the benchmarks that take one (capture, sweep: default cpu; gpu: cuda)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=list(WEIGHT_DTYPES),
        help="weight dtype for the benchmarks that take one (capture, sweep; both sides use it)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        dest="shapes",
        metavar="NAME",
        help="model shape(s) for the benchmarks that take them, instead of the device's "
        "(capture: mini-pythia or pythia-<size>; sweep: mini-pythia = the quickstart, or "
        "pythia-<size>); repeatable",
    )
    parser.add_argument(
        "--part",
        action="append",
        dest="parts",
        metavar="PART",
        help="gpu: the parts to run (capture, step, memory, suite; default all); repeatable",
    )
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="MODEL",
        help="gpu: the models (pythia-160m, pythia-1b; default both); repeatable",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="gpu: run the parts in order while their estimated time fits this many seconds; "
        "the others are named as skipped",
    )
    parser.add_argument(
        "--rows",
        default="benchmark-rows.jsonl",
        help="JSON-lines file each row is appended to as it is measured ('' = none)",
    )
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(MODULES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; allowed: {MODULES}")
    if args.parts or args.models:
        from benchmarks._parts import check_choices

        try:
            check_choices(tuple(args.parts or ()), tuple(args.models or ()))
        except ValueError as error:
            parser.error(str(error))
    console = Console(width=180)
    device = args.device or ("cuda" if "gpu" in args.names else "cpu")
    sink = RowSink(console, args.rows or None, device)
    rows: list[dict[str, Any]] = []
    for name in args.names or [m for m in MODULES if m not in ON_REQUEST]:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        kwargs: dict[str, Any] = {"quick": args.quick}
        accepted = inspect.signature(module.run).parameters
        for option in ("device", "dtype", "shapes", "parts", "models", "budget_s"):
            value = getattr(args, option)
            if option in accepted and value is not None:
                kwargs[option] = tuple(value) if isinstance(value, list) else value
        if "emit" in accepted:  # reports each row as it is measured
            found = module.run(emit=sink, **kwargs)
        else:
            with console.status(f"running bench_{name}"):
                found = module.run(**kwargs)
            for row in found:
                sink(row)
        if hasattr(module, "render"):  # a table of its own (the GPU's)
            module.render(found, console)
        else:
            rows.extend(found)
    if rows:
        render(rows, console)


if __name__ == "__main__":
    main()
