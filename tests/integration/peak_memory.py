"""Resident memory of the current process, for the memory tests' child processes.

The peak is ``VmHWM`` of ``/proc/self/status``, not ``ru_maxrss``: Linux keeps ``ru_maxrss``
across ``execve``, so a child started by a pytest process that once held 3 GB reports 3 GB
whatever it does itself. ``VmHWM`` belongs to the child's own address space.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ``RssAnon``) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def resident() -> int:
    """Resident bytes now."""
    return status_bytes("VmRSS")


def peak_resident() -> int:
    """The highest resident bytes of this process so far."""
    return status_bytes("VmHWM")


def run_child(script: Path, spec: dict, env: dict[str, str]) -> dict:
    """Run ``script`` with ``spec`` as its JSON argument in a fresh process (glibc's mmap
    threshold at 128 KiB, so that freed blocks leave the resident set; 2 threads) and return the
    JSON object its last output line holds."""
    env = {**os.environ, **env, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    if done.returncode:
        raise AssertionError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])
