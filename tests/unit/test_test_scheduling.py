"""The test run's own scheduling (``tests/conftest.py``): the default suites' background
training starts from the ids pytest-xdist's workers report, which ``--dist loadgroup`` suffixes
with ``@group``."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture
def scheduling(monkeypatch):
    """A fresh copy of ``tests/conftest.py`` whose ``Popen`` records the script it is given."""
    spec = importlib.util.spec_from_file_location(
        "scheduling_under_test", Path(__file__).parents[1] / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    started = []

    def popen(command, **kwargs):
        started.append(command[-1])
        return SimpleNamespace(poll=lambda: 0)

    monkeypatch.setattr(subprocess, "Popen", popen)
    return module, started


CONFIG = SimpleNamespace(option=SimpleNamespace(collectonly=False))


@pytest.mark.parametrize("suffix", ["", "@default-suites"])
def test_the_default_suites_train_in_the_background_for_the_ids_a_worker_reports(
    scheduling, suffix
):
    module, started = scheduling
    ids = ["tests/unit/test_x.py::test_y@tests/unit/test_x.py"]
    ids += [test + suffix for test in module.DEFAULT_SUITE_TESTS]
    module._train_default_suites(CONFIG, ids)
    assert len(started) == 1
    assert started[0].count("ensure_mini_suite(") == 2
    for suite in ("'mini-pythia'", "'mini-bert'"):
        assert f"ensure_mini_suite({suite})" in started[0]


def test_no_training_without_a_default_suite_test_or_a_second_time(scheduling):
    module, started = scheduling
    module._train_default_suites(CONFIG, ["tests/unit/test_x.py::test_y@tests/unit/test_x.py"])
    assert started == []
    ids = [test + "@default-suites" for test in module.DEFAULT_SUITE_TESTS]
    module._train_default_suites(CONFIG, ids)
    module._train_default_suites(CONFIG, ids)
    assert len(started) == 1
