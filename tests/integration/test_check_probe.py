"""``check_probe(PROBE)``: the probe author passes nothing — the check builds small inputs for
the probe's scope (two checkpoints of a tiny random decoder, captured through the sweep's own
step code, the proxies fitted, the state kept, the transition handed to ``across``), as
scikit-learn's ``check_estimator`` builds its own data. Every built-in probe, the installed
example's and a researcher's probe of each scope pass with their defaults; what the check hands
a probe is what a sweep hands it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tangentlens.capture.needs import Needs
from tangentlens.conformance import check_probe, small_inputs
from tangentlens.contract import MODEL_FREE_STEP, STATE_KEYS
from tangentlens.models.configs import UntrainedBlockConfig
from tangentlens.registry import Probe, builtin_probes, resolve
from tangentlens.results import make_row
from tests.pages import blocks, page

#: Configs smaller than the defaults, where the defaults take long (a model-free probe runs).
SMALL = {
    "untrained_block": UntrainedBlockConfig(
        d_model=16, n_heads=2, d_mlp=32, n_sequences=2, seq_len=8, vocab_size=50
    ),
}


@pytest.mark.parametrize("name", sorted(builtin_probes()))
def test_each_builtin_probe_passes_check_probe_with_nothing_given(name):
    """Rows of the probe only, every metric declared; a per-step probe's at both checkpoints
    (steps 0 and 1), an across probe's at the later one, a model-free probe's at the model-free
    step."""
    probe = builtin_probes()[name]
    rows = check_probe(probe, SMALL.get(name))
    assert rows and {r["probe"] for r in rows} == {name}
    assert {r["metric"] for r in rows} <= set(probe.metrics)
    steps = {r["step"] for r in rows}
    if probe.scope == "model_free":
        assert steps == {MODEL_FREE_STEP}
        assert len(rows) == len(SMALL[name].bias_norms) * len(probe.metrics)
    elif probe.per_step and probe.across is None:
        assert steps == {0, 1}
    elif not probe.per_step:
        assert steps == {1}


def test_the_fixture_package_probes_pass_check_probe():
    """The documented example and the fixture package's probe of each other scope: their rows
    from the inputs check_probe built (the HAAR probe writes step 0: its row is at the
    model-free step)."""
    (grad_norm,) = {r["metric"] for r in check_probe(resolve("grad_norm"))}
    assert grad_norm == "gradient_rms"
    ratios = check_probe(resolve("tangentlens_scopes:GRAD_RATIO"))
    assert ratios and {r["step"] for r in ratios} == {1} and all(r["value"] > 0 for r in ratios)
    shares = check_probe(resolve("tangentlens_scopes:PROXY_SHARE"))
    assert {r["method"] for r in shares} == {"seminmf", "pca", "mean_direction"}
    assert all(0 <= r["value"] <= 1 for r in shares)
    (row,) = check_probe(resolve("tangentlens_scopes:HAAR"))
    assert row["probe"] == "haar_energy" and 0 < row["value"] < 1
    assert row["step"] == MODEL_FREE_STEP


@dataclass(frozen=True)
class NoConfig:
    pass


def _recording(scope: str, seen: list, **fields) -> Probe:
    """A probe of ``scope`` that records what it is handed and writes one row per call."""

    def rows(inputs, config):
        seen.append(inputs)
        capture = getattr(inputs, "capture", None)
        return [make_row(capture, "seen", "calls", 1.0)] if capture is not None else []

    def across(inputs, config):
        seen.append(inputs)
        return []

    return Probe(
        name="seen",
        config=NoConfig,
        scope=scope,
        metrics={"calls": "how often it was called"},
        rows=None if scope == "across" else rows,
        across=across if scope == "across" else None,
        **fields,
    )


def test_a_step_probe_is_handed_each_checkpoints_capture_keeping_what_it_needs():
    seen: list = []
    rows = check_probe(_recording("step", seen, needs=Needs(gradients=True, bins=True)))
    assert [r["step"] for r in rows] == [0, 1]
    assert [inputs.capture.step for inputs in seen] == [0, 1]
    kept = seen[0].capture.kept
    assert kept.gradients and kept.bins and not kept.attention and not kept.type_sums
    assert seen[0].proxies is None  # a step probe scores no proxies


def test_a_tangent_probe_is_handed_the_fitted_proxies_and_the_stage():
    seen: list = []
    check_probe(_recording("tangent", seen, needs=Needs(gradients=True)))
    proxies = seen[0].proxies
    assert set(next(iter(proxies.values()))) == {"seminmf", "pca", "mean_direction"}
    assert seen[0].tangent.rank == 4 and seen[0].tangent.draws == 20


def test_an_across_probe_is_handed_the_transition_with_its_own_state():
    seen: list = []

    def state(inputs, config):
        return {"mine": inputs.capture.step}

    check_probe(_recording("across", seen, state=state))
    (inputs,) = seen
    (transition,) = inputs.transitions
    assert (transition.before["step"], transition.now["step"]) == (0, 1)
    assert (transition.before["mine"], transition.now["mine"]) == (0, 1)
    assert set(transition.now) == {"mine", *STATE_KEYS}
    assert {r["step"] for r in inputs.step_rows} == {0, 1}  # every step's rows


def test_a_state_using_a_shared_key_is_refused_when_the_check_keeps_it():
    def state(inputs, config):
        return {"proxies": 1}

    with pytest.raises(ValueError, match=r"its state uses the keys \['proxies'\]"):
        check_probe(_recording("across", [], state=state))


def test_the_small_inputs_are_those_of_a_sweep_of_two_steps():
    built = small_inputs(
        builtin_probes()["cosine_drift"], builtin_probes()["cosine_drift"].config()
    )
    assert [{r["step"] for r in rows} for rows in built.step_rows] == [{0}, {1}]
    assert {r["probe"] for r in built.step_rows[0]} == {"capture", "cosine_drift"}


def test_the_reporting_example_passes_check_probe():
    """The reporting example of docs/your-probe.md."""
    namespace: dict = {}
    exec(blocks(page("your-probe"))[1], namespace)
    rows = check_probe(namespace["REPORTED"])
    assert rows and {r["metric"] for r in rows} == {"gradient_rms"}
