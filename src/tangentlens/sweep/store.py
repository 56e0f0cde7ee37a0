"""The results store of one run directory: parquet parts, a manifest and a lock.

Layout::

    RUN_DIR/
      manifest.json          resolved recipe, versions, git hash, seeds, device, per-step info
      results/<unit>.parquet one part per finished unit (tidy rows, the schema below)
      state/                 what later units need from earlier ones (e.g. frozen proxies)
      .lock                  the pid of the sweep writing here

Every file is written to a temporary name in its final folder and renamed into place, so a
killed sweep leaves either a whole part or none: ``--resume`` skips the units whose part exists
and recomputes the rest, which gives exactly the table of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tangentlens.probes.base import ROW_FIELDS

__all__ = ["SCHEMA", "RunStore", "read_results"]

_TYPES = {
    "suite": pa.string(),
    "step": pa.int64(),
    "tokens_seen": pa.int64(),
    "site": pa.string(),
    "layer": pa.int64(),
    "probe": pa.string(),
    "method": pa.string(),
    "rank": pa.int64(),
    "freq_bin": pa.string(),
    "metric": pa.string(),
    "value": pa.float64(),
    "ci_low": pa.float64(),
    "ci_high": pa.float64(),
    "n_tokens": pa.int64(),
}
#: The parquet schema of result rows, in the order of ``tangentlens.probes.base.ROW_FIELDS``.
SCHEMA = pa.schema([(name, _TYPES[name]) for name in ROW_FIELDS])


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunStore:
    """One run directory. Open with :meth:`open` (creates or resumes, takes the lock)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results = root / "results"
        self.state = root / "state"

    @classmethod
    @contextlib.contextmanager
    def open(cls, root: str | Path, *, resume: bool) -> Iterator[RunStore]:
        """Create ``root`` (it must not hold a run unless ``resume``) and hold its lock.

        If the body fails before any result part exists in a run this call created, the run
        directory is removed again: a failed start leaves nothing half-written.
        """
        store = cls(Path(root))
        created = not store.root.exists()
        manifest = store.root / "manifest.json"
        if store.root.exists() and any(store.root.iterdir()) and not resume:
            raise ValueError(
                f"{store.root} already holds a run; pass --resume to continue it or choose "
                "another --out"
            )
        if resume and not manifest.exists():
            raise ValueError(f"--resume: {store.root} holds no run (no manifest.json)")
        store.root.mkdir(parents=True, exist_ok=True)
        lock = store.root / ".lock"
        store._acquire(lock)
        try:
            yield store
        except BaseException:
            if not resume and not any(store.results.glob("*.parquet")):
                if created:
                    shutil.rmtree(store.root)
                else:
                    store._clear()
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def _clear(self) -> None:
        """Empty a run directory that existed (empty) before this run started."""
        for child in self.root.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()

    def _acquire(self, lock: Path) -> None:
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    pid = int(lock.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and _pid_alive(pid) and pid != os.getpid():
                    raise ValueError(
                        f"{self.root} is locked by a running sweep (pid {pid}); wait for it or "
                        "choose another --out"
                    ) from None
                lock.unlink(missing_ok=True)  # left by a killed sweep
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(str(os.getpid()))
            return
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

    def write_state(self, name: str, write: Any) -> Path:
        """Atomically write ``state/name`` with ``write(tmp_path)``."""
        path = self.state / name
        _atomic_write_bytes(path, write)
        return path


def read_results(root: str | Path) -> pa.Table:
    """Every part of a run as one table (sorted by step, probe, site, method, bin, metric)."""
    parts = sorted((Path(root) / "results").glob("*.parquet"))
    if not parts:
        raise ValueError(f"{root} holds no results (results/*.parquet)")
    table = pa.concat_tables([pq.read_table(p, schema=SCHEMA) for p in parts])
    keys = ["step", "probe", "site", "method", "freq_bin", "metric"]
    return table.sort_by([(k, "ascending") for k in keys])
