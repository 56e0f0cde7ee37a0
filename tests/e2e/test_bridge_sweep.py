"""A sweep whose units load every checkpoint through TransformerLens' ``TransformerBridge``
(``suite.loader = "bridge"``) gives the hooked sweep's table — every unit kind: window captures,
the frozen-early fit, per-step probes, update alignment across steps, the untrained block —
within the parity tolerances (:mod:`tests.integration.bridge_parity`), and records its loader."""

from __future__ import annotations

import json

from tangentlens.sweep.store import read_results
from tests.integration.bridge_parity import TOLERANCES, keyed, mismatches, tolerance_class


def test_a_bridge_sweep_gives_the_hooked_sweeps_table(
    sweeps, units_env, units_reference, tmp_path
) -> None:
    out = tmp_path / "bridge"
    process = sweeps.start(
        ["--out", str(out), *sweeps.units, "--set", "suite.loader='bridge'"], units_env
    )
    assert process.wait(timeout=600) == 0, process.stderr.read()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["loader"] == "bridge" and manifest["recipe"]["suite"]["loader"] == "bridge"
    assert manifest["memory_plan"]["modelled_loader"] == "hooked"  # not measured for the bridge
    reference = json.loads((units_reference / "manifest.json").read_text())
    assert reference["loader"] == "hooked"

    def site_key(site: str) -> str:  # a decoder: both loaders name every site alike
        return site

    hooked = keyed(read_results(units_reference).to_pylist(), site_key)
    bridge = keyed(read_results(out).to_pylist(), site_key)
    assert {k[1] for k in hooked} >= {"update_alignment", "tangent_energy", "untrained_block"}
    assert {tolerance_class(row) for row in hooked.values()} <= set(TOLERANCES)
    assert mismatches(hooked, bridge) == []
