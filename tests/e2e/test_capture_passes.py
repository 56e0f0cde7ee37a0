"""Capture passes: the micro sweep with its sites split over three capture passes (the model
run three times per step) gives exactly the one-pass table, and ``--resume`` accepts a run
started with another number of passes (they are not part of the recipe's identity)."""

from __future__ import annotations

import json

from tangentlens.cli import main


def test_three_capture_passes_give_the_one_pass_table(
    units_reference, units_env, sweeps, tmp_path
) -> None:
    out = tmp_path / "passes"
    argv = ["sweep", "--recipe", sweeps.recipe, "--out", str(out), *sweeps.units]
    assert main([*argv, "--set", "capture.passes=3"]) == 0
    sweeps.assert_same_table(out, units_reference)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["memory_plan"]["passes"] == 3
    assert "passes" not in manifest["recipe"]["capture"]
