"""The threading runtime beside other work: the CPUs this process may use, and the passive
OpenMP wait policy every process and worker starts with."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
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
    v2.write_text("150000 100000 later-fields\n")  # the first two are the quota and period
    assert runtime._cgroup_quota(v2, v1) == pytest.approx(1.5)
    v2.write_text("max 100000\n")
    assert runtime._cgroup_quota(v2, v1) is None
    v2.unlink()
    v1[0].write_text("300000\n")
    v1[1].write_text("100000\n")
    assert runtime._cgroup_quota(v2, v1) == pytest.approx(3.0)
    v1[0].write_text("-1\n")  # no limit
    assert runtime._cgroup_quota(v2, v1) is None
    v1[0].write_text("1\n")  # the smallest quota is a quota
    assert runtime._cgroup_quota(v2, v1) == pytest.approx(1e-5)
    v1[0].write_text("garbled\n")
    assert runtime._cgroup_quota(v2, v1) is None
    v1[0].unlink()
    assert runtime._cgroup_quota(v2, v1) is None


def test_workers_inherit_the_users_threading_runtime_settings(monkeypatch):
    for name in runtime.RUNTIME_VARS:
        monkeypatch.delenv(name, raising=False)
    assert not set(worker_env(2)) & set(runtime.RUNTIME_VARS)  # nothing imposed
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    env = worker_env(3)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["GOMP_SPINCOUNT"] == "10000"
    assert env["OMP_NUM_THREADS"] == "3"


def _threads_seen_by(monkeypatch, module, name: str) -> list[int]:
    """Replace ``module.name`` (a torch function) by one that records the thread count."""
    import torch

    seen: list[int] = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


def test_small_matrix_loops_run_on_one_thread_and_restore_the_count(monkeypatch):
    """Semi-NMF's fit (torch and numpy's BLAS) and the control frames' QR run on one thread
    (they spin on a busy core otherwise); the caller's thread counts are restored, also after
    an error."""
    import torch

    from tangentlens.dictionaries import SemiNMF
    from tangentlens.metrics import control_frames

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    blas_limit = runtime._blas_pools().limit(limits=2)
    blas_before = _blas_threads()  # 2, or fewer where OpenBLAS started with fewer CPUs
    try:
        with runtime.single_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), runtime.single_thread():
            raise RuntimeError
        assert torch.get_num_threads() == 2
        with runtime.threads(3):  # a unit's capture.threads
            assert torch.get_num_threads() == 3
        assert torch.get_num_threads() == 2

        pinv = _threads_seen_by(monkeypatch, torch.linalg, "pinv")
        blas = _blas_threads_seen_by(monkeypatch, np.linalg, "eigh")  # the loop runs in numpy
        SemiNMF(2, max_iter=3).fit(torch.randn(20, 5, generator=torch.Generator().manual_seed(0)))
        assert pinv and set(pinv) == {1}
        assert set(blas) == ({1} if blas_before else set())  # no pool found: nothing to pin
        assert _blas_threads() == blas_before  # restored
        qr = _threads_seen_by(monkeypatch, torch.linalg, "qr")
        control_frames(6, 2, 4, (0,))
        assert qr and set(qr) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
        blas_limit.restore_original_limits()


def _blas_threads() -> list[int]:
    return sorted({pool.num_threads for pool in runtime._blas_pools().lib_controllers})


def _blas_threads_seen_by(monkeypatch, module, name: str) -> list[int]:
    """Replace ``module.name`` by one that records numpy's BLAS thread count."""
    seen: list[int] = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        seen.extend(_blas_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


def test_a_unit_run_in_process_leaves_the_callers_thread_count(tmp_path, monkeypatch):
    """The local executor runs units in the coordinator's process: a unit runs at the recipe's
    ``capture.threads`` and the coordinator's count is restored after, also when it fails."""
    import torch

    from tangentlens.core.recipe import CaptureSpec, Recipe, SuiteSpec
    from tangentlens.core.resolve import resolve
    from tangentlens.models.configs import UntrainedBlockConfig
    from tangentlens.sweep import units
    from tangentlens.sweep.plan import Unit

    config = UntrainedBlockConfig(
        d_model=8, n_heads=2, d_mlp=16, n_sequences=2, seq_len=4, vocab_size=11, bias_norms=(0.0,)
    )
    recipe = Recipe(
        name="threads",
        suite=SuiteSpec(name="micro-pythia"),
        capture=CaptureSpec(threads=1),
        probes={"untrained_block": config},
    )
    unit = Unit("untrained-block", "model_free", None, (), "results/untrained-block.parquet")
    seen: list[int] = []
    real = units._RUNNERS["model_free"]

    def recording(*args):
        seen.append(torch.get_num_threads())
        return real(*args)

    monkeypatch.setitem(units._RUNNERS, "model_free", recording)
    run = resolve(recipe)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        units.run_unit(run, tmp_path, unit)
        assert seen == [1] and torch.get_num_threads() == 2
        monkeypatch.setitem(units._RUNNERS, "model_free", lambda *args: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            units.run_unit(run, tmp_path, unit)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_half_precision_slowdown_is_a_timed_ratio(monkeypatch):
    """The ratio of the two timed ``mm`` calls (the second of each: the first warms up)."""
    import torch

    clock = iter([0.0, 0.5, 10.0, 40.0])  # float32 0.5 s, bfloat16 30 s
    monkeypatch.setattr(runtime, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    mm, timed = torch.mm, []
    monkeypatch.setattr(torch, "mm", lambda a, b: timed.append((a.dtype, a.shape)) or mm(a, b))
    assert runtime.half_precision_slowdown("bfloat16", size=8) == pytest.approx(60.0)
    assert timed == [(torch.float32, (8, 8))] * 2 + [(torch.bfloat16, (8, 8))] * 2
    clock, timed[:] = iter([0.0, 1.0, 2.0, 3.0]), []
    runtime.half_precision_slowdown("float16")
    assert {shape for _, shape in timed} == {(512, 512)}  # the default: 512³ products
    monkeypatch.undo()
    assert runtime.half_precision_slowdown("float16", size=64) > 0  # the real clock


def test_a_slow_half_precision_cpu_sweep_is_warned_about(monkeypatch, caplog):
    from tangentlens.core.recipe import load_recipe
    from tangentlens.sweep import runner

    calls = []

    def slowdown(dtype):
        calls.append(dtype)
        return measured

    monkeypatch.setattr(runner, "half_precision_slowdown", slowdown)
    half = load_recipe("quickstart", ["suite.dtype='bfloat16'", "suite.device='cpu'"])
    measured = 60.0
    with caplog.at_level("WARNING", logger=runner.__name__):
        assert runner.warn_slow_half_precision(half) == 60.0
    assert "suite.dtype = 'bfloat16' on this CPU: its matmuls run 60× slower" in caplog.text
    assert "set suite.dtype = 'float32'" in caplog.text
    caplog.clear()
    measured = 2.0  # native kernels: no warning
    assert runner.warn_slow_half_precision(half) == 2.0 and not caplog.text
    full = load_recipe("quickstart", ["suite.device='cpu'"])
    assert runner.warn_slow_half_precision(full) is None and calls == ["bfloat16", "bfloat16"]


def test_a_task_alongside_runs_on_its_own_thread_and_the_block_on_the_others():
    """``alongside``: the task on a second thread, pinned to one (torch and numpy's BLAS); the
    block on the caller's threads less one; numpy's BLAS on one throughout; everything
    restored after; the task's exception raised where its result is asked for."""
    import threading

    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    blas_before = _blas_threads()
    seen: dict[str, object] = {}
    started = threading.Event()

    def task() -> str:
        seen["thread"] = threading.current_thread() is not threading.main_thread()
        seen["torch"] = torch.get_num_threads()
        seen["blas"] = _blas_threads()
        started.set()
        return "fitted"

    try:
        with runtime.alongside(task) as result:
            assert started.wait(10)
            assert torch.get_num_threads() == 2
            assert _blas_threads() == ([1] if blas_before else [])
            assert result() == "fitted"
        assert seen == {"thread": True, "torch": 1, "blas": [1] if blas_before else []}
        assert torch.get_num_threads() == 3 and _blas_threads() == blas_before

        def failing() -> None:
            raise KeyError("no proxies")

        with pytest.raises(KeyError, match="no proxies"), runtime.alongside(failing) as result:
            result()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(previous)


def test_alongside_with_one_thread_runs_the_task_in_line_once():
    """With one thread to the caller there is no second one to give: the task runs in line
    when its result is first asked for, once; never when it is not asked for."""
    import threading

    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    calls: list[bool] = []

    def task() -> int:
        calls.append(threading.current_thread() is threading.main_thread())
        return 7

    try:
        with runtime.alongside(task) as result:
            assert calls == []
            assert result() == 7 and result() == 7
        assert calls == [True]
        with runtime.alongside(task):
            pass
        assert calls == [True]
    finally:
        torch.set_num_threads(previous)


_STAT = (
    "cpu  {a} 0 0 {b} 0 0 0 0 0 0\ncpu0 {a0} 0 0 {i0} 5 0 0 0 0 0\ncpu1 {a1} 0 0 {i1} 5 0 0 0 0 0\n"
)


def test_busy_cpus_are_other_programs_jiffies_over_the_window_on_this_process_cpus(
    monkeypatch, tmp_path
):
    """cpu0 busy for the whole window, cpu1 idle: one of two CPUs busy; a CPU outside the
    affinity mask does not count; the idle and iowait columns are not busy."""
    stat = tmp_path / "stat"
    stat.write_text(_STAT.format(a=0, b=0, a0=100, i0=100, a1=100, i1=100))
    after = _STAT.format(a=0, b=0, a0=200, i0=100, a1=100, i1=200)
    monkeypatch.setattr(runtime.time, "sleep", lambda seconds: stat.write_text(after))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert runtime.busy_cpus(0.1, stat) == pytest.approx(1.0)
    stat.write_text(_STAT.format(a=0, b=0, a0=100, i0=100, a1=100, i1=100))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})  # only the idle one
    assert runtime.busy_cpus(0.1, stat) == 0.0
    assert runtime._cpu_jiffies({0}, stat) == (200, 305)  # iowait (5) counts as idle
    assert runtime._cpu_jiffies({0}, tmp_path / "missing") is None
    stat.write_text("garbled\n")
    assert runtime.busy_cpus(0.1, stat) is None


def test_busy_cpus_look_at_this_process_mask_for_a_quarter_second_by_default(monkeypatch, tmp_path):
    """The mask read is this process's (pid 0), and the default window is 0.25 s."""
    stat = tmp_path / "stat"
    stat.write_text(_STAT.format(a=0, b=0, a0=100, i0=100, a1=100, i1=100))
    asked: list[int] = []
    slept: list[float] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: asked.append(pid) or {0})
    monkeypatch.setattr(runtime.time, "sleep", slept.append)
    assert runtime.busy_cpus(stat=stat) is None  # nothing moved over the window
    assert asked == [0] and slept == [0.25]


def test_a_busy_loop_beside_is_seen_as_a_busy_cpu():
    import subprocess
    import sys

    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = runtime.busy_cpus(0.5)
    finally:
        loop.kill()
        loop.wait()
    assert busy is not None and busy >= 0.7


def test_idle_threads_sleep_when_other_programs_keep_a_cpu_busy(monkeypatch):
    """PASSIVE from one half busy CPU on (and the one line saying so), only before torch is
    imported, and never over the user's own runtime setting."""
    import sys

    for name in runtime.RUNTIME_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch")  # restored after the test
    monkeypatch.setattr(runtime, "busy_cpus", lambda: 0.49)
    assert runtime.passive_when_busy() is None and "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setattr(runtime, "busy_cpus", lambda: None)  # not Linux
    assert runtime.passive_when_busy() is None and "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setattr(runtime, "busy_cpus", lambda: 1.04)
    line = runtime.passive_when_busy()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert line is not None and line.startswith("other programs keep 1.0 of this process's")
    assert worker_env(2)["OMP_WAIT_POLICY"] == "PASSIVE"  # every worker started from here
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice stands
    assert runtime.passive_when_busy() is None and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setitem(sys.modules, "torch", object())  # too late: torch's threads have read it
    assert runtime.passive_when_busy() is None and "OMP_WAIT_POLICY" not in os.environ


@pytest.fixture
def no_runtime_vars(monkeypatch):
    """No runtime setting of the user's, torch not imported (both restored after)."""
    import sys

    for name in runtime.RUNTIME_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 4)


def test_idle_threads_sleep_from_exactly_the_threshold(monkeypatch, no_runtime_vars):
    assert runtime.BUSY_CPUS == 0.5
    monkeypatch.setattr(runtime, "busy_cpus", lambda: 0.5)
    assert runtime.passive_when_busy() == (
        "other programs keep 0.5 of this process's 4 CPUs busy: idle compute threads sleep "
        "(OMP_WAIT_POLICY=PASSIVE) rather than spin on a core they need; set OMP_WAIT_POLICY "
        "yourself to choose"
    )
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setattr(runtime, "busy_cpus", lambda: 1.5)
    assert runtime.passive_when_busy(threshold=1.5) is not None  # the threshold given
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert runtime.passive_when_busy(threshold=1.6) is None
    assert "OMP_WAIT_POLICY" not in os.environ


@pytest.mark.parametrize("name", ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"])
def test_each_runtime_setting_of_the_users_stands_alone(monkeypatch, no_runtime_vars, name):
    """Any one of the runtime's settings, set alone (even empty), leaves the wait policy to the
    user, however busy the machine; and it alone travels to the workers."""
    assert name in runtime.RUNTIME_VARS
    monkeypatch.setattr(runtime, "busy_cpus", lambda: 2.0)
    assert runtime.runtime_env() == {}
    monkeypatch.setenv(name, "")
    assert runtime.passive_when_busy() is None
    assert runtime.runtime_env() == {name: ""}
    monkeypatch.setenv(name, "7")
    assert runtime.passive_when_busy() is None
    assert runtime.runtime_env() == {name: "7"} and worker_env(1)[name] == "7"
    assert "OMP_WAIT_POLICY" not in os.environ or name == "OMP_WAIT_POLICY"


def test_the_runtime_settings_are_the_three_and_travel_together(monkeypatch):
    assert runtime.RUNTIME_VARS == ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
    for name, value in zip(runtime.RUNTIME_VARS, ("PASSIVE", "0", "200"), strict=True):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_PROC_BIND", "true")  # not a runtime setting of these
    assert runtime.runtime_env() == {
        "OMP_WAIT_POLICY": "PASSIVE",
        "GOMP_SPINCOUNT": "0",
        "KMP_BLOCKTIME": "200",
    }


def test_torch_imported_alone_leaves_the_policy(monkeypatch, no_runtime_vars):
    import sys

    looked: list[bool] = []
    monkeypatch.setattr(runtime, "busy_cpus", lambda: looked.append(True) or 3.0)
    monkeypatch.setitem(sys.modules, "torch", object())
    assert runtime.passive_when_busy() is None and not looked  # not even a look at the load
    assert "OMP_WAIT_POLICY" not in os.environ


def test_an_unchanged_total_over_the_window_is_no_reading(monkeypatch, tmp_path):
    """A window in which the CPUs' total jiffies did not grow (a frozen or coarse /proc/stat)
    gives no reading rather than a division by zero; a grown one gives its share, the guest
    columns (9 and 10, already in user time) not counted twice."""
    stat = tmp_path / "stat"
    line = "cpu0 {u} 0 0 {i} 0 0 0 0 {g} {g}\n"
    stat.write_text(line.format(u=100, i=100, g=50))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(runtime.time, "sleep", lambda seconds: None)
    assert runtime.busy_cpus(0.1, stat) is None
    assert runtime._cpu_jiffies({0}, stat) == (100, 200)
    after = line.format(u=130, i=170, g=90)
    monkeypatch.setattr(runtime.time, "sleep", lambda seconds: stat.write_text(after))
    assert runtime.busy_cpus(0.1, stat) == pytest.approx(0.3)
    stat.write_text("cpu0 0 0 0 0 0 0 0 0 0 0\n")
    assert runtime._cpu_jiffies({0}, stat) is None  # no ticks at all: no reading
    stat.write_text("cpu0 1 2\n")
    assert runtime._cpu_jiffies({0}, stat) is None  # a short line


def test_usable_cpus_without_an_affinity_mask_or_with_an_empty_one(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "_cgroup_quota", lambda: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set())
    assert runtime.usable_cpus() == 1
    monkeypatch.delattr(os, "sched_getaffinity")  # not Linux: the machine's count
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert runtime.usable_cpus() == 5
    monkeypatch.setattr(runtime, "_cgroup_quota", lambda: 4.0)  # a whole quota: not rounded up
    assert runtime.usable_cpus() == 4
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    monkeypatch.setattr(runtime, "_cgroup_quota", lambda: None)
    assert runtime.usable_cpus() == 1
    stat = tmp_path / "stat"
    stat.write_text("cpu0 1 0 0 1 0 0 0 0\n")
    monkeypatch.setattr(runtime.time, "sleep", lambda s: stat.write_text("cpu0 9 0 0 1 0 0 0 0\n"))
    assert runtime.busy_cpus(0.1, stat) is None  # no mask (not Linux): no reading


def test_a_zero_v1_quota_is_no_limit_and_a_v2_file_wins(tmp_path):
    v2 = tmp_path / "cpu.max"
    v1 = (tmp_path / "cfs_quota_us", tmp_path / "cfs_period_us")
    v1[0].write_text("0\n")
    v1[1].write_text("100000\n")
    assert runtime._cgroup_quota(v2, v1) is None
    v1[0].write_text("50000\n")
    assert runtime._cgroup_quota(v2, v1) == pytest.approx(0.5)
    v2.write_text("200000 100000\n")
    assert runtime._cgroup_quota(v2, v1) == pytest.approx(2.0)
    v2.write_text("garbled\n")
    assert runtime._cgroup_quota(v2, v1) is None
    v2.unlink()
    v1[1].unlink()
    assert runtime._cgroup_quota(v2, v1) is None


def test_thread_counts_are_restored_after_a_pin_and_after_an_error():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with runtime.threads(2):
            assert torch.get_num_threads() == 2
            with runtime.single_thread():
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 3
        with pytest.raises(KeyError), runtime.threads(2):
            raise KeyError
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(previous)


def test_exact_float32_turns_reduced_precision_off_and_restores_the_users_choice():
    import torch

    holders = runtime._precision_settings()
    saved = [h.fp32_precision for h in holders]
    legacy = torch.get_float32_matmul_precision()
    try:
        if holders:
            for holder in holders[1:]:
                holder.fp32_precision = "tf32" if "mkldnn" not in repr(holder) else "bf16"
            chosen = [h.fp32_precision for h in holders]
            with runtime.exact_float32():
                assert [h.fp32_precision for h in holders[1:]] == ["ieee"] * (len(holders) - 1)
            assert [h.fp32_precision for h in holders] == chosen
            with pytest.raises(KeyError), runtime.exact_float32():
                raise KeyError
            assert [h.fp32_precision for h in holders] == chosen
        else:
            torch.set_float32_matmul_precision("high")
            with runtime.exact_float32():
                assert torch.get_float32_matmul_precision() == "highest"
            assert torch.get_float32_matmul_precision() == "high"
    finally:
        for holder, value in zip(holders, saved, strict=True):
            holder.fp32_precision = value
        if not holders:
            torch.set_float32_matmul_precision(legacy)


def test_the_precision_settings_are_every_holder_parents_first():
    """On a torch with ``fp32_precision`` (≥ 2.9; the pinned one): the generic holder, then
    cuBLAS, cuDNN and oneDNN's."""
    import torch

    b = torch.backends
    if not hasattr(b.cuda.matmul, "fp32_precision"):
        assert runtime._precision_settings() == []
        return
    expected = [b, b.cuda.matmul, b.cudnn, b.cudnn.conv, b.cudnn.rnn]
    expected += [b.mkldnn, b.mkldnn.matmul, b.mkldnn.conv, b.mkldnn.rnn]
    assert runtime._precision_settings() == expected


def test_phases_on_a_cuda_device_wait_for_its_queue_at_both_ends(monkeypatch):
    import torch

    waited: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    with runtime.Phases("cuda:1").phase("capture"):
        assert waited == ["cuda:1"]
    assert waited == ["cuda:1", "cuda:1"]
    with runtime.Phases("cpu").phase("capture"), runtime.Phases().phase("fit"):
        pass
    assert waited == ["cuda:1", "cuda:1"]


def test_phases_add_up_in_the_order_first_met(monkeypatch):
    clock = iter([0.0, 1.0, 1.0, 3.5, 4.0, 4.25])
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: next(clock))
    phases = runtime.Phases("cpu")
    with phases.phase("capture"):
        pass
    with pytest.raises(KeyError), phases.phase("probe"):
        raise KeyError  # a failed phase is timed too
    with phases.phase("capture"):
        pass
    assert phases.seconds == {"capture": 1.25, "probe": 2.5}
    assert list(phases.seconds) == ["capture", "probe"]


def test_alongside_with_exactly_two_threads_gives_the_task_a_thread_of_its_own():
    import threading

    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[tuple[bool, int]] = []

    def task() -> int:
        seen.append(
            (threading.current_thread() is threading.main_thread(), torch.get_num_threads())
        )
        return 3

    try:
        with runtime.alongside(task) as result:
            assert torch.get_num_threads() == 1
            assert result() == 3
        assert seen == [(False, 1)] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
