"""The probe registry: every built-in probe declared once (its metrics are the metric
glossary's, docs/glossary.md), declarations and rows checked, probes resolved by name, entry
point or import path with one-line refusals."""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tangentlens.capture.needs import Needs
from tangentlens.glossary import BEGIN, END, glossary_table
from tangentlens.registry import (
    SCOPES,
    Probe,
    builtin_probes,
    entries,
    resolve,
)
from tangentlens.results import make_row
from tests.pages import blocks, page

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    scale: float = 1.0


@dataclass
class Mutable:
    scale: float = 1.0


def _rows(inputs, config):
    return []


def _probe(**changes) -> Probe:
    fields = {
        "name": "mine",
        "config": Settings,
        "scope": "step",
        "metrics": {"my_metric": "a definition"},
        "rows": _rows,
    }
    return Probe(**{**fields, **changes})


def _glossary() -> dict[str, dict[str, str]]:
    body = page("glossary").split(BEGIN, 1)[1]
    found: dict[str, dict[str, str]] = {}
    for probe, metric, definition in re.findall(
        r"^\| `([a-z_]+)` \| `([a-z0-9_<>]+)` \| (.*) \|$", body, flags=re.M
    ):
        found.setdefault(probe, {})[metric] = definition.replace("\\|", "|")
    return found


def test_the_builtin_catalogue_is_every_probe_module():
    import tangentlens.probes

    folder = Path(tangentlens.probes.__path__[0])  # probes/, or a staging copy's (make mutate)
    names = {p.stem for p in folder.glob("*.py")} - {"__init__", "base", "configs"}
    assert set(builtin_probes()) == names
    assert set(tangentlens.probes.__all__) == names  # the package's names come from its modules
    for name, probe in builtin_probes().items():
        assert probe.name == name and probe.module == f"tangentlens.probes.{name}"
        assert getattr(tangentlens.probes, name).PROBE is probe


def test_the_glossary_page_is_the_generated_one():
    """Regenerate (``python -m tangentlens.glossary``, into docs/glossary.md) after changing a
    probe's metrics; the table holds each probe's definitions word for word."""
    text = page("glossary")
    assert text.split(BEGIN + "\n", 1)[1].split(END, 1)[0] == glossary_table()
    glossary = _glossary()
    for name, probe in builtin_probes().items():
        assert dict(probe.metrics) == glossary[name], name
    # what the core writes (not a probe's): the capture's and the proxy fit's rows
    assert set(glossary) - set(builtin_probes()) == {"capture", "proxy_fit"}


def test_needs_union_and_resolved_entries():
    probes = builtin_probes()
    assert probes["cosine_drift"].needs_for(None) == Needs()
    both = probes["qk_drift"].needs_for(None).union(probes["shape_of_learning"].needs_for(None))
    assert both == Needs(attention=True, reservoir=True)
    assert probes["tangent_energy"].needs_for(None).bin_moments
    config = probes["cosine_drift"].config()
    (entry,) = entries({"cosine_drift": config}).values()
    assert (entry.key, entry.probe, entry.config) == (
        "cosine_drift",
        probes["cosine_drift"],
        config,
    )
    assert entries({"cosine_drift": entry}) == {"cosine_drift": entry}
    with pytest.raises(ValueError, match=r"probes\.qk_drift: its config must be a QKDriftConfig"):
        entries({"qk_drift": config})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "My-Probe"}, "a probe's name must be snake_case"),
        ({"scope": "sometimes"}, f"scope must be one of {list(SCOPES)}"),
        ({"config": Mutable}, "config Mutable must be a frozen dataclass"),
        ({"config": dict}, "config must be a dataclass type"),
        ({"metrics": {}}, "metrics must map each snake_case metric name to its definition"),
        ({"metrics": {"Bad Name": "x"}}, "metrics must map each snake_case"),
        ({"rows": None}, "a 'step' probe needs a callable rows"),
        ({"scope": "across", "rows": None}, "an 'across' probe needs a callable across"),
        ({"state": _rows}, "state is kept for across rows: give across too"),
        ({"refits": True}, "only a 'tangent' probe reads the step's own refit"),
        ({"needs": Needs(type_sums=True)}, "a probe needing type sums names its types"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_probe(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _probe(**changes)


def _row(**changes):
    row = {
        "suite": "s",
        "step": 3,
        "tokens_seen": None,
        "site": "blocks.0.hook_resid_post",
        "layer": 0,
        "probe": "mine",
        "method": "-",
        "rank": None,
        "freq_bin": "all",
        "metric": "my_metric",
        "value": 1.5,
        "ci_low": None,
        "ci_high": None,
        "n_tokens": 10,
    }
    row.update(changes)
    return row


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"metric": "other"}, "returned a row of probe 'mine', metric 'other'; it declares"),
        ({"probe": "theirs"}, "returned a row of probe 'theirs'"),
        ({"value": "1.5"}, "row field 'value' of probe 'mine' (metric 'my_metric') must be real"),
        ({"step": 2.0}, "row field 'step' of probe 'mine' (metric 'my_metric') must be integral"),
        ({"site": None}, "row field 'site' of probe 'mine' (metric 'my_metric') must be str,"),
        ({"colour": "red"}, "unknown fields ['colour']"),
    ],
)
def test_rows_outside_the_schema_or_the_declared_metrics_are_refused(row, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        _probe().check_rows([_row(**row)], "unit 'step-00000003'")
    assert str(error.value).startswith("unit 'step-00000003': ")


def test_a_row_missing_a_field_is_refused_and_make_rows_pass():
    row = _row()
    del row["n_tokens"]
    with pytest.raises(ValueError, match=re.escape("has missing fields ['n_tokens']")):
        _probe().check_rows([row], "here")
    _probe().check_rows([_row(), _row(value=float("nan"), ci_low=0.5, ci_high=2)], "here")


def test_resolve_by_name_suggests_and_lists_the_allowed():
    assert resolve("tangent_energy") is builtin_probes()["tangent_energy"]
    with pytest.raises(ValueError, match=r"unknown probe 'tangent_enrgy'; allowed: \[") as error:
        resolve("tangent_enrgy")
    assert "(did you mean 'tangent_energy'?)" in str(error.value)
    assert "'grad_norm'" in str(error.value)  # the installed example's entry point


def test_the_installed_example_resolves_through_its_entry_point():
    probe = resolve("grad_norm")
    assert probe.name == "grad_norm" and probe.module == "tangentlens_gradnorm"
    assert probe.needs == Needs(gradients=True, bins=True)


def _module(tmp_path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_import_paths_resolve_and_bad_ones_are_refused_in_one_line(tmp_path, monkeypatch):
    source = """
        from dataclasses import dataclass
        from tangentlens.registry import Probe

        @dataclass(frozen=True)
        class Config:
            pass

        PROBE = Probe(name="ok_probe", config=Config, scope="step",
                      metrics={"x": "a thing"}, rows=lambda inputs, config: [])
        NOT_A_PROBE = 3
    """
    name = _module(tmp_path, monkeypatch, "probe_paths_ok", source)
    assert resolve(f"{name}:PROBE").name == "ok_probe"
    (tmp_path / "probe_package").mkdir()
    (tmp_path / "probe_package" / "__init__.py").write_text("")
    (tmp_path / "probe_package" / "mine.py").write_text(textwrap.dedent(source))
    assert resolve("probe_package.mine").name == "ok_probe"  # a module: its PROBE
    with pytest.raises(ValueError, match=r"NOT_A_PROBE is not a tangentlens.registry.Probe"):
        resolve(f"{name}:NOT_A_PROBE")
    broken = _module(tmp_path, monkeypatch, "probe_paths_broken", "import not_a_module_here\n")
    with pytest.raises(ValueError) as error:
        resolve(f"{broken}:PROBE")
    assert str(error.value) == (
        f"probe '{broken}:PROBE': cannot import '{broken}' (ModuleNotFoundError: No module named "
        "'not_a_module_here')"
    )
    assert "\n" not in str(error.value)
    shadow = _module(
        tmp_path,
        monkeypatch,
        "probe_paths_shadow",
        source.replace('name="ok_probe"', 'name="cosine_drift"'),
    )
    with pytest.raises(ValueError, match="a built-in probe's name"):
        resolve(f"{shadow}:PROBE")
    config = resolve(f"{name}:PROBE").config()
    with pytest.raises(ValueError, match="are both named 'ok_probe'"):
        entries({f"{name}:PROBE": config, "probe_package.mine": config})


def test_an_installed_probe_may_not_shadow_a_built_in_one(tmp_path, monkeypatch):
    """An entry point named like a built-in probe is refused in one line (value test of the
    message), as is one declaring another name; a well-formed one is listed."""
    import importlib.metadata

    from tangentlens import registry

    source = """
        from dataclasses import dataclass
        from tangentlens.registry import Probe

        @dataclass(frozen=True)
        class Config:
            pass

        PROBE = Probe(name="cosine_drift", config=Config, scope="step",
                      metrics={"x": "a thing"}, rows=lambda inputs, config: [])
        OTHER = Probe(name="elsewhere", config=Config, scope="step",
                      metrics={"x": "a thing"}, rows=lambda inputs, config: [])
    """
    module = _module(tmp_path, monkeypatch, "probe_entry_shadow", source)

    def installed(**points: str) -> dict:
        group = registry.ENTRY_POINT_GROUP
        entries = {n: importlib.metadata.EntryPoint(n, v, group) for n, v in points.items()}
        monkeypatch.setattr(registry, "_entry_points", lambda: entries)
        registry.installed_probes.cache_clear()
        try:
            return registry.installed_probes()
        finally:
            registry.installed_probes.cache_clear()

    with pytest.raises(ValueError) as error:
        installed(cosine_drift=f"{module}:PROBE")
    assert str(error.value) == (
        f"entry point 'cosine_drift' ({module}:PROBE) shadows a built-in probe"
    )
    with pytest.raises(ValueError, match="declares a probe named 'elsewhere'"):
        installed(mine=f"{module}:OTHER")
    assert list(installed(elsewhere=f"{module}:OTHER")) == ["elsewhere"]


def test_the_probe_example_is_the_fixture_package_word_for_word():
    block = blocks(page("your-probe"))[0]  # the README's is the same (tests/e2e/test_readme.py)
    module = ROOT / "tests" / "fixtures" / "gradnorm_probe" / "tangentlens_gradnorm.py"
    assert block == module.read_text(encoding="utf-8")


def test_make_row_rows_of_the_example_pass_its_own_check():
    probe = resolve("grad_norm")

    @dataclass(frozen=True)
    class Label:
        suite: str = "s"
        step: int = 0
        tokens_seen: int | None = None
        layers: dict | None = None

    label = Label(layers={"blocks.0.hook_resid_post": 0})
    row = make_row(label, "grad_norm", "gradient_rms", 2.0, site="blocks.0.hook_resid_post")
    probe.check_rows([row], "here")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "proxies.rank=64",  # the unit would fail drawing the complement controls
            "suite 'mini-pythia' (d_model = 128): proxies.rank = 64 is out of range: "
            "tangent_energy's complement controls are k-frames outside the proxy and m̂, of "
            "dimension d − k − 1 (k ≤ ⌊(d − 1)/2⌋ = 63 at d = 128); allowed: 1 … 63",
        ),
        (
            "probes.tangent_energy.data_matched_m=32",
            "probes.tangent_energy.data_matched_m = 32 is out of range: the data-matched "
            "controls are k-frames in a top-m PCA span (m < d = 128) outside the proxy and m̂ "
            "(m − k − 1 ≥ k: m ≥ 33 at proxies.rank = 16); allowed: 33 … 127",
        ),
        (
            "probes.tangent_energy.data_matched_m=128",  # PCA's rank is below the width
            "probes.tangent_energy.data_matched_m = 128 is out of range",
        ),
        ('capture.layers="0,4"', "capture.layers names block(s) [4], but the model has 4 blocks"),
    ],
)
def test_what_the_models_shape_rules_out_is_refused_at_planning(override, message):
    """Checked from the suite's shape alone (no checkpoint opened, no unit run), by recipe key
    with the range the unit allows: the widest rank and data-matched span plan."""
    from tangentlens.core.recipe import load_recipe
    from tangentlens.sweep.runner import plan_sweep

    plan_sweep(load_recipe("quickstart", ["proxies.rank=63"]))  # the widest
    plan_sweep(load_recipe("quickstart", ["probes.tangent_energy.data_matched_m=33"]))
    plan_sweep(load_recipe("quickstart", ["probes.tangent_energy.data_matched_m=127"]))
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_sweep(load_recipe("quickstart", [override]))


def test_the_rank_bound_follows_what_the_probes_draw():
    """Without tangent_energy's complement controls the exchangeable ones bound the rank
    (k ≤ d − 1); without m̂ projected out, k ≤ d (and the dictionaries' d − 1)."""
    from tangentlens.core.recipe import load_recipe
    from tangentlens.sweep.runner import plan_sweep

    alone = ["probes.tangent_energy=false", "probes.anisotropy_share=true"]
    plan_sweep(load_recipe("quickstart", [*alone, "proxies.rank=127"]))
    with pytest.raises(ValueError, match=re.escape("proxies.rank = 128 is out of range: a dict")):
        plan_sweep(load_recipe("quickstart", [*alone, "proxies.rank=128"]))
    plain = load_recipe("quickstart", ["proxies.mean_direction=false", "proxies.rank=64"])
    plan_sweep(plain)  # complement room d − k ≥ k
    with pytest.raises(ValueError, match=re.escape("(k ≤ ⌊(d − 0)/2⌋ = 64 at d = 128)")):
        plan_sweep(load_recipe("quickstart", ["proxies.mean_direction=false", "proxies.rank=65"]))


def test_the_reporting_example_declares_what_the_report_draws():
    namespace: dict = {}
    exec(blocks(page("your-probe"))[1], namespace)
    probe = namespace["REPORTED"]
    assert [(t.metric, t.title) for t in probe.tables] == [("gradient_rms", "gradient RMS ‖g‖")]
    assert [f.file for f in probe.figures] == ["grad_norm.png"]
    assert [(m.name, m.path) for m in probe.reporting.must_match] == [
        ("per bin", "probes.grad_norm.per_bin")
    ]
