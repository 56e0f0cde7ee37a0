"""Rich tables of a run's results: the held-out loss and each present probe's declared tables,
headline metrics over steps and layers, or what the probe's own renderer draws from its rows
(``Table.render``, loaded by import path: this module names no probe), compact enough for a
100-column terminal. ``tangentlens report RUN_DIR`` re-renders them.

A table never averages rows that differ in a key that varies: one table per block site kind
(``resid_post`` and ``mlp_out`` of one block are never one "L0" cell), per proxy method and
rank where a probe's table is per method; a table that averages the methods (attention heads)
says so in its title. Where the rows carry an interval the cell shows it: ``value [low,
high]``.

Step 0 (random weights) is the first row of each table, labelled ``0 (init)``: the baseline the
later steps are read against (:mod:`tangentlens.report.baseline`); a run without step 0 says so
in one line above the tables."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tangentlens.drawing.tables import fmt_value, interval, pivot
from tangentlens.models.sites import site_kind
from tangentlens.report.baseline import baseline_notice
from tangentlens.report.declared import reported_probes
from tangentlens.report.reproduction import reproduction_summary
from tangentlens.reporting import load_renderer
from tangentlens.sweep.store import read_results
from tangentlens.sweep.timing import time_line

__all__ = ["render_report"]

Row = dict[str, Any]


def _known(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r["value"] is not None and not math.isnan(r["value"])]


def _with_interval(value: str, ci: tuple[float, float] | None) -> str:
    if ci is None:
        return value
    return f"{value} [{fmt_value(ci[0])}, {fmt_value(ci[1])}]"


def _mean_cell(rows: list[Row]) -> str:
    """The value (the mean of several rows' values), with its interval where the rows carry
    one (the means of their ends)."""
    known = _known(rows)
    if not known:
        return "–"
    return escape(
        _with_interval(fmt_value(statistics.fmean(r["value"] for r in known)), interval(known))
    )


def _select(rows: list[Row], probe: str, metric: str, **where: Any) -> list[Row]:
    return [
        r
        for r in rows
        if r["probe"] == probe
        and r["metric"] == metric
        and all(r[k] == v for k, v in where.items())
    ]


def _kind(r: Row) -> str:
    """A row's site kind (``"-"`` for a row about the whole model)."""
    return site_kind(r["site"] or "-") or "-"


def _place(r: Row) -> tuple[str, int | None]:
    """A table column: the row's site kind and block."""
    return (_kind(r), r["layer"])


def _place_label(place: tuple[str, int | None]) -> str:
    kind, layer = place
    if layer is not None:
        return f"L{layer}"
    return "emb" if kind == "embed" else kind


def _place_order(place: tuple[str, int | None]) -> tuple[int, int, str]:
    kind, layer = place
    return (-1 if kind == "embed" else 0, -1 if layer is None else layer, kind)


def _proxy_label(method: Any, rank: Any) -> str:
    return str(method) if rank is None else f"{method} (rank {rank})"


def _declared_tables(rows: list[Row], declared: Any, probe: str) -> list[Table | None]:
    """A declared table of ``probe``'s metric over every token (``freq_bin`` "all"): steps ×
    blocks, one table per key that varies — per block site kind (the embedding and the
    model's rows beside each) and, for a table per method (``per_method``), per (method,
    rank) — each titled by what it holds; a table that averages the methods says so."""
    selected = _select(rows, probe, declared.metric, freq_bin="all")
    blocks = sorted({_kind(r) for r in selected if r["layer"] is not None})
    kinds: list[str | None] = list(blocks) if len(blocks) > 1 else [None]
    proxies = sorted(
        {(r["method"], r["rank"]) for r in selected}, key=lambda p: (str(p[0]), p[1] or 0)
    )
    split = declared.per_method and len(proxies) > 1
    tables: list[Table | None] = []
    for kind in kinds:
        for proxy in proxies if split else [None]:
            picked = [
                r
                for r in selected
                if (kind is None or r["layer"] is None or _kind(r) == kind)
                and (proxy is None or (r["method"], r["rank"]) == proxy)
            ]
            parts = [kind] if kind is not None else []
            if proxy is not None:
                parts.append(_proxy_label(*proxy))
            title = declared.title + (f" — {', '.join(parts)}" if parts else "")
            averaged = {r["method"] for r in picked}
            if not split and len(averaged) > 1 and "mean over" not in declared.title:
                title += f" (mean over {len(averaged)} methods)"
            tables.append(pivot(picked, title, _place, _mean_cell, _place_label, _place_order))
    return tables


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


def _probe_tables(rows: list[Row], manifest: dict[str, Any]) -> list[Table | None]:
    """Each present probe's declared tables (:mod:`tangentlens.reporting`), in recipe order: a
    step × block table of its metric over every token (``freq_bin`` "all") per key that varies
    (:func:`_declared_tables`), or what its custom renderer draws from the probe's rows."""
    tables: list[Table | None] = []
    for probe in reported_probes(rows, [manifest]):
        own = [r for r in rows if r["probe"] == probe.name]
        for declared in probe.tables:
            if not declared.in_report:
                continue
            if declared.render is not None:
                tables += load_renderer(declared.render)(own)
                continue
            tables += _declared_tables(own, declared, probe.name)
    return tables


def render_report(run_dir: str | Path, console: Console) -> None:
    """Print the headline tables of the run in ``run_dir``."""
    rows = read_results(run_dir).to_pylist()
    header = _header_lines(Path(run_dir), rows)
    for line in header:
        console.print(line, soft_wrap=True)
    if header:
        console.print()
    manifest = _manifest(Path(run_dir))
    tables: list[Table | None] = [
        pivot(
            _select(rows, "capture", "mean_loss"),
            "held-out loss",
            lambda r: r["probe"],
            _mean_cell,
            lambda _: "loss",
        ),
        *_probe_tables(rows, manifest),
    ]
    for table in tables:
        if table is not None:
            console.print(table)
            console.print()
    findings = reproduction_summary(rows, [manifest])
    if findings:
        console.print("[bold]Reproduction summary[/] (the seed papers' qualitative findings)")
        colours = {True: "green", False: "red", None: "yellow"}
        for finding in findings:
            mark = f"[{colours[finding.holds]}]{finding.verdict}[/]"
            console.print(f"• {escape(finding.claim)}: {mark} — {escape(finding.evidence)}")
