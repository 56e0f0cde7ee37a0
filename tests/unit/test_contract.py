"""What a probe's declaration accepts and refuses, at each rule's edge
(:mod:`tangentlens.contract`), and the registry's order and refusals
(:mod:`tangentlens.registry`)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from tangentlens.capture.needs import Needs
from tangentlens.checks import Bound
from tangentlens.contract import MODEL_FREE_STEP, SCOPES, STATE_KEYS, ModelFreeInputs, Probe
from tangentlens.registry import builtin_probes, resolve
from tangentlens.reporting import Figure, Reporting, Table
from tests.unit.test_registry import _module


@dataclass(frozen=True)
class Settings:
    scale: float = 1.0


@dataclass(frozen=True)
class Tabled:
    scale: float = 1.0

    def to_table(self) -> dict[str, Any]:
        return {"scale": self.scale}


def _rows(inputs, config):
    return []


def _across(inputs, config):
    return []


def _probe(**changes: Any) -> Probe:
    fields = {
        "name": "mine",
        "config": Settings,
        "scope": "step",
        "metrics": {"my_metric": "a definition"},
        "rows": _rows,
    }
    return Probe(**{**fields, **changes})


def _refusal(**changes: Any) -> str:
    with pytest.raises(ValueError) as error:
        _probe(**changes)
    return str(error.value)


def test_the_scopes_and_shared_keys_are_the_documented_ones():
    assert list(SCOPES) == ["step", "tangent", "across", "model_free"]
    assert STATE_KEYS == ("step", "layers", "tokens_seen", "proxies")
    assert MODEL_FREE_STEP == -1 and ModelFreeInputs("s").step == -1


@pytest.mark.parametrize("name", ["a", "a1", "my_probe_2", "x_"])
def test_snake_case_names_are_accepted(name):
    assert _probe(name=name).name == name


@pytest.mark.parametrize("name", ["", "1a", "_a", "a-b", "aB", "a b", "class", "lambda", 3, None])
def test_other_names_and_keywords_are_refused(name):
    assert _refusal(name=name) == f"a probe's name must be snake_case (a-z, 0-9, _), got {name!r}"


def test_a_name_or_metric_ending_in_a_newline_is_refused():
    """``$`` matches before a final newline: the whole name must be snake_case."""
    assert "must be snake_case" in _refusal(name="mine\n")
    assert "metrics must map each snake_case" in _refusal(metrics={"my_metric\n": "x"})


def test_each_scope_with_its_function_is_accepted():
    assert _probe(scope="step").per_step
    assert _probe(scope="tangent").per_step
    assert _probe(scope="tangent", refits=True).refits
    tangent_across = _probe(scope="tangent", rows=None, across=_across)
    assert not tangent_across.per_step  # a tangent probe with across rows only
    assert not _probe(scope="across", rows=None, across=_across).per_step
    assert not _probe(scope="model_free").per_step
    assert _probe(scope="across", rows=None, across=_across, state=_rows).state is _rows


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scope": "tangent", "rows": None}, "a 'tangent' probe needs a callable rows or across"),
        ({"scope": "model_free", "rows": None}, "a 'model_free' probe needs a callable rows"),
        ({"scope": "step", "rows": 3}, "a 'step' probe needs a callable rows"),
        ({"scope": "model_free", "across": _across}, "a 'model_free' probe has no across rows"),
        ({"scope": "model_free", "state": _rows}, "a 'model_free' probe has no across rows"),
        ({"scope": "across", "rows": None, "across": _across, "refits": True}, "only a 'tangent'"),
        ({"tracked_types": _rows}, "a probe needing type sums names its types"),
        ({"max_tracked_types": _rows}, "a probe needing type sums names its types"),
        (
            {"needs": Needs(type_sums=True), "tracked_types": _rows},
            "a probe needing type sums names its types",
        ),
        ({"metrics": {"ok": " "}}, "metrics must map each snake_case metric name"),
        ({"metrics": {"ok": 3}}, "metrics must map each snake_case metric name"),
        ({"metrics": {3: "x"}}, "metrics must map each snake_case metric name"),
        ({"metrics": {"ok": "x", "Not": "y"}}, "metrics must map each snake_case metric name"),
        ({"reporting": None}, "reporting must be a tangentlens Reporting"),
        ({"config": Settings()}, "config must be a dataclass type, got Settings(scale=1.0)"),
    ],
)
def test_each_rule_refuses_at_its_edge(changes, message):
    refusal = _refusal(**changes)
    assert message in refusal
    if "name must be" not in message:
        assert refusal.startswith("probe 'mine': ")


@pytest.mark.parametrize(
    ("changes", "needed"),
    [
        (
            {"scope": "step", "rows": None, "across": _across},
            "a 'step' probe needs a callable rows",
        ),
        ({"scope": "across"}, "an 'across' probe needs a callable across"),
        (
            {"scope": "model_free", "rows": None, "across": _across},
            "a 'model_free' probe needs a callable rows",
        ),
    ],
)
def test_the_other_scopes_function_does_not_stand_in(changes, needed):
    """A probe of one scope with only another scope's function is refused for the one it lacks."""
    assert _refusal(**changes) == f"probe 'mine': {needed}"


def test_the_scope_refusal_names_every_scope():
    assert _refusal(scope="Step") == (
        "probe 'mine': scope must be one of ['step', 'tangent', 'across', 'model_free'], got 'Step'"
    )


def test_type_sums_need_both_type_functions_and_the_needs_to_say_so():
    """The one refusal, word for word, whether the probe's declaration or its needs function
    disagrees with its named types."""
    probe = _probe(
        needs=Needs(type_sums=True), tracked_types=_rows, max_tracked_types=lambda c, n: 1
    )
    assert probe.needs_for(None).type_sums
    rule = (
        "probe 'mine': a probe needing type sums names its types (tracked_types and "
        "max_tracked_types), and only such a probe does"
    )
    assert _refusal(tracked_types=_rows) == rule
    assert _refusal(tracked_types=_rows, max_tracked_types=_rows) == rule
    asks = _probe(needs=lambda config: Needs(type_sums=True))
    with pytest.raises(ValueError) as error:
        asks.needs_for(None)
    assert str(error.value) == rule


def test_may_differ_names_keys_of_the_config_unless_it_gives_its_own_table():
    assert _probe(reporting=Reporting(may_differ=("scale",))).reporting.may_differ == ("scale",)
    assert _refusal(reporting=Reporting(may_differ=("scale", "seed"))) == (
        "probe 'mine': may_differ names ['seed'], not keys of its config ['scale']"
    )
    tabled = _probe(config=Tabled, reporting=Reporting(may_differ=("seed",)))
    assert tabled.reporting.may_differ == ("seed",)


def test_figures_and_log_scale_name_declared_metrics():
    figure = Figure("mine.png", "other", "label", "Other")
    assert _refusal(reporting=Reporting(figures=(figure,))) == (
        "probe 'mine': figure 'Other' shows 'other', not one of its metrics ['my_metric']"
    )
    assert _refusal(reporting=Reporting(log_scale=("my_metric", "other"))) == (
        "probe 'mine': log_scale names ['other'], not among its metrics ['my_metric']"
    )
    good = Reporting(
        tables=(Table("my_metric", "T"),),
        figures=(Figure("mine.png", "my_metric", "label", "F"),),
        log_scale=("my_metric",),
    )
    probe = _probe(reporting=good)
    assert probe.tables == good.tables and probe.figures == good.figures


def test_a_recipe_check_and_width_bounds_are_the_probes_own():
    seen: list[tuple[Any, Any]] = []
    bound = Bound("probes.mine.scale", 1.0, 0, 4, "(k ≤ d)")

    def recipe_check(config, recipe):
        seen.append((config, recipe))

    def width_bounds(config, recipe, d):
        return iter([bound] * d)

    plain = _probe()
    assert plain.check_recipe(Settings(), "recipe") is None and plain.bounds(Settings(), 0, 8) == []
    probe = _probe(recipe_check=recipe_check, width_bounds=width_bounds)
    probe.check_recipe(Settings(2.0), "recipe")
    assert seen == [(Settings(2.0), "recipe")]
    assert probe.bounds(Settings(), "recipe", 2) == [bound, bound]


def test_the_module_is_the_rows_then_the_across_then_the_configs():
    def rows(inputs, config):
        return []

    rows.__module__ = "pkg.rows"
    across = _across
    assert _probe(rows=rows).module == "pkg.rows"
    assert _probe(scope="across", rows=None, across=across).module == __name__
    assert _probe(scope="tangent", rows=rows, across=across).module == "pkg.rows"


def test_a_state_is_a_dict_of_string_keys_outside_the_shared_ones():
    probe = _probe(scope="across", rows=None, across=_across)
    for bad in ([("a", 1)], {1: "x"}, None):
        with pytest.raises(ValueError) as error:
            probe.check_state(bad)
        assert str(error.value) == (
            f"probe 'mine' ({__name__}): state must return a dict with string keys, got "
            f"{type(bad).__name__}"
        )
    with pytest.raises(ValueError) as error:
        probe.check_state({"tokens_seen": 0, "step": 1, "proxies": 4, "layers": 2, "mine": 3})
    assert str(error.value) == (
        f"probe 'mine' ({__name__}): its state uses the keys ['layers', 'proxies', 'step', "
        "'tokens_seen'], which every transition already holds (step, layers, tokens_seen, "
        "proxies): rename them"
    )
    assert probe.check_state({}) == {}


def test_model_free_rows_need_the_scope_and_the_rows():
    from tangentlens.results import row

    probe = _probe(
        scope="model_free", rows=lambda i, c: [row(i.suite, 5, None, "mine", "my_metric", 1.0)]
    )
    (only,) = probe.model_free_rows(ModelFreeInputs("s"), Settings(), "here")
    assert only["step"] == MODEL_FREE_STEP
    tangent = _probe(scope="tangent", rows=None, across=_across)
    with pytest.raises(ValueError, match=re.escape("probe 'mine' (tangent) has no model-free")):
        tangent.model_free_rows(ModelFreeInputs("s"), Settings(), "here")
    with pytest.raises(ValueError, match=re.escape("probe 'mine' (step) has no model-free")):
        _probe().model_free_rows(ModelFreeInputs("s"), Settings(), "here")


def test_model_free_rows_are_checked_under_the_callers_name():
    """A row naming a metric the probe did not declare is refused, the message starting with
    where the rows were asked for."""
    from tangentlens.results import row

    probe = _probe(
        scope="model_free", rows=lambda i, c: [row(i.suite, 5, None, "mine", "other", 1.0)]
    )
    with pytest.raises(ValueError) as error:
        probe.model_free_rows(ModelFreeInputs("s"), Settings(), "unit model-free-mine")
    assert str(error.value).startswith("unit model-free-mine: probe 'mine' (")
    assert "metric 'other'; it declares the metrics ['my_metric']" in str(error.value)


# ---------------------------------------------------------------------------- the registry


def test_the_builtin_catalogue_is_in_module_order():
    names = list(builtin_probes())
    modules = [builtin_probes()[n].module.rsplit(".", 1)[1] for n in names]
    assert modules == sorted(modules) and len(names) > 3


#: A probe module's preamble (its config and rows function); a test appends its probes.
PROBE_MODULE = """
        from dataclasses import dataclass
        from tangentlens.registry import Probe

        @dataclass(frozen=True)
        class Config:
            pass

        def _rows(inputs, config):
            return []
"""


def test_a_missing_attribute_is_refused_offering_the_modules_public_probes(tmp_path, monkeypatch):
    source = (
        PROBE_MODULE
        + """
        GRAD = Probe(name="grad", config=Config, scope="step", metrics={"x": "a"}, rows=_rows)
        _HIDDEN = GRAD
    """
    )
    name = _module(tmp_path, monkeypatch, "probe_attr_edges", source)
    with pytest.raises(ValueError) as error:
        resolve(f"{name}:GRAF")
    assert str(error.value) == (
        f"probe '{name}:GRAF': module {name} has no attribute 'GRAF'; its probes: GRAD "
        "(did you mean 'GRAD'?)"
    )
    with pytest.raises(ValueError) as error:
        resolve(f"{name}:")  # no attribute: its PROBE
    assert str(error.value).startswith(f"probe '{name}:': module {name} has no attribute 'PROBE'")
    empty = _module(tmp_path, monkeypatch, "probe_attr_empty", "X = 1\n")
    with pytest.raises(ValueError) as error:
        resolve(f"{empty}:PROBE")
    assert str(error.value) == f"probe '{empty}:PROBE': module {empty} has no attribute 'PROBE'"
    with pytest.raises(ValueError) as error:
        resolve(f"{empty}:X")
    assert str(error.value) == (
        f"probe '{empty}:X': {empty}:X is not a tangentlens.registry.Probe (got int)"
    )


def test_an_import_path_is_cut_at_its_first_colon_and_lists_every_probe(tmp_path, monkeypatch):
    """``module:attribute`` splits at the first colon (the rest is the attribute, refused by
    name); a missing attribute lists every public probe of the module; ``module:`` whose
    ``PROBE`` is no probe is refused by that name."""
    source = (
        PROBE_MODULE
        + """
        ONE = Probe(name="one", config=Config, scope="step", metrics={"x": "a"}, rows=_rows)
        TWO = Probe(name="two", config=Config, scope="step", metrics={"x": "a"}, rows=_rows)
    """
    )
    name = _module(tmp_path, monkeypatch, "probe_two_colons", source)
    with pytest.raises(ValueError) as error:
        resolve(f"{name}:ONE:x")
    assert str(error.value) == (
        f"probe '{name}:ONE:x': module {name} has no attribute 'ONE:x'; its probes: ONE, TWO "
        "(did you mean 'ONE'?)"
    )
    plain = _module(tmp_path, monkeypatch, "probe_plain_probe", "PROBE = 1\n")
    with pytest.raises(ValueError) as error:
        resolve(f"{plain}:")
    assert str(error.value) == (
        f"probe '{plain}:': {plain}:PROBE is not a tangentlens.registry.Probe (got int)"
    )


def test_a_builtin_name_wins_and_an_unknown_one_lists_the_allowed():
    assert resolve("cosine_drift") is builtin_probes()["cosine_drift"]
    with pytest.raises(ValueError) as error:
        resolve("zzzz")
    message = str(error.value)
    allowed = re.search(r"allowed: (\[.*?\]) \(or an import path", message).group(1)
    assert allowed.startswith(str(list(builtin_probes()))[:-1])
    assert message.endswith("(or an import path, 'package.module:PROBE')")


def test_the_catalogue_keeps_probe_values_only_in_module_order(tmp_path, monkeypatch):
    """A module's ``PROBE`` that is no Probe, or none, adds nothing; the order is the modules'
    (not the probes' names)."""
    import types

    import tangentlens

    folder = tmp_path / "fake_probes"
    folder.mkdir()
    declare = (
        "from dataclasses import dataclass\n"
        "from tangentlens.contract import Probe\n"
        "@dataclass(frozen=True)\n"
        "class C:\n"
        "    pass\n"
        "PROBE = Probe(name={name!r}, config=C, scope='step', metrics={{'x': 'a'}},\n"
        "              rows=lambda inputs, config: [])\n"
    )
    (folder / "a_first.py").write_text(declare.format(name="zeta"))
    (folder / "b_second.py").write_text(declare.format(name="alpha"))
    (folder / "c_not_a_probe.py").write_text("PROBE = 'no'\n")
    (folder / "d_none.py").write_text("X = 1\n")
    package = types.ModuleType("tangentlens.probes")
    package.__path__ = [str(folder)]
    for name in ("a_first", "b_second", "c_not_a_probe", "d_none"):
        monkeypatch.delitem(sys.modules, f"tangentlens.probes.{name}", raising=False)
    monkeypatch.setitem(sys.modules, "tangentlens.probes", package)
    monkeypatch.setattr(tangentlens, "probes", package, raising=False)
    found = builtin_probes.__wrapped__()
    assert list(found) == ["zeta", "alpha"]
    for name in ("a_first", "b_second", "c_not_a_probe", "d_none"):
        sys.modules.pop(f"tangentlens.probes.{name}", None)


def test_an_entry_given_as_a_value_is_kept_and_its_needs_follow_its_config():
    from tangentlens.registry import ProbeEntry, entries

    probe = _probe(needs=lambda config: Needs(gradients=config.scale > 1))
    entry = ProbeEntry("my_key", probe, Settings(scale=2.0))
    assert entries({"my_key": entry}) == {"my_key": entry}  # not resolved by its key
    assert entry.needs == Needs(gradients=True)
    assert ProbeEntry("my_key", probe, Settings()).needs == Needs()
