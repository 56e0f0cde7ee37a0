"""``compare`` and the statistics' precision: runs of one precision compare as before; a float32
run beside a float64 one is compared (flagged) only when its stated bound is within
``MIXED_PRECISION_BOUND``, else every row is refused in one line naming both precisions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tangentlens.comparison import compare
from tangentlens.comparison.settings import MIXED_PRECISION_BOUND
from tangentlens.results import row
from tangentlens.sweep.store import RunStore

RECIPE = {"name": "r", "suite": {"name": "micro-pythia"}, "data": {"n_bins": 3}, "probes": {}}


def _run(root: Path, scale: float, **manifest: Any) -> Path:
    store = RunStore(root)
    rows = [
        row("s", 10, 100, "cosine_drift", "cosine_anisotropy", 0.1 * scale, site=site, layer=layer)
        for layer, site in enumerate(["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"])
    ]
    store.write_part("step-all", rows)
    store.write_manifest({"recipe": RECIPE, "finished": True, "n_layers": 2, **manifest})
    return root


def _float32(bound: float) -> dict[str, Any]:
    return {"statistics_dtype": "float32", "statistics_bound": {"relative": bound}}


def test_one_precision_compares_without_a_word(tmp_path):
    bound = MIXED_PRECISION_BOUND * 10  # one precision: its bound does not matter
    a, b = (_run(tmp_path / name, scale, **_float32(bound)) for name, scale in (("a", 1), ("b", 2)))
    comparison = compare([a, b])
    assert len(comparison.to_pylist()) == 6
    assert not any("precision" in line for line in comparison.flagged)


def test_mixed_precisions_within_the_bound_are_compared_and_flagged(tmp_path):
    a = _run(tmp_path / "a", 1.0, statistics_dtype="float64")
    b = _run(tmp_path / "b", 2.0, **_float32(MIXED_PRECISION_BOUND / 10))
    comparison = compare([a, b])
    assert len(comparison.to_pylist()) == 6  # two rows each, and their differences
    assert [line for line in comparison.flagged if "precision" in line] == [
        "statistics precision differs (a float64, b float32 (bound 1.0e-04)): within 0.001"
    ]


def test_mixed_precisions_beyond_the_bound_are_refused(tmp_path):
    a = _run(tmp_path / "a", 1.0)  # from before the setting: float64
    b = _run(tmp_path / "b", 2.0, **_float32(4.9e-4 * 10))
    with pytest.raises(ValueError, match=r"statistics precision differs \(a float64, b float32"):
        compare([a, b])
