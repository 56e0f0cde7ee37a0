"""The comparison's decisions at their edges: which rows each estimator note and must-match
setting covers (metric A and not metric B), the precision bound on the bound, the shortened
estimator texts, the flags and recipe differences, the differences' log scale and intervals, the
order of bins and rows, and the comparison report's columns and row order. Value tests on
hand-built runs."""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from tangentlens.comparison import compare
from tangentlens.comparison import settings as cs
from tangentlens.comparison import table as ct
from tangentlens.comparison.runs import Run, read_run, relative_depth, row_identity
from tangentlens.report import compare_report
from tangentlens.results import row
from tangentlens.sweep.store import RunStore
from tests.unit import test_compare_probe_settings as probe_settings


def _run(label: str = "a", rows: tuple = (), **manifest: Any) -> Run:
    return Run(label, Path(label), manifest, tuple(rows), 4)


def _concerns(setting: cs.Setting, probe: str, metric: str, freq_bin: str = "all") -> bool:
    return setting.concerns({"probe": probe, "metric": metric, "freq_bin": freq_bin})


# ----------------------------------------------------------- which rows an estimator covers


def test_a_prefix_note_covers_its_probes_metrics_with_that_prefix_only():
    scope = cs.estimator_scopes()["centred_anisotropy"]
    assert _concerns(scope, "shape_of_learning", "centred_anisotropy")
    assert _concerns(scope, "shape_of_learning", "centred_singular_anisotropy")
    assert not _concerns(scope, "shape_of_learning", "isoscore")
    assert not _concerns(scope, "shape_of_learning", "not_centred_anisotropy")
    assert not _concerns(scope, "cosine_drift", "centred_anisotropy")  # another probe's
    assert scope.what() == "shape_of_learning rows (centred_*)"


def test_a_suffix_note_covers_the_ratios_of_both_probes_that_declare_it():
    scope = cs.estimator_scopes()["energy_ratio"]
    assert _concerns(scope, "tangent_energy", "energy_complement_ratio")
    assert _concerns(scope, "update_alignment", "update_energy_ratio")
    assert not _concerns(scope, "tangent_energy", "energy_fraction")
    assert not _concerns(scope, "tangent_energy", "energy_ratio_z")
    assert not _concerns(scope, "anisotropy_share", "share_ratio")
    assert scope.what() == "tangent_energy, update_alignment rows (*_ratio)"


def test_a_note_on_listed_metrics_covers_those_and_no_other():
    scope = cs.estimator_scopes()["energy_interval"]
    assert _concerns(scope, "tangent_energy", "energy_fraction")
    assert _concerns(scope, "tangent_energy", "energy_complement_ratio")
    assert not _concerns(scope, "tangent_energy", "data_matched_energy_ratio")
    assert not _concerns(scope, "tangent_energy", "energy_control_mean")
    assert scope.what() == (
        "tangent_energy rows (energy_fraction, energy_ratio, energy_complement_ratio)"
    )


def test_the_cores_notes_cover_the_tangent_account_or_every_probe():
    window = cs.estimator_scopes()["fit_window"]
    assert _concerns(window, "proxy_fit", "explained_variance")
    assert _concerns(window, "anisotropy_share", "x")
    assert not _concerns(window, "cosine_drift", "cosine_anisotropy")
    positions = cs.estimator_scopes()["positions"]
    assert _concerns(positions, "cosine_drift", "cosine_anisotropy")
    assert _concerns(positions, "my_probe", "anything")
    assert positions.what() == "every probe rows"
    # a probe-wide note (no prefix) covers every metric of its probe only
    share = cs.estimator_scopes()["anisotropy_share"]
    assert _concerns(share, "anisotropy_share", "delta_isoscore")
    assert not _concerns(share, "tangent_energy", "delta_isoscore")
    assert share.what() == "anisotropy_share rows"


def test_the_bins_setting_covers_per_bin_rows_only():
    (bins,) = [s for s in cs.must_match() if s.name == "bins"]
    assert _concerns(bins, "cosine_drift", "cosine_anisotropy", freq_bin="0")
    assert not _concerns(bins, "cosine_drift", "cosine_anisotropy")
    assert bins.what() == "per-bin rows (freq_bin ≠ all)"


def test_an_estimator_text_is_shortened_past_48_characters():
    text = "x" * 48
    assert cs._estimator_text(_run(estimators={"k": text}), "k") == f'"{text}"'
    longer = _run(estimators={"k": text + "y"})
    assert cs._estimator_text(longer, "k") == '"' + "x" * 47 + '…"'
    assert cs._estimator_text(_run(), "k") == "not recorded"


def test_estimator_refusals_are_sorted_and_name_each_run():
    a = _run("a", estimators={"z_new": "1", "positions": "p", "same": "s"})
    b = _run("b", estimators={"positions": "q", "same": "s"})
    refused = cs.estimator_refusals([a, b])
    assert [r.line for r in refused] == [
        'estimator positions differs (a: "p"; b: "q"): every probe rows not compared',
        'estimator z_new differs (a: "1"; b: not recorded): every probe rows not compared',
    ]
    assert cs.estimator_refusals([a, a]) == []


# ----------------------------------------------------------------------- settings' edges


def test_mixed_precisions_exactly_on_the_bound_are_compared():
    bound = cs.MIXED_PRECISION_BOUND
    f32 = {"statistics_dtype": "float32", "statistics_bound": {"relative": bound}}
    refused, flags = cs.precision_refusals([_run("a"), _run("b", **f32)])
    assert refused == []
    assert flags == [
        "statistics precision differs (a float64, b float32 (bound 1.0e-03)): within 0.001"
    ]
    above = {**f32, "statistics_bound": {"relative": bound * 1.01}}
    refused, flags = cs.precision_refusals([_run("a"), _run("b", **above)])
    assert flags == [] and len(refused) == 1
    assert refused[0].concerns({"probe": "x", "metric": "y", "freq_bin": "all"})
    # a float64 run's recorded bound is not read
    f64 = {"statistics_dtype": "float64", "statistics_bound": {"relative": 1.0}}
    assert cs.precision_refusals([_run("a", **f64), _run("b", **f32)])[0] == []


def test_flags_and_settings_need_every_run_to_record_them():
    seq = {"recipe": {"data": {"seq_len": 32}}}
    assert cs.flag_lines([_run("a", **seq), _run("b", **seq)]) == []
    assert cs.flag_lines([_run("a", **seq), _run("b")]) == []  # one run lacks it
    other = {"recipe": {"data": {"seq_len": 64, "max_tokens": True}}}
    assert cs.flag_lines([_run("a", **seq), _run("b", **other)]) == [
        "seq_len differs (data.seq_len: a 32, b 64)"
    ]
    held = {"recipe": {"proxies": {"held_out": True}}}
    unset = {"recipe": {"proxies": {"held_out": None}}}
    (refusal,) = cs.refusals([_run("a", **held), _run("b", **unset)])
    assert refusal.line.startswith("held_out differs (proxies.held_out: a true, b none): ")


def test_the_corpus_size_flag_reads_the_capture_rows_at_the_compared_steps():
    def tokens(step: int, n: float) -> dict[str, Any]:
        return {"probe": "capture", "metric": "n_tokens", "step": step, "value": n}

    a = _run("a", [tokens(10, 100.0), tokens(20, 200.0)])
    b = _run("b", [tokens(10, 100.0), tokens(20, 300.0)])
    assert cs.corpus_size_flag([a, b], [10, 10]) is None
    assert cs.corpus_size_flag([a, b], [20, 20]) == (
        "corpus size differs (tokens analysed: a 200, b 300)"
    )
    assert cs.corpus_size_flag([a, _run("b")], [20, 20]) is None
    c = _run("c", [tokens(20, 300.0)])
    assert cs.corpus_size_flag([a, _run("b"), c], [20, 20, 20]) is None  # b has no such row


def test_fit_windows_are_listed_only_when_they_differ():
    assert cs.fit_window_lines([_run("a", fit_window=[0, 10]), _run("b", fit_window=[0, 10])]) == []
    assert cs.fit_window_lines([_run("a"), _run("b")]) == []
    assert cs.fit_window_lines([_run("a", fit_window=[0, 10]), _run("b")]) == [
        "fit window of a: 0, 10",
        "fit window of b: none",
    ]


def test_recipe_differences_name_a_probe_once_and_list_keys_sorted():
    a = {"recipe": {"probes": {"p": {"lower": 1}, "q": {}}, "data": {"seq_len": 32}, "z": 1}}
    b = {"recipe": {"probes": {"q": {}}, "data": {"seq_len": 64}, "b": False}}
    assert cs.recipe_differences([_run("a", **a), _run("b", **b)]) == [
        ("b", ["—", "false"]),
        ("data.seq_len", ["32", "64"]),
        ("probes.p", ["on", "—"]),
        ("z", ["1", "—"]),
    ]


def test_across_rows_are_refused_only_when_the_transitions_differ():
    def across(step: int) -> dict[str, Any]:
        return {
            "step": step, "probe": "update_alignment", "metric": "m", "site": "s",
            "method": "pca", "rank": 4, "freq_bin": "all",
        }  # fmt: skip

    def run(label: str, steps: list[int]) -> Run:
        rows = tuple(across(s) for s in steps)
        ids = frozenset(tuple(r[k] for k in ("step", "probe", "metric", "site", "method",
                                             "rank", "freq_bin")) for r in rows)  # fmt: skip
        return Run(label, Path(label), {}, rows, 4, across=ids)

    a, b = run("a", [0, 64, 1200]), run("b", [0, 1200])
    assert cs.transition_refusal([a, a], [1200, 1200]) is None
    refusal = cs.transition_refusal([a, b], [1200, 1200])
    assert refusal.line == (
        "transitions differ (a 64 → 1200, b 0 → 1200): across-steps rows (update_alignment) "
        "not compared"
    )
    assert refusal.concerns(across(1200)) and not refusal.concerns({**across(1200), "site": "t"})
    started = cs.transition_refusal([a, b], [0, 1200])  # a's first step has no earlier one
    assert started.line.startswith("transitions differ (a start → 0, b 0 → 1200): ")
    first = cs.transition_refusal([a, b], [0, 0])
    assert first is None  # start → 0 in both


# --------------------------------------------------------------------- the table's edges


def test_differences_on_the_log_scale_need_both_values_positive():
    assert ct._difference(True, 2.0, 8.0) == pytest.approx(math.log(4.0))
    assert math.isnan(ct._difference(True, 0.0, 8.0))
    assert math.isnan(ct._difference(True, 2.0, 0.0))
    assert math.isnan(ct._difference(True, -2.0, -8.0))
    assert ct._difference(False, 2.0, -8.0) == -10.0
    assert math.isnan(ct._difference(False, None, 1.0))
    assert math.isnan(ct._difference(False, 1.0, None))


def test_a_difference_interval_needs_two_finite_paired_replicates():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0])
    low, high = ct._difference_interval(False, 1.5, a, b)  # paired on the first 2
    diffs = np.array([1.0, 2.0])
    assert (low, high) == pytest.approx(tuple(np.quantile(diffs, (0.025, 0.975))))
    # widened to contain the difference itself
    assert ct._difference_interval(False, 5.0, a, b) == pytest.approx((1.025, 5.0))
    assert ct._difference_interval(False, -1.0, a, b) == pytest.approx((-1.0, 1.975))
    # one finite log difference (a replicate at 0) is too few
    assert ct._difference_interval(True, 0.5, np.array([0.0, 1.0]), np.array([1.0, 2.0])) == (
        None,
        None,
    )
    assert ct._difference_interval(False, math.nan, a, b) == (None, None)
    assert ct._difference_interval(False, 1.0, None, b) == (None, None)
    assert ct._difference_interval(False, 1.0, a, None) == (None, None)


def test_bins_are_ordered_by_number_with_all_last():
    assert sorted(["all", "10", "2", "x", "0"], key=ct._bin_order) == ["x", "0", "2", "10", "all"]
    keys = [
        ("p", "m", "pca", None, "all", "resid_post", None),
        ("p", "m", "pca", 4, "all", "resid_post", None),
        ("p", "m", "pca", 4, "all", "resid_post", 1),
        ("p", "m", "pca", 4, "all", "embed", 0),
    ]
    ordered = sorted(reversed(keys), key=ct._sort_key)
    assert ordered == [keys[0], keys[3], keys[1], keys[2]]


def test_relative_depth_and_place():
    assert relative_depth("resid_post", 3, 4) == 1
    assert relative_depth("embed", 5, 4) == 0
    assert relative_depth("-", None, 4) is None
    run = _run()  # 4 blocks
    assert run.place({"site": "blocks.1.hook_resid_post", "layer": 1}) == (
        "resid_post",
        Fraction(1, 2),
    )
    assert run.place({"site": "t", "layer": 0}) == ("t", Fraction(1, 4))  # a kind of its own
    assert run.place({"site": "-", "layer": None}) == ("-", None)


# ---------------------------------------------------------------- compare() on run folders


def _write(root: Path, values: dict[str, float], **manifest: Any) -> Path:
    """A 2-block run at step 10: ``cosine_anisotropy`` per method key ``"<method>@<layer>"``
    (method "-" for none) and an embedding row."""
    rows = []
    for where, value in values.items():
        method, layer = where.split("@")
        kind = "resid_post"
        if layer.startswith("a"):  # "a0": the attention output of block 0
            kind, layer = "attn_out", layer[1:]
        site = "hook_embed" if layer == "e" else f"blocks.{layer}.hook_{kind}"
        rows.append(
            row("s", 10, 12000, "cosine_drift", "cosine_anisotropy", value, site=site,
                layer=None if layer == "e" else int(layer),
                method=method)
        )  # fmt: skip
    store = RunStore(root)
    store.write_part("step-all", rows)
    store.write_manifest({"recipe": {}, "finished": True, "n_layers": 2, **manifest})
    return root


def test_labels_name_each_run_once_and_same_folder_names_use_the_paths(tmp_path):
    a = _write(tmp_path / "x" / "run", {"-@0": 0.1})
    b = _write(tmp_path / "y" / "run", {"-@0": 0.3})
    assert [r.label for r in compare([a, b]).runs] == [str(a), str(b)]
    assert [r.label for r in compare([a, b], labels=["A", "B"]).runs] == ["A", "B"]
    with pytest.raises(ValueError, match=r"labels must name each of the 2 runs once"):
        compare([a, b], labels=["A", "A"])
    with pytest.raises(ValueError, match=r"labels must name each of the 2 runs once"):
        compare([a, b], labels=["A"])
    with pytest.raises(ValueError, match=r"single path"):
        compare(str(a))
    with pytest.raises(ValueError, match=r"step must be 'last' or a checkpoint step"):
        compare([a, b], step=True)
    with pytest.raises(ValueError, match=r"has no rows at step 5; its steps: \[10\]"):
        compare([a, b], step=5)


def _headline(comparison) -> list[str]:
    console = Console(record=True, width=160)
    compare_report.render_comparison(comparison, console)
    text = console.export_text()
    lines = text.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("cosine anisotropy"))
    start = next(i for i in range(title, len(lines)) if "site, depth" in lines[i]) - 1
    end = lines.index("", start)
    return [re.sub(r"\s+", " ", line.strip()) for line in lines[start + 1 : end]]


def test_compare_rows_put_the_embedding_first_then_depth_per_method(tmp_path):
    a = _write(tmp_path / "a", {"pca@1": 0.4, "pca@a0": 0.3, "pca@0": 0.2, "pca@e": 0.05,
                                "ica@0": 0.7})  # fmt: skip
    b = _write(tmp_path / "b", {"pca@1": 0.5, "pca@a0": 0.3, "pca@0": 0.1, "pca@e": 0.15,
                                "ica@0": 0.9})  # fmt: skip
    # by method, the embedding first (though "attn_out" sorts before it), then kind and depth
    assert _headline(compare([a, b])) == [
        "method site, depth a b Δ b",
        "ica resid_post 0.50 0.700 0.900 0.200",
        "pca embed 0.00 0.050 0.150 0.100",
        "pca attn_out 0.50 0.300 0.300 0.000",
        "pca resid_post 0.50 0.200 0.100 -0.100",
        "pca resid_post 1.00 0.400 0.500 0.100",
    ]
    # one method (none): no method column
    a = _write(tmp_path / "c", {"-@1": 0.4, "-@e": 0.05})
    b = _write(tmp_path / "d", {"-@1": 0.5, "-@e": 0.15})
    assert _headline(compare([a, b]))[0] == "site, depth c d Δ d"


def test_the_compare_header_names_partial_runs_and_unshared_rows_by_probe(tmp_path):
    a = _write(tmp_path / "a", {"-@0": 0.1}, finished=False, suite={"name": "s", "family": "f"})
    extra = [row("s", 10, 12000, p, "m", 1.0, site="-", layer=None) for p in ("zz", "aa", "zz")]
    extra[2] = {**extra[2], "metric": "m2"}
    RunStore(a).write_part("extra", extra)
    b = _write(tmp_path / "b", {"-@0": 0.3})
    lines = compare_report._header(compare([a, b]))
    assert lines[1].endswith(
        "(2 blocks, f) · step 10, 12,000 tokens seen · [yellow]partial run (1 steps)[/]"
    )
    assert lines[2].endswith("(2 blocks) · step 10, 12,000 tokens seen")  # finished
    assert "[dim]rows not shared (refused or in one run only): a: aa 1, zz 2[/]" in lines


# ------------------------------------------------------------------ more edges (mutmut survivors)


def test_each_estimator_entry_covers_exactly_its_declared_rows():
    scopes = cs.estimator_scopes.__wrapped__()  # not the cached table: built here
    assert scopes["positions"] == cs.Setting("estimator positions", "estimators.positions")
    assert scopes["fit_window"] == cs.Setting(
        "estimator fit_window", "estimators.fit_window", cs.TANGENT_ACCOUNT
    )
    assert scopes["drift_cosine"] == cs.Setting(
        "estimator drift_cosine",
        "estimators.drift_cosine",
        ("cosine_drift",),
        metric_prefix="drift_cosine_",
    )
    assert scopes["energy_ratio"] == cs.Setting(
        "estimator energy_ratio",
        "estimators.energy_ratio",
        ("tangent_energy", "update_alignment"),
        metric_suffix="_ratio",
    )
    assert scopes["energy_interval"].metrics == (
        "energy_fraction",
        "energy_ratio",
        "energy_complement_ratio",
    )


def test_a_row_repeated_at_the_compared_step_is_named_in_the_error():
    rows = [
        row("s", 10, 100, "tangent_energy", "energy_ratio", v, site="blocks.1.hook_resid_post",
            layer=1, method="pca", rank=4, freq_bin="0")
        for v in (1.0, 2.0)
    ]  # fmt: skip
    message = (
        "run a has two energy_ratio rows at step 10 for site blocks.1.hook_resid_post, "
        "method 'pca', bin '0'"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ct._keyed(_run("a", rows), 10)


def test_a_run_without_rows_names_itself_and_its_folder():
    with pytest.raises(ValueError, match=r"^run a \(a\) holds no checkpoint rows yet$"):
        _run("a").pick_step("last")


@pytest.mark.parametrize("recipe", [{"recipe": {"name": "r"}}, {}], ids=["no suite", "no recipe"])
def test_a_manifest_without_layers_or_suite_is_refused_naming_the_folder(tmp_path, recipe):
    store = RunStore(tmp_path / "run")
    store.write_part("step-all", [row("s", 10, 100, "capture", "n_tokens", 1.0)])
    store.write_manifest({"finished": True, **recipe})
    expected = f"{tmp_path / 'run'}: the number of layers is unknown (the manifest has no n_layers "
    with pytest.raises(ValueError) as error:
        read_run(tmp_path / "run")
    assert str(error.value).startswith(expected + "and suite None cannot be read: ")


def test_a_comparison_refuses_the_rows_its_refusals_concern():
    setting = cs.Setting("estimator drift_cosine", "estimators.drift_cosine", ("cosine_drift",))
    comparison = ct.Comparison((), (), None, (cs.Refusal(setting, "line"),), (), (), (), ())
    assert comparison.is_refused({"probe": "cosine_drift", "metric": "m", "freq_bin": "all"})
    assert not comparison.is_refused({"probe": "capture", "metric": "m", "freq_bin": "all"})


def test_a_difference_interval_over_zero_or_negative_replicates_warns_of_nothing():
    a, b = np.array([0.0, -1.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0, 4.0])
    inf = np.array([np.inf, 1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # log: ln 0 (divide) and ln −1 (invalid) dropped; the two ln 2 remain
        assert ct._difference_interval(True, 0.5, a, b) == pytest.approx((0.5, math.log(2)))
        # plain: inf − inf (invalid) dropped
        assert ct._difference_interval(False, 1.0, inf, inf + 1) == pytest.approx((1.0, 1.0))


def test_replicates_are_read_as_floats_with_a_missing_one_as_nan():
    record = {"step": 10, "probe": "p", "metric": "m", "method": "-", "rank": None,
              "freq_bin": "all", "site": "blocks.0.hook_resid_post", "layer": 0}  # fmt: skip
    run = Run("a", Path("a"), {}, (), 4, ({**record, "replicates": [1, None, 3]},))
    (values,) = ct._replicates(run, 10).values()
    assert values.dtype == np.float64
    np.testing.assert_array_equal(values, [1.0, math.nan, 3.0])


def test_a_row_without_a_rank_sorts_before_rank_1_whatever_its_bin():
    no_rank = ("p", "m", "pca", None, "all", "resid_post", Fraction(1, 2))
    rank_1 = ("p", "m", "pca", 1, "0", "resid_post", Fraction(1, 2))
    assert sorted([rank_1, no_rank], key=ct._sort_key) == [no_rank, rank_1]


def test_a_difference_row_names_the_site_kind_method_and_rank(tmp_path):
    a = probe_settings._run(tmp_path / "a", probe_settings._recipe(), [10])
    b = probe_settings._run(tmp_path / "b", probe_settings._recipe(), [10])
    RunStore(b).write_part("extra", [row("s", 10, 100, "capture", "n_tokens", 5.0)])
    comparison = compare([a, b])  # b's extra row (a lacks it) is not compared
    assert comparison.unshared == (Counter(), Counter({"capture": 1}))
    rows = [r for r in comparison.to_pylist() if r["probe"] == "site_grad"]
    assert [(r["run"], r["site"], r["difference"]) for r in rows] == [
        ("a", probe_settings.SITE, None),
        ("b", probe_settings.SITE, None),
        ("b − a", "resid_post", "difference"),
    ]
    assert {(r["method"], r["rank"]) for r in rows} == {("pca", 4)}


def test_across_rows_are_refused_when_the_first_runs_row_compares_steps(tmp_path):
    recipe = probe_settings._recipe()
    a = probe_settings._run(tmp_path / "a", recipe, [64, 1200], [probe_settings._update(1200, 2)])
    b = probe_settings._run(tmp_path / "b", recipe, [0, 1000])
    RunStore(b).write_part("more", [probe_settings._update(1000, 3.0)])  # not b's across part
    comparison = compare([a, b])
    assert [r.line for r in comparison.refused] == [
        "transitions differ (a 64 → 1200, b 0 → 1000): across-steps rows (update_alignment) "
        "not compared"
    ]
    assert "update_alignment" not in {r["probe"] for r in comparison.to_pylist()}


def test_runs_sharing_no_row_are_refused_with_each_reason(tmp_path):
    a = _write(tmp_path / "a", {"-@0": 0.1})
    b = _write(tmp_path / "b", {"-@1": 0.3})
    message = (
        "the runs share no comparable row (a step 10, b step 10): "
        "no metric at a common site kind and depth"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        compare([a, b])
    c = _write(tmp_path / "c", {"-@0": 0.1}, estimators={"positions": "all", "proxies": "x"})
    d = _write(tmp_path / "d", {"-@0": 0.3}, estimators={"positions": "last", "proxies": "y"})
    with pytest.raises(ValueError) as error:
        compare([c, d])
    assert str(error.value).startswith(
        "the runs share no comparable row (c step 10, d step 10): "
        'estimator positions differs (c: "all"; d: "last"): every probe rows not compared; '
        'estimator proxies differs (c: "x"; d: "y"): '
    )  # then the tangent account's probes


def test_mixed_precisions_above_the_bound_refuse_every_row_in_one_line():
    f32 = {"statistics_dtype": "float32", "statistics_bound": {"relative": 0.01}}
    refused, flags = cs.precision_refusals([_run("a"), _run("b", **f32)])
    assert flags == []
    assert [(r.setting, r.line, r.rows) for r in refused] == [
        (
            cs.Setting("statistics precision", "statistics_dtype"),
            "statistics precision differs (a float64, b float32 (bound 1.0e-02)), a bound above "
            "0.001: no row compared (rerun one with capture.precision matching the other)",
            None,
        )
    ]
    # a float32 run that states no bound is read as bound 0: flagged, not refused
    refused, flags = cs.precision_refusals([_run("a"), _run("b", statistics_dtype="float32")])
    assert refused == []
    assert flags == ["statistics precision differs (a float64, b float32): within 0.001"]


def test_probe_keys_name_a_probe_by_its_key_unless_a_manifest_records_its_name():
    recipe = {"probes": {"k": {}, "x": {}}}
    a = _run("a", recipe=recipe, probes={"k": {"name": "n"}})
    b = _run("b", recipe={"probes": {"k": {}, "x": {}, "y": {}}})
    assert cs.probe_keys([a, b]) == {"k": "n", "x": "x"}


def test_a_transition_refusal_lists_every_across_probe():
    def run(label: str, first: int) -> Run:
        across = [row("s", 1200, 0, p, "m", 1.0, site="-") for p in ("q", "p")]
        rows = (row("s", first, 0, "c", "m", 1.0, site="-"), *across)
        return Run(label, Path(label), {}, rows, 4, (), frozenset(map(row_identity, across)))

    refusal = cs.transition_refusal([run("a", 64), run("b", 0)], [1200, 1200])
    assert refusal.line == (
        "transitions differ (a 64 → 1200, b 0 → 1200): across-steps rows (p, q) not compared"
    )


def test_a_comparison_names_its_runs_and_steps_and_keeps_integer_columns_nullable(tmp_path):
    comparison = compare(
        [_write(tmp_path / "a", {"-@0": 0.1}), _write(tmp_path / "b", {"-@0": 0.3})]
    )
    assert repr(comparison) == "Comparison(a @ step 10, b @ step 10; 3 rows)"
    frame = comparison.to_pandas()
    assert str(frame["step"].dtype) == "Int64"
    assert frame["step"].isna().tolist() == [False, False, True]  # the difference row has none
