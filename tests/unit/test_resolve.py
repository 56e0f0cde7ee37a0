"""A recipe resolved once (``tangentlens.core.resolve``): the suite's facts parsed once, one
capture request read by the capture and the memory plan, the memory plans a unit picks its
passes from without planning again, the estimator notes, each refusal written once — each
decision tested at its boundary."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tangentlens.capture.needs import Needs
from tangentlens.capture.request import CaptureRequest
from tangentlens.core import memory
from tangentlens.core.estimators import estimator_notes
from tangentlens.core.recipe import load_recipe
from tangentlens.core.resolve import RunPlan, refuse_attention, refuse_no_loss, resolve
from tangentlens.models import catalog
from tangentlens.models.facts import suite_facts
from tangentlens.models.shapes import PYTHIA_CONFIGS
from tangentlens.probes.tangent_energy import PROBE as ENERGY
from tangentlens.probes.tangent_energy import TangentEnergyConfig


def test_the_suite_string_is_parsed_once_per_resolve(monkeypatch):
    """Before: about 13 parses per sweep (loader, shape, steps, headless, manifest, memory)."""
    calls = []
    real = catalog.parse_suite_spec

    def counting(spec):
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr("tangentlens.models.facts.parse_suite_spec", counting)
    run = resolve(load_recipe("quickstart"))
    assert calls == ["mini-pythia"]
    assert (run.suite.kind, run.suite.family, run.suite.loader) == ("mini", "decoder", "hooked")
    assert (run.suite.n_layers, run.suite.d_model) == (4, 128)
    assert run.steps == (0, 2, 8, 16, 64, 200, 400, 1200)
    assert run.window == (0, 8, 16, 32, 64, 100, 200, 300)
    assert resolve(load_recipe("quickstart", ["proxies.window_checkpoints=1"])).window == (300,)


def test_the_facts_of_each_kind_of_suite(tmp_path):
    pythia = suite_facts("EleutherAI/pythia-160m")
    assert (pythia.kind, pythia.loader, pythia.tokenizer) == ("pythia", "hooked", "main")
    assert pythia.revisions[:2] == ("step0", "step1") and len(pythia.revisions) == 154
    assert pythia.d_model == 768 and pythia.attention is None and pythia.no_loss is None
    encoder = suite_facts("EuroBERT/EuroBERT-210m")
    assert (encoder.kind, encoder.family, encoder.loader) == ("hub", "encoder", "hf")
    assert "loader 'hf'" in encoder.attention  # no per-head statistics through it
    folder = tmp_path / "suite"
    for step, architecture in ((0, "GPTNeoXForCausalLM"), (10, "GPTNeoXForCausalLM")):
        (folder / f"step{step}").mkdir(parents=True)
        config = {**PYTHIA_CONFIGS["EleutherAI/pythia-70m"], "architectures": [architecture]}
        config["model_type"] = "gpt_neox"
        (folder / f"step{step}" / "config.json").write_text(json.dumps(config))
    local = suite_facts(f"local:{folder}")
    assert (local.kind, local.steps, local.revisions) == ("local", (0, 10), ("step0", "step10"))
    assert local.tokenizer == str(folder / "step10") and local.model_name == "suite"
    assert local.d_model == 512 and local.headless == () and local.no_loss is None
    gqa = json.loads((folder / "step10" / "config.json").read_text())
    gqa.update(architectures=["BertModel"], model_type="bert")
    (folder / "step10" / "config.json").write_text(json.dumps(gqa))
    headless = suite_facts(f"local:{folder}")
    assert headless.headless == ("BertModel",)
    assert headless.no_loss == (
        f"suite 'local:{folder}' has no language-modelling head (architectures ['BertModel'])"
    )


def test_each_refusal_is_one_line_naming_the_probes_and_why():
    needs = {"qk_drift": Needs(attention=True), "cosine_drift": Needs()}
    refuse_attention(needs, None)  # nothing to refuse
    refuse_attention({"cosine_drift": Needs()}, "no heads")
    with pytest.raises(ValueError) as error:
        refuse_attention(needs, "the model has no heads")
    assert str(error.value) == (
        "probe(s) qk_drift cannot run: the model has no heads; drop them from the recipe"
    )
    refuse_no_loss({"energy": Needs(gradients=True)}, None)
    with pytest.raises(ValueError) as error:
        refuse_no_loss({"energy": Needs(gradients=True), "c": Needs()}, "no loss was chosen")
    assert str(error.value).startswith(
        "probe(s) energy cannot run: no loss was chosen (they need gradients of a loss); "
        "activation-only probes can: cosine_drift, frequency_geometry, qk_drift, "
        "shape_of_learning, untrained_block"
    )


def test_a_suites_refusals_are_read_from_its_facts():
    gqa = "suite 'smollm2-360m' uses grouped-query attention \\(15 query heads, 5 key/value"
    with pytest.raises(ValueError, match=rf"^probe\(s\) qk_drift cannot run: {gqa}"):
        resolve(load_recipe("quickstart", ["suite.name='smollm2-360m'", "proxies.rank=8"]))
    with pytest.raises(ValueError, match=r"capture.layers names block\(s\) \[9\]"):
        resolve(load_recipe("quickstart", ["capture.layers='0,9'"]))


def test_the_capture_request_keeps_what_the_probes_need():
    run = resolve(load_recipe("quickstart"))
    request = run.capture
    assert request.needs == Needs(
        gradients=True,
        bins=True,
        bin_moments=True,
        type_sums=True,
        reservoir=True,
        attention=True,
        sequence_sums=True,  # tangent_energy draws intervals, and the proxies are frozen early
    )
    assert (request.n_bins, request.reservoir, request.seed) == (5, 4096, 0)
    assert request.sequence_sums and request.type_limit > 0
    assert run.window_capture == CaptureRequest(Needs(reservoir=True), reservoir=4096)
    # the proxies fitted per checkpoint: no sums (they are not known before the capture)
    fitted = resolve(load_recipe("quickstart", ["proxies.fit_policy='per_checkpoint'"]))
    assert fitted.capture.needs.sequence_sums and not fitted.capture.sequence_sums
    # no bootstrap: tangent_energy asks for no sums
    bare = resolve(load_recipe("quickstart", ["probes.tangent_energy.bootstrap=0"]))
    assert not bare.capture.sequence_sums
    assert not bare.needs["tangent_energy"].sequence_sums
    # a probe keeping its replicates
    kept = resolve(load_recipe("quickstart", ["probes.tangent_energy.keep_replicates=true"]))
    assert kept.replicates("tangent_energy") and not kept.replicates("cosine_drift")
    assert not run.replicates("tangent_energy")


def test_tangent_energys_needs_follow_its_config():
    assert ENERGY.needs_for(TangentEnergyConfig()).sequence_sums
    assert not ENERGY.needs_for(TangentEnergyConfig(bootstrap=0)).sequence_sums
    assert ENERGY.needs_for(TangentEnergyConfig(keep_replicates=True)).replicates
    assert not ENERGY.needs_for(None).replicates  # the defaults


def test_the_request_builds_the_statistics_as_it_says():
    request = CaptureRequest(
        Needs(gradients=True, bins=True, bin_moments=True, type_sums=True, reservoir=True),
        n_bins=3,
        reservoir=64,
        seed=7,
    )
    config = request.statistics(
        vocab_size=50, type_ids=(1, 2), sequence_energy=None, precision="float64"
    )
    assert (config.gradients, config.n_bins, config.gradient_bin_moments) == (True, 3, True)
    assert (config.type_sums, config.vocab_size, config.type_ids) == (True, 50, (1, 2))
    assert (config.reservoir_size, config.seed, config.precision) == (64, 7, "float64")
    rows = CaptureRequest(Needs(reservoir=True), reservoir=64)
    config = rows.statistics(
        vocab_size=50, type_ids=(1, 2), sequence_energy=None, precision="float32"
    )
    assert (config.gradients, config.n_bins, config.type_sums, config.vocab_size) == (
        False,
        0,
        False,
        None,
    )
    with pytest.raises(ValueError, match="sequence_energy projectors are given exactly when"):
        CaptureRequest(Needs(gradients=True), sequence_sums=True).statistics(
            vocab_size=None, type_ids=None, sequence_energy=None, precision="float64"
        )
    with pytest.raises(ValueError, match="n_bins = 3 but the needs keep no bins"):
        CaptureRequest(Needs(), n_bins=3)
    with pytest.raises(ValueError, match="sequence_sums sum gradients"):
        CaptureRequest(Needs(reservoir=True), sequence_sums=True)


def test_the_requests_kept_needs_leave_out_what_it_serves_where_it_can():
    needs = Needs(gradients=True, bins=True, reservoir=True, sequence_sums=True, replicates=True)
    kept = CaptureRequest(needs, n_bins=2, reservoir=0).kept
    assert kept == Needs(gradients=True, bins=True)  # no rows at reservoir 0
    # a capture without the served requests still serves a probe that asks for them
    assert kept.missing(Needs(gradients=True, sequence_sums=True, replicates=True)) == []
    assert kept.missing(Needs(attention=True)) == ["attention"]
    with pytest.raises(ValueError, match="sequence_sums are sums of gradients"):
        Needs(sequence_sums=True)


def test_the_memory_plan_is_read_from_the_plans_without_planning_again(monkeypatch):
    """``capture.passes = 0``: the plan holds one memory plan per pass count; a unit picks the
    fewest that fit its budget — at the peak exactly, or a byte below it (one pass more)."""
    run = resolve(load_recipe("pythia_160m", ["capture.passes=0", "suite.device='cuda'"]))
    assert [p.passes for p in run.memory] == list(range(1, len(run.memory_inputs.sites) + 1))
    two = run.memory[1]
    fixed = resolve(load_recipe("pythia_160m", ["suite.device='cuda'"]))

    def no_planning(*args, **kwargs):
        raise AssertionError("planned again")

    monkeypatch.setattr(memory, "memory_plan", no_planning)
    assert run.memory_plan(accelerator=two.accelerator_peak).passes == 2
    assert run.memory_plan(accelerator=two.accelerator_peak - 1).passes == 3
    assert run.memory_plan().passes == 1  # nothing checked: the fewest
    assert [p.passes for p in fixed.memory] == [1]
    assert fixed.memory_plan(accelerator=fixed.memory[0].accelerator_peak).passes == 1


def test_a_plan_that_cannot_fit_is_refused_with_what_would(monkeypatch):
    run = resolve(load_recipe("pythia_160m", ["suite.device='cuda'"]))
    peak = run.memory[0].accelerator_peak
    fits = r"the sweep will not fit: .*\((data.batch_size|capture.passes) = \d+.* fits\)$"
    with pytest.raises(ValueError, match=fits):
        run.memory_plan(accelerator=peak // 2)
    two = resolve(load_recipe("pythia_160m", ["capture.passes=0", "suite.device='cuda'"]))
    fewest = r"reduce capture\.reservoir \(capture\.passes = 2 fits\)$"
    with pytest.raises(ValueError, match=fewest):  # two passes fit, one does not
        run.memory_plan(accelerator=two.memory[1].accelerator_peak)


def test_the_memory_plan_reads_the_capture_request():
    """What the capture keeps is what the plan counts: the request's bins, rows and sums."""
    run = resolve(load_recipe("quickstart"))
    inputs = run.memory_inputs
    assert (inputs.bins, inputs.reservoir, inputs.gradients) == (5, 4096, True)
    assert inputs.energy_methods == 3 and inputs.energy_drift  # seminmf, pca, m̂
    assert inputs.n_types == min(run.suite.shape.d_vocab, run.capture.type_limit) == 4096
    bare = resolve(load_recipe("quickstart", ["probes.tangent_energy.bootstrap=0"]))
    assert bare.memory_inputs.energy_methods == 0 and not bare.memory_inputs.energy_drift
    assert bare.memory[0].host_peak < run.memory[0].host_peak


def test_the_estimator_notes_are_the_cores_and_the_probes():
    frozen = estimator_notes(load_recipe("quickstart"))
    assert frozen["energy_interval"].startswith(
        "studentized bootstrap over all_sequences: every analysed sequence"
    )
    fitted = estimator_notes(load_recipe("quickstart", ["proxies.fit_policy='per_checkpoint'"]))
    assert fitted["energy_interval"].startswith("studentized bootstrap over reservoir_sample")
    bare = estimator_notes(load_recipe("quickstart", ["probes.tangent_energy.bootstrap=0"]))
    assert "energy_interval" not in bare  # a note that says None is not recorded
    geometry = estimator_notes(load_recipe("razzhigaev2023"))
    assert "energy_interval" not in geometry and "energy_ratio" in geometry  # a fixed note


def test_the_resolved_recipe_is_plain_json(tmp_path):
    run = resolve(load_recipe("quickstart"))
    saved = json.loads(json.dumps(run.to_dict()))
    assert list(saved) == [
        "recipe", "suite", "steps", "window", "capture", "window_capture", "needs", "estimators",
        "memory",
    ]  # fmt: skip
    assert saved["recipe"] == json.loads(json.dumps(run.recipe.to_dict()))
    assert saved["steps"] == list(run.steps)
    assert saved["suite"]["loader"] == "hooked" and saved["window"] == list(run.window)
    assert saved["window_capture"] == json.loads(json.dumps(dataclasses.asdict(run.window_capture)))
    assert saved["window_capture"]["needs"]["gradients"] is False  # forward only
    assert saved["capture"]["needs"]["sequence_sums"] is True
    assert saved["needs"]["tangent_energy"]["bins"] is True
    assert saved["memory"][0]["passes"] == 1
    assert saved["estimators"] == dict(run.estimators)


def test_a_run_plan_is_frozen():
    run = resolve(load_recipe("quickstart"))
    assert isinstance(run, RunPlan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.steps = ()  # type: ignore[misc]


def test_measure_resolves_through_the_same_function(monkeypatch):
    """No second recipe: ``measure`` and ``capture_model`` resolve theirs as a sweep does."""
    import tangentlens.notebook as notebook

    assert notebook.resolve is resolve
    assert Path(notebook.__file__).read_text(encoding="utf-8").count("Recipe(") == 1


def test_the_refusals_name_every_probe_they_refuse():
    needs = {"a": Needs(gradients=True, attention=True), "b": Needs(gradients=True, attention=True)}
    with pytest.raises(ValueError, match=r"^probe\(s\) a, b cannot run: no heads; drop them"):
        refuse_attention(needs, "no heads")
    with pytest.raises(ValueError, match=r"^probe\(s\) a, b cannot run: no loss \(they need"):
        refuse_no_loss(needs, "no loss")


def test_resolve_reads_the_refusals_and_the_shape_from_the_facts_it_is_given():
    """A suite's facts (what ``measure`` passes for a model in memory): its missing loss
    refuses the gradient probes, its missing shape gives no memory plan, saying why."""
    facts = resolve(load_recipe("quickstart")).suite
    with pytest.raises(ValueError, match=r"^probe\(s\) tangent_energy.* cannot run: headless"):
        resolve(load_recipe("quickstart"), dataclasses.replace(facts, no_loss="headless"))
    unknown = dataclasses.replace(
        facts, shape=None, n_layers=None, d_model=None, unknown_shape="a model in memory"
    )
    run = resolve(load_recipe("quickstart"), unknown)
    assert run.memory == () and run.memory_inputs is None
    with pytest.raises(ValueError, match=r"^no memory plan: a model in memory$"):
        run.memory_plan()


def test_the_memory_plan_checks_the_host_budget():
    run = resolve(load_recipe("quickstart"))
    host = run.memory[0].host_peak
    assert run.memory_plan(host=host).passes == 1
    with pytest.raises(ValueError, match="the sweep will not fit"):
        run.memory_plan(host=host - 1)


def test_the_request_counts_the_probes_types_and_carries_the_capture_seed():
    recipe = load_recipe("quickstart", ["capture.seed=7"])
    run = resolve(recipe)
    tracked = [
        e.probe.max_tracked_types(e.config, recipe.data.max_tokens)
        for e in recipe.probes.values()
        if e.probe.max_tracked_types is not None
    ]
    assert tracked and run.capture.type_limit == sum(tracked)
    assert run.capture.seed == run.window_capture.seed == 7


def test_a_width_refusal_names_a_model_in_memory_as_the_model():
    recipe = load_recipe("quickstart", ["proxies.rank=200"])
    facts = resolve(load_recipe("quickstart")).suite
    with pytest.raises(ValueError, match=r"^suite 'mini-pythia' \(d_model = 128\): proxies"):
        resolve(recipe)
    with pytest.raises(ValueError, match=r"^the model \(d_model = 128\): proxies\.rank = 200"):
        resolve(recipe, dataclasses.replace(facts, kind="model"))


def test_the_plan_inputs_read_the_sites_and_the_stages_control_frames():
    from tangentlens.core.memory import control_draw_columns

    run = resolve(load_recipe("quickstart"))
    inputs, stage = run.memory_inputs, run.recipe.proxies
    assert inputs.sites[:2] == (("embed", None), ("resid_post", 0))
    assert (inputs.draws, inputs.draw_columns) == (stage.draws, 67)
    assert inputs.draw_columns == control_draw_columns(stage.rank, True, len(stage.methods))
    assert control_draw_columns(stage.rank, False, len(stage.methods)) == 64  # m̂ counts
    geometry = resolve(load_recipe("razzhigaev2023")).memory_inputs  # no proxies stage
    assert (geometry.draws, geometry.draw_columns, geometry.energy_methods) == (0, 0, 0)


def test_the_plan_inputs_read_the_device_the_loss_the_types_and_the_rows():
    cuda = resolve(load_recipe("pythia_160m", ["suite.device='cuda:1'", "capture.passes=0"]))
    assert cuda.memory_inputs.device == "cuda"
    assert ", 2 capture passes)" in cuda.memory[1].summary()
    assert "capture passes" not in cuda.memory[0].summary()  # one pass goes unsaid
    geometry = resolve(load_recipe("razzhigaev2023")).memory_inputs  # activations only
    assert not geometry.gradients and geometry.shape.has_head
    assert resolve(load_recipe("quickstart")).memory_inputs.n_types == 4096
    odd = resolve(load_recipe("quickstart", ["data.max_tokens=1000", "data.seq_len=128"]))
    assert odd.memory_inputs.n_sequences == 7 and isinstance(odd.memory_inputs.n_sequences, int)


def test_the_largest_batch_that_fits_the_host_is_named():
    small = resolve(load_recipe("quickstart", ["data.batch_size=2"])).memory[0].host_peak
    with pytest.raises(ValueError, match=r"\(data\.batch_size = 2 fits\)$"):
        resolve(load_recipe("quickstart")).memory_plan(host=small)  # batch 16 on the CPU


def test_the_capture_keeps_sampled_rows_for_a_proxies_stage_alone():
    """godey2024's probes need no sampled rows; a proxies stage added to it does."""
    plain = resolve(load_recipe("godey2024", ["capture.reservoir=64"]))
    assert plain.recipe.proxies is None and plain.capture.reservoir == 0
    staged = resolve(load_recipe("godey2024", ["proxies.rank=8", "capture.reservoir=64"]))
    assert staged.capture.reservoir == 64
