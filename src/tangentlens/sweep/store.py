"""The results store of one run directory: parquet parts, a manifest and a lock.

Layout::

    RUN_DIR/
      manifest.json          resolved recipe, versions, git hash, seeds, device, per-step info
      results/<unit>.parquet one part per finished unit (tidy rows, the schema below)
      replicates/<unit>.parquet  bootstrap replicates of a step's intervals (opt-in:
                             probes.tangent_energy.keep_replicates), written before the part
      state/                 what later units need from earlier ones (e.g. frozen proxies)
      units/<unit>.json      host and pid of each unit while it runs
      logs/<unit>.log        the traceback of a unit that failed
      .lock                  host and pid of the coordinating sweep (units take no lock)

Every file is written to a temporary name in its final folder and renamed into place, so a
killed sweep leaves either a whole part or none: ``--resume`` skips the units whose part exists
and recomputes the rest, which gives exactly the table of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tangentlens.results import REPLICATE_SCHEMA, SCHEMA

__all__ = ["REPLICATES", "RunStore", "read_parts", "read_replicates", "read_results"]

logger = logging.getLogger(__name__)

#: The folder of the replicate records (one file per step unit that kept them).
REPLICATES = "replicates"
#: Temporary files a coordinator writes before its manifest exists (its lock, its manifest).
_SCRATCH = (".lock.", ".manifest.json.")


def _atomic_write_bytes(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _lock_holder(lock: Path) -> dict[str, Any] | None:
    """``{"host", "pid"}`` from a lock file, or None when it is unreadable (half-written)."""
    try:
        holder = json.loads(lock.read_text())
        return {"host": str(holder["host"]), "pid": int(holder["pid"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _refuse_holder(root: Path, lock: Path, holder: dict[str, Any]) -> None:
    """Raise when the lock's ``holder`` may still be running: on another host, or a live
    process (not this one) on this host; return when it is a dead process of this host."""
    if holder["host"] != socket.gethostname():
        raise ValueError(
            f"{root} is locked by a sweep on host {holder['host']} (pid {holder['pid']}); wait "
            f"for it, or delete {lock} if that sweep is dead"
        )
    if holder["pid"] != os.getpid() and _pid_alive(holder["pid"]):
        raise ValueError(
            f"{root} is locked by a running sweep (pid {holder['pid']}); wait for it or choose "
            "another --out"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunStore:
    """One run directory. Open with :meth:`open` (creates or resumes, takes the lock);
    ``resuming`` says whether it continues a run that holds a manifest."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results = root / "results"
        self.state = root / "state"
        self.resuming = False

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        root: str | Path,
        *,
        resume: bool,
        started: Callable[[Path], bool] | None = None,
    ) -> Iterator[RunStore]:
        """Create ``root`` (it must not hold a run unless ``resume``) and hold its lock.

        A directory a coordinator left before it wrote the manifest (killed in its first
        seconds: nothing but its lock, the process dead, on this host) holds no run: it is
        started afresh, with or without ``resume``. If the body fails before the run has
        ``started`` (default: before any result part exists) in a run this call did not resume,
        the run directory is removed again (emptied when it existed before): a failed start
        leaves nothing half-written.
        """
        store = cls(Path(root))
        store._check_lock()
        unstarted = store._unstarted()
        if unstarted:
            logger.info("%s holds no run (its sweep stopped before it began): starting it", root)
            store._clear()
        created = not store.root.exists()
        manifest = store.root / "manifest.json"
        if store.root.exists() and any(store.root.iterdir()) and not resume:
            raise ValueError(
                f"{store.root} already holds a run; pass --resume to continue it or choose "
                "another --out"
            )
        if resume and not unstarted and not manifest.exists():
            raise ValueError(f"--resume: {store.root} holds no run (no manifest.json)")
        store.resuming = resume and manifest.exists()
        store.root.mkdir(parents=True, exist_ok=True)
        lock = store.root / ".lock"
        store._acquire(lock)
        try:
            yield store
        except BaseException:
            begun = started or (lambda root: any((root / "results").glob("*.parquet")))
            if not store.resuming and not begun(store.root):
                if created:
                    shutil.rmtree(store.root)
                else:
                    store._clear()
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def _unstarted(self) -> bool:
        """Whether the directory holds no run: no manifest, nothing but the lock a coordinator
        takes first (and its temporary files), the lock's holder dead (checked before: a live
        holder is refused). Without a lock it is not taken for one: temporary files alone may
        be a live coordinator's, about to take it."""
        if not self.root.is_dir() or (self.root / "manifest.json").exists():
            return False
        names = [child.name for child in self.root.iterdir()]
        return ".lock" in names and all(
            name == ".lock" or name.startswith(_SCRATCH) for name in names
        )

    def _clear(self) -> None:
        """Empty a run directory that existed before this run started."""
        for child in self.root.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()

    def _check_lock(self) -> None:
        """Refuse a run directory whose lock a live coordinator holds, or one on another host
        (whose liveness cannot be checked from here)."""
        lock = self.root / ".lock"
        holder = _lock_holder(lock) if lock.exists() else None
        if holder is not None:
            _refuse_holder(self.root, lock, holder)

    def _acquire(self, lock: Path) -> None:
        """Take the coordinator's lock: ``{"host", "pid"}``. A lock left by a dead process on
        this host is taken over; one held by a live process, or by any process on another host
        (whose liveness cannot be checked from here), is an error naming it."""
        here = socket.gethostname()
        # written whole under a temporary name, then linked into place: link fails when the
        # lock exists, so nobody ever reads a half-written lock
        fd, tmp = tempfile.mkstemp(prefix=".lock.", dir=self.root)
        with os.fdopen(fd, "w") as handle:
            json.dump({"host": here, "pid": os.getpid()}, handle)
        try:
            for _ in range(2):
                try:
                    os.link(tmp, lock)
                    return
                except FileExistsError:
                    pass
                holder = _lock_holder(lock)
                if holder is not None:
                    _refuse_holder(self.root, lock, holder)
                lock.unlink(missing_ok=True)  # left by a killed sweep on this host
        finally:
            os.unlink(tmp)
        raise ValueError(f"could not take the lock {lock}")

    # ------------------------------------------------------------------ manifest

    def read_manifest(self) -> dict[str, Any]:
        return json.loads((self.root / "manifest.json").read_text(encoding="utf-8"))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        text = json.dumps(manifest, indent=2, sort_keys=True, default=str)
        _atomic_write_bytes(
            self.root / "manifest.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8")
        )

    # ------------------------------------------------------------------ parts

    def part_path(self, unit: str) -> Path:
        return self.results / f"{unit}.parquet"

    def has_part(self, unit: str) -> bool:
        return self.part_path(unit).exists()

    def write_part(self, unit: str, rows: list[dict[str, Any]]) -> None:
        """Write a unit's rows atomically (an empty unit still gets a part: it is done)."""
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        _atomic_write_bytes(self.part_path(unit), lambda tmp: pq.write_table(table, tmp))

    def write_replicates(self, unit: str, records: list[dict[str, Any]]) -> None:
        """Write a unit's replicate records atomically (before its part)."""
        table = pa.Table.from_pylist(records, schema=REPLICATE_SCHEMA)
        path = self.root / REPLICATES / f"{unit}.parquet"
        _atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp))

    def write_file(self, name: str, text: str) -> Path:
        """Atomically write the text file ``name`` (relative to the run directory)."""
        path = self.root / name
        _atomic_write_bytes(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        return path

    def write_state(self, name: str, write: Any) -> Path:
        """Atomically write ``state/name`` with ``write(tmp_path)``."""
        path = self.state / name
        _atomic_write_bytes(path, write)
        return path


def read_parts(parts: Sequence[str | Path]) -> pa.Table:
    """The rows of the given parts as one table (sorted by step, probe, site, method, bin,
    metric)."""
    if not parts:
        raise ValueError("no result part to read")
    table = pa.concat_tables([pq.read_table(p, schema=SCHEMA) for p in parts])
    keys = ["step", "probe", "site", "method", "freq_bin", "metric"]
    return table.sort_by([(k, "ascending") for k in keys])


def read_results(root: str | Path) -> pa.Table:
    """Every part of a run as one table (sorted as :func:`read_parts`)."""
    parts = sorted((Path(root) / "results").glob("*.parquet"))
    if not parts:
        raise ValueError(f"{root} holds no results (results/*.parquet)")
    return read_parts(parts)


def read_replicates(root: str | Path) -> pa.Table:
    """Every replicate record of the run directory ``root`` (an empty table when it kept none)."""
    files = sorted((Path(root) / REPLICATES).glob("*.parquet"))
    if not files:
        return REPLICATE_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=REPLICATE_SCHEMA) for f in files])
