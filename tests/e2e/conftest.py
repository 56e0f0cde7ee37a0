"""What the end-to-end sweep tests share: a cache holding the trained micro suite, the micro
recipe cut to a few units of every kind, its local run (the reference table), and how to compare
tables and start a sweep process."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tangentlens.sweep.store import read_results

_KEY = ("step", "site", "probe", "method", "rank", "freq_bin", "metric")


@dataclass(frozen=True)
class Sweeps:
    """``recipe``: the micro recipe; ``units``: overrides giving every kind of unit, few of each
    (data, 2 window captures, fit, 2 steps, across-steps, the untrained block: 8 units, 5 parts),
    one thread per unit (2 workers on 2 cores)."""

    recipe: str = str(Path(__file__).parent / "recipes" / "micro.toml")
    units: tuple[str, ...] = (
        "--set",
        "suite.steps='0,40'",
        "--set",
        "probes.tangent_energy.window_checkpoints=2",
        "--set",
        "capture.threads=1",
    )

    def start(self, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        """``tangentlens sweep --recipe <micro> ARGS`` in a child process."""
        return subprocess.Popen(
            [sys.executable, "-m", "tangentlens.cli", "sweep", "--recipe", self.recipe, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def assert_same_table(run: Path, reference: Path, parts: int = 5) -> None:
        """Same rows, same values (NaN equal to NaN), ``parts`` parts (one per unit with rows),
        no temporary file."""
        got = {tuple(r[k] for k in _KEY): r for r in read_results(run).to_pylist()}
        want = {tuple(r[k] for k in _KEY): r for r in read_results(reference).to_pylist()}
        assert len(got) == len(read_results(run)) and got.keys() == want.keys()
        for key, row in want.items():
            assert all(_same(row[f], got[key][f]) for f in row), key
        assert len(list((run / "results").glob("*.parquet"))) == parts
        assert not list((run / "results").glob(".*"))


def _same(a, b) -> bool:
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


@pytest.fixture(scope="session")
def sweeps() -> Sweeps:
    return Sweeps()


@pytest.fixture(scope="session")
def units_cache(tmp_path_factory):
    """A cache holding the trained micro suite."""
    from tangentlens.models.suites import ensure_mini_suite

    root = tmp_path_factory.mktemp("units-cache")
    ensure_mini_suite("micro-pythia", cache_dir=root / "suites")
    return root


@pytest.fixture
def units_env(units_cache, monkeypatch):
    monkeypatch.setenv("TANGENTLENS_CACHE", str(units_cache))
    return {**os.environ, "TANGENTLENS_CACHE": str(units_cache)}


@pytest.fixture(scope="session")
def units_reference(sweeps, units_cache, tmp_path_factory):
    """The local executor's run of the cut micro recipe: the table every executor must give."""
    out = tmp_path_factory.mktemp("local") / "run"
    env = {**os.environ, "TANGENTLENS_CACHE": str(units_cache)}
    process = sweeps.start(["--out", str(out), *sweeps.units], env)
    assert process.wait(timeout=600) == 0, process.stderr.read()
    return out
