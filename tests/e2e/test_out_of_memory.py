"""A unit that runs out of memory (a simulated ``torch.OutOfMemoryError``, as CUDA raises it)
fails in one line naming the unit, the plan's peak and a ``data.batch_size`` that fits, and is
not retried unchanged."""

from __future__ import annotations

import pytest
import torch

from tangentlens.core.recipe import load_recipe
from tangentlens.sweep import units
from tangentlens.sweep.runner import SweepFailedError, run_sweep


def test_a_unit_out_of_memory_fails_once_in_one_line(sweeps, units_env, tmp_path, monkeypatch):
    calls: list[str] = []

    def out_of_memory(recipe, store, unit, status):
        calls.append(unit.name)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")

    monkeypatch.setitem(units._RUNNERS, "step", out_of_memory)
    overrides = [arg for arg in sweeps.units if arg != "--set"]
    recipe = load_recipe(sweeps.recipe, [*overrides, "executor.retries=2"])
    with pytest.raises(SweepFailedError) as failed:
        run_sweep(recipe, tmp_path / "run")
    assert sorted(calls) == ["step-00000000", "step-00000040"]  # each once: not retried
    lines = {f.unit: f.error for f in failed.value.failures if f.unit.startswith("step")}
    for name, line in lines.items():
        assert line.startswith(f"UnitOutOfMemoryError: unit {name} ran out of host memory"), line
        assert "the plan's peak at data.batch_size = 16 is" in line
        assert "set data.batch_size = " in line
    log = (tmp_path / "run" / "logs" / "step-00000040.log").read_text()
    assert log.startswith(units.NOT_RETRIED)
