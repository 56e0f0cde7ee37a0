"""The reference site's generated parts (docs/tooling/hooks.py): recipe-key tables from the
recipe's dataclasses, the README as the home page."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs/tooling/hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_clauses_cut_at_semicolons_and_sentences_outside_brackets_and_code(hooks):
    text = "``a``: one (x; y). ``b``, e.g. two; ``c`` = `p; q`.\n\n Last"
    assert hooks.clauses(text) == [
        "``a``: one (x; y).",
        "``b``, e.g. two;",
        "``c`` = `p; q`.",
        "Last",
    ]


@dataclass(frozen=True)
class _Section:
    """A section. ``rate``: how fast (per second); ``size`` in bytes."""

    rate: float = 0.5
    size: int = 4
    seed: int = 0


def test_a_key_its_docstring_never_names_fails_the_build(hooks, caplog):
    out: list[str] = []
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.tangentlens"):
        hooks._section("demo", _Section, out)
    rows = [line for line in out if line.startswith("| `")]
    assert rows == [
        "| `rate` | `float` | `0.5` | ``rate``: how fast (per second); |",
        "| `size` | `int` | `4` | ``size`` in bytes. |",
        "| `seed` | `int` | `0` |  |",
    ]
    assert "A section." in out
    assert [r.getMessage() for r in caplog.records] == [
        f"recipe key demo.seed: {__name__}._Section's docstring never names it"
    ]


def test_every_recipe_key_is_named_by_its_section(hooks, caplog):
    with caplog.at_level(logging.WARNING):
        page = hooks.recipe_keys()
    assert [r.getMessage() for r in caplog.records] == []
    assert "## `[proxies.pretrained_sae]`" in page
    assert "| `early_fraction` | `float` | `0.3` | ``early_fraction`` and" in page


def test_the_readme_links_to_the_pages_of_the_site(hooks):
    home = hooks.readme()
    assert "](docs/" not in home
    assert "[On a GPU](gpu.md)" in home and "[metric glossary](glossary.md)" in home
