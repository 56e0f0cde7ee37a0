"""The coordinator-side scheduler on a scripted backend: dependencies, concurrency, retries,
failures and adopted (already running) units."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tangentlens.sweep.executors.base import Finished, UnitEvent, schedule
from tangentlens.sweep.plan import Plan, Unit


def _plan() -> Plan:
    units = (
        Unit("data", "data", None, (), "out/data"),
        Unit("step-1", "step", 1, ("data",), "out/step-1"),
        Unit("step-2", "step", 2, ("data",), "out/step-2"),
        Unit("step-3", "step", 3, ("data",), "out/step-3"),
        Unit("pair-2", "across", 2, ("step-1", "step-2"), "out/pair-2"),
        Unit("across-steps", "across", 3, ("step-1", "step-2", "step-3"), "out/across"),
    )
    return Plan("r", "s", (1, 2, 3), (), units)


class Scripted:
    """Runs units when waited on, ``capacity`` at a time, writing their outputs; ``fail``: unit
    → how many attempts fail before one succeeds."""

    def __init__(
        self, root: Path, capacity: int, fail: dict[str, int] | None = None, retry: bool = True
    ):
        self.root, self.capacity, self.fail = root, capacity, dict(fail or {})
        self.retry = retry
        self.running: list[Unit] = []
        self.started: list[str] = []
        self.peak = 0

    def submit(self, units: Sequence[Unit]) -> None:
        for unit in units:
            for dep in unit.deps:  # every input exists when a unit starts
                assert (self.root / _output(dep)).exists(), (unit.name, dep)
        self.running += units
        self.started += [u.name for u in units]
        self.peak = max(self.peak, len(self.running))

    def wait(self, timeout: float) -> list[Finished]:
        unit = self.running.pop(0)
        if self.fail.get(unit.name, 0) > 0:
            self.fail[unit.name] -= 1
            error = "RuntimeError: boom" if self.retry else "ValueError: bad setting"
            return [Finished(unit, error, "log/" + unit.name, retry=self.retry)]
        (self.root / unit.output).parent.mkdir(parents=True, exist_ok=True)
        (self.root / unit.output).write_text("")
        return [Finished(unit)]


def _output(name: str) -> str:
    return {u.name: u.output for u in _plan().units}[name]


def _run(tmp_path, backend, retries=0, running=()):
    events: list[UnitEvent] = []
    failures = schedule(
        _plan(), tmp_path, backend, retries=retries, emit=events.append, poll=0, running=running
    )
    return failures, events


def test_every_unit_runs_once_after_its_inputs_within_capacity(tmp_path):
    backend = Scripted(tmp_path, capacity=2)
    failures, events = _run(tmp_path, backend)
    assert failures == [] and sorted(backend.started) == sorted(u.name for u in _plan().units)
    assert backend.peak == 2
    assert [e.unit for e in events if e.phase == "done"] == backend.started
    assert sum(e.phase == "queued" for e in events) == 6


def test_done_units_are_skipped_and_adopted_units_are_not_resubmitted(tmp_path):
    for name in ("data", "step-1"):
        (tmp_path / _output(name)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / _output(name)).write_text("")
    backend = Scripted(tmp_path, capacity=4)
    step2 = _plan()["step-2"]
    backend.running.append(step2)  # submitted by an earlier (detached) invocation
    failures, _ = _run(tmp_path, backend, running=[step2])
    assert failures == []
    assert sorted(backend.started) == ["across-steps", "pair-2", "step-3"]


def test_a_failing_unit_is_retried_then_reported_and_its_dependents_not_run(tmp_path):
    backend = Scripted(tmp_path, capacity=1, fail={"step-1": 1})
    failures, events = _run(tmp_path, backend, retries=1)
    assert failures == [] and backend.started.count("step-1") == 2
    assert [e.detail for e in events if e.phase == "retry"] == ["RuntimeError: boom"]

    backend = Scripted(tmp_path / "b", capacity=1, fail={"step-1": 5})
    failures, events = _run(tmp_path / "b", backend, retries=1)
    assert backend.started.count("step-1") == 2
    assert [(f.unit, f.error, f.log) for f in failures] == [
        ("step-1", "RuntimeError: boom", "log/step-1"),
        ("pair-2", "not run: step-1 failed", ""),
        ("across-steps", "not run: step-1 failed", ""),
    ]
    # the independent units still finish
    assert (tmp_path / "b" / _output("step-3")).exists()
    assert {e.unit for e in events if e.phase == "skipped"} == {"pair-2", "across-steps"}


def test_an_error_a_retry_cannot_change_is_not_retried(tmp_path):
    backend = Scripted(tmp_path, capacity=1, fail={"step-1": 1}, retry=False)
    failures, events = _run(tmp_path, backend, retries=3)
    assert backend.started.count("step-1") == 1
    assert not [e for e in events if e.phase == "retry"]
    assert (failures[0].unit, failures[0].error) == ("step-1", "ValueError: bad setting")
