"""The run directory's lifecycle: a directory a coordinator left before writing its manifest
(killed in its first seconds) is an unstarted run, started again with or without --resume; a
live or remote lock is never taken; a failed start leaves nothing."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tangentlens.sweep.store import RunStore, check_run_dir


def _dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left_by_a_killed_sweep(root, pid: int, host: str | None = None) -> None:
    """What `kill -9` leaves after the lock is taken and before the manifest is written: the
    lock and the temporary file it was linked from."""
    root.mkdir()
    holder = json.dumps({"host": host or socket.gethostname(), "pid": pid})
    (root / ".lock").write_text(holder)
    (root / ".lock.k2j4x8").write_text(holder)


def _replicate_record(**fields) -> dict:
    """A replicate record of probe ``p``'s metric ``m`` (suite ``s``), other labels None."""
    from tangentlens.results import REPLICATE_FIELDS

    return {**dict.fromkeys(REPLICATE_FIELDS), "suite": "s", "probe": "p", "metric": "m", **fields}


@pytest.mark.parametrize("resume", [False, True])
def test_a_dead_coordinators_lock_without_a_manifest_is_an_unstarted_run(tmp_path, resume, caplog):
    root = tmp_path / "run"
    _left_by_a_killed_sweep(root, _dead_pid())
    assert not RunStore(root).resuming  # a store not opened continues nothing
    with (
        caplog.at_level("INFO", logger="tangentlens.sweep.store"),
        RunStore.open(root, resume=resume) as store,
    ):
        assert not store.resuming  # nothing to resume: a fresh run
        assert json.loads((root / ".lock").read_text())["pid"] == os.getpid()
        assert sorted(p.name for p in root.iterdir()) == [".lock"]
        store.write_manifest({"recipe": {}})
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json"]
    said = f"{root} holds no run (its sweep stopped before it began): starting"
    assert [r.getMessage() for r in caplog.records] == [said]


def test_a_live_or_remote_lock_is_never_taken_even_without_a_manifest(tmp_path):
    live = tmp_path / "live"
    _left_by_a_killed_sweep(live, os.getppid())  # a live process on this host
    for resume in (False, True):
        with (
            pytest.raises(
                ValueError,
                match=r"by a running sweep \(pid \d+\); wait for it or choose another --out$",
            ),
            RunStore.open(live, resume=resume),
        ):
            pass
    remote = tmp_path / "remote"
    _left_by_a_killed_sweep(remote, 1, host="node-7")
    with (
        pytest.raises(ValueError, match=r"locked by a sweep on host node-7 \(pid 1\)"),
        RunStore.open(remote, resume=False),
    ):
        pass
    assert (live / ".lock").exists() and (remote / ".lock").exists()


def test_a_run_with_a_manifest_or_other_files_is_not_taken_for_an_unstarted_one(tmp_path):
    started = tmp_path / "started"
    _left_by_a_killed_sweep(started, _dead_pid())
    (started / "manifest.json").write_text("{}")
    with (
        pytest.raises(ValueError, match="already holds a run; pass --resume"),
        RunStore.open(started, resume=False),
    ):
        pass
    with RunStore.open(started, resume=True) as store:
        assert store.resuming
    other = tmp_path / "other"
    _left_by_a_killed_sweep(other, _dead_pid())
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already holds a run"), RunStore.open(other, resume=False):
        pass
    assert (other / "notes.txt").exists()
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="holds no run"), RunStore.open(missing, resume=True):
        pass


def test_a_failed_start_leaves_nothing_and_a_failed_resume_keeps_the_run(tmp_path):
    root = tmp_path / "run"
    with pytest.raises(RuntimeError), RunStore.open(root, resume=False) as store:
        store.write_manifest({})
        raise RuntimeError("before any unit finished")
    assert not root.exists()
    with RunStore.open(root, resume=False) as store:
        store.write_manifest({})
    with pytest.raises(RuntimeError), RunStore.open(root, resume=True):
        raise RuntimeError("while resuming")
    assert (root / "manifest.json").exists()


def _race(root, barrier, results, hold: float) -> None:
    """One coordinator of a race: open ``root`` as a fresh run when the barrier falls; reports
    ``(outcome, text, when)`` — "in" with the (monotonic, system-wide) time it let go, or
    "refused" with the message and the time it was refused."""
    barrier.wait()
    try:
        with RunStore.open(root, resume=False) as store:
            time.sleep(hold)  # a coordinator makes its manifest (versions, git hash) first
            store.write_manifest({"recipe": {}})
            time.sleep(hold)
        results.put(("in", str(os.getpid()), time.monotonic()))
    except ValueError as error:
        results.put(("refused", str(error), time.monotonic()))
    except BaseException as error:  # anything else is a defect (e.g. a temporary file lost)
        results.put(("error", repr(error), time.monotonic()))


def _race_trials(tmp_path, trials: int, prepare) -> list[list[tuple[str, str, float]]]:
    """``trials`` races of two coordinators started together on a run directory that
    ``prepare(root)`` sets up: each trial's outcomes."""
    context = multiprocessing.get_context("fork")  # no re-import: the racers start in ~1 ms
    outcomes = []
    for trial in range(trials):
        root = tmp_path / f"run{trial}"
        prepare(root)
        barrier, results = context.Barrier(2), context.Queue()
        racers = [
            context.Process(target=_race, args=(root, barrier, results, 0.02)) for _ in range(2)
        ]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(timeout=60)
        outcomes.append([results.get(timeout=5) for _ in racers])
    return outcomes


def _exactly_one_in(outcomes: list[list[tuple[str, str, float]]]) -> None:
    """One coordinator in, the other refused: by the lock while the first holds it (not "holds
    a run", nor a crash on the other's temporary files); "already holds a run" only after the
    first has let go."""
    for outcome in outcomes:
        assert sorted(kind for kind, _, _ in outcome) == ["in", "refused"], outcome
        ((_, _, left),) = [o for o in outcome if o[0] == "in"]
        ((_, message, refused),) = [o for o in outcome if o[0] == "refused"]
        if refused < left:
            assert "is locked by a running sweep" in message, outcome
        else:
            assert "already holds a run" in message, outcome


def test_two_coordinators_started_together_never_both_hold_the_run(tmp_path):
    """Two coordinators racing for one fresh run directory, many times: exactly one gets in,
    the other is refused with the lock's message (never both in, never a crash on the other's
    temporary files)."""
    _exactly_one_in(_race_trials(tmp_path, 40, lambda root: None))


def test_two_coordinators_taking_over_a_dead_lock_never_both_win(tmp_path):
    dead = _dead_pid()
    _exactly_one_in(_race_trials(tmp_path, 30, lambda root: _left_by_a_killed_sweep(root, dead)))


def test_a_takeover_marker_of_a_dead_coordinator_is_cleared(tmp_path):
    root = tmp_path / "run"
    _left_by_a_killed_sweep(root, _dead_pid())
    marker = root / ".lock.takeover"
    marker.write_text("")
    os.utime(marker, (time.time() - 60, time.time() - 60))  # left a minute ago
    with RunStore.open(root, resume=False) as store:
        store.write_manifest({})
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json"]


@pytest.mark.parametrize("where", ["file", "below-file"])
def test_an_out_that_is_or_passes_through_a_file_is_refused_before_anything(tmp_path, where):
    path = tmp_path / "results.txt"
    path.write_text("mine")
    out = path if where == "file" else path / "run"
    with pytest.raises(ValueError, match=r"--out .* not a folder: choose another --out"):
        check_run_dir(out)
    with pytest.raises(ValueError, match="not a folder"), RunStore.open(out, resume=False):
        pass
    assert path.read_text() == "mine"


def test_a_full_disk_is_told_apart_and_says_where():
    """ENOSPC / EDQUOT (also as text, the way pyarrow re-raises them) is a full disk: a retry
    cannot help, and the error says so and where."""
    import errno

    from tangentlens.sweep.store import DiskFullError, disk_full
    from tangentlens.sweep.units import retryable

    full = OSError(errno.ENOSPC, "No space left on device", "/runs/x/results/.step.parquet.1")
    assert disk_full(full) and disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert disk_full(OSError("IOError: [Errno 28] No space left on device"))
    assert not disk_full(OSError(errno.EIO, "Input/output error"))
    assert not retryable(full) and retryable(OSError(errno.EIO, "Input/output error"))
    error = DiskFullError(Path("/tmp"), full)
    assert disk_full(error) and not retryable(error)
    assert str(error).startswith(
        "the disk is full: no space left writing /runs/x/results/.step.parquet.1 ("
    )
    assert "MiB free on the filesystem of /tmp); free some space there" in str(error)
    inside = DiskFullError(Path("/runs/x"), full)  # a file in the run directory: named from it
    assert "no space left writing results/.step.parquet.1 (" in str(inside)


def test_a_long_error_line_keeps_its_advice():
    """An error's one line is cut only past ERROR_LINE_CHARS, and then in the middle: what to do
    (at its end) stays, as a deep run directory's full-disk message needs."""
    import errno

    from tangentlens.sweep.executors.base import ERROR_LINE_CHARS, error_line
    from tangentlens.sweep.store import DiskFullError

    deep = Path("/scratch") / ("deep/" * 80) / "run"
    line = error_line(DiskFullError(deep, OSError(errno.ENOSPC, "No space left", str(deep))))
    assert line.startswith("DiskFullError: the disk is full") and " … " in line
    assert line.endswith("free some space there (or choose another --out) and --resume")
    assert len(line) <= ERROR_LINE_CHARS + 3
    assert error_line(ValueError("short\nsecond line")) == "ValueError: short"


def test_a_remote_lock_says_how_to_clear_it(tmp_path):
    from tangentlens.sweep.store import take_lock

    root = tmp_path / "run"
    _left_by_a_killed_sweep(root, 4, host="node-7")
    with pytest.raises(ValueError) as error:
        take_lock(root)
    assert str(error.value) == (
        f"{root} is locked by a sweep on host node-7 (pid 4); wait for it, or delete "
        f"{root / '.lock'} if that sweep is dead"
    )
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert take_lock(fresh) == (fresh / ".lock", False)


def test_an_out_that_is_a_file_or_below_one_is_named_exactly(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("mine")
    with pytest.raises(ValueError) as error:
        check_run_dir(path)
    assert str(error.value) == f"--out {path} is a file, not a folder: choose another --out"
    with pytest.raises(ValueError) as error:
        check_run_dir(path / "a" / "run")
    assert str(error.value) == (
        f"--out {path / 'a' / 'run'} passes through the file {path}, not a folder: choose "
        "another --out"
    )


def test_only_the_nearest_existing_folder_must_be_writable(tmp_path, monkeypatch):
    """The nearest existing folder is checked (writable and searchable), not those above it,
    nor the missing ones below it (they are made)."""
    asked: list[tuple[Path, int]] = []
    locked = {tmp_path}

    def access(path, mode):
        asked.append((Path(path), mode))
        return Path(path) not in locked

    monkeypatch.setattr(os, "access", access)
    (tmp_path / "out").mkdir()
    check_run_dir(tmp_path / "out" / "a" / "run")  # out is writable; tmp_path is not looked at
    assert asked == [(tmp_path / "out", os.W_OK | os.X_OK)]
    with pytest.raises(ValueError) as error:
        check_run_dir(tmp_path / "run")
    assert str(error.value) == (
        f"--out {tmp_path / 'run'}: {tmp_path} cannot be written (read-only or not yours): "
        "choose another --out"
    )
    locked.add(tmp_path / "out")
    with (
        pytest.raises(ValueError, match="cannot be written"),
        RunStore.open(tmp_path / "out" / "run", resume=False),
    ):
        pass
    assert not (tmp_path / "out" / "run").exists()


def test_a_refused_start_lets_go_of_the_lock_and_keeps_what_was_there(tmp_path):
    other = tmp_path / "other"
    _left_by_a_killed_sweep(other, _dead_pid())
    (other / "notes.txt").write_text("mine")
    said = f"{other} already holds a run; pass --resume to continue it or choose another --out"
    with pytest.raises(ValueError) as error, RunStore.open(other, resume=False):
        pass
    assert str(error.value) == said
    assert sorted(p.name for p in other.iterdir()) == [".lock.k2j4x8", "notes.txt"]  # lock freed
    missing = tmp_path / "missing"
    with pytest.raises(ValueError) as error, RunStore.open(missing, resume=True):
        pass
    assert str(error.value) == f"--resume: {missing} holds no run (no manifest.json)"
    assert not missing.exists()  # made by this call: removed again
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no run"), RunStore.open(empty, resume=True):
        pass
    assert empty.is_dir() and not any(empty.iterdir())  # there before: kept


def test_an_empty_folder_is_a_fresh_run_and_a_dead_lock_alone_an_unstarted_one(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with RunStore.open(empty, resume=False) as store:
        assert not store.resuming
    bare = tmp_path / "bare"  # a dead coordinator's lock, its temporary file already gone
    bare.mkdir()
    (bare / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid()}))
    with RunStore.open(bare, resume=True) as store:  # nothing to resume: started afresh
        assert not store.resuming
        assert sorted(p.name for p in bare.iterdir()) == [".lock"]


def test_a_coordinators_temporary_files_alone_are_an_unstarted_run(tmp_path):
    """No lock (it was never linked), only a coordinator's temporary files: no run, cleared."""
    root = tmp_path / "run"
    root.mkdir()
    (root / ".manifest.json.x1").write_text("{")
    (root / ".lock.y2").write_text("{}")
    with RunStore.open(root, resume=True) as store:
        assert not store.resuming
        assert sorted(p.name for p in root.iterdir()) == [".lock"]
    (root / ".manifest.json.x1").write_text("{")
    (root / "manifest.json").write_text("{}")  # begun: a run to resume, not to clear
    with RunStore.open(root, resume=True) as store:
        assert store.resuming
        assert (root / ".manifest.json.x1").exists()


def test_an_interrupt_keeps_a_run_that_holds_its_manifest(tmp_path):
    root = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), RunStore.open(root, resume=False):
        raise KeyboardInterrupt
    assert not root.exists()
    with pytest.raises(KeyboardInterrupt), RunStore.open(root, resume=False) as store:
        store.write_manifest({})
        raise KeyboardInterrupt  # no part yet: kept all the same (--resume)
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json"]
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(KeyboardInterrupt), RunStore.open(existing, resume=False) as store:
        (existing / "state").mkdir()
        raise KeyboardInterrupt
    assert existing.is_dir() and not any(existing.iterdir())  # there before: emptied, kept


def test_a_failed_start_of_an_existing_folder_empties_it_and_a_begun_run_stays(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    with pytest.raises(RuntimeError), RunStore.open(root, resume=False) as store:
        store.write_manifest({})
        (root / "state" / "deep").mkdir(parents=True)
        (root / "results").mkdir()
        raise RuntimeError
    assert root.is_dir() and not any(root.iterdir())
    with pytest.raises(RuntimeError), RunStore.open(root, resume=False) as store:
        store.write_manifest({})
        store.write_part("step-1", [])  # a finished unit: the run has begun
        raise RuntimeError
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json", "results"]
    other = tmp_path / "other"
    with pytest.raises(RuntimeError), RunStore.open(other, resume=False, started=lambda r: True):
        raise RuntimeError  # begun by the caller's own measure
    assert sorted(p.name for p in other.iterdir()) == []


def test_parts_are_read_sorted_and_a_run_without_any_is_refused(tmp_path):
    from tangentlens.results import row
    from tangentlens.sweep.store import read_parts, read_replicates, read_results

    def rows(*steps: int, probe: str = "p") -> list[dict]:
        return [row("s", s, None, probe, "m", 1.0) for s in steps]

    store = RunStore(tmp_path)
    assert not store.has_part("b")
    store.write_part("b", rows(3, 1))
    store.write_part("a", rows(2) + rows(1, probe="z"))
    store.write_part("empty", [])
    assert store.has_part("b") and store.part_path("b") == tmp_path / "results" / "b.parquet"
    table = read_results(tmp_path)
    assert list(zip(table["step"].to_pylist(), table["probe"].to_pylist(), strict=True)) == [
        (1, "p"),
        (1, "z"),
        (2, "p"),
        (3, "p"),
    ]
    assert read_parts([store.part_path("b")]).column("step").to_pylist() == [1, 3]
    with pytest.raises(ValueError, match=r"^no result part to read$"):
        read_parts([])
    with pytest.raises(ValueError) as error:
        read_results(tmp_path / "none")
    assert str(error.value) == f"{tmp_path / 'none'} holds no results (results/*.parquet)"
    assert read_replicates(tmp_path).num_rows == 0
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "a.parquet",
        "b.parquet",
        "empty.parquet",
    ]


def test_a_failed_write_leaves_the_file_before_it_and_no_temporary_one(tmp_path):
    store = RunStore(tmp_path)
    path = store.write_file("notes.txt", "first")
    assert path == tmp_path / "notes.txt" and path.read_text() == "first"

    def failing(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        store.write_state("s.bin", failing)
    with pytest.raises(OSError, match="disk gone"):
        from tangentlens.sweep.store import _atomic_write_bytes

        _atomic_write_bytes(path, failing)
    assert path.read_text() == "first"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["notes.txt", "state"]


def test_a_full_disk_at_the_root_or_unknown_free_space_is_said_plainly(tmp_path):
    import errno

    from tangentlens.sweep.store import DiskFullError, disk_full

    assert disk_full(OSError(errno.EDQUOT, "quota")) and disk_full(OSError(errno.ENOSPC, "full"))
    assert disk_full("Disk quota exceeded") and not disk_full(OSError(errno.EACCES, "denied"))
    at_root = DiskFullError(tmp_path, OSError(errno.ENOSPC, "No space", str(tmp_path)))
    assert f"no space left writing {tmp_path} (" in str(at_root)
    nameless = DiskFullError(tmp_path, OSError(errno.ENOSPC, "No space"))
    assert f"no space left writing {tmp_path} (" in str(nameless)
    said = RuntimeError("write failed: No space left on device")  # known by its text: no filename
    assert disk_full(said)
    assert f"no space left writing {tmp_path} (" in str(DiskFullError(tmp_path, said))
    gone = tmp_path / "gone"
    error = DiskFullError(gone, OSError(errno.ENOSPC, "No space"))
    assert f"(free space unknown on the filesystem of {gone})" in str(error)
    assert error.errno == errno.ENOSPC


def test_a_full_disk_says_the_free_space_in_mib(tmp_path, monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    from tangentlens.sweep.store import DiskFullError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, 3 * 2**20 + 2**19))
    error = DiskFullError(tmp_path, OSError(errno.ENOSPC, "No space"))
    assert f"(3.5 MiB free on the filesystem of {tmp_path})" in str(error)


def test_replicates_are_written_in_their_schema(tmp_path):
    """Whole-number replicates and a missing label are stored as the schema's float64 and
    null, whatever the records' Python types suggest."""
    import pyarrow.parquet as pq

    from tangentlens.results import REPLICATE_SCHEMA
    from tangentlens.sweep.store import read_replicates

    store = RunStore(tmp_path)
    store.write_replicates("step-10", [_replicate_record(step=10, replicates=[1, 2, 3])])
    (written,) = (tmp_path / "replicates").glob("*.parquet")
    assert pq.read_schema(written).remove_metadata() == REPLICATE_SCHEMA
    assert read_replicates(tmp_path).column("replicates").to_pylist() == [[1.0, 2.0, 3.0]]


def test_a_write_goes_through_a_hidden_file_beside_its_target(tmp_path):
    """Beside it (so the rename stays on one file system) and hidden (so no reader globs it up);
    a failed write whose temporary file is already gone raises its own error."""
    from tangentlens.sweep.store import _atomic_write_bytes

    path = tmp_path / "part" / "notes.txt"
    seen: list[Path] = []

    def write(tmp: str) -> None:
        seen.append(Path(tmp))
        Path(tmp).write_text("kept")

    _atomic_write_bytes(path, write)
    assert path.read_text() == "kept" and seen[0].parent == path.parent
    assert seen[0].name.startswith(".notes.txt.") and not seen[0].exists()

    def vanishing(tmp: str) -> None:
        os.unlink(tmp)
        raise OSError("disk gone")

    with pytest.raises(OSError, match=r"^disk gone$"):
        _atomic_write_bytes(path, vanishing)
    assert path.read_text() == "kept"


def test_parts_are_written_in_their_schema_and_the_manifest_as_sorted_json(tmp_path):
    """An empty unit's part still has the results' columns; the manifest is indented, sorted
    JSON whose paths and other objects are written as text."""
    import pyarrow.parquet as pq

    from tangentlens.results import SCHEMA

    store = RunStore(tmp_path)
    store.write_part("empty", [])
    assert pq.read_schema(store.part_path("empty")).remove_metadata() == SCHEMA
    store.write_manifest({"b": 1, "a": {"out": tmp_path / "run"}})
    written = (tmp_path / "manifest.json").read_text(encoding="utf-8")
    assert written == f'{{\n  "a": {{\n    "out": "{tmp_path / "run"}"\n  }},\n  "b": 1\n}}'
    assert store.read_manifest() == {"a": {"out": str(tmp_path / "run")}, "b": 1}


def test_parts_are_read_in_the_results_schema_whatever_they_were_written_in(tmp_path):
    """A part (or replicates file) whose step column was stored as int32 (another writer's
    choice) is read as the schema's int64 beside the others, not refused as a different
    schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tangentlens.results import REPLICATE_SCHEMA, SCHEMA, row
    from tangentlens.sweep.store import read_parts, read_replicates

    def write_with_int32_steps(rows: list[dict], schema: pa.Schema, path: Path) -> None:
        table = pa.Table.from_pylist(rows, schema=schema)
        at = table.schema.get_field_index("step")
        pq.write_table(table.set_column(at, "step", table["step"].cast(pa.int32())), path)

    store = RunStore(tmp_path)
    store.write_part("a", [row("s", 1, None, "p", "m", 1.0)])
    write_with_int32_steps([row("s", 2, None, "p", "m", 2.0)], SCHEMA, tmp_path / "b.pq")
    table = read_parts([store.part_path("a"), tmp_path / "b.pq"])
    assert table.schema == SCHEMA and table["step"].to_pylist() == [1, 2]
    store.write_replicates("a", [_replicate_record(step=3, replicates=[1.0])])
    mine = [_replicate_record(step=4, replicates=[1.0])]
    write_with_int32_steps(mine, REPLICATE_SCHEMA, tmp_path / "replicates" / "b.parquet")
    replicates = read_replicates(tmp_path)
    assert replicates.schema == REPLICATE_SCHEMA and replicates["step"].to_pylist() == [3, 4]
