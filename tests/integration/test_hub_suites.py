"""The hub catalogue's suites (OLMo, SmolLM2, Gaperon, EuroBERT, ModernCamemBERT) through fake hub
caches at their published widths: specs, steps and tokens without opening them, offline refusal
of uncached revisions with the fetch command, verify, and a decoder revision through the bridge
into ``tangentlens.measure``."""

from __future__ import annotations

import pytest
import torch

import tangentlens as tl
from tangentlens.models.catalog import parse_suite_spec, suite_family, suite_loader, suite_steps
from tangentlens.models.hub_suites import HUB_ALIASES, HUB_SUITES
from tangentlens.models.shapes import suite_shape
from tangentlens.models.suites import CatalogueSuite, HubSuite, PythiaSuite, open_suite
from tests.integration.conftest import scratch_dir, use_hub_cache
from tests.integration.fake_hub import write_fake_hub

OLMO = "allenai/OLMo-1B-hf"
SMOL = "HuggingFaceTB/SmolLM2-360M-intermediate-checkpoints"
EUROBERT = "EuroBERT/EuroBERT-210m"


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory):
    """A hub cache with OLMo-1B-hf at steps 1000 and 10000, SmolLM2-360M at 160000 and
    320000 (one block each, published widths) and EuroBERT-210m's main (1.8 GB, removed after
    the module)."""
    with scratch_dir(tmp_path_factory, "catalogue-hub") as root:
        hub = root / "hub"
        write_fake_hub(hub, OLMO, {1000: 0, 10000: 1})
        write_fake_hub(hub, SMOL, {160_000: 0, 320_000: 1})
        write_fake_hub(hub, EUROBERT, {1: 0})
        yield hub


@pytest.fixture
def hub(hub_dir, monkeypatch):
    """huggingface_hub pointed at the fake cache, sockets refused."""
    return use_hub_cache(monkeypatch, hub_dir)


def test_specs_name_a_suite_by_hub_id_short_name_or_prefix():
    for spec in (OLMO, "olmo-1b", f"hub:{OLMO}", "hub:olmo-1b"):
        assert parse_suite_spec(spec) == ("hub", OLMO)
    assert set(HUB_ALIASES.values()) == set(HUB_SUITES)
    with pytest.raises(ValueError, match=r"need the hf_olmo package .*'allenai/OLMo-1B-hf'"):
        parse_suite_spec("allenai/OLMo-1B")
    with pytest.raises(ValueError) as error:
        parse_suite_spec("gpt2")
    for form in ("mini-pythia", "pythia:EleutherAI/pythia-160m", "hub:allenai/OLMo-1B-hf",
                 "smollm2-360m", "local:/path/to/folder"):  # fmt: skip
        assert form in str(error.value)


def test_steps_tokens_families_and_loaders_without_opening():
    assert suite_steps("smollm2-360m") == tuple(range(160_000, 2_560_001, 160_000))
    assert suite_steps("smollm2-1.7b")[-1] == 5_125_000
    assert suite_family(OLMO) == "decoder" and suite_family("eurobert-210m") == "encoder"
    assert suite_loader(OLMO) == "bridge" and suite_loader("eurobert-210m") == "hf"
    with pytest.raises(ValueError, match="load only through loader 'hf'"):
        suite_loader("eurobert-210m", "bridge")
    shape = suite_shape("smollm2-360m")
    assert (shape.family, shape.d_model, shape.n_heads, shape.n_kv_heads) == ("llama", 960, 15, 5)
    suite = open_suite(SMOL, offline=True)
    assert isinstance(suite, CatalogueSuite) and isinstance(suite, HubSuite)
    assert suite.tokens_seen(320_000) == 320_000 * 1_572_864
    assert suite.revision(2_560_000) == "step-2560000"
    assert open_suite("gaperon-1.5b", offline=True).tokens_seen(1) is None
    assert issubclass(PythiaSuite, HubSuite)


def test_olmo_revision_names_carry_their_step_and_about_its_tokens():
    """The names are the publisher's: ``step{N}-tokens{M}B`` with M at most 2B under N × 4,194,304
    (floored from a slightly smaller count, so listed rather than computed)."""
    entry = HUB_SUITES[OLMO]
    for step, name in entry.revisions:
        prefix, tokens = name.removesuffix("B").split("-tokens")
        assert prefix == f"step{step}"
        assert 0 <= step * entry.tokens_per_step / 1e9 - int(tokens) < 2.0
    assert entry.revision(738_020) == "step738020-tokens3094B"


def test_catalogue_entries_are_consistent():
    for hub_id, entry in HUB_SUITES.items():
        assert entry.hub_id == hub_id and entry.family in ("decoder", "encoder")
        assert entry.loader == ("bridge" if entry.family == "decoder" else "hf")
        assert entry.source and (entry.verified or entry.note)


def test_an_offline_suite_refuses_uncached_revisions_with_the_fetch_command(hub):
    suite = open_suite("olmo-1b", offline=True)
    suite.check_available([1000, 10000])
    with pytest.raises(ValueError) as caught:
        suite.check_available([1000, 20000, 40000])
    message = str(caught.value)
    assert f"{OLMO} at step(s) 20000, 40000 is not in the local" in message
    assert f"hf download {OLMO} --revision step20000-tokens83B" in message
    with pytest.raises(ValueError, match=r"`hf download .* --revision step20000-tokens83B`"):
        suite.load(20000)


def test_verify_checks_cached_revisions_and_reports_the_others(hub):
    report = open_suite(SMOL, offline=True).verify([160_000, 320_000])
    assert report.damaged == {} and report.config_differs == {} and report.duplicates == []
    assert report.not_checked == [2_560_000]
    suite = open_suite(SMOL, offline=True)
    assert suite.weights_hash(160_000) != suite.weights_hash(320_000) is not None
    assert suite.weights_hash(480_000) is None


def test_a_decoder_revision_loads_through_the_bridge_and_is_measured(hub):
    suite = open_suite("smollm2-360m", offline=True)
    model = suite.load(320_000)
    assert type(model).__name__ == "TransformerBridge"
    assert model.cfg.checkpoint_value == 320_000
    tokens = torch.randint(3, 300, (4, 12), generator=torch.Generator().manual_seed(0))
    table = tl.measure(model, tokens, probes=["cosine_drift"], n_bins=1, step=320_000)
    rows = table.where(metric="cosine_anisotropy").to_pylist()
    assert {row["site"] for row in rows} == {"blocks.0.hook_resid_post"}
    assert all(row["step"] == 320_000 for row in rows)


def test_olmo_loads_through_the_bridge_only(hub):
    suite = open_suite(OLMO, offline=True)
    with pytest.raises(ValueError, match="model type 'olmo' load only through loader 'bridge'"):
        suite.load(1000, loader="hooked")
    bridge = suite.load(1000)
    tokens = torch.randint(3, 300, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(bridge(tokens)).all()


def test_an_encoder_revision_loads_through_the_hf_loader(hub):
    from tangentlens.models.loading import load_local_checkpoint

    suite = open_suite("eurobert-210m", offline=True)
    folder = suite.snapshot(1)
    model = load_local_checkpoint(folder, loader="hf")
    assert suite.load(1).cfg.checkpoint_value == 1
    tokens = torch.randint(5, 300, (2, 8), generator=torch.Generator().manual_seed(0))
    table = tl.measure(model, tokens, probes=["cosine_drift"], n_bins=1)
    assert table.where(metric="cosine_anisotropy").to_pylist()


def test_the_suite_command_shows_revisions_sources_and_unverified_entries(hub, capsys):
    from tangentlens.cli import main

    # the fake revisions hold one block where SmolLM2-360M has 32: not its checkpoints
    assert main(["suite", "smollm2-360m", "--offline", "--steps", "160000,320000", "--verify"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "verified:" in out and "1,572,864 tokens per step" in out and "step-320000" in out
    assert "config.json at steps 160000, 320000 is not the suite's published config" in out
    assert "num_hidden_layers 1 (published 32)" in out and "not checked: steps 2560000" in out
    assert "checkpoints verified" not in out
    assert main(["suite", "gaperon-1.5b", "--offline"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "UNVERIFIED" in out and "not confirmed offline" in out
    assert main(["suite", "allenai/OLMo-1B"]) == 2
    assert "need the hf_olmo package" in " ".join(capsys.readouterr().err.split())


#: The suites without a fixture above, at their first catalogued step: a one-block fake at the
#: published width, heads and MLP with a 512-entry vocabulary (Gaperon's and EuroBERT's 128,256
#: embeddings alone would take over a gigabyte), opened offline and run through their loader.
OTHER_SUITES = sorted(set(HUB_SUITES) - {OLMO, SMOL, EUROBERT})


@pytest.mark.parametrize("hub_id", OTHER_SUITES)
def test_every_other_catalogue_suite_opens_offline_and_measures_through_its_loader(
    hub_id, tmp_path, monkeypatch
):
    use_hub_cache(monkeypatch, tmp_path)
    entry = HUB_SUITES[hub_id]
    step = entry.steps[0]
    suite = open_suite(hub_id, offline=True)
    with pytest.raises(ValueError, match=f"hf download {hub_id} --revision {entry.revision(step)}"):
        suite.check_available([step])  # nothing cached yet
    write_fake_hub(tmp_path, hub_id, {step: 0}, vocab=512)
    suite.check_available([step])
    report = suite.verify([step])
    assert report.damaged == {} and report.config_differs == {} and step not in report.not_checked
    model = suite.load(step)
    expected = "TransformerBridge" if entry.loader == "bridge" else "HfLens"
    assert type(model).__name__ == expected and suite_loader(hub_id) == entry.loader
    tokens = torch.randint(5, 300, (2, 8), generator=torch.Generator().manual_seed(0))
    table = tl.measure(model, tokens, probes=["cosine_drift"], n_bins=1, step=step)
    rows = table.where(metric="cosine_anisotropy").to_pylist()
    assert {row["site"] for row in rows} == {"blocks.0.hook_resid_post"}
    assert all(0 < row["value"] <= 1 for row in rows)
