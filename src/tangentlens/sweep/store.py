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
import errno
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

from tangentlens.locking import release, try_lock
from tangentlens.results import REPLICATE_SCHEMA, SCHEMA

__all__ = [
    "REPLICATES",
    "DiskFullError",
    "RunStore",
    "check_run_dir",
    "disk_full",
    "read_parts",
    "read_replicates",
    "read_results",
    "take_lock",
]

logger = logging.getLogger(__name__)

#: The folder of the replicate records (one file per step unit that kept them).
REPLICATES = "replicates"
#: Temporary files a coordinator writes before its manifest exists (its lock, its manifest).
_SCRATCH = (".lock.", ".manifest.json.")


#: ``errno`` values of a full disk (no space left, the user's quota spent).
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: How those errors read when a library re-raised them without an ``errno`` (pyarrow).
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


def disk_full(error: BaseException | str) -> bool:
    """Whether ``error`` (or an error's text) says that the disk is full (``ENOSPC``,
    ``EDQUOT``): running the same unit again cannot help."""
    if isinstance(error, OSError) and error.errno in _DISK_FULL:
        return True
    return any(text in str(error) for text in _DISK_FULL_TEXT)


class DiskFullError(OSError):
    """The disk holding a run directory is full: says so, where, and how much is free."""

    def __init__(self, root: Path, cause: BaseException) -> None:
        try:
            free = f"{shutil.disk_usage(root).free / 2**20:.1f} MiB free"
        except OSError:
            free = "free space unknown"
        where = Path(getattr(cause, "filename", None) or root)
        if where.is_relative_to(root) and where != root:
            where = where.relative_to(root)  # the root is named once, below
        super().__init__(
            errno.ENOSPC,
            f"the disk is full: no space left writing {where} ({free} on the filesystem of "
            f"{root}); free some space there (or choose another --out) and --resume",
        )

    def __str__(self) -> str:
        return str(self.strerror)


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


def take_lock(root: Path) -> tuple[Path, bool]:
    """Take the coordinator's lock ``root/.lock`` (:func:`tangentlens.locking.try_lock`: one
    atomic step, a dead coordinator's lock taken over); returns its path and whether a dead
    coordinator's lock was taken over. A lock a live coordinator holds, or one on another host
    (whose liveness cannot be checked from here), is refused naming its holder."""
    lock = root / ".lock"
    holder, took_over = try_lock(lock)
    if holder is None:
        return lock, took_over
    if holder["host"] != socket.gethostname():
        raise ValueError(
            f"{root} is locked by a sweep on host {holder['host']} (pid {holder['pid']}); wait "
            f"for it, or delete {lock} if that sweep is dead"
        )
    raise ValueError(
        f"{root} is locked by a running sweep (pid {holder['pid']}); wait for it or choose "
        "another --out"
    )


def check_run_dir(root: str | Path) -> None:
    """Refuse, before anything is planned or made, a run directory that cannot be one: a path
    naming an existing file or passing through one, or below a folder that cannot be written
    (read-only)."""
    root = Path(root)
    for path in (root, *root.absolute().parents):
        if not path.exists():
            continue
        if not path.is_dir():
            what = "is a file" if path == root else f"passes through the file {path}"
            raise ValueError(f"--out {root} {what}, not a folder: choose another --out")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(
                f"--out {root}: {path} cannot be written (read-only or not yours): choose "
                "another --out"
            )
        return


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

        The lock is taken first (:func:`take_lock`), and what the directory holds is judged
        while it is held. A directory a coordinator left before it wrote the manifest (killed
        in its first seconds: nothing but its lock and temporary files, its process dead, on
        this host) holds no run: it is started afresh, with or without ``resume``. If the body
        fails before the run has ``started`` (default: before any result part exists) in a run
        this call did not resume, the run directory is removed again (emptied when it existed
        before): a failed start leaves nothing half-written. An interrupt (Ctrl-C, or a stop
        signal: :mod:`tangentlens.sweep.stops`) keeps a run that holds its manifest, for
        ``--resume`` from any host.
        """
        store = cls(Path(root))
        check_run_dir(store.root)
        store.root.parent.mkdir(parents=True, exist_ok=True)
        try:  # whether this call made the directory: decided atomically by mkdir
            store.root.mkdir()
            created = True
        except FileExistsError:
            created = False
        lock, took_over = take_lock(store.root)
        try:
            store._judge(resume, created, took_over)
        except BaseException:
            release(lock)
            if created:
                shutil.rmtree(store.root, ignore_errors=True)
            raise
        try:
            yield store
        except KeyboardInterrupt:
            if not store.resuming and not (store.root / "manifest.json").exists():
                store._remove(created)
            raise
        except BaseException:
            begun = started or (lambda root: any((root / "results").glob("*.parquet")))
            if not store.resuming and not begun(store.root):
                store._remove(created)
            raise
        finally:
            release(lock)

    def _judge(self, resume: bool, created: bool, took_over: bool) -> None:
        """With the lock held: clear a run a dead coordinator left unstarted (``took_over``
        its lock, or its temporary files are all there is), refuse a run without ``resume``
        and ``resume`` without a run; sets :attr:`resuming`."""
        manifest = self.root / "manifest.json"
        names = [child.name for child in self.root.iterdir() if child.name != ".lock"]
        unstarted = (
            not manifest.exists()
            and (took_over or bool(names))
            and all(name.startswith(_SCRATCH) for name in names)
        )
        if unstarted:
            logger.info("%s holds no run (its sweep stopped before it began): starting", self.root)
            self._clear()
        elif names and not resume:
            raise ValueError(
                f"{self.root} already holds a run; pass --resume to continue it or choose "
                "another --out"
            )
        if resume and not manifest.exists() and not unstarted:
            raise ValueError(f"--resume: {self.root} holds no run (no manifest.json)")
        self.resuming = resume and manifest.exists()

    def _remove(self, created: bool) -> None:
        """Remove the run directory (empty it when it existed before this run)."""
        if created:
            shutil.rmtree(self.root)
        else:
            self._clear()

    def _clear(self) -> None:
        """Empty the run directory but for the lock this coordinator holds."""
        for child in self.root.iterdir():
            if child.name == ".lock":
                continue
            with contextlib.suppress(FileNotFoundError):  # (another's temporary file, gone)
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()

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
