"""``tangentlens compare`` end to end: the quickstart recipe (decoder) against ``mini_bert``
(encoder), both cut to micro sweeps, compared through the CLI and ``tangentlens.compare``; the
table checked against each run's own rows value for value."""

from __future__ import annotations

import json
import math
import re

import pyarrow.parquet as pq
import pytest

import tangentlens
from tangentlens.cli import main
from tangentlens.results import SCHEMA
from tangentlens.sweep.store import read_replicates, read_results

#: Both recipes on a micro suite, two steps, every size cut (the must-match settings agree).
TINY = (
    "suite.steps='0,40'",
    "data.seq_len=32",
    "data.max_tokens=2048",
    "data.n_bins=3",
    "capture.reservoir=512",
    "capture.threads=1",
    "probes.shape_of_learning.twonn_batch=256",
    "proxies.rank=4",
    "proxies.draws=20",
    "probes.tangent_energy.bootstrap=20",
    "probes.tangent_energy.keep_replicates=true",
    "proxies.window_checkpoints=2",
    "probes.anisotropy_share.isoscore_draws=3",
    "probes.frequency_geometry.min_count=3",
    "probes.frequency_geometry.k=16",
    "probes.frequency_geometry.tangent_dim=4",
    "probes.frequency_geometry.n_anchors=128",
)
#: The quickstart's probes that mini_bert does not run.
QUICKSTART_ONLY = (
    "probes.update_alignment.draws=20",
    "probes.untrained_block.d_model=32",
    "probes.untrained_block.n_heads=2",
    "probes.untrained_block.d_mlp=64",
    "probes.untrained_block.n_sequences=2",
    "probes.untrained_block.seq_len=16",
    "probes.untrained_block.vocab_size=100",
)
_EMBED = {"hook_embed", "embed.hook_embed"}
_BLOCK = re.compile(r"blocks\.(\d+)\.hook_(?:normalized_)?resid_post")


def _same(a, b) -> bool:
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def _place(r) -> tuple[str, float | None]:
    """(kind, relative depth) of a row of a 2-block micro model, written out for the test."""
    if r["site"] in _EMBED:
        return "embed", 0.0
    if r["site"] == "-":
        return "-", None
    block = _BLOCK.fullmatch(r["site"])
    if block:
        return "resid_post", (int(block[1]) + 1) / 2
    assert r["site"] == f"blocks.{r['layer']}.attn", r["site"]
    return "attn", (r["layer"] + 1) / 2


def _key(r) -> tuple:
    return (r["probe"], r["metric"], r["method"], r["rank"], r["freq_bin"], *_place(r))


def _sweep(recipe: str, suite: str, out, extra=()) -> None:
    sets = [a for s in (f"suite.name='{suite}'", *TINY, *extra) for a in ("--set", s)]
    assert main(["sweep", "--recipe", recipe, "--out", str(out), *sets]) == 0


@pytest.mark.slow
def test_quickstart_against_mini_bert(units_env, tmp_path, capsys):
    decoder, encoder = tmp_path / "quickstart", tmp_path / "mini_bert"
    _sweep("quickstart", "micro-pythia", decoder, QUICKSTART_ONLY)
    _sweep("mini_bert", "micro-bert", encoder)
    capsys.readouterr()
    out = tmp_path / "compare"
    assert main(["compare", str(decoder), str(encoder), "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "tangent/control energy ratio" in shown and "Δln mini_bert" in shown
    assert "refused:" not in shown and "flagged:" not in shown  # the cut settings agree
    assert "percentile interval of the runs' paired bootstrap" in shown
    table = pq.read_table(out / "compare.parquet")
    assert table.equals(tangentlens.compare([decoder, encoder]).to_arrow())
    rows = table.to_pylist()

    own = {}
    for label, run in (("quickstart", decoder), ("mini_bert", encoder)):
        assert json.loads((run / "manifest.json").read_text())["n_layers"] == 2
        last = [r for r in read_results(run).to_pylist() if r["step"] == 40]
        own[label] = {_key(r): r for r in last}
        assert len(own[label]) == len(last)
    shared = own["quickstart"].keys() & own["mini_bert"].keys()
    assert {k[0] for k in own["quickstart"].keys() - shared} >= {"update_alignment"}
    # each run's rows: exactly the shared keys, every field its own row's
    for label in own:
        mine = [r for r in rows if r["run"] == label]
        assert {_key(r) for r in mine} == shared and len(mine) == len(shared)
        for r in mine:
            assert all(_same(r[f], own[label][_key(r)][f]) for f in SCHEMA.names), _key(r)
    # the differences: B − A, ln B − ln A for ratios
    differences = [r for r in rows if r["run"] == "mini_bert − quickstart"]
    assert len(differences) == len(shared)
    for r in differences:
        key = (r["probe"], r["metric"], r["method"], r["rank"], r["freq_bin"], r["site_kind"])
        key += (r["relative_depth"],)
        a, b = own["quickstart"][key]["value"], own["mini_bert"][key]["value"]
        if r["metric"].endswith("_ratio"):  # energy_enrichment has its own null: a difference
            want = math.log(b) - math.log(a) if a > 0 and b > 0 else math.nan
            assert r["difference"] == "log_ratio"
        else:
            want = b - a
            assert r["difference"] == "difference"
        assert _same(r["value"], want), key
        # an interval from both runs' stored replicates where both rows have one, else none
        both = all(own[label][key]["ci_low"] is not None for label in own)
        if both and math.isfinite(r["value"]):
            assert r["metric"] in ("energy_fraction", "energy_ratio", "energy_complement_ratio")
            assert r["ci_low"] <= r["value"] <= r["ci_high"], key
        else:
            assert r["ci_low"] is None and r["ci_high"] is None, key
    assert any(r["ci_low"] is not None for r in differences)
    for run in (decoder, encoder):
        assert read_replicates(run).num_rows == sum(
            r["ci_low"] is not None for r in read_results(run).to_pylist()
        )
    ratios = {
        (r["method"], r["relative_depth"])
        for r in differences
        if r["metric"] == "energy_ratio" and r["freq_bin"] == "all"
    }
    assert ratios == {(m, d) for m in ("mean_direction", "pca", "seminmf") for d in (0, 0.5, 1)}
    for name in ("energy_ratio", "anisotropy_depth", "frequency_correlation"):
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000
