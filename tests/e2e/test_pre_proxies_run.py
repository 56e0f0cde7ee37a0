"""A run directory written before the ``[proxies]`` stage (tests/fixtures/pre_proxies_run: made by
e6a78c2 from its ``recipe.toml``, tangent settings under ``[probes.tangent_energy]``, the figures
left out) resumes with nothing recomputed — from its own recipe and from the same recipe in the
new layout — and reports."""

from __future__ import annotations

import shutil
from pathlib import Path

from tangentlens.cli import main

PRE = Path(__file__).parents[1] / "fixtures" / "pre_proxies_run"

#: The fixture's recipe in the new layout: the stage's keys in ``[proxies]``.
NEW_LAYOUT = """
[suite]
name = "micro-pythia"
steps = "0,40"
[data]
corpus = "analysis"
seq_len = 32
max_tokens = 1024
batch_size = 16
n_bins = 3
[capture]
sites = ["resid_post"]
embed = true
reservoir = 64
threads = 1
[proxies]
methods = ["seminmf", "pca"]
rank = 4
fit_policy = "frozen_early"
window_checkpoints = 2
draws = 20
[probes.cosine_drift]
[probes.tangent_energy]
bootstrap = 20
[probes.anisotropy_share]
isoscore_draws = 3
[probes.subspace_stability]
seeds = 2
[probes.update_alignment]
draws = 20
"""


def _outputs(run: Path) -> dict[str, bytes]:
    """Every unit output (results, saved state) by path."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for folder in ("results", "state")
        for p in sorted((run / folder).rglob("*"))
        if p.is_file()
    }


def test_a_run_from_before_the_stage_resumes_with_nothing_recomputed_and_reports(
    units_env, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(PRE / "run", run)
    before = _outputs(run)
    new_layout = tmp_path / "new" / "recipe.toml"  # the same name: part of the identity
    new_layout.parent.mkdir()
    new_layout.write_text(NEW_LAYOUT)
    for recipe in (PRE / "recipe.toml", new_layout):
        plan_only = ["sweep", "--recipe", str(recipe), "--out", str(run), "--plan-only"]
        assert main(plan_only) == 0
        shown = capsys.readouterr().out
        assert "step-<step> × 2         after data, fit-proxies           2/2 done" in shown
        assert "0 s for the 0 unit(s) not done" in shown
        assert main(["sweep", "--recipe", str(recipe), "--out", str(run), "--resume"]) == 0
        assert "7 of 7 units already in" in capsys.readouterr().out
        assert _outputs(run) == before  # every output kept as it was, none added
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "energy ratio [95 % CI], p-value" in out and "cosine anisotropy" in out
    assert (run / "figures" / "tangent_energy.png").read_bytes().startswith(b"\x89PNG")
