"""Recipe validation and sweep planning stay light: they import neither torch nor any model
library, and the lazy packages still export every public name they did."""

import importlib
import pkgutil
import subprocess
import sys
import textwrap
from types import ModuleType

import pytest

HEAVY = ("torch", "transformer_lens", "transformers", "sae_lens")

LAZY_PACKAGES = (
    "tangentlens.capture",
    "tangentlens.comparison",
    "tangentlens.data",
    "tangentlens.dictionaries",
    "tangentlens.metrics",
    "tangentlens.models",
    "tangentlens.probes",
)


def test_recipes_and_suite_steps_import_no_heavy_library(tmp_path):
    for step in ("step0", "step10"):
        (tmp_path / step).mkdir()  # checkpoint subfolders are found by name alone
    script = textwrap.dedent(
        f"""
        import sys

        from tangentlens.dictionaries.policy import early_window
        from tangentlens.models.catalog import suite_steps
        from tangentlens.core.recipe import builtin_recipes, load_recipe

        for name in builtin_recipes():
            load_recipe(name)
        try:
            load_recipe("quickstart", ["proxies.rnak=3"])
        except ValueError as error:
            assert "did you mean 'rank'" in str(error), error
        else:
            raise AssertionError("the typo was accepted")
        assert suite_steps({str(tmp_path)!r}) == (0, 10)
        for spec in ("mini-pythia", "micro-bert", "EleutherAI/pythia-70m"):
            early_window(suite_steps(spec))
        print(sorted({set(HEAVY)!r} & sys.modules.keys()))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_lazy_packages_export_their_names_not_shadowing_submodules(name):
    package = importlib.import_module(name)
    # import every submodule first, as other code may: each binds itself on the package
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{name}.{info.name}")
    for export in package.__all__:
        value = getattr(package, export)
        # the probes package exports its probe modules; the others export no module (an
        # export named like a submodule, tangentlens.metrics.isoscore, stays the function)
        assert isinstance(value, ModuleType) == (name == "tangentlens.probes"), export
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'not_exported'"):
        package.not_exported  # noqa: B018


def test_cli_plan_only_and_a_typo_import_no_heavy_library(tmp_path):
    """``tangentlens sweep --plan-only`` and a ``--set`` typo answer without torch or a model
    library (a typo used to take 11–15 s: every probe module and transformer_lens first)."""
    script = textwrap.dedent(
        f"""
        import sys

        from tangentlens.cli import main

        assert main(["sweep", "--recipe", "quickstart", "--plan-only",
                     "--out", {str(tmp_path / "run")!r}]) == 0
        assert main(["sweep", "--set", "proxies.rnak=3"]) == 2
        assert main(["sweep", "--executor", "ray", "--set", "executor.workers=-1",
                     "--plan-only"]) == 2
        print(sorted({set(HEAVY)!r} & sys.modules.keys()))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "step-<step> × 8" in result.stdout and "fit-proxies" in result.stdout
    assert "did you mean 'rank'" in result.stderr and "executor.workers" in result.stderr
    assert not (tmp_path / "run").exists()  # planning writes nothing
