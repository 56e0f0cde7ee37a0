"""check_probe and the reporting declarations: what a researcher's own test of a probe refuses,
each with the message that says what is wrong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tangentlens.capture.needs import Needs
from tangentlens.conformance import check_probe
from tangentlens.contract import MODEL_FREE_STEP
from tangentlens.registry import ModelFreeInputs, Probe
from tangentlens.reporting import Figure, Reporting, Table
from tangentlens.results import row


@dataclass(frozen=True)
class Settings:
    scale: float = 1.0


@dataclass(frozen=True)
class Lossy:
    """A config whose own table forgets its setting."""

    scale: float = 1.0

    def to_table(self) -> dict[str, Any]:
        return {}


def _rows(metric: str):
    def rows(inputs, config):
        return [row(inputs.suite, 0, None, "mine", metric, config.scale)]

    return rows


def _probe(**changes: Any) -> Probe:
    fields = {
        "name": "mine",
        "config": Settings,
        "scope": "model_free",
        "metrics": {"my_metric": "a definition"},
        "rows": _rows("my_metric"),
    }
    return Probe(**{**fields, **changes})


def test_a_conforming_probe_returns_its_checked_rows():
    rows = check_probe(_probe(), Settings(scale=3.0))
    assert [(r["probe"], r["metric"], r["value"]) for r in rows] == [("mine", "my_metric", 3.0)]


def test_the_engine_sets_a_model_free_rows_step():
    """The probe writes step 0 (a checkpoint's step); its rows are given the model-free step,
    so neither the step-0 baseline nor ``compare`` reads them as a checkpoint's."""
    (written,) = _rows("my_metric")(ModelFreeInputs("s"), Settings())
    assert written["step"] == 0
    (row_,) = _probe().model_free_rows(ModelFreeInputs("s"), Settings(), "here")
    assert row_["step"] == MODEL_FREE_STEP == -1
    assert {k: v for k, v in row_.items() if k != "step"} == {
        k: v for k, v in written.items() if k != "step"
    }
    with pytest.raises(ValueError, match="'mine' \\(step\\) has no model-free rows"):
        _probe(scope="step").model_free_rows(ModelFreeInputs("s"), Settings(), "here")


@pytest.mark.parametrize(
    ("changes", "config", "message"),
    [
        ({"rows": _rows("other")}, None, "metric 'other'; it declares the metrics ['my_metric']"),
        ({"config": Lossy}, Lossy(scale=2.0), "does not round-trip through its recipe table"),
        ({}, Lossy(), "config must be a Settings"),
        (
            {
                "reporting": Reporting(
                    tables=(
                        Table("my_metric", "t", in_compare=False, render="no_such_module:draw"),
                    )
                )
            },
            None,
            "renderer 'no_such_module:draw' cannot be loaded",
        ),
    ],
)
def test_check_probe_refuses(changes, config, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        check_probe(_probe(**changes), config)


def test_a_state_may_not_use_the_shared_keys():
    def state(inputs, config):
        return {"proxies": 1, "mine": 2}

    def across(inputs, config):
        return []

    probe = _probe(scope="across", rows=None, across=across, state=state)
    with pytest.raises(ValueError, match=r"its state uses the keys \['proxies'\]"):
        probe.check_state(state(None, None))
    assert probe.check_state({"mine": 2}) == {"mine": 2}


def test_reporting_declarations_name_declared_metrics_and_default_from_them():
    with pytest.raises(ValueError, match="table 'T' shows 'undeclared'"):
        _probe(reporting=Reporting(tables=(Table("undeclared", "T"),)))
    with pytest.raises(ValueError, match="render must be an import path"):
        Table("my_metric", "T", in_compare=False, render="not a path")
    probe = _probe(metrics={"a_metric": "A", "b_metric": "B"}, rows=_rows("a_metric"))
    assert [(t.metric, t.title, t.in_report, t.in_compare) for t in probe.tables] == [
        ("a_metric", "mine: a_metric", True, True),
        ("b_metric", "mine: b_metric", True, True),
    ]
    assert [(f.file, f.metric, f.over) for f in probe.figures] == [
        ("mine.png", "a_metric", "steps"),
        ("mine.png", "b_metric", "steps"),
    ]
    silent = _probe(reporting=Reporting(tables=(), figures=()))
    assert silent.tables == () and silent.figures == ()
    with pytest.raises(ValueError, match=r"a \.png file"):
        Figure("mine.svg", "my_metric", "label", "title")


def test_needs_may_be_a_function_of_the_config_and_are_checked():
    def needs(config):
        return Needs(gradients=config.scale > 1)

    probe = _probe(needs=needs)
    assert probe.needs_for(Settings(scale=2.0)) == Needs(gradients=True)
    assert probe.needs_for(None) == Needs()  # the config's defaults
    with pytest.raises(
        ValueError, match=r"needs\(config\) must return a tangentlens Needs, got dict$"
    ):
        _probe(needs=lambda config: {"gradients": True}).needs_for(None)
    with pytest.raises(ValueError, match="a probe needing type sums names its types"):
        _probe(needs=lambda config: Needs(type_sums=True)).needs_for(None)
    with pytest.raises(ValueError, match="needs must be a tangentlens Needs or a function"):
        _probe(needs=3)
