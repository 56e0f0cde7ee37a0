"""``--set`` keys (issue 42, item 6): a probe named by a dotted import path is addressed as in a
recipe file (its key quoted) or bare (the part holding ``:`` ends it); an import path to a
missing attribute says so; a key set twice with two values is refused, as in a file."""

from __future__ import annotations

import re
import textwrap

import pytest

from tangentlens.core.recipe import load_recipe

PACKAGE = """
import dataclasses

from tangentlens_gradnorm import PROBE as _EXAMPLE

PROBE = dataclasses.replace(_EXAMPLE, name="grad_norm_dotted")
"""


@pytest.fixture
def dotted(tmp_path, monkeypatch):
    """A researcher's probe at ``mypkg42.probes:PROBE`` (a dotted module path)."""
    package = tmp_path / "mypkg42"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probes.py").write_text(textwrap.dedent(PACKAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "mypkg42.probes:PROBE"


@pytest.mark.parametrize(
    "override",
    [
        'probes."mypkg42.probes:PROBE"=true',  # quoted, as a recipe file writes the table
        "probes.'mypkg42.probes:PROBE'.per_bin=false",
        "probes.mypkg42.probes:PROBE=true",  # bare: the part with ':' ends the import path
        "probes.mypkg42.probes:PROBE.per_bin=false",
    ],
)
def test_a_dotted_import_path_probe_is_addressed_by_set(dotted, override):
    recipe = load_recipe("quickstart", [override])
    entry = recipe.probes[dotted]
    assert entry.probe.name == "grad_norm_dotted"
    assert entry.config.per_bin is ("per_bin" not in override)


def test_a_missing_attribute_is_named_as_such(dotted):
    with pytest.raises(
        ValueError,
        match=re.escape(
            "probe 'mypkg42.probes:NOPE': module mypkg42.probes has no attribute 'NOPE'; its "
            "probes: PROBE"
        ),
    ):
        load_recipe("quickstart", ["probes.mypkg42.probes:NOPE=true"])
    module = load_recipe("quickstart", ['probes."mypkg42.probes"=true'])  # its PROBE
    assert module.probes["mypkg42.probes"].probe.name == "grad_norm_dotted"
    with pytest.raises(ValueError, match=re.escape('a quoted key part is not closed (")')):
        load_recipe("quickstart", ['probes."mypkg42.probes:PROBE=true'])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["probes.tangent_energy.rank=8", "proxies.rank=12"],
            "--set sets proxies.rank twice: probes.tangent_energy.rank=8 and proxies.rank=12",
        ),
        (
            ["proxies.rank=12", "probes.tangent_energy.rank=8"],
            "--set sets proxies.rank twice: proxies.rank=12 and probes.tangent_energy.rank=8",
        ),
        (["data.seq_len=64", "data.seq_len=32"], "--set sets data.seq_len twice"),
    ],
)
def test_a_key_set_twice_with_two_values_is_refused_as_in_a_file(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_recipe("quickstart", overrides)


def test_a_key_set_twice_with_one_value_is_that_value():
    recipe = load_recipe("quickstart", ["probes.tangent_energy.rank=8", "proxies.rank=8"])
    assert recipe.proxies.rank == 8


def test_a_set_keys_path_splits_on_dots_outside_quotes_and_import_paths():
    from tangentlens.core.recipe import _override_path

    assert _override_path("probes.pkg.eXtra:PROBE_X.per_bin") == [
        "probes", "pkg.eXtra:PROBE_X", "per_bin",
    ]  # fmt: skip
    assert _override_path('probes."a.b:X".k') == ["probes", "a.b:X", "k"]
    assert _override_path("data.'max_tokens'") == ["data", "max_tokens"]
