"""Rich tables of a run's results: headline metrics over steps and layers (or frequency bins),
compact enough for a 100-column terminal. ``tangentlens report RUN_DIR`` re-renders them.

Step 0 (random weights) is the first row of each table, labelled ``0 (init)``: the baseline the
later steps are read against (:mod:`tangentlens.report.baseline`); a run without step 0 says so
in one line above the tables."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tangentlens.report.baseline import baseline_notice, step_label
from tangentlens.report.console import fmt_value
from tangentlens.report.declared import reported_probes
from tangentlens.report.reproduction import reproduction_summary
from tangentlens.reporting import load_renderer
from tangentlens.sweep.store import read_results
from tangentlens.sweep.timing import time_line

__all__ = ["energy_tables", "render_report", "untrained_block_table"]

Row = dict[str, Any]


def _pivot(
    rows: list[Row],
    title: str,
    column: str,
    cell: Callable[[list[Row]], str],
    column_label: Callable[[Any], str] = str,
) -> Table | None:
    """Steps down, ``column`` values across; ``cell`` renders the rows of one (step, column)."""
    if not rows:
        return None
    grid: dict[tuple[int, Any], list[Row]] = defaultdict(list)
    for r in rows:
        grid[(r["step"], r[column])].append(r)
    steps = sorted({r["step"] for r in rows})
    columns = sorted({r[column] for r in rows}, key=lambda c: (c is not None, str(c).zfill(6)))
    table = Table(title=f"[bold]{title}", title_justify="left", pad_edge=False, box=None)
    table.min_width = min(100, len(title) + 2)
    table.add_column("step", justify="right", style="bold")
    for c in columns:
        table.add_column(column_label(c), justify="right")
    for step in steps:
        table.add_row(step_label(step), *(cell(grid.get((step, c), [])) for c in columns))
    return table


def _mean_cell(rows: list[Row]) -> str:
    values = [r["value"] for r in rows if r["value"] is not None and not math.isnan(r["value"])]
    return fmt_value(statistics.fmean(values)) if values else "–"


def _select(rows: list[Row], probe: str, metric: str, **where: Any) -> list[Row]:
    return [
        r
        for r in rows
        if r["probe"] == probe
        and r["metric"] == metric
        and all(r[k] == v for k, v in where.items())
    ]


def _layer_label(layer: Any) -> str:
    return "emb" if layer is None else f"L{layer}"


def _manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _header_lines(run_dir: Path, rows: list[Row]) -> list[str]:
    """A run without step 0 (no baseline at initialisation); from the run's manifest: the
    frozen-early fit window, and checkpoints whose weights are identical (a suite serving the
    same weights at two steps), the memory plan, the run's time against its prediction."""
    manifest = _manifest(run_dir)
    notice = baseline_notice(rows)
    lines = [f"[yellow]{notice}[/]"] if notice else []
    window = manifest.get("fit_window")
    if window:
        lines.append(
            f"[dim]frozen-early proxies fitted on checkpoints {', '.join(map(str, window))}; "
            f"update alignment of transitions starting before step {window[-1]} is reported as "
            "*_in_window_*[/]"
        )
    integrity = manifest.get("integrity", {})
    for earlier, later in integrity.get("duplicates", []):
        lines.append(
            f"[yellow]identical checkpoints: steps {earlier} and {later} have the same weights "
            "(the suite served one checkpoint twice); their rows measure the same model[/]"
        )
    if integrity.get("not_checked"):
        steps = ", ".join(map(str, integrity["not_checked"]))
        lines.append(f"[dim]weights not on this machine, not checked for duplicates: {steps}[/]")
    memory = manifest.get("memory_plan")
    if memory:
        budgets = memory.get("budgets", {})
        checked = [
            f"{where} {budgets[where] / 1024**3:.1f} GiB"
            for where in ("accelerator", "host")
            if budgets.get(where)
        ]
        against = f"; checked against {', '.join(checked)}" if checked else "; not checked"
        lines.append(f"[dim]{escape(memory['summary'])}{against}[/]")
    if manifest.get("time"):
        line = time_line(manifest["time"], manifest.get("resumed", False))
        lines.append(f"[dim]{escape(line)}[/]")
    return lines


def _ratio_and_p(cell_rows: list[Row]) -> str:
    """One cell of an energy table: ``energy_ratio`` and its p-value (one site, method, bin
    and step)."""
    by_metric = {r["metric"]: r["value"] for r in cell_rows}
    if "energy_ratio" not in by_metric:
        return "–"
    ratio, p = by_metric["energy_ratio"], by_metric.get("energy_p_value")
    return f"{fmt_value(ratio)} p{fmt_value(p)}"


def energy_tables(energy: list[Row]) -> list[Table | None]:
    """Steps × frequency bins of ``energy_ratio`` and its p-value at the deepest layer, one
    table per site there (``resid_post`` and ``mlp_out`` of one block are two tables, each
    titled by its site) and per proxy method."""
    deepest = max((r["layer"] for r in energy if r["layer"] is not None), default=None)
    picked = [
        r
        for r in energy
        if r["layer"] == deepest and r["metric"] in ("energy_ratio", "energy_p_value")
    ]
    tables: list[Table | None] = []
    for site in sorted({r["site"] for r in picked}):
        for method in sorted({r["method"] for r in picked if r["site"] == site}):
            cell = [r for r in picked if r["site"] == site and r["method"] == method]
            title = f"energy ratio and p-value against the exchangeable controls — {method}, {site}"
            tables.append(_pivot(cell, title, "freq_bin", _ratio_and_p))
    return tables


def untrained_block_table(rows: list[Row]) -> list[Table | None]:
    """The untrained block's metrics per common bias norm N (the probe's ``method``,
    ``N=<value>``), one row per N ascending."""
    table = Table(
        title="[bold]untrained block with a common bias of norm N",
        box=None,
        title_justify="left",
    )
    metrics = [
        "input_cosine_anisotropy",
        "output_cosine_anisotropy",
        "norm_ratio",
        "attention_entropy",
    ]
    table.add_column("N", justify="right")
    for m in metrics:
        table.add_column(m.replace("_", " "), justify="right")
    norms = sorted({r["method"] for r in rows}, key=lambda m: float(m.split("=")[1]))
    for norm in norms:
        values = {r["metric"]: r["value"] for r in rows if r["method"] == norm}
        table.add_row(norm.split("=")[1], *(fmt_value(values.get(m)) for m in metrics))
    return [table]


def _probe_tables(rows: list[Row], manifest: dict[str, Any]) -> list[Table | None]:
    """Each present probe's declared tables (:mod:`tangentlens.reporting`), in recipe order: a
    step × layer table of its metric over every token (``freq_bin`` "all", the mean over
    methods), or what its custom renderer draws from the probe's rows."""
    tables: list[Table | None] = []
    for probe in reported_probes(rows, [manifest]):
        own = [r for r in rows if r["probe"] == probe.name]
        for declared in probe.tables:
            if not declared.in_report:
                continue
            if declared.render is not None:
                tables += load_renderer(declared.render)(own)
                continue
            selected = _select(own, probe.name, declared.metric, freq_bin="all")
            tables.append(_pivot(selected, declared.title, "layer", _mean_cell, _layer_label))
    return tables


def render_report(run_dir: str | Path, console: Console) -> None:
    """Print the headline tables of the run in ``run_dir``."""
    rows = read_results(run_dir).to_pylist()
    header = _header_lines(Path(run_dir), rows)
    for line in header:
        console.print(line, soft_wrap=True)
    if header:
        console.print()
    tables: list[Table | None] = [
        _pivot(
            _select(rows, "capture", "mean_loss"),
            "held-out loss",
            "probe",
            _mean_cell,
            lambda _: "loss",
        ),
        *_probe_tables(rows, _manifest(Path(run_dir))),
    ]
    for table in tables:
        if table is not None:
            console.print(table)
            console.print()
    findings = reproduction_summary(rows)
    if findings:
        console.print("[bold]Reproduction summary[/] (the seed papers' qualitative findings)")
        colours = {True: "green", False: "red", None: "yellow"}
        for finding in findings:
            mark = f"[{colours[finding.holds]}]{finding.verdict}[/]"
            console.print(f"• {escape(finding.claim)}: {mark} — {escape(finding.evidence)}")
