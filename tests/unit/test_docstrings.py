"""Every name a public module of tangentlens exports (its ``__all__``) has a docstring, and so
has every public module: read statically by the reference site's griffe extension
(docs/tooling/griffe_tangentlens.py), which also reads the lazily exported ``__all__`` of the
packages, ``tangentlens.probes`` from ``probes/`` and ``#:`` comments as the docstrings of
constants."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def extension():
    spec = importlib.util.spec_from_file_location(
        "griffe_tangentlens_test", ROOT / "docs" / "tooling" / "griffe_tangentlens.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def package(extension):
    return extension.load_package(ROOT)


def _public_modules(module) -> Iterator:
    yield module
    for sub in module.modules.values():
        if not sub.is_alias and not sub.name.startswith("_"):
            yield from _public_modules(sub)


def _documented(obj) -> bool:
    return obj.docstring is not None and bool(obj.docstring.value.strip())


def test_every_public_module_and_export_has_a_docstring(package):
    missing = []
    for module in _public_modules(package):
        if not _documented(module):
            missing.append(f"{module.path} (module)")
        for name in module.exports or ():
            member = module.members[str(name)]
            target = member.final_target if member.is_alias else member
            if not _documented(target):
                missing.append(f"{module.path}.{name}")
    assert missing == [], "public names without a docstring:\n" + "\n".join(missing)


def test_the_walk_covers_the_lazy_packages_and_the_probes(package):
    """The check above sees what Python imports: the packages' lazily exported names, the
    probe modules under ``tangentlens.probes`` (from ``probes/``), ``#:`` comments."""
    modules = {m.path: m for m in _public_modules(package)}
    assert {"measure", "capture_model", "open_suite", "Capture", "ResultTable"} <= set(
        package.exports
    )
    assert package["measure"].final_target.path == "tangentlens.notebook.measure"
    assert "CaptureConfig" in modules["tangentlens.capture"].exports
    probes = modules["tangentlens.probes.tangent_energy"]
    assert Path(probes.filepath) == ROOT / "probes" / "tangent_energy.py"
    assert "Haar k-frames" in probes.docstring.value
    weight_dtypes = modules["tangentlens.core.recipe"]["WEIGHT_DTYPES"]
    assert weight_dtypes.docstring.value.startswith("Weight dtypes a suite can be loaded in")


def test_every_role_names_an_object(package, extension):
    """Each Sphinx role of a docstring names an object of tangentlens or of an installed
    package (a strict build fails on the others too, after some 30 s)."""
    assert extension.BROKEN == []


def test_roles_become_references_and_a_dangling_one_is_reported(package, extension):
    """``:class:`~a.b.C``` links to the object's documented path; a name of no object is kept
    as a reference (a strict build fails on it) and listed."""
    suite = package["core.recipe.SuiteSpec"]
    assert "[`WEIGHT_DTYPES`][tangentlens.core.recipe.WEIGHT_DTYPES]" in suite.docstring.value
    assert (
        "[`DEFAULT_LOADERS`][tangentlens.models.catalog.DEFAULT_LOADERS]" in suite.docstring.value
    )
    before = len(extension.BROKEN)
    assert extension._crossref(suite, "no_such_name") == "[`no_such_name`][no_such_name]"
    assert extension.BROKEN[before:] == [("tangentlens.core.recipe.SuiteSpec", "no_such_name")]
    del extension.BROKEN[before:]
    assert extension._crossref(suite, "~torch.Tensor") == "`Tensor`"  # external: code
    # a re-exported name links to where it is defined; a private one is code
    assert (
        extension._crossref(suite, "tangentlens.capture.CaptureConfig")
        == "[`tangentlens.capture.CaptureConfig`][tangentlens.capture.engine.CaptureConfig]"
    )
    assert extension._crossref(suite, "_table") == "`_table`"
