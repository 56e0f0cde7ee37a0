"""The reference site builds strictly and offline (``make docs``): the README as its home page,
the guide's pages, the glossary, each probe's definitions from its docstring, the recipe keys,
the API."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tangentlens.core.recipe import ProxiesSpec, Recipe
from tangentlens.registry import builtin_probes
from tests import pages

ROOT = Path(__file__).resolve().parents[2]


def _text(page: Path) -> str:
    """A page's visible text, tags dropped, entities decoded, white space collapsed."""
    raw = re.sub(
        r"<(script|style|svg)\b.*?</\1>", " ", page.read_text(encoding="utf-8"), flags=re.S
    )
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", raw)))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    return out


@pytest.mark.slow
def test_probe_pages_hold_the_definitions_of_their_docstrings(site):
    page = site / "probes" / "tangent_energy.html"
    text = _text(page)
    assert "Haar k-frames in span(m̂)⊥" in text  # the exchangeable controls' definition
    assert 'id="tangentlens.probes.tangent_energy.rows"' in page.read_text(encoding="utf-8")
    for name in builtin_probes():  # one page per probe
        assert (site / "probes" / f"{name}.html").is_file(), name


@pytest.mark.slow
def test_glossary_page_holds_the_generated_table(site):
    pairs = re.findall(
        r"^\| `([a-z_]+)` \| `([a-z0-9_<>]+)` \|", pages.page("glossary"), flags=re.M
    )
    assert len(pairs) > 50
    text = _text(site / "glossary.html")
    for probe, metric in pairs:
        assert f"{probe} {metric}" in text, (probe, metric)
    assert "E(T) / energy_null_mean : over the exchangeable controls' exact mean" in text


@pytest.mark.slow
def test_the_home_page_is_the_readme_and_links_every_guide_page(site):
    """The front door on the site: its links reach the pages (a strict build fails on a link to
    no page), each page of the nav is built."""
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "In a notebook" in _text(site / "index.html")
    assert "energy_complement_null_mean" not in _text(site / "index.html")
    for name in ("suites", "notebook", "sweeps", "memory", "gpu", "clusters", "compare"):
        assert f'href="{name}.html"' in home, name
        assert (site / f"{name}.html").is_file(), name
    assert "Loaders" in _text(site / "suites.html")  # a moved section keeps its subsections


@pytest.mark.slow
def test_recipe_keys_page_lists_every_key_with_its_default(site):
    page = (site / "recipe-keys.html").read_text(encoding="utf-8")
    found: dict[str, dict[str, str]] = {}
    for section, body in re.findall(
        r"<h2 id=[^>]*><code>\[([\w.]+)\]</code>(.*?)(?=<h2 |$)", page, re.S
    ):
        rows = re.findall(
            r"<tr>\s*<td><code>(\w+)</code></td>\s*<td>.*?</td>\s*<td>(.*?)</td>", body, re.S
        )
        found[section] = {key: _text_of(default) for key, default in rows}
    sections = {
        field.name: type(field.default_factory())
        for field in dataclasses.fields(Recipe)
        if field.name not in ("name", "probes", "proxies")
    }
    sections |= {"proxies": ProxiesSpec}  # no section unless a recipe names it or a tangent probe
    sections |= {f"probes.{name}": p.config for name, p in builtin_probes().items()}
    for section, cls in sections.items():
        assert set(found[section]) == {f.name for f in dataclasses.fields(cls)}, section
    assert found["proxies"]["rank"] == "16"
    assert found["proxies"]["fit_policy"] == '"per_checkpoint"'
    assert found["suite"]["name"] == '"mini-pythia"'
    assert found["capture"]["sites"] == '["resid_post"]'
    assert set(found["proxies.pretrained_sae"]) == {"release", "ids", "select_step"}


def _text_of(cell: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()


@pytest.mark.slow
def test_api_pages_and_nothing_fetched_from_the_web(site):
    for package in ("tangentlens", "capture", "dictionaries", "metrics", "models", "data"):
        name = "tangentlens" if package == "tangentlens" else f"tangentlens.{package}"
        assert (site / "api" / f"{name}.html").is_file(), name
    api = (site / "api" / "tangentlens.core.html").read_text(encoding="utf-8")
    assert 'id="tangentlens.core.recipe.load_recipe"' in api
    executors = (site / "api" / "tangentlens.sweep.executors.html").read_text(encoding="utf-8")
    assert 'id="tangentlens.sweep.executors.base.Backend"' in executors  # its own package
    for page in site.rglob("*.html"):
        fetched = re.findall(
            r'<(?:link|script|img)\b[^>]*(?:href|src)="(https?:[^"]+)"',
            page.read_text(encoding="utf-8"),
        )
        assert fetched == [], (page, fetched)
