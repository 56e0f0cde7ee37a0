"""The boundaries of the core's smaller decisions, by value: the proxies stage's width bounds
(rank below d, an SAE's active latents among its 8·d), the published SAEs' reservoir, the
recipe sections' refusals at their first bad and last good value, what the identity leaves
out, the host budget, the capture loss of each family and each probe's view of a saved step
state."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from tangentlens.core import memory
from tangentlens.core.bounds import SAE_EXPANSION, check_width, stage_width_bounds
from tangentlens.core.data import capture_loss
from tangentlens.core.recipe import (
    CaptureSpec,
    DataSpec,
    ExecutorSpec,
    ProxiesSpec,
    Recipe,
    SuiteSpec,
)
from tangentlens.core.states import own_view
from tangentlens.dictionaries.proxy_config import PretrainedSAESpec
from tangentlens.registry import resolve


def _recipe(stage: ProxiesSpec | None = None, **sections) -> Recipe:
    probe = resolve("cosine_drift")  # no width bounds of its own
    return Recipe("r", probes={"cosine_drift": probe.config()}, proxies=stage, **sections)


def test_the_stage_bounds_the_rank_below_the_width():
    check_width(_recipe(ProxiesSpec(methods=("pca",), rank=7)), 8, "the model (d_model = 8)")
    with pytest.raises(ValueError) as error:
        check_width(_recipe(ProxiesSpec(methods=("pca",), rank=8)), 8, "the model (d_model = 8)")
    assert str(error.value) == (
        "the model (d_model = 8): proxies.rank = 8 is out of range: a dictionary's rank is "
        "below d = 8; allowed: 1 … 7"
    )
    assert stage_width_bounds(_recipe(), 8) == []


def test_an_sae_proxys_active_latents_are_among_its_latents():
    assert SAE_EXPANSION == 8
    check_width(_recipe(ProxiesSpec(methods=("sae",), rank=2, sae_k=64)), 8, "m")
    with pytest.raises(ValueError) as error:
        check_width(_recipe(ProxiesSpec(methods=("sae",), rank=2, sae_k=65)), 8, "m")
    assert str(error.value) == (
        "m: proxies.sae_k = 65 is out of range: an SAE proxy's active latents are among its "
        "d_sae = 8·d = 64; allowed: 1 … 64"
    )
    # no SAE among the methods: no bound on its latents
    check_width(_recipe(ProxiesSpec(methods=("pca",), rank=2, sae_k=65)), 8, "m")
    keys = [b.key for b in stage_width_bounds(_recipe(ProxiesSpec(methods=("pca",))), 8)]
    assert keys == ["proxies.rank"]


def test_published_saes_need_one_sampled_row_at_least():
    stage = ProxiesSpec(pretrained_sae=PretrainedSAESpec("r", ("a",)))
    assert _recipe(stage, capture=CaptureSpec(reservoir=1)).capture.reservoir == 1
    with pytest.raises(ValueError, match=r"set capture\.reservoir ≥ 1$"):
        _recipe(stage, capture=CaptureSpec(reservoir=0))
    assert _recipe(ProxiesSpec(), capture=CaptureSpec(reservoir=0)).capture.reservoir == 0


def test_a_recipe_without_probes_is_refused_naming_them():
    with pytest.raises(ValueError, match=r"^the recipe enables no probe; allowed: \['"):
        Recipe("r", probes={})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: DataSpec(seq_len=3), "data.seq_len must be ≥ 4, got 3"),
        (lambda: DataSpec(batch_size=0), "data.batch_size must be an integer ≥ 1, got 0"),
        (lambda: DataSpec(n_bins=0), "data.n_bins must be an integer ≥ 1, got 0"),
        (lambda: CaptureSpec(reservoir=-1), "capture.reservoir must be an integer ≥ 0, got -1"),
        (lambda: CaptureSpec(passes=-1), "capture.passes must be an integer ≥ 0, got -1"),
        (lambda: CaptureSpec(threads=0), "capture.threads must be an integer ≥ 1, got 0"),
        (lambda: CaptureSpec(sites=("resid_posts",)), "capture.sites: unknown site kind"),
        (lambda: CaptureSpec(reduction="mean"), "capture.reduction must be 'sum', got 'mean'"),
        (lambda: CaptureSpec(layers="every:0"), "capture.layers: cannot read 'every:0'"),
        (lambda: SuiteSpec(device="cpu:0"), "suite.device must be one of"),
        (lambda: SuiteSpec(device="tpu"), "suite.device must be one of"),
        (lambda: SuiteSpec(dtype="float64"), "suite.dtype must be one of"),
        (lambda: SuiteSpec(loader="hookd"), "suite.loader must be one of"),
        (lambda: ExecutorSpec(time_min=0), "executor.time_min must be an integer ≥ 1, got 0"),
        (lambda: ExecutorSpec(sbatch={"x": 1.5}), "executor.sbatch.x must be a string or"),
        (lambda: ExecutorSpec(sbatch={"x": True}), "executor.sbatch.x must be a string or"),
    ],
)
def test_each_section_refuses_its_first_bad_value(make, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        make()


def test_each_section_takes_its_last_good_value():
    assert DataSpec(seq_len=4, batch_size=1, n_bins=1, max_tokens=1).seq_len == 4
    capture = CaptureSpec(reservoir=0, passes=0, threads=1, layers="every:1")
    assert (capture.reservoir, capture.passes, capture.threads) == (0, 0, 1)
    assert SuiteSpec(device="cuda:1").device == "cuda:1"
    assert SuiteSpec(device="auto", dtype="float16", loader="bridge").dtype == "float16"
    executor = ExecutorSpec(workers=0, retries=0, array_parallelism=0, sbatch={"a": "b", "n": 2})
    assert executor.sbatch == {"a": "b", "n": 2}


def test_the_identity_leaves_out_the_passes_and_a_float64_precision():
    plain = _recipe().to_dict()
    assert "passes" not in plain["capture"] and "precision" not in plain["capture"]
    assert "proxies" not in plain
    f32 = _recipe(capture=CaptureSpec(precision="float32", passes=3)).to_dict()
    assert f32["capture"]["precision"] == "float32" and "passes" not in f32["capture"]
    staged = _recipe(ProxiesSpec(rank=3)).to_dict()
    assert staged["proxies"] == dataclasses.asdict(ProxiesSpec(rank=3))


def test_the_host_budget(monkeypatch):
    def recipe(**executor):
        return _recipe(executor=ExecutorSpec(**executor))

    assert memory.host_budget(recipe(memory_gb=1.5)) == int(1.5 * memory.GIB)
    here = memory.host_budget(recipe())  # this machine's physical memory: whole pages
    assert isinstance(here, int) and here >= 256 * 2**20 and here % os.sysconf("SC_PAGE_SIZE") == 0
    assert memory.host_budget(recipe(kind="submitit-local")) == here
    assert memory.host_budget(recipe(kind="slurm")) is None
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert memory.host_budget(recipe(kind="ray")) == here
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert memory.host_budget(recipe(kind="ray")) is None


def test_the_capture_loss_of_each_family():
    assert capture_loss("encoder", True) == "mlm"
    assert capture_loss("decoder", True) == "next_token"
    assert capture_loss("encoder", False) == capture_loss("decoder", False) == "none"


def test_each_probe_reads_the_shared_keys_and_its_own_state():
    from tangentlens.contract import Transition
    from tangentlens.results import StepLabel

    shared = {"step": 4, "layers": {"b": 0}, "tokens_seen": 40, "proxies": None}
    now = {**shared, "extra": 1, "states": {"a": {"x": 1}, "b": {"y": 2}}}
    before = {"step": 2, "x": 0}  # written before the namespaces: read as it was
    label = StepLabel("s", 4, 40, {"b": 0})
    transition = Transition(label, before, now, None, False)
    seen = own_view(transition, "a")
    assert seen.now == {**shared, "x": 1} and seen.before is before
    assert seen.label is label and seen.scoring is None and seen.in_window is False
    assert own_view(transition, "c").now == shared  # a probe that kept nothing
    assert transition.now is now  # the saved state is not changed
    both = Transition(label, {"step": 2, "states": {"a": {"x": 0}}}, now, None, True)
    assert own_view(both, "a").before == {"step": 2, "x": 0}


def test_the_capture_request_keeps_bins_and_rows_only_for_whoever_reads_them():
    from tangentlens.capture.needs import Needs
    from tangentlens.core.resolve import _capture_request

    recipe = _recipe(capture=CaptureSpec(reservoir=7), data=DataSpec(n_bins=3))
    plain = _capture_request(recipe, {"c": Needs()}, frozen=False)
    assert (plain.n_bins, plain.reservoir, plain.sequence_sums) == (0, 0, False)
    wanted = _capture_request(recipe, {"c": Needs(bins=True, reservoir=True)}, frozen=False)
    assert (wanted.n_bins, wanted.reservoir) == (3, 7)
    staged = _recipe(ProxiesSpec(), capture=CaptureSpec(reservoir=7))
    fits = _capture_request(staged, {"c": Needs()}, frozen=False)
    assert fits.reservoir == 7  # the proxy fits sample rows
