"""The ``untrained_block`` probe's table, named by import path in its ``Reporting``
(:mod:`tangentlens.probes.untrained_block`): its metrics per common bias norm N."""

from __future__ import annotations

from rich.table import Table

from tangentlens.drawing.tables import Row, fmt_value

__all__ = ["untrained_block_table"]


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
