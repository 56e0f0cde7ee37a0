"""Fixtures shared by every test layer: micro mini-suites trained in about a second each; how
``make test``'s two pytest-xdist workers share the tests."""

from __future__ import annotations

import dataclasses
import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on one machine: idle torch threads sleep instead of spinning on the core the
    # other worker computes on (set before torch is imported; a user's own setting stands)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tangentlens.models.training import MINI_SUITE_CONFIGS, MiniSuiteConfig


@pytest.fixture(scope="session")
def micro_config():
    """``micro_config("pythia" | "bert", **overrides)``: the micro suite's config, modified."""

    def make(architecture: str = "pythia", **overrides) -> MiniSuiteConfig:
        return dataclasses.replace(MINI_SUITE_CONFIGS[f"micro-{architecture}"], **overrides)

    return make


@pytest.fixture(scope="session")
def suite_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("suites")


@pytest.fixture(scope="session")
def micro_pythia(suite_cache):
    from tangentlens.models.suites import ensure_mini_suite

    return ensure_mini_suite("micro-pythia", cache_dir=suite_cache)


@pytest.fixture(scope="session")
def micro_bert(suite_cache):
    from tangentlens.models.suites import ensure_mini_suite

    return ensure_mini_suite("micro-bert", cache_dir=suite_cache)


#: Session fixtures that run sweeps and are shared by tests in several files: their tests run
#: on one xdist worker, so that each sweep runs once.
SHARED_SWEEPS = frozenset({"units_reference", "executor_runs"})
#: Files of long independent tests with nothing shared: spread over the workers test by test.
SPREAD_FILES = frozenset({"test_interval_coverage.py", "test_drift_null.py"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group the tests for ``--dist loadgroup``: a file's tests together (its module fixtures
    are built once), those sharing a sweep with other files together, the long independent
    ones of :data:`SPREAD_FILES` one by one."""
    for item in items:
        if SHARED_SWEEPS & set(getattr(item, "fixturenames", ())):
            group = "shared-sweeps"
        elif item.path.name in SPREAD_FILES:
            continue
        else:
            group = item.path.relative_to(config.rootpath).as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
