"""What travels with a unit to its worker, the resources each engine is asked for, and the
refusal of an executor this machine cannot run. Nothing here needs Slurm on the host: the Slurm
commands are stand-ins on a PATH of the test's own (and never run)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from tangentlens.cli import main
from tangentlens.core.recipe import load_recipe
from tangentlens.sweep.executors import SLURM_TOOLS, check_executor
from tangentlens.sweep.executors.base import concurrent_units, unit_cpus, worker_env


def _path_with(tmp_path: Path, tools: tuple[str, ...]) -> str:
    """A PATH of one folder holding stand-ins for ``tools`` (and nothing else)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for tool in tools:
        script = folder / tool
        script.write_text("#!/bin/sh\necho 'not a real Slurm' >&2\nexit 1\n")
        script.chmod(0o755)
    return str(folder)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch, srun and squeue on PATH, whatever the host has (submitit looks for srun)."""
    monkeypatch.setenv("PATH", _path_with(tmp_path, SLURM_TOOLS))


@pytest.fixture
def no_slurm(tmp_path, monkeypatch):
    """A PATH without any Slurm command, whatever the host has."""
    monkeypatch.setenv("PATH", _path_with(tmp_path, ()))


def test_worker_env_carries_offline_mode_caches_and_thread_pools(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TANGENTLENS_CACHE", "/shared/cache")
    monkeypatch.delenv("HF_HOME", raising=False)
    env = worker_env(3)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TANGENTLENS_CACHE"] == "/shared/cache"
    assert "HF_HOME" not in env  # only what is set here travels
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"


def test_units_get_at_least_their_threads_and_workers_fill_the_cores(monkeypatch):
    monkeypatch.setattr("tangentlens.sweep.executors.base.usable_cpus", lambda: 8)
    recipe = load_recipe("quickstart", ["capture.threads=2"])
    assert unit_cpus(recipe) == 2 and concurrent_units(recipe) == 4
    recipe = load_recipe("quickstart", ["capture.threads=2", "executor.cpus_per_unit=3"])
    assert unit_cpus(recipe) == 3 and concurrent_units(recipe) == 2
    recipe = load_recipe("quickstart", ["capture.threads=16"])
    assert concurrent_units(recipe) == 1
    recipe = load_recipe("quickstart", ["executor.workers=5"])
    assert concurrent_units(recipe) == 5


def test_slurm_jobs_carry_the_environment_resources_and_sbatch_options(
    fake_slurm, monkeypatch, tmp_path
):
    pytest.importorskip("submitit")
    from tangentlens.sweep.executors.submitit import _additional, _executor

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = [
        "executor.kind='slurm'",
        "executor.partition='gpu'",
        "executor.time_min=90",
        "executor.array_parallelism=4",
        "executor.memory_gb=16",
        "executor.sbatch={account='lab', nice=10}",
        "capture.threads=4",
    ]
    recipe = load_recipe("quickstart", overrides)
    params = _executor(recipe, tmp_path)._executor.parameters
    assert params["partition"] == "gpu" and params["time"] == 90
    assert params["array_parallelism"] == 4 and params["cpus_per_task"] == 4
    assert params["mem"] == "16GB"
    assert "export HF_HUB_OFFLINE=1" in params["setup"]
    assert "export OMP_NUM_THREADS=4" in params["setup"]
    extra = _additional(recipe, ["17_0", "17_1"])
    assert extra == {
        "requeue": True,
        "account": "lab",
        "nice": 10,
        "dependency": "afterok:17_0:17_1",
        "kill_on_invalid_dep": "yes",
    }
    assert "dependency" not in _additional(recipe)


def test_detach_needs_slurm(tmp_path):
    from tangentlens.sweep.runner import run_sweep

    recipe = load_recipe("quickstart", ["executor.kind='ray'"])
    with pytest.raises(ValueError, match=r"--detach .* needs executor.kind = 'slurm', got 'ray'"):
        check_executor(recipe, detach=True)
    with pytest.raises(ValueError, match=r"--detach .* needs executor.kind = 'slurm', got 'ray'"):
        run_sweep(recipe, tmp_path / "run", detach=True)  # refused before anything is made
    assert not (tmp_path / "run").exists()


def test_a_failed_submitit_job_reports_the_units_error_and_log(tmp_path):
    """The error line is the last line of the unit's own traceback, not of submitit's message
    (which ends with the paths of its logs)."""
    submitit = pytest.importorskip("submitit")
    from types import SimpleNamespace

    from tangentlens.sweep.executors.submitit import SubmititBackend
    from tangentlens.sweep.plan import Unit

    class FailedJob:
        paths = SimpleNamespace(result_pickle=tmp_path / "result.pkl", stderr=tmp_path / "err")

        def result(self):
            raise submitit.core.utils.FailedJobError(
                "Job failed\nTraceback …\nRuntimeError: boom\n---\n  - /x/2642_0_log.out"
            )

    (tmp_path / "result.pkl").write_bytes(b"")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "step-00000010.log").write_text("Traceback …\nValueError: bad site\n")
    backend = SimpleNamespace(root=tmp_path)
    unit = Unit("step-00000010", "step", 10, (), "results/step-00000010.parquet")
    done = SubmititBackend._finished(backend, unit, FailedJob(), 0.0, None)  # type: ignore[arg-type]
    assert done.error == "ValueError: bad site"
    assert done.log == str(tmp_path / "logs" / "step-00000010.log")


ALTERNATIVES = "executor.kind = 'local' | 'ray' | 'submitit-local'"


@pytest.fixture
def nothing_runs(monkeypatch):
    """Training a suite or running a sweep fails the test: a refusal must come before both."""

    def ran(*args, **kwargs):
        raise AssertionError("a suite was trained or a sweep started before the executor check")

    suites = types.ModuleType("tangentlens.models.suites")
    suites.MINI_SUITE_CONFIGS = {"mini-pythia": None}  # type: ignore[attr-defined]
    suites.ensure_mini_suite = ran  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tangentlens.models.suites", suites)
    monkeypatch.setattr("tangentlens.sweep.runner.run_sweep", ran)


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", "executor.kind='slurm'"],
        ["--executor", "slurm"],
        ["--executor", "slurm", "--detach"],
    ],
)
def test_slurm_without_its_commands_is_one_line_exit_2_and_no_run_directory(
    no_slurm, nothing_runs, capsys, tmp_path, argv
):
    out = tmp_path / "run"
    assert main(["sweep", "--recipe", "quickstart", "--out", str(out), *argv]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error, error
    assert error.startswith("error: executor.kind = 'slurm' needs Slurm's sbatch, srun, squeue")
    assert "not found: sbatch, srun, squeue;" in error
    assert "scripts/slurm_localhost.sh start" in error and ALTERNATIVES in error
    assert not out.exists()


def test_the_slurm_check_names_only_the_missing_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path, ("sbatch",)))
    recipe = load_recipe("quickstart", ["executor.kind='slurm'"])
    with pytest.raises(ValueError, match=r"on PATH, not found: srun, squeue; start a local"):
        check_executor(recipe)


def test_the_slurm_check_passes_with_the_commands_and_other_kinds_need_none(
    fake_slurm, tmp_path, monkeypatch
):
    check_executor(load_recipe("quickstart", ["executor.kind='slurm'"]))
    check_executor(load_recipe("quickstart", ["executor.kind='slurm'"]), detach=True)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    for kind in ("local", "ray", "submitit-local"):
        check_executor(load_recipe("quickstart", [f"executor.kind='{kind}'"]))


def test_local_jobs_start_as_the_job_itself_with_the_units_environment(monkeypatch, tmp_path):
    """``submitit-local`` starts each job directly (no ``sh -c`` from a setup: cancelling a
    job must signal the job), with the units' environment set while it starts and restored
    after."""
    pytest.importorskip("submitit")
    from tangentlens.sweep.executors.submitit import _executor, _local_env

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    recipe = load_recipe("quickstart", ["executor.kind='submitit-local'", "capture.threads=3"])
    executor = _executor(recipe, tmp_path)
    assert not executor._executor.parameters.get("setup")
    with _local_env(executor, recipe):
        seen = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    assert seen == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    assert os.environ["OMP_NUM_THREADS"] == "7" and "MKL_NUM_THREADS" not in os.environ
