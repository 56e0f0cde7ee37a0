"""``compare`` differences a metric on the log scale only where its probe declares it
(``Reporting(log_scale=…)``), never because its name ends in ``_ratio``: a researcher's
``*_ratio`` metric is a plain difference unless declared; a declared one is ln B − ln A; a probe
this installation cannot resolve declares nothing."""

from __future__ import annotations

import math
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tangentlens.comparison import compare
from tangentlens.registry import Probe
from tangentlens.reporting import Reporting
from tangentlens.results import row
from tangentlens.sweep.store import RunStore

SOURCE = """
from dataclasses import dataclass
from tangentlens.registry import Probe
from tangentlens.reporting import Reporting

@dataclass(frozen=True)
class Config:
    pass

PROBE = Probe(name="my_probe", config=Config, scope="step",
              metrics={"my_ratio": "a ratio", "my_share": "a share"},
              rows=lambda inputs, config: [], reporting=Reporting(log_scale=LOG))
"""


def _module(tmp_path: Path, monkeypatch, name: str, log: tuple[str, ...]) -> str:
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(SOURCE).replace("LOG", repr(log)), encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return f"{name}:PROBE"


def _run(root: Path, key: str, values: dict[str, float]) -> Path:
    store = RunStore(root)
    store.write_part(
        "step-all",
        [row("s", 100, 1000, "my_probe", metric, v, site="-") for metric, v in values.items()]
        + [row("s", 100, 1000, "tangent_energy", "energy_ratio", values["my_ratio"], site="-")],
    )
    store.write_manifest(
        {
            "recipe": {"probes": {key: {}, "tangent_energy": {}}},
            "finished": True,
            "n_layers": 2,
            "steps": [100],
            "probes": {key: {"name": "my_probe"}},
        }
    )
    return root


def _differences(tmp_path: Path, key: str) -> dict[str, dict[str, Any]]:
    a = _run(tmp_path / "a", key, {"my_ratio": 2.0, "my_share": 0.2})
    b = _run(tmp_path / "b", key, {"my_ratio": 4.0, "my_share": 0.5})
    return {(r["probe"], r["metric"]): r for r in compare([a, b]).to_pylist() if r["difference"]}


def test_a_ratio_named_metric_is_a_plain_difference_unless_declared(tmp_path, monkeypatch):
    key = _module(tmp_path, monkeypatch, "log_scale_none", ())
    found = _differences(tmp_path / "none", key)
    assert found["my_probe", "my_ratio"]["difference"] == "difference"
    assert found["my_probe", "my_ratio"]["value"] == pytest.approx(2.0)
    # the built-in ratio is declared on the log scale
    assert found["tangent_energy", "energy_ratio"]["difference"] == "log_ratio"
    assert found["tangent_energy", "energy_ratio"]["value"] == pytest.approx(math.log(2))


def test_a_declared_metric_is_compared_on_the_log_scale(tmp_path, monkeypatch):
    key = _module(tmp_path, monkeypatch, "log_scale_declared", ("my_share",))
    found = _differences(tmp_path / "declared", key)
    assert found["my_probe", "my_share"]["difference"] == "log_ratio"
    assert found["my_probe", "my_share"]["value"] == pytest.approx(math.log(2.5))
    assert found["my_probe", "my_ratio"]["difference"] == "difference"


def test_an_unresolvable_probe_declares_no_log_scale(tmp_path):
    found = _differences(tmp_path, "nowhere42.probes:PROBE")
    assert found["my_probe", "my_ratio"]["difference"] == "difference"


@dataclass(frozen=True)
class _Config:
    pass


def test_log_scale_names_declared_metrics_only():
    with pytest.raises(ValueError, match=r"log_scale names \['other_ratio'\], not among"):
        Probe(
            name="p",
            config=_Config,
            scope="step",
            metrics={"m": "d"},
            rows=lambda i, c: [],
            reporting=Reporting(log_scale=("other_ratio",)),
        )
