"""The decisions of one checkpoint step (``tangentlens.core.step``), pinned by value on fakes: the
frozen-early bases go to the capture's device before any probe or fit row reads them; the step's
own fit runs beside the probes only for a frozen stage with a refitting probe, and those probes
run last with it; which proxies are scored and which fit diagnostics are reported; the capture's
own rows; who gets the bootstrap replicates; the fixed proxies joining the fit.

The probes, the dictionary fit and the fit rows are fakes that record what they were handed, so
each test reads what the step decided, not what a probe computed from it (the real path runs in
tests/integration/test_device_path.py and test_held_out_fit.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tangentlens.capture.captured import Capture
from tangentlens.core import step as core_step
from tangentlens.core.proxy_stage import ProxiesSpec
from tangentlens.proxies import FittedProxies, FixedProxy
from tangentlens.registry import ProbeEntry

SITE, OTHER = "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"
D = 4
FROZEN_BASIS = torch.eye(D, dtype=torch.float64)[:, :2]
OWN_BASIS = torch.eye(D, dtype=torch.float64)[:, 2:]


class _Probe:
    """A probe that records the inputs it was given, in the order probes ran."""

    def __init__(self, log: list, scope: str, *, refits: bool = False, per_step: bool = True):
        self.log, self.scope, self.refits, self.per_step = log, scope, refits, per_step
        self.checked: list[str] = []

    def rows(self, inputs, config):
        self.log.append((config, inputs))
        return [{"probe": config, "value": 1.0}]

    def check_rows(self, rows, where):
        self.checked.append(where)


def _run(probes: dict[str, _Probe], stage: ProxiesSpec | None, keeps: tuple[str, ...] = ()):
    entries = {key: ProbeEntry(key, probe, key) for key, probe in probes.items()}
    recipe = SimpleNamespace(probes=entries, proxies=stage)
    return SimpleNamespace(recipe=recipe, replicates=lambda key: key in keeps)


def _capture(device: str = "meta") -> Capture:
    statistics = SimpleNamespace(
        device=torch.device(device),
        sites={SITE: "site statistics"},
        mean_loss=2.5,
        n_scored=10,
        n_tokens=12,
        excluded={"pad": 2, "bos": 1},
    )
    return Capture("suite", 7, 700, statistics, {SITE: 0}, seq_len=8)


@pytest.fixture
def fits(monkeypatch):
    """The dictionary fit and the fit rows, faked: ``fits.configs`` the configs fitted with,
    ``fits.rows`` what ``fit_rows`` was handed."""
    record = SimpleNamespace(configs=[], rows=[], sites=[])

    def fit_proxies(site, config):
        record.configs.append(config)
        record.sites.append(site)
        return FittedProxies({"pca": OWN_BASIS}, {"pca": {"pca_explained_variance": 0.5}})

    def fit_rows(capture, proxies, diagnostics):
        record.rows.append((proxies, diagnostics))
        return [{"probe": "proxy_fit"}]

    monkeypatch.setattr(core_step, "fit_proxies", fit_proxies)
    monkeypatch.setattr(core_step, "fit_rows", fit_rows)
    return record


FROZEN_STAGE = ProxiesSpec(methods=("pca",), rank=2, fit_policy="frozen_early", draws=3)
OWN_STAGE = ProxiesSpec(methods=("pca",), rank=2, draws=3)


def test_frozen_bases_are_moved_to_the_captures_device_before_anything_reads_them(fits):
    log: list = []
    run = _run({"energy": _Probe(log, "tangent")}, FROZEN_STAGE)
    frozen = {SITE: {"pca": FROZEN_BASIS}}
    rows, own = core_step.step_rows(run, _capture("meta"), frozen=frozen)
    ((_, inputs),) = log
    for proxies in (inputs.frozen, inputs.proxies, fits.rows[0][0]):
        (basis,) = proxies[SITE].values()
        assert basis.device == torch.device("meta")
        assert basis.dtype == torch.float64 and basis.shape == (D, 2)
    assert inputs.own is None and own is None  # no refitting probe: no own fit at all
    assert fits.configs == [] and fits.rows[0][1] == {}  # no diagnostics of a frozen fit
    assert frozen[SITE]["pca"].device == torch.device("cpu")  # the caller's dict is kept
    assert [r["probe"] for r in rows][-2:] == ["proxy_fit", "energy"]


def test_frozen_bases_already_on_the_device_stay_equal(fits):
    log: list = []
    run = _run({"energy": _Probe(log, "tangent")}, FROZEN_STAGE)
    core_step.step_rows(run, _capture("cpu"), frozen={SITE: {"pca": FROZEN_BASIS}})
    ((_, inputs),) = log
    assert torch.equal(inputs.frozen[SITE]["pca"], FROZEN_BASIS)
    assert inputs.proxies is inputs.frozen and inputs.tangent is FROZEN_STAGE


def test_a_frozen_stage_refits_beside_the_probes_and_the_refitting_ones_run_last(fits):
    log: list = []
    probes = {
        "refitting": _Probe(log, "tangent", refits=True),
        "plain": _Probe(log, "tangent"),
    }
    said: list[str] = []
    rows, own = core_step.step_rows(
        _run(probes, FROZEN_STAGE),
        _capture("cpu"),
        frozen={SITE: {"pca": FROZEN_BASIS}},
        status=said.append,
    )
    assert [config for config, _ in log] == ["plain", "refitting"]
    plain, refitting = (inputs for _, inputs in log)
    assert plain.own is None
    assert torch.equal(refitting.own[SITE]["pca"], OWN_BASIS)
    assert refitting.proxies[SITE]["pca"] is refitting.frozen[SITE]["pca"]
    assert torch.equal(own[SITE]["pca"], OWN_BASIS)
    assert fits.configs == [FROZEN_STAGE.proxy_config()] and fits.sites == ["site statistics"]
    assert "fitting proxies (pca) beside the probes" in said
    assert [r["probe"] for r in rows][-2:] == ["refitting", "plain"]  # the recipe's order


def test_a_frozen_stage_without_a_refitting_probe_does_not_fit(fits):
    log: list = []
    run = _run({"plain": _Probe(log, "tangent")}, FROZEN_STAGE)
    said: list[str] = []
    core_step.step_rows(
        run, _capture("cpu"), frozen={SITE: {"pca": FROZEN_BASIS}}, status=said.append
    )
    assert fits.configs == [] and not any("fitting" in s for s in said)


def test_a_step_without_frozen_bases_scores_its_own_fit_with_its_diagnostics(fits):
    log: list = []
    said: list[str] = []
    run = _run({"refitting": _Probe(log, "tangent", refits=True)}, OWN_STAGE)
    rows, own = core_step.step_rows(run, _capture("cpu"), status=said.append)
    ((_, inputs),) = log
    assert inputs.frozen is None
    assert torch.equal(inputs.proxies[SITE]["pca"], OWN_BASIS)
    assert inputs.own == inputs.proxies
    assert fits.rows[0][1] == {SITE: {"pca": {"pca_explained_variance": 0.5}}}
    assert said[0] == "fitting proxies (pca)"
    assert "beside" not in " ".join(said)
    assert own == {SITE: {"pca": OWN_BASIS}}
    assert [r["probe"] for r in rows][-2:] == ["proxy_fit", "refitting"]


def test_proxies_fitted_elsewhere_are_scored_on_the_scored_statistics_without_a_new_fit(fits):
    log: list = []
    run = _run({"refitting": _Probe(log, "tangent", refits=True)}, OWN_STAGE)
    fitted = {SITE: FittedProxies({"pca": FROZEN_BASIS}, {"pca": {"x": 1.0}})}
    capture = _capture("cpu")
    scored = SimpleNamespace(name="second half")
    _, own = core_step.step_rows(
        run, capture, scored=scored, fitted=fitted, frozen={SITE: {"pca": OWN_BASIS}}
    )
    assert fits.configs == []  # fitted on the first half already: no refit beside
    ((_, inputs),) = log
    assert inputs.scored.statistics is scored and inputs.capture is capture
    assert inputs.own[SITE]["pca"] is FROZEN_BASIS and own[SITE]["pca"] is FROZEN_BASIS


def test_without_the_stage_only_the_capture_and_step_probes_give_rows(fits):
    log: list = []
    probes = {
        "geometry": _Probe(log, "step"),
        "energy": _Probe(log, "tangent"),
        "across": _Probe(log, "step", per_step=False),
    }
    rows, own = core_step.step_rows(_run(probes, None), _capture("cpu"))
    assert [config for config, _ in log] == ["geometry"]
    assert own is None and fits.rows == [] and fits.configs == []
    assert [r["probe"] for r in rows] == ["capture"] * 4 + ["geometry"]
    assert probes["geometry"].checked == ["probe 'geometry' at step 7"]
    assert log[0][1].proxies is None and log[0][1].scored is log[0][1].capture


def test_only_the_probes_that_keep_replicates_are_handed_the_list(fits):
    log: list = []
    probes = {"keeps": _Probe(log, "step"), "drops": _Probe(log, "step")}
    kept: list = []
    core_step.step_rows(_run(probes, None, keeps=("keeps",)), _capture("cpu"), replicates=kept)
    by = {config: inputs for config, inputs in log}
    assert by["keeps"].replicates is kept and by["drops"].replicates is None
    log.clear()
    tangent = {"keeps": _Probe(log, "tangent"), "drops": _Probe(log, "tangent")}
    core_step.step_rows(
        _run(tangent, OWN_STAGE, keeps=("keeps",)), _capture("cpu"), replicates=kept
    )
    by = {config: inputs for config, inputs in log}
    assert by["keeps"].replicates is kept and by["drops"].replicates is None


def test_the_captures_own_rows():
    rows = core_step.capture_rows(_capture("cpu"))
    got = [(r["metric"], r["value"], r["n_tokens"]) for r in rows]
    assert got == [
        ("mean_loss", 2.5, 10),
        ("n_tokens", 12.0, 12),
        ("excluded_bos", 1.0, None),
        ("excluded_pad", 2.0, None),
    ]
    assert {r["probe"] for r in rows} == {"capture"} and rows[0]["step"] == 7


def test_fixed_proxies_join_only_the_sites_that_were_fitted():
    fitted = {SITE: FittedProxies({"pca": OWN_BASIS}, {})}
    fixed = {  # a site that was not fitted first: the next ones still get theirs
        OTHER: {"sae": FixedProxy(FROZEN_BASIS, {})},
        SITE: {"sae": FixedProxy(FROZEN_BASIS, {"sae_l0": 3.0})},
    }
    out = core_step.with_fixed(fitted, fixed)
    assert set(out) == {SITE}
    assert set(out[SITE].bases) == {"pca", "sae"}
    assert out[SITE].diagnostics["sae"] == {"sae_l0": 3.0}
    assert set(fitted[SITE].bases) == {"pca"}  # the input is not changed


def test_fit_step_fits_every_site_with_the_stages_config_and_adds_the_fixed(fits):
    said: list[str] = []
    stats = SimpleNamespace(sites={SITE: "a", OTHER: "b"})
    fixed = {OTHER: {"sae": FixedProxy(FROZEN_BASIS, {})}}
    out = core_step.fit_step(stats, OWN_STAGE, fixed, said.append)
    assert said == ["fitting proxies (pca)"]
    assert fits.sites == ["a", "b"] and fits.configs == [OWN_STAGE.proxy_config()] * 2
    assert set(out[SITE].bases) == {"pca"} and set(out[OTHER].bases) == {"pca", "sae"}
    said.clear()
    core_step.fit_step(stats, ProxiesSpec(methods=("pca", "seminmf")), {}, said.append)
    assert said == ["fitting proxies (pca, seminmf)"]


class _Stats:
    """What a fake capture pass returns: where it was sent (``moved``)."""

    def __init__(self, config, first_sequence, rows):
        self.config, self.first_sequence, self.rows, self.moved = config, first_sequence, rows, []

    def to(self, device):
        self.moved.append(device)
        return self


@pytest.fixture
def passes(monkeypatch):
    """``capture_step`` on a fake model: ``passes.calls`` the statistics each pass was asked
    for, ``passes.requested`` what the request built them with."""
    record = SimpleNamespace(calls=[], requested=[])
    lens = SimpleNamespace(device=torch.device("cpu"), n_layers=3, d_vocab=10)
    monkeypatch.setattr(core_step, "lens_model", lambda model: lens)

    def capture_statistics(model, batches, config, special, statistics, **kw):
        assert model is lens and statistics == "the statistics" and special == "special"
        rows = [b.tolist() for b in batches]
        record.calls.append(_Stats(config, kw["first_sequence"], rows))
        record.calls[-1].bins, record.calls[-1].step = kw["bins"], kw["step"]
        return record.calls[-1]

    monkeypatch.setattr(core_step, "capture_statistics", capture_statistics)
    monkeypatch.setattr(core_step, "combine_site_passes", lambda parts: parts)
    return record


def _capture_run(
    record, *, attention=False, type_sums=False, bins=False, precision="float64", gradients=True
):
    def statistics(**kw):
        record.requested.append(kw)
        return "the statistics"

    kept = SimpleNamespace(type_sums=type_sums, attention=attention, bins=bins)
    request = SimpleNamespace(kept=kept, gradients=gradients, statistics=statistics)
    tracks = SimpleNamespace(tracked_types=lambda config, counts: [config, 7])
    silent = SimpleNamespace(tracked_types=None)
    capture = SimpleNamespace(
        layers="0,2", precision=precision, reduction="sum", seed=5, sites=("resid_post",)
    )
    recipe = SimpleNamespace(
        probes={"a": ProbeEntry("a", tracks, 2), "b": ProbeEntry("b", silent, None)},
        capture=capture,
        data=SimpleNamespace(batch_size=2),
    )
    return SimpleNamespace(recipe=recipe, capture=request)


def _data():
    import numpy as np

    return SimpleNamespace(
        rows=np.arange(5 * 4).reshape(5, 4),
        frequencies=SimpleNamespace(counts=np.zeros(10)),
        loss="next_token",
        special="special",
        bins="the bins",
    )


SITES = {"embed": None, "b.0": 0, "b.1": 1}


def test_one_capture_pass_keeps_its_statistics_where_they_were_made(passes):
    run = _capture_run(passes, attention=True)
    (stats,) = core_step.capture_step("model", SITES, _data(), run, 9)
    assert stats.moved == []  # on the model's device, where the probes compute
    assert stats.config.sites == tuple(SITES) and stats.config.attention_layers == (0, 2)
    assert stats.config.score_loss and stats.config.gradients and stats.config.seed == 5
    assert stats.first_sequence == 0 and stats.step == 9 and len(stats.rows) == 3
    assert stats.bins is None  # the request keeps no bins
    assert passes.requested == [
        {"vocab_size": 10, "type_ids": None, "sequence_energy": None, "precision": "float64"}
    ]
    encoder = _data()
    encoder.loss = "mlm"
    (stats,) = core_step.capture_step("model", SITES, encoder, run, 9)
    assert stats.config.loss == "mlm"  # the data's loss, not the default


def test_several_capture_passes_send_each_pass_to_the_host_and_attention_in_the_first(passes):
    run = _capture_run(passes, attention=True, bins=True)
    parts = core_step.capture_step("model", SITES, _data(), run, 9, passes=2)
    assert [p.config.sites for p in parts] == [("embed", "b.0"), ("b.1",)]
    assert [p.moved for p in parts] == [["cpu"], ["cpu"]]
    assert [p.config.attention_layers for p in parts] == [(0, 2), ()]
    assert {p.bins for p in parts} == {"the bins"}


def test_a_part_of_the_rows_is_captured_from_its_first_sequence(passes):
    run = _capture_run(passes)
    forward = _capture_run(passes, gradients=False).capture  # a request of its own
    (stats,) = core_step.capture_step(
        "model", SITES, _data(), run, 9, part=slice(3, None), score_loss=False, request=forward
    )
    assert not stats.config.gradients and stats.config.loss == "next_token"
    assert stats.first_sequence == 3
    assert stats.rows == [[[12, 13, 14, 15], [16, 17, 18, 19]]]
    assert not stats.config.score_loss and stats.config.attention_layers == ()


def test_type_sums_track_only_the_types_the_probes_read_and_precision_resolves(passes):
    run = _capture_run(passes, type_sums=True, precision="auto")
    core_step.capture_step("model", SITES, _data(), run, 9)
    assert passes.requested[0]["type_ids"] == (2, 7)
    assert passes.requested[0]["precision"] == "float64"  # auto on the CPU
    core_step.capture_step("model", SITES, _data(), run, 9, precision="float32")
    assert passes.requested[1]["precision"] == "float32"
    core_step.capture_step("model", SITES, _data(), run, 9, sequence_energy="the sums")
    assert passes.requested[2]["sequence_energy"] == "the sums"


class _Merging:
    def __init__(self, where):
        self.where, self.merged = where, []

    def merge(self, other):
        self.merged.append(other)


def test_a_held_out_stage_fits_the_first_half_and_scores_the_second(monkeypatch):
    calls, fitted_on, given = [], [], []

    def capture_step(model, sites, data, run, step, **kw):
        calls.append(kw)
        given.append((model, sites, data, run, step))
        return _Merging(kw.get("part"))

    def fit_step(stats, stage, fixed, status):
        fitted_on.append((stats.where, fixed))
        return "fitted"

    monkeypatch.setattr(core_step, "capture_step", capture_step)
    monkeypatch.setattr(core_step, "fit_step", fit_step)
    held = ProxiesSpec(methods=("pca",), held_out=True)
    run = SimpleNamespace(recipe=SimpleNamespace(proxies=held))
    data = SimpleNamespace(rows=list(range(7)))
    stats, scored, fitted = core_step.capture_scored(
        "m", SITES, data, run, 3, passes=2, sequence_energy="sums", precision="float32"
    )
    assert [c["part"] for c in calls] == [slice(0, 3), slice(3, None)]
    assert given == [("m", SITES, data, run, 3)] * 2  # the step names it in its errors
    assert {(c["passes"], c["precision"]) for c in calls} == {(2, "float32")}
    assert "sequence_energy" not in calls[0]
    assert fitted == "fitted" and fitted_on == [(slice(0, 3), {})]
    assert stats.where == slice(0, 3) and scored.where == slice(3, None)
    assert stats.merged == [scored]  # the whole stream's statistics for the other probes
    calls.clear()
    run = SimpleNamespace(recipe=SimpleNamespace(proxies=ProxiesSpec(methods=("pca",))))
    stats, scored, fitted = core_step.capture_scored("m", SITES, data, run, 3, sequence_energy="s")
    assert calls == [{"passes": 1, "precision": None, "sequence_energy": "s"}]
    assert given[-1] == ("m", SITES, data, run, 3)
    assert stats is scored and fitted is None


def test_the_sites_are_the_embedding_then_each_kind_at_each_selected_block(monkeypatch):
    from tangentlens.capture.needs import Needs

    refusal: list = [None]
    lens = SimpleNamespace(
        n_layers=3,
        attention_refusal=lambda: refusal[0],
        hook_name=lambda kind, layer=None: kind if layer is None else f"blocks.{layer}.{kind}",
    )
    monkeypatch.setattr(core_step, "lens_model", lambda model: lens)
    capture = SimpleNamespace(embed=True, sites=("resid_mid", "resid_post"), layers="0,2")
    run = SimpleNamespace(
        recipe=SimpleNamespace(capture=capture), needs={"qk": Needs(attention=True)}
    )
    assert list(core_step.capture_sites("m", run).items()) == [
        ("embed", None),
        ("blocks.0.resid_mid", 0),
        ("blocks.2.resid_mid", 2),
        ("blocks.0.resid_post", 0),
        ("blocks.2.resid_post", 2),
    ]
    capture.embed = False
    assert "embed" not in core_step.capture_sites("m", run)
    refusal[0] = "the model uses grouped-query attention"
    with pytest.raises(ValueError, match=r"^probe\(s\) qk cannot run: the model uses grouped"):
        core_step.capture_sites("m", run)


def test_the_phases_and_status_lines_name_each_probe_and_the_fit(fits):
    """What the sweep's timing table and progress line show for a step: each probe by name,
    the step's own fit and its rows; the refit when it runs beside the probes."""
    from tangentlens.runtime import Phases

    log: list = []
    probes = {"geometry": _Probe(log, "step"), "energy": _Probe(log, "tangent", refits=True)}
    phases, said = Phases(), []
    rows, _ = core_step.step_rows(
        _run(probes, OWN_STAGE), _capture("cpu"), status=said.append, phases=phases
    )
    assert [r["probe"] for r in rows] == ["capture"] * 4 + ["geometry", "proxy_fit", "energy"]
    assert list(phases.seconds) == ["probe geometry", "fit", "fit rows", "probe energy"]
    energy = "energy (3 control frames per measurement)"
    assert said == ["geometry", "fitting proxies (pca)", energy]
    beside = Phases()
    core_step.step_rows(
        _run(probes, FROZEN_STAGE), _capture("cpu"), frozen={SITE: {"pca": FROZEN_BASIS}},
        phases=beside,
    )  # fmt: skip
    assert set(beside.seconds) == {
        "probe geometry", "fit rows", "probe energy", "refit", "waiting for the refit",
    }  # fmt: skip
