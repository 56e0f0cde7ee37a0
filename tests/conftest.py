"""Fixtures shared by every test layer: micro mini-suites trained in about a second each; how
``make test``'s two pytest-xdist workers share the tests; the default suites trained once per
test run, in the background, while the other tests run."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.version import Version

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


#: Tests that read a default suite trained (the artifacts ``make run`` uses: minutes to train on
#: 2 cores) → that suite. They run last, in one group; when they are selected, the run starts
#: one background process at once that trains the suites they need, one after the other
#: (:func:`_train_default_suites`), while the other tests run; such a test finds its suite
#: trained, or waits for the training's lock (``ensure_mini_suite``) — never a second training.
DEFAULT_SUITE_TESTS = {
    "tests/slow/test_default_suite.py::test_default_decoder_ends_far_below_the_unigram_entropy": (
        "mini-pythia"
    ),
    "tests/integration/test_training.py::"
    "test_default_encoder_learns_to_fill_masks_a_nat_below_the_unigram_entropy": "mini-bert",
    "tests/integration/test_suites.py::test_suite_steps_of_a_trained_mini_suite[mini-pythia]": (
        "mini-pythia"
    ),
    "tests/integration/test_suites.py::test_suite_steps_of_a_trained_mini_suite[mini-bert]": (
        "mini-bert"
    ),
}
_trainer: subprocess.Popen | None = None

#: Session fixtures that run sweeps and are shared by tests in several files: their tests run
#: on one xdist worker, so that each sweep runs once.
SHARED_SWEEPS = frozenset({"units_reference", "executor_runs"})
#: Files of long independent tests with nothing shared: spread over the workers test by test.
SPREAD_FILES = frozenset({"test_interval_coverage.py", "test_drift_null.py"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group the tests for ``--dist loadgroup``: a file's tests together (its module fixtures
    are built once), those sharing a sweep with other files together, the long independent
    ones of :data:`SPREAD_FILES` one by one, those of :data:`DEFAULT_SUITE_TESTS` together and
    last (their suites train meanwhile)."""
    for item in items:
        if item.nodeid in DEFAULT_SUITE_TESTS:
            group = "default-suites"
        elif SHARED_SWEEPS & set(getattr(item, "fixturenames", ())):
            group = "shared-sweeps"
        elif item.path.name in SPREAD_FILES:
            continue
        else:
            group = item.path.relative_to(config.rootpath).as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.nodeid in DEFAULT_SUITE_TESTS)  # stable: the rest as is


def pytest_collection_finish(session):
    """Without xdist: start the default suites' training (:func:`_train_default_suites`)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and not _distributed(session.config):
        _train_default_suites(session.config, [item.nodeid for item in session.items])


def pytest_configure(config):
    """Refuse ``--dist loadgroup`` under a pytest that pytest-xdist cannot group with, rather
    than spread a file's tests over the workers and build every module fixture and shared sweep
    on each: from pytest 9.2 a node's id no longer reads the ``_nodeid`` that loadgroup renames
    to ``…@group`` (pytest-xdist 3.8, the newest)."""
    if config.getoption("dist", None) != "loadgroup":
        return
    xdist = Version(metadata.version("pytest-xdist"))
    if Version(pytest.__version__) >= Version("9.2") and xdist <= Version("3.8"):
        raise pytest.UsageError(
            f"pytest-xdist {xdist}'s --dist loadgroup does not group tests under pytest "
            f"{pytest.__version__}: install the dev dependencies' pytest (make setup)"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist (the controller, once a worker has collected): likewise."""
    _train_default_suites(node.config, ids)


def _distributed(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and config.option.dist != "no"


def _train_default_suites(config, selected: list[str]) -> None:
    """Start one process that ensures the default suites the ``selected`` tests need, one after
    the other (training those the cache lacks), its idle threads sleeping: it runs beside the
    tests."""
    global _trainer
    needed = dict.fromkeys(
        DEFAULT_SUITE_TESTS[test] for test in map(_without_group, selected)
        if test in DEFAULT_SUITE_TESTS
    )  # fmt: skip
    if _trainer is not None or not needed or config.option.collectonly:
        return
    script = "from tangentlens.models.suites import ensure_mini_suite\n" + "".join(
        f"ensure_mini_suite({name!r})\n" for name in needed
    )
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
    # silent: a test whose suite this process failed to train trains it itself, and says why
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    _trainer = subprocess.Popen([sys.executable, "-c", script], env=env, **quiet)


def _without_group(nodeid: str) -> str:
    """``nodeid`` without the ``@group`` that pytest-xdist's ``--dist loadgroup`` appends to the
    ids a worker reports (none of :data:`DEFAULT_SUITE_TESTS` has an ``@``)."""
    return nodeid.partition("@")[0]


def pytest_sessionfinish(session):
    """The background training ends with the run: interrupted (it cleans up after itself: no
    half-written suite, no lock), killed if it does not stop."""
    if _trainer is not None and _trainer.poll() is None:
        _trainer.send_signal(signal.SIGINT)
        try:
            _trainer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _trainer.kill()
            _trainer.wait()
