"""The same micro sweep on every executor gives exactly the local table: a real local Ray
cluster (worker processes), submitit's local executor, and a worker killed mid-unit (one run per
executor, shared by the table and the kill: tests/e2e/conftest.py ``executor_runs``). A run
stopped by SIGTERM and resumed on another executor: tests/e2e/test_recovery.py."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_executor_gives_the_local_table(executor, executor_runs, units_reference, sweeps):
    run = executor_runs(executor)
    sweeps.assert_same_table(run.out, units_reference, added=run.added)
    assert 1 <= run.peak <= 2  # at most `workers` units at once
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert manifest["executor"]["kind"] == executor and manifest["threads"] == 1
    assert not list((run.out / "units").glob("*.json"))  # no unit left marked running


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_a_worker_killed_mid_unit_is_retried_and_the_table_is_identical(
    executor, executor_runs, units_reference, sweeps
):
    run = executor_runs(executor)  # step-00000040's worker was killed while the unit ran
    assert run.killed != run.coordinator  # a worker, not the sweep: the sweep finished (rc 0)
    sweeps.assert_same_table(run.out, units_reference, added=run.added)
