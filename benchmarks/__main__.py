"""Run every ``benchmarks/bench_*.py`` (or the named ones) and print one table of ratios.

``python -m benchmarks [--quick] [--device cuda] [--dtype bfloat16] [--shape NAME ...]
[geometry capture ...]``. Each module exposes ``run(quick: bool) -> list[dict]`` (plus
``device``, ``dtype`` and ``shapes`` where it takes them) whose rows carry: ``benchmark``,
``shape``, ``reference_name``, ``ours_s``, ``reference_s``, ``ours``, ``reference``,
``difference``, ``difference_kind`` ("absolute" / "relative") and ``goal``.

On a GPU (each within the device machine's 10-minute command limit)::

    python -m benchmarks gpu                       # the GPU's table: capture, steps, suites
    python -m benchmarks capture --device cuda     # pythia-160m, pythia-1b at 16 × 512
    python -m benchmarks sweep --device cuda       # one pythia_1b-recipe sweep step

``gpu`` runs only when named (its device defaults to ``cuda``); ``python -m benchmarks gpu
--device cpu --quick`` is its smoke test on the smallest shapes.
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

from tangentlens.core.recipe import WEIGHT_DTYPES

MODULES = sorted(
    m.name.removeprefix("bench_")
    for m in pkgutil.iter_modules([str(Path(__file__).parent)])
    if m.name.startswith("bench_")
)
#: Run only when named: the GPU's table.
ON_REQUEST = ("gpu",)


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
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(MODULES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; allowed: {MODULES}")
    console = Console(width=180)
    rows: list[dict[str, Any]] = []
    for name in args.names or [m for m in MODULES if m not in ON_REQUEST]:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        kwargs: dict[str, Any] = {"quick": args.quick}
        accepted = inspect.signature(module.run).parameters
        for option in ("device", "dtype", "shapes"):
            if option in accepted and getattr(args, option) is not None:
                kwargs[option] = getattr(args, option)
        with console.status(f"running bench_{name}"):
            found = module.run(**kwargs)
        if hasattr(module, "render"):  # a table of its own (the GPU's)
            module.render(found, console)
        else:
            rows.extend(found)
    if rows:
        render(rows, console)


if __name__ == "__main__":
    main()
