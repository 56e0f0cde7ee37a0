"""The threading runtime beside other work: the CPUs this process may use, and the passive
OpenMP wait policy every process and worker starts with."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tangentlens import runtime
from tangentlens.sweep.executors.base import worker_env


def test_usable_cpus_follow_the_affinity_mask_and_the_cgroup_quota(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(runtime, "_cgroup_quota", lambda: None)
    assert runtime.usable_cpus() == 6
    monkeypatch.setattr(runtime, "_cgroup_quota", lambda: 2.5)  # 250 ms per 100 ms period
    assert runtime.usable_cpus() == 3
    monkeypatch.setattr(runtime, "_cgroup_quota", lambda: 0.2)
    assert runtime.usable_cpus() == 1
    monkeypatch.setattr(runtime, "_cgroup_quota", lambda: 16.0)  # more than the mask allows
    assert runtime.usable_cpus() == 6


def test_cgroup_quotas_are_read_from_v2_and_v1_files(tmp_path):
    v2 = tmp_path / "cpu.max"
    v1 = (tmp_path / "cfs_quota_us", tmp_path / "cfs_period_us")
    v2.write_text("150000 100000\n")
    assert runtime._cgroup_quota(v2, v1) == pytest.approx(1.5)
    v2.write_text("max 100000\n")
    assert runtime._cgroup_quota(v2, v1) is None
    v2.unlink()
    v1[0].write_text("300000\n")
    v1[1].write_text("100000\n")
    assert runtime._cgroup_quota(v2, v1) == pytest.approx(3.0)
    v1[0].write_text("-1\n")  # no limit
    assert runtime._cgroup_quota(v2, v1) is None
    v1[0].write_text("garbled\n")
    assert runtime._cgroup_quota(v2, v1) is None
    v1[0].unlink()
    assert runtime._cgroup_quota(v2, v1) is None


def test_workers_get_the_passive_wait_policy_unless_the_user_chose_one(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert worker_env(2)["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert worker_env(2)["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_command_line_sets_the_policy_before_torch_is_imported():
    """A fresh interpreter running the command line (a plan, which loads no torch): the policy
    is in the environment and torch is still not loaded; a user's own value is kept."""
    script = (
        "import os, sys\n"
        "from tangentlens.cli import main\n"
        "code = main(['sweep', '--recipe', 'quickstart', '--plan-only'])\n"
        "print('RESULT', code, 'torch' in sys.modules, os.environ['OMP_WAIT_POLICY'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    for chosen, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        if chosen is not None:
            env["OMP_WAIT_POLICY"] = chosen
        run = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True
        )
        result = run.stdout.split("RESULT", 1)[1].split()
        assert result == ["0", "False", expected], run.stderr
