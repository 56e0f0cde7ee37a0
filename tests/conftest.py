"""Fixtures shared by every test layer: micro mini-suites trained in about a second each."""

from __future__ import annotations

import dataclasses

import pytest

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
