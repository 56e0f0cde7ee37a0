"""``tangentlens.compare`` on hand-built run directories: rows matched on site kind and relative
depth (a 4-block decoder against a 2-block encoder), differences (log ratios for ratios) computed
by hand, the step choice, refusals of must-match settings, flags, and the CLI."""

from __future__ import annotations

import doctest
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import tangentlens
from tangentlens.cli import main
from tangentlens.comparison import COMPARE_SCHEMA, compare
from tangentlens.comparison import runs as comparison_runs
from tangentlens.models.sites import site_kind
from tangentlens.results import row
from tangentlens.sweep.store import RunStore


def _recipe(**changes: Any) -> dict[str, Any]:
    """A manifest's recipe; ``changes`` maps dotted keys to new values."""
    recipe = {
        "name": "r",
        "suite": {"name": "micro-pythia"},
        "data": {"n_bins": 3, "seq_len": 32, "max_tokens": 2048},
        "proxies": {
            "rank": 4,
            "draws": 20,
            "fit_policy": "frozen_early",
            "held_out": False,
            "mean_direction": True,
        },
        "probes": {"cosine_drift": {}, "tangent_energy": {"data_matched_m": None}},
    }
    for key, value in changes.items():
        *path, last = key.split(".")
        node = recipe
        for part in path:
            node = node[part]
        node[last] = value
    return recipe


def _write_run(
    root: Path, rows: list[dict[str, Any]], recipe: dict[str, Any], **manifest: Any
) -> Path:
    store = RunStore(root)
    store.write_part("step-all", rows)
    store.write_manifest({"recipe": recipe, "finished": True, **manifest})
    return root


def _decoder_rows(step: int, scale: float) -> list[dict[str, Any]]:
    """A 4-block decoder: energy ratio and cosine anisotropy at the embedding and each block,
    the ratio also in bin "0"; the tokens analysed."""
    out = [
        row("dec", step, 10 * step, "capture", "n_tokens", 1000.0),
        row("dec", step, 10 * step, "cosine_drift", "cosine_anisotropy", 0.1, site="hook_embed"),
        row("dec", step, 10 * step, "tangent_energy", "energy_ratio", 1.5 * scale,
            site="hook_embed", method="pca", rank=4),
    ]  # fmt: skip
    for layer in range(4):
        site = f"blocks.{layer}.hook_resid_post"
        cell = {"site": site, "layer": layer}
        out += [
            row("dec", step, 10 * step, "cosine_drift", "cosine_anisotropy", 0.2 * (layer + 1),
                **cell),
            row("dec", step, 10 * step, "tangent_energy", "energy_ratio", scale * (layer + 1),
                method="pca", rank=4, **cell),
            row("dec", step, 10 * step, "tangent_energy", "energy_ratio", 3.0, method="pca",
                rank=4, freq_bin="0", **cell),
        ]  # fmt: skip
    return out


def _encoder_rows(step: int) -> list[dict[str, Any]]:
    """A 2-block BERT encoder (its site names), same metrics."""
    out = [
        row("enc", step, 7 * step, "capture", "n_tokens", 900.0),
        row("enc", step, 7 * step, "cosine_drift", "cosine_anisotropy", 0.05,
            site="embed.hook_embed"),
        row("enc", step, 7 * step, "tangent_energy", "energy_ratio", 0.75,
            site="embed.hook_embed", method="pca", rank=4),
    ]  # fmt: skip
    for layer, (cosine, ratio) in enumerate([(0.5, 4.0), (0.9, 1.0)]):
        cell = {"site": f"blocks.{layer}.hook_normalized_resid_post", "layer": layer}
        out += [
            row("enc", step, 7 * step, "cosine_drift", "cosine_anisotropy", cosine, **cell),
            row("enc", step, 7 * step, "tangent_energy", "energy_ratio", ratio, method="pca",
                rank=4, **cell),
            row("enc", step, 7 * step, "tangent_energy", "energy_ratio", 6.0, method="pca",
                rank=4, freq_bin="0", **cell),
        ]  # fmt: skip
    return out


@pytest.fixture
def two_runs(tmp_path):
    """``dec`` (4 blocks, steps 0 and 100) and ``enc`` (2 blocks, steps 0 and 50)."""
    # the proxy fit's rows name the fit window's last checkpoint, 10: not a scored step
    fit = row("dec", 10, 100, "proxy_fit", "explained_variance", 0.5, site="hook_embed")
    dec = _write_run(
        tmp_path / "dec",
        [*_decoder_rows(0, 1.0), fit, *_decoder_rows(100, 2.0)],
        _recipe(),
        n_layers=4,
        fit_window=[0, 10],
        steps=[0, 100],
    )
    enc = _write_run(
        tmp_path / "enc",
        _encoder_rows(0) + _encoder_rows(50),
        _recipe(**{"suite.name": "micro-bert", "data.seq_len": 64}),
        n_layers=2,
        fit_window=[0, 20],
    )
    return dec, enc


def _by_run(comparison) -> dict[tuple[str, str, str, float | None, str], float]:
    return {
        (r["run"], r["metric"], r["freq_bin"], r["relative_depth"], r["site_kind"]): r["value"]
        for r in comparison.to_pylist()
    }


def test_rows_match_on_site_kind_and_relative_depth_with_hand_computed_differences(two_runs):
    dec, enc = two_runs
    comparison = compare([dec, enc])
    assert comparison.steps == (100, 50)  # each run's last step
    assert comparison.to_arrow().schema == COMPARE_SCHEMA
    got = _by_run(comparison)
    # the decoder's blocks 1 and 3 sit at depths 1/2 and 1, the encoder's blocks 0 and 1 too;
    # the decoder's blocks 0 and 2 (depths 1/4, 3/4) have no partner
    depths = {k[3] for k in got if k[1] == "cosine_anisotropy"}
    assert depths == {0.0, 0.5, 1.0}
    delta = "enc − dec"
    assert got[("dec", "cosine_anisotropy", "all", 0.5, "resid_post")] == pytest.approx(0.4)
    assert got[("enc", "cosine_anisotropy", "all", 0.5, "resid_post")] == 0.5
    assert got[(delta, "cosine_anisotropy", "all", 0.5, "resid_post")] == pytest.approx(0.1)
    assert got[(delta, "cosine_anisotropy", "all", 1.0, "resid_post")] == pytest.approx(0.9 - 0.8)
    assert got[(delta, "cosine_anisotropy", "all", 0.0, "embed")] == pytest.approx(0.05 - 0.1)
    # ratios on the log scale: dec's step-100 ratio at block 1 is 2 × 2 = 4, enc's 4 → ln 1 = 0
    assert got[(delta, "energy_ratio", "all", 0.5, "resid_post")] == pytest.approx(0.0, abs=1e-15)
    assert got[(delta, "energy_ratio", "all", 1.0, "resid_post")] == pytest.approx(math.log(1 / 8))
    assert got[(delta, "energy_ratio", "all", 0.0, "embed")] == pytest.approx(math.log(0.75 / 3))
    assert got[(delta, "energy_ratio", "0", 1.0, "resid_post")] == pytest.approx(math.log(2))
    assert got[(delta, "n_tokens", "all", None, "-")] == -100.0
    # the runs' own rows, unchanged: sites keep each family's names
    rows = comparison.to_pylist()
    (enc_row,) = [
        r for r in rows if r["run"] == "enc" and r["metric"] == "energy_ratio"
        and r["relative_depth"] == 1.0 and r["freq_bin"] == "all"
    ]  # fmt: skip
    assert enc_row["site"] == "blocks.1.hook_normalized_resid_post" and enc_row["step"] == 50
    assert enc_row["tokens_seen"] == 350 and enc_row["difference"] is None
    differences = {r["difference"] for r in rows if r["run"] == delta}
    assert differences == {"log_ratio", "difference"}
    assert all(r["ci_low"] is None and r["step"] is None for r in rows if r["run"] == delta)
    # 5 shared keys per metric family: 3 cosine, 3 ratio "all", 2 ratio bin 0, 1 n_tokens
    assert len(comparison) == 3 * (3 + 3 + 2 + 1)
    assert comparison.unshared[0] == {"cosine_drift": 2, "tangent_energy": 4}
    assert not comparison.unshared[1]
    assert comparison.flagged == (
        "seq_len differs (data.seq_len: dec 32, enc 64)",
        "corpus size differs (tokens analysed: dec 1000, enc 900)",
    )
    assert comparison.fit_windows == ("fit window of dec: 0, 10", "fit window of enc: 0, 20")
    assert ("suite.name", ["micro-pythia", "micro-bert"]) in comparison.recipe_differences
    assert tangentlens.compare is compare  # the public name


def test_a_chosen_step_every_run_has(two_runs):
    dec, enc = two_runs
    comparison = compare([dec, enc], step=0, labels=["decoder", "encoder"])
    assert comparison.steps == (0, 0)
    got = _by_run(comparison)
    # at step 0 the decoder's block-3 ratio is 4 (scale 1): ln(1/4)
    assert got[("encoder − decoder", "energy_ratio", "all", 1.0, "resid_post")] == pytest.approx(
        math.log(1 / 4)
    )
    with pytest.raises(ValueError, match=r"run enc has no rows at step 100; its steps: \[0, 50\]"):
        compare([dec, enc], step=100)
    with pytest.raises(ValueError, match=r"run dec has no rows at step 10; its steps: \[0, 100\]"):
        compare([dec, enc], step=10)
    with pytest.raises(ValueError, match="two or more run directories, got 1"):
        compare([dec])


def test_must_match_settings_refuse_the_rows_they_concern(tmp_path, two_runs):
    dec, _ = two_runs
    rows = _encoder_rows(50)
    other = _write_run(
        tmp_path / "rank8",
        rows,
        _recipe(**{"proxies.rank": 8, "data.n_bins": 5}),
        n_layers=2,
    )
    comparison = compare([dec, other])
    assert [r.line for r in comparison.refused] == [
        "rank differs (proxies.rank: dec 4, rank8 8): anisotropy_share, "
        "subspace_stability, tangent_energy, update_alignment, proxy_fit rows not compared",
        "bins differs (data.n_bins: dec 3, rank8 5): per-bin rows (freq_bin ≠ all) not compared",
    ]
    assert {r["probe"] for r in comparison.to_pylist()} == {"capture", "cosine_drift"}
    assert comparison.unshared[1]["tangent_energy"] == 5
    # the bins alone: the ratio in bin "all" is still compared, bin "0" is not
    bins = _write_run(tmp_path / "bins", rows, _recipe(**{"data.n_bins": 5}), n_layers=2)
    got = {(r["metric"], r["freq_bin"]) for r in compare([dec, bins]).to_pylist()}
    assert ("energy_ratio", "all") in got and ("energy_ratio", "0") not in got
    # nothing left to compare: refused, with the reason
    only_energy = [r for r in rows if r["probe"] == "tangent_energy"]
    alone = _write_run(
        tmp_path / "alone", only_energy, _recipe(**{"proxies.draws": 50}), n_layers=2
    )
    with pytest.raises(ValueError, match=r"share no comparable row .*draws differs"):
        compare([dec, alone])
    # the draws both tangent_energy and anisotropy_share declare: one line over both
    draws = _write_run(tmp_path / "draws", rows, _recipe(**{"proxies.draws": 50}), n_layers=2)
    assert [r.line for r in compare([dec, draws]).refused] == [
        "draws differs (proxies.draws: dec 20, draws 50): anisotropy_share, "
        "tangent_energy rows not compared"
    ]


def test_number_of_layers_from_the_suite_when_the_manifest_lacks_it(tmp_path, two_runs):
    dec, _ = two_runs
    old = _write_run(tmp_path / "old", _encoder_rows(50), _recipe())  # micro-pythia: 2 blocks
    assert comparison_runs.read_run(old).n_layers == 2
    assert {r["relative_depth"] for r in compare([dec, old]).to_pylist()} == {None, 0, 0.5, 1}
    lost = _write_run(tmp_path / "lost", [], _recipe(**{"suite.name": "local:/nowhere"}))
    with pytest.raises(ValueError, match="number of layers is unknown"):
        comparison_runs.read_run(lost)


def test_site_kinds_and_relative_depth():
    assert site_kind("blocks.3.hook_normalized_resid_post") == "resid_post"
    assert site_kind("embed.hook_out") == site_kind("hook_embed") == "embed"
    assert site_kind("blocks.0.attn") == "attn" and site_kind("-") is None
    depth = comparison_runs.relative_depth
    assert [depth("resid_post", layer, 12) for layer in (2, 5, 8, 11)] == [
        depth("resid_post", layer, 4) for layer in range(4)
    ]


def test_cli_writes_the_table_and_figures(two_runs, tmp_path, capsys, monkeypatch):
    dec, enc = two_runs
    manifest = RunStore(enc).read_manifest()
    RunStore(enc).write_manifest({**manifest, "finished": False})  # a run still going
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(dec), str(enc)]) == 0
    out = tmp_path / "runs" / "compare-dec-vs-enc"  # the default folder
    shown = capsys.readouterr().out
    assert "flagged: seq_len differs" in shown and "Δln enc" in shown
    assert "enc:" in shown and "partial run (2 steps)" in shown
    assert pq.read_table(out / "compare.parquet").equals(compare([dec, enc]).to_arrow())
    for name in ("energy_ratio", "anisotropy_depth"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    assert not (out / "frequency_correlation.png").exists()  # no frequency_geometry rows
    assert main(["compare", str(dec), str(enc), "--step", "7", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run dec has no rows at step 7" in err
    assert main(["compare", str(dec), str(tmp_path / "nothing")]) == 2
    assert "is not a run directory (no manifest.json)" in capsys.readouterr().err


def test_docstring_examples():
    from tangentlens.drawing import tables
    from tangentlens.models import sites

    for module in (comparison_runs, sites, tables):
        failed, tried = doctest.testmod(module)
        assert tried and not failed, module.__name__


# ------------------------------------------------- estimators and the other must-match settings


def _estimators(**changes: str | None) -> dict[str, str]:
    """A manifest's ``estimators`` (this version's), with ``changes`` (None: not recorded)."""
    from tangentlens.core.estimators import estimator_notes
    from tangentlens.core.recipe import load_recipe

    out = {
        **estimator_notes(load_recipe("quickstart")),
        "energy_interval": "studentized bootstrap over all_sequences",
    }
    for key, value in changes.items():
        if value is None:
            out.pop(key)
        else:
            out[key] = value
    return out


def test_runs_whose_estimators_differ_are_compared_only_on_the_rows_they_leave_alone(tmp_path):
    """Null: the same estimators compare every shared row. Planted: a run written before the
    ratios read the controls' exact mean (no ``energy_ratio`` entry) against one after: every
    ``*_ratio`` row of tangent_energy is refused in one line naming the entry and both runs,
    the rest compared."""
    rows = _decoder_rows(100, 2.0)
    new = _write_run(tmp_path / "new", rows, _recipe(), n_layers=4, estimators=_estimators())
    same = _write_run(tmp_path / "same", rows, _recipe(), n_layers=4, estimators=_estimators())
    assert compare([new, same]).refused == ()
    assert {r["metric"] for r in compare([new, same]).to_pylist()} == {
        "n_tokens",
        "cosine_anisotropy",
        "energy_ratio",
    }
    old = _write_run(
        tmp_path / "old", rows, _recipe(), n_layers=4, estimators=_estimators(energy_ratio=None)
    )
    comparison = compare([old, new])
    assert [r.line for r in comparison.refused] == [
        'estimator energy_ratio differs (old: not recorded; new: "E(T) over the control '
        "family's exact mean k/(d …\"): tangent_energy, update_alignment rows (*_ratio) not "
        "compared"
    ]
    assert {r["metric"] for r in comparison.to_pylist()} == {"n_tokens", "cosine_anisotropy"}
    assert comparison.unshared[0]["tangent_energy"] == 9  # 5 "all" + 4 bin "0"
    # an entry of no known scope refuses every row: nothing is left
    odd = _write_run(
        tmp_path / "odd", rows, _recipe(), n_layers=4, estimators=_estimators(novel="v2")
    )
    with pytest.raises(ValueError, match=r"share no comparable row .*estimator novel differs"):
        compare([new, odd])


def test_every_estimator_the_manifest_records_has_a_scope():
    from tangentlens.comparison.settings import estimator_scopes
    from tangentlens.core.estimators import estimator_notes
    from tangentlens.core.recipe import load_recipe

    recorded = estimator_notes(load_recipe("quickstart"))
    assert set(estimator_scopes()) == set(recorded)
    # a note declared by two probes covers the rows of both, as it declares them
    ratio = estimator_scopes()["energy_ratio"]
    assert (ratio.probe_names(), ratio.metric_suffix) == (
        ("tangent_energy", "update_alignment"),
        "_ratio",
    )
    interval = estimator_scopes()["energy_interval"]
    assert interval.metrics == ("energy_fraction", "energy_ratio", "energy_complement_ratio")
    # a probe's declared entry refuses that probe's rows only
    assert estimator_scopes()["drift_cosine"].probe_names() == ("cosine_drift",)
    assert estimator_scopes()["drift_cosine"].metric_prefix == "drift_cosine_"


def test_a_run_recorded_before_the_proxies_stage_compares_with_one_after(tmp_path, two_runs):
    """A manifest written before ``[proxies]`` recorded the stage's keys under
    ``probes.tangent_energy``: read from there, the same settings refuse nothing, and a
    different one is named by its key now."""
    dec, _ = two_runs
    recipe = _recipe()
    legacy = {**recipe, "probes": {**recipe["probes"]}}
    legacy["probes"]["tangent_energy"] = {**legacy.pop("proxies"), "data_matched_m": None}
    rows = _decoder_rows(100, 2.0)
    old = _write_run(tmp_path / "old", rows, legacy, n_layers=4)
    assert compare([dec, old]).refused == ()
    legacy["probes"]["tangent_energy"]["rank"] = 8
    other = _write_run(tmp_path / "other", rows, legacy, n_layers=4)
    assert (
        compare([dec, other])
        .refused[0]
        .line.startswith("rank differs (proxies.rank: dec 4, other 8)")
    )


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"proxies.fit_policy": "per_checkpoint"},
            "fit policy differs (proxies.fit_policy: dec frozen_early, other "
            "per_checkpoint): anisotropy_share, subspace_stability, tangent_energy, "
            "update_alignment, proxy_fit rows not compared",
        ),
        (
            {"proxies.held_out": True},
            "held_out differs (proxies.held_out: dec false, other true): "
            "anisotropy_share, subspace_stability, tangent_energy, update_alignment, proxy_fit "
            "rows not compared",
        ),
        (
            {"proxies.mean_direction": False},
            "control family differs (proxies.mean_direction: dec true, other "
            "false): anisotropy_share, subspace_stability, tangent_energy, update_alignment, "
            "proxy_fit rows not compared",
        ),
    ],
)
def test_each_tangent_setting_refuses_the_tangent_account(tmp_path, two_runs, change, line):
    """Value tests for the must-match settings beyond rank, draws and bins (a setting dropped
    from must_match() compares the energy ratio across a changed estimator)."""
    dec, _ = two_runs
    other = _write_run(tmp_path / "other", _decoder_rows(100, 2.0), _recipe(**change), n_layers=4)
    comparison = compare([dec, other])
    assert [r.line for r in comparison.refused] == [line]
    assert {r["probe"] for r in comparison.to_pylist()} == {"capture", "cosine_drift"}


def test_the_data_matched_control_refuses_only_its_own_rows(tmp_path):
    rows = [
        *_decoder_rows(100, 2.0),
        row("dec", 100, 1000, "tangent_energy", "data_matched_energy_ratio", 1.2,
            site="blocks.3.hook_resid_post", layer=3, method="pca", rank=4),
    ]  # fmt: skip
    a = _write_run(tmp_path / "a", rows, _recipe(), n_layers=4)
    b = _write_run(
        tmp_path / "b", rows, _recipe(**{"probes.tangent_energy.data_matched_m": 8}), n_layers=4
    )
    comparison = compare([a, b])
    assert [r.line for r in comparison.refused] == [
        "control family differs (probes.tangent_energy.data_matched_m: a none, b 8): "
        "tangent_energy rows (data_matched_*) not compared"
    ]
    got = {r["metric"] for r in comparison.to_pylist()}
    assert "energy_ratio" in got and "data_matched_energy_ratio" not in got


def test_the_enrichment_is_compared_as_a_difference_beside_its_null(tmp_path):
    """``energy_enrichment``'s null is not 1 but ``energy_enrichment_null``: a plain Δ (0.7),
    not a log ratio (ln 2), with its null's Δ beside it."""
    cell = {"site": "blocks.3.hook_resid_post", "layer": 3, "method": "pca", "rank": 4}
    runs = []
    for name, enrichment in (("a", 0.7), ("b", 1.4)):
        rows = [
            row(name, 100, 1000, "tangent_energy", "energy_enrichment", enrichment, **cell),
            row(name, 100, 1000, "tangent_energy", "energy_enrichment_null", 0.7, **cell),
        ]
        runs.append(_write_run(tmp_path / name, rows, _recipe(), n_layers=4))
    got = {
        r["metric"]: (r["value"], r["difference"])
        for r in compare(runs).to_pylist()
        if r["run"] == "b − a"
    }
    assert got == {
        "energy_enrichment": (pytest.approx(0.7), "difference"),
        "energy_enrichment_null": (0.0, "difference"),
    }


def test_a_probes_declared_setting_refuses_only_its_rows(tmp_path):
    """``update_alignment`` declares ``MustMatch("draws", "probes.update_alignment.draws")``
    (``Reporting.must_match``): runs whose draws differ compare everything but its rows."""
    rows = [
        *_decoder_rows(100, 2.0),
        row("dec", 100, 1000, "update_alignment", "centroid_update_energy_ratio", 1.2,
            site="blocks.3.hook_resid_post", layer=3, method="pca", rank=4),
    ]  # fmt: skip
    runs = []
    for name, draws in (("a", 20), ("b", 50)):
        recipe = _recipe(**{"probes.update_alignment": {"draws": draws}})
        runs.append(_write_run(tmp_path / name, rows, recipe, n_layers=4))
    comparison = compare(runs)
    assert [r.line for r in comparison.refused] == [
        "draws differs (probes.update_alignment.draws: a 20, b 50): update_alignment rows not "
        "compared"
    ]
    got = {r["probe"] for r in comparison.to_pylist()}
    assert got == {"capture", "cosine_drift", "tangent_energy"}
