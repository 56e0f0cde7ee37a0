"""CheckpointSuite over the three kinds: mini suites, local folders, Pythia through the HF cache."""

import shutil

import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformer
from transformers import BertForMaskedLM, GPTNeoXForCausalLM

from tangentlens.models.catalog import suite_steps
from tangentlens.models.schedule import PYTHIA_STEPS
from tangentlens.models.suites import LocalSuite, PythiaSuite, ensure_mini_suite, open_suite


def test_mini_decoder_suite_loads_with_hf_parity(micro_pythia):
    step = micro_pythia.steps[-1]
    model = micro_pythia.load(step)
    assert isinstance(model, HookedTransformer)
    assert model.tokenizer is not None
    hf = GPTNeoXForCausalLM.from_pretrained(micro_pythia.folder(step)).eval()
    tokens = torch.randint(
        0, hf.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ours = model(tokens)
        reference = hf(tokens).logits
    assert (ours - reference).abs().max().item() <= 1e-4


def test_mini_encoder_suite_loads_as_hooked_encoder(micro_bert):
    step = micro_bert.steps[-1]
    model = micro_bert.load(step)
    assert isinstance(model, HookedEncoder)
    hf = BertForMaskedLM.from_pretrained(micro_bert.folder(step)).eval()
    tokens = torch.randint(
        5, hf.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ours = model(tokens)
        reference = hf(tokens).logits
    assert (ours - reference).abs().max().item() <= 1e-4


def test_mini_suite_analysis_corpus_is_the_heldout_split(micro_pythia):
    heldout = micro_pythia.analysis_corpus()
    assert heldout.name.endswith("heldout")
    assert len(heldout.documents) == micro_pythia.metadata["data"]["heldout_documents"]


def test_local_suite_reads_steps_tokens_and_finds_identical_checkpoints(micro_pythia, tmp_path):
    root = tmp_path / "suite"
    root.mkdir()
    for step in (0, 10, 20):
        shutil.copytree(micro_pythia.folder(step), root / f"checkpoint-{step}")
    shutil.copytree(micro_pythia.folder(20), root / "step30")  # an identical re-save
    suite = LocalSuite(root, tokens_per_step=100)
    assert suite.steps == (0, 10, 20, 30)
    assert suite.tokens_seen(30) == 3000
    assert suite.family == "decoder"
    duplicates = suite.duplicate_steps()
    assert [(d.previous, d.step) for d in duplicates] == [(20, 30)]
    assert suite.select("log:2") == [0, 30]
    assert LocalSuite(root).tokens_seen(10) is None  # no suite.json, no argument: unknown


def test_local_suite_errors_name_the_problem(micro_pythia, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LocalSuite(tmp_path / "missing")
    with pytest.raises(ValueError, match="no checkpoints found"):
        LocalSuite(tmp_path)
    root = tmp_path / "broken"
    shutil.copytree(micro_pythia.folder(10), root / "step10")
    weights = root / "step10" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    suite = LocalSuite(root)
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        suite.load(10)
    with pytest.raises(ValueError, match="not a checkpoint"):
        suite.load(11)


def test_pythia_suite_schedule_and_validation():
    suite = PythiaSuite("EleutherAI/pythia-160m", offline=True)
    assert suite.steps == PYTHIA_STEPS
    assert suite.tokens_seen(1000) == 1000 * 2_097_152
    with pytest.raises(ValueError, match="nearest"):
        suite.tokens_seen(1500)
    with pytest.raises(ValueError, match="pythia-160m"):
        PythiaSuite("EleutherAI/pythia-999m")


def test_pythia_suite_loads_cached_revisions_offline(fake_hf_cache):
    suite = PythiaSuite("EleutherAI/pythia-14m", offline=True)
    first, later = suite.load(0), suite.load(1000)
    tokens = torch.arange(16).unsqueeze(0)
    with torch.no_grad():
        assert not torch.allclose(first(tokens), later(tokens))
    assert suite.weights_hash(0) != suite.weights_hash(1000)
    assert suite.weights_hash(2000) is None  # not cached: nothing to hash
    with pytest.raises(ValueError, match="step2000"):
        suite.load(2000)


def test_open_suite_specs(micro_pythia):
    assert isinstance(open_suite(f"local:{micro_pythia.root}"), LocalSuite)
    assert isinstance(open_suite(str(micro_pythia.root)), LocalSuite)
    assert isinstance(open_suite("EleutherAI/pythia-70m", offline=True), PythiaSuite)
    assert isinstance(open_suite("pythia:EleutherAI/pythia-70m", offline=True), PythiaSuite)
    with pytest.raises(ValueError, match="mini-pythia"):
        open_suite("gpt2")


def test_suite_steps_are_the_opened_suites_steps(micro_pythia, tmp_path, monkeypatch):
    assert suite_steps(str(micro_pythia.root)) == micro_pythia.steps
    assert suite_steps(f"local:{micro_pythia.root}") == micro_pythia.steps
    assert suite_steps("pythia:EleutherAI/pythia-70m") == PYTHIA_STEPS
    assert suite_steps("EleutherAI/pythia-70m") == open_suite("EleutherAI/pythia-70m").steps
    # the steps a trained mini suite finds on disk are the ones its config predicts
    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path))
    assert suite_steps("micro-pythia") == open_suite("micro-pythia").steps


@pytest.mark.parametrize("name", ["mini-pythia", "mini-bert"])
def test_suite_steps_of_a_trained_mini_suite(name):
    try:
        suite = ensure_mini_suite(name, train=False)
    except ValueError:
        pytest.skip(f"{name} is not trained in this cache")
    assert suite_steps(name) == suite.steps


def test_suite_steps_errors_are_open_suites(tmp_path):
    (tmp_path / "empty").mkdir()
    folders = [str(tmp_path / "missing"), str(tmp_path / "empty")]
    for spec in ("gpt2", "pythia:EleutherAI/pythia-999m", *folders):
        with pytest.raises(ValueError) as ours:
            suite_steps(spec)
        with pytest.raises(ValueError) as theirs:
            open_suite(spec, offline=True)
        assert str(ours.value) == str(theirs.value)
