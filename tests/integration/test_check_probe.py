"""Every built-in probe with per-step rows passes ``check_probe`` on a real capture (the micro
suite's last step), its rows checked against the schema and its declared metrics — the check a
researcher runs on a probe of their own."""

from __future__ import annotations

import pytest

from tangentlens.checks import build_section
from tangentlens.conformance import check_probe
from tangentlens.core.proxy_stage import ProxiesSpec
from tangentlens.proxies import fit_proxies
from tangentlens.registry import StepInputs, builtin_probes

#: The micro recipe's small settings (tests/e2e/recipes/micro.toml): its stage, its probes.
STAGE = {"methods": ["pca"], "rank": 4, "draws": 20}
TABLES = {
    "tangent_energy": {"bootstrap": 20},
    "shape_of_learning": {"twonn_batch": 256},
    "frequency_geometry": {"min_count": 3, "k": 16, "tangent_dim": 4, "n_anchors": 128},
    "anisotropy_share": {"isoscore_draws": 3},
    "subspace_stability": {"seeds": 2},
}
PER_STEP = sorted(name for name, probe in builtin_probes().items() if probe.per_step)


def _config(name: str):
    probe = builtin_probes()[name]
    return build_section(probe.config, TABLES.get(name, {}), f"probes.{name}")


@pytest.fixture(scope="module")
def step_inputs(micro_step_data):
    stage = build_section(ProxiesSpec, STAGE, "proxies")
    sites = micro_step_data.statistics.sites
    proxies = {s: fit_proxies(stats, stage.proxy_config()).bases for s, stats in sites.items()}
    return StepInputs(micro_step_data, micro_step_data, proxies, own=proxies, tangent=stage)


@pytest.mark.parametrize("name", PER_STEP)
def test_each_per_step_probe_passes_check_probe_on_a_capture(name, step_inputs):
    probe = builtin_probes()[name]
    rows = check_probe(probe, _config(name), step=step_inputs)
    assert rows and {r["probe"] for r in rows} == {name}
    assert {r["step"] for r in rows} == {step_inputs.capture.step}
    assert {r["metric"] for r in rows} <= set(probe.metrics)
