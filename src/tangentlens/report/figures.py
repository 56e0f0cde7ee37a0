"""PNG figures of a run, written to ``RUN_DIR/figures``:

* ``tangent_energy.png`` — energy fraction of each proxy against the controls' band (min–max,
  and mean) over steps, one panel per frequency bin, at the deepest captured layer;
* ``anisotropy_depth.png`` — centred and cosine anisotropy against depth, one line per step;
* ``twonn.png`` — TwoNN intrinsic dimension over steps, one line per layer;
* ``qk_drift.png`` — cos(m_Q, m_K) and attention entropy over steps (mean over heads).

Steps are drawn on a symmetric-log axis (step 0 and Pythia's log-spaced early steps both show).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tangentlens.sweep.store import read_results

__all__ = ["write_figures"]

Row = dict[str, Any]


def _series(
    rows: list[Row], probe: str, metric: str, by: str
) -> dict[Any, list[tuple[int, float]]]:
    """``{by value: [(step, mean value over the other keys)]}``, steps ascending."""
    grouped: dict[tuple[Any, int], list[float]] = defaultdict(list)
    for r in rows:
        if r["probe"] == probe and r["metric"] == metric:
            grouped[(r[by], r["step"])].append(r["value"])
    out: dict[Any, list[tuple[int, float]]] = defaultdict(list)
    for (key, step), values in sorted(grouped.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        out[key].append((step, statistics.fmean(values)))
    return out


def _steps_axis(ax: Any) -> None:
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=0)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)


def _layer_name(layer: Any) -> str:
    return "embed" if layer is None else f"layer {layer}"


def _tangent_energy(rows: list[Row], path: Path) -> bool:
    energy = [r for r in rows if r["probe"] == "tangent_energy"]
    if not energy:
        return False
    deepest = max((r["layer"] for r in energy if r["layer"] is not None), default=None)
    energy = [r for r in energy if r["layer"] == deepest]
    bins = sorted({r["freq_bin"] for r in energy}, key=lambda b: (b == "all", b))
    methods = sorted({r["method"] for r in energy})
    fig, axes = plt.subplots(1, len(bins), figsize=(3.2 * len(bins), 3.4), sharey=True)
    axes = axes if len(bins) > 1 else [axes]
    for ax, b in zip(axes, bins, strict=True):
        cell = [r for r in energy if r["freq_bin"] == b]
        for i, method in enumerate(methods):
            picked = [r for r in cell if r["method"] == method]
            value = dict(_series(picked, "tangent_energy", "energy_fraction", "method")[method])
            low = dict(_series(picked, "tangent_energy", "energy_control_min", "method")[method])
            high = dict(_series(picked, "tangent_energy", "energy_control_max", "method")[method])
            mean = dict(_series(picked, "tangent_energy", "energy_control_mean", "method")[method])
            steps = sorted(value)
            color = f"C{i}"
            ax.plot(steps, [value[s] for s in steps], "o-", color=color, label=f"{method} proxy")
            # each proxy against its own controls: ranks differ (mean_direction is rank 1)
            ax.fill_between(
                steps,
                [low[s] for s in steps],
                [high[s] for s in steps],
                color=color,
                alpha=0.15,
                label=f"{method} controls (min–max)",
            )
            ax.plot(steps, [mean[s] for s in steps], "--", color=color, linewidth=0.8)
        ax.set_title("all tokens" if b == "all" else f"frequency bin {b}")
        ax.set_yscale("log")
        _steps_axis(ax)
    axes[0].set_ylabel("gradient energy fraction")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Tangent energy vs matched-rank controls ({_layer_name(deepest)})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _anisotropy_depth(rows: list[Row], path: Path) -> bool:
    panels = [
        ("shape_of_learning", "centred_anisotropy", "centred anisotropy σ₁²/Σσ²"),
        ("cosine_drift", "cosine_anisotropy", "cosine anisotropy"),
    ]
    present = [p for p in panels if any(r["probe"] == p[0] for r in rows)]
    if not present:
        return False
    fig, axes = plt.subplots(1, len(present), figsize=(5.5 * len(present), 3.8))
    axes = axes if len(present) > 1 else [axes]
    steps = sorted({r["step"] for r in rows})
    cmap = plt.get_cmap("viridis")
    for ax, (probe, metric, label) in zip(axes, present, strict=True):
        by_step = _series(rows, probe, metric, "step")
        for i, step in enumerate(steps):
            per_layer = {}
            for r in rows:
                if r["probe"] == probe and r["metric"] == metric and r["step"] == step:
                    per_layer[-1 if r["layer"] is None else r["layer"]] = r["value"]
            if step in by_step and per_layer:
                layers = sorted(per_layer)
                color = cmap(i / max(len(steps) - 1, 1))
                ax.plot(layers, [per_layer[k] for k in layers], "o-", color=color, label=f"{step}")
        ticks = sorted(
            {-1 if r["layer"] is None else r["layer"] for r in rows if r["probe"] == probe}
        )
        ax.set_xticks(ticks, ["emb" if t == -1 else f"L{t}" for t in ticks])
        ax.set_xlabel("depth")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].legend(title="step", fontsize=7, ncol=2)
    fig.suptitle("Anisotropy against depth, over training")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _per_layer_over_steps(
    rows: list[Row], path: Path, panels: list[tuple[str, str, str]], title: str
) -> bool:
    present = [p for p in panels if any(r["probe"] == p[0] and r["metric"] == p[1] for r in rows)]
    if not present:
        return False
    fig, axes = plt.subplots(1, len(present), figsize=(5.5 * len(present), 3.8))
    axes = axes if len(present) > 1 else [axes]
    for ax, (probe, metric, label) in zip(axes, present, strict=True):
        for layer, points in sorted(
            _series(rows, probe, metric, "layer").items(),
            key=lambda kv: -1 if kv[0] is None else kv[0],
        ):
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=_layer_name(layer))
        ax.set_ylabel(label)
        _steps_axis(ax)
    axes[-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_figures(run_dir: str | Path) -> list[Path]:
    """Write every figure the run's results allow; returns their paths."""
    rows = read_results(run_dir).to_pylist()
    folder = Path(run_dir) / "figures"
    folder.mkdir(exist_ok=True)
    written = []
    jobs = {
        "tangent_energy.png": lambda p: _tangent_energy(rows, p),
        "anisotropy_depth.png": lambda p: _anisotropy_depth(rows, p),
        "twonn.png": lambda p: _per_layer_over_steps(
            rows,
            p,
            [("shape_of_learning", "twonn_dimension", "TwoNN intrinsic dimension")],
            "Intrinsic dimension over training",
        ),
        "qk_drift.png": lambda p: _per_layer_over_steps(
            rows,
            p,
            [
                ("qk_drift", "qk_cosine", "cos(m_Q, m_K), mean over heads"),
                ("qk_drift", "attention_entropy", "attention entropy (nats)"),
            ],
            "Query/key drift over training",
        ),
    }
    for name, draw in jobs.items():
        path = folder / name
        if draw(path):
            written.append(path)
    return written
