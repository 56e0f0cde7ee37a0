"""CheckpointSuite over the three kinds: mini suites, local folders, Pythia through the HF cache."""

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformer
from transformers import BertForMaskedLM, GPTNeoXForCausalLM

from tangentlens.models.catalog import suite_steps
from tangentlens.models.schedule import PYTHIA_STEPS
from tangentlens.models.suites import LocalSuite, PythiaSuite, ensure_mini_suite, open_suite
from tests.numerics import assert_float64_parity, hugging_face_in_float64, share_rotary_tables


def test_mini_decoder_suite_loads_with_hf_parity(micro_pythia):
    """Logits of the hooked model and Hugging Face's, both in float64, within float64
    rounding (in float32 they differ by float32 rounding in another order: no CPU-independent
    tolerance; :mod:`tests.numerics`)."""
    step = micro_pythia.steps[-1]
    model = micro_pythia.load(step, dtype=torch.float64)
    assert isinstance(model, HookedTransformer)
    assert model.tokenizer is not None
    hf = GPTNeoXForCausalLM.from_pretrained(micro_pythia.folder(step), dtype=torch.float64).eval()
    tokens = torch.randint(
        0, hf.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad(), hugging_face_in_float64(hf):
        share_rotary_tables(model, hf.base_model.rotary_emb, tokens.shape[1])
        ours = model(tokens)
        reference = hf(tokens).logits
    assert_float64_parity(ours, reference, "logits")


def test_mini_encoder_suite_loads_as_hooked_encoder(micro_bert):
    """As the decoder: float64 on both sides, within float64 rounding."""
    step = micro_bert.steps[-1]
    model = micro_bert.load(step, dtype=torch.float64)
    assert isinstance(model, HookedEncoder)
    hf = BertForMaskedLM.from_pretrained(micro_bert.folder(step), dtype=torch.float64).eval()
    tokens = torch.randint(
        5, hf.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad(), hugging_face_in_float64(hf):
        ours = model(tokens)
        reference = hf(tokens).logits
    assert_float64_parity(ours, reference, "logits")


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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mini-pythia", "mini-bert"])
def test_suite_steps_of_a_trained_mini_suite(name):
    """A default suite, trained once per test run (``tests/conftest.py``)."""
    assert suite_steps(name) == ensure_mini_suite(name).steps


def test_suite_steps_errors_are_open_suites(tmp_path):
    (tmp_path / "empty").mkdir()
    folders = [str(tmp_path / "missing"), str(tmp_path / "empty")]
    for spec in ("gpt2", "pythia:EleutherAI/pythia-999m", *folders):
        with pytest.raises(ValueError) as ours:
            suite_steps(spec)
        with pytest.raises(ValueError) as theirs:
            open_suite(spec, offline=True)
        assert str(ours.value) == str(theirs.value)


def _copy_suite(micro_pythia, root, layout):
    """A local suite folder: ``layout`` maps a folder name to the micro suite's step it copies."""
    root.mkdir()
    for name, step in layout.items():
        shutil.copytree(micro_pythia.folder(step), root / name)
    return root


def test_verify_finds_duplicates_over_all_pairs_damage_and_config_changes(micro_pythia, tmp_path):
    layout = {"step0": 0, "step10": 10, "step20": 20, "step30": 0, "step40": 40}
    root = _copy_suite(micro_pythia, tmp_path / "suite", layout)
    suite = LocalSuite(root)
    report = suite.verify()
    # step 30 re-serves step 0's weights: not consecutive, still found
    assert [(d.previous, d.step) for d in report.duplicates] == [(0, 30)]
    assert report.damaged == {} and report.config_differs == {} and report.not_checked == []
    assert [(d.previous, d.step) for d in suite.duplicate_steps([10, 30])] == []
    assert [(d.previous, d.step) for d in suite.duplicate_steps([0, 30])] == [(0, 30)]
    weights = root / "step20" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    config = json.loads((root / "step40" / "config.json").read_text())
    (root / "step40" / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    report = LocalSuite(root).verify()
    assert list(report.damaged) == [20] and "truncated" in report.damaged[20]
    width = config["hidden_size"]
    assert report.config_differs == {"hidden_size": {0: width, 10: width, 30: width, 40: 64}}
    lines = report.problems()
    assert (
        lines[0].startswith("checkpoint at step 20 is damaged") and "model.safetensors" in lines[0]
    )
    assert (
        f"'hidden_size' differs across checkpoints: {width} at steps 0, 10, 30; 64 at step 40"
        in lines[1]
    )


def _poison(folder: Path, name: str, value: float, dtype: torch.dtype | None = None) -> None:
    """Set one value of the weight ``name`` in ``folder``'s safetensors to ``value``."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    weights = load_file(path)
    if dtype is not None:
        weights = {k: v.to(dtype) for k, v in weights.items()}
    weights[name].view(-1)[0] = value
    save_file(weights, path, metadata={"format": "pt"})


WEIGHT = "gpt_neox.layers.0.attention.dense.weight"


def test_a_nan_weight_is_named_by_the_integrity_check_when_loaded_and_before_a_sweep(
    micro_pythia, tmp_path, capsys
):
    """A NaN in one checkpoint's weights: named by its parameter where the suite's files are
    read (``verify``, which a sweep runs before any unit), and when it is loaded — not later as
    non-finite activations at some site."""
    from tangentlens.cli import main

    root = _copy_suite(micro_pythia, tmp_path / "suite", {"step0": 0, "step10": 10})
    _poison(root / "step10", WEIGHT, float("nan"))
    (line,) = LocalSuite(root).verify().problems()
    assert line.startswith("checkpoint at step 10 is damaged: weights in ")
    assert f"(model.safetensors): parameter {WEIGHT} holds 1 non-finite value(s)" in line
    with pytest.raises(ValueError, match=f"parameter {WEIGHT} holds 1 non-finite value"):
        LocalSuite(root).load(10)
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[suite]\nname = "{root}"\nsteps = "all"\n\n[data]\nseq_len = 32\nmax_tokens = 512\n'
        '\n[capture]\nsites = ["resid_post"]\n\n[probes.cosine_drift]\n'
    )
    out = tmp_path / "run"
    assert main(["sweep", "--recipe", str(recipe), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"parameter {WEIGHT} holds 1 non-finite" in error and "activations" not in error
    assert not out.exists()  # refused before any unit ran


def test_a_half_precision_overflow_names_the_dtype_when_loaded(micro_pythia, tmp_path):
    folder = tmp_path / "step10"
    shutil.copytree(micro_pythia.folder(10), folder)
    _poison(folder, WEIGHT, float("inf"), dtype=torch.float16)
    from tangentlens.models.loading import load_local_checkpoint

    with pytest.raises(ValueError, match=f"{WEIGHT} holds 1 non-finite .* stored in float16"):
        load_local_checkpoint(folder, dtype=torch.float16)


def test_two_folders_naming_one_step_are_an_error_naming_both(micro_pythia, tmp_path):
    root = _copy_suite(micro_pythia, tmp_path / "suite", {"step1": 1, "checkpoint-1": 1})
    with pytest.raises(
        ValueError, match=r"two checkpoint folders name step 1 .*checkpoint-1/ and step1/"
    ):
        LocalSuite(root)


def test_hub_snapshots_are_compared_by_the_blob_digests_the_cache_names(tmp_path):
    """Revisions whose snapshot links point at the same blob are identical, without reading the
    blob: the digest is the SHA-256 the cache names it by."""
    from safetensors.torch import save_file

    from tangentlens.models.weights import weights_hash

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    names = {}
    for seed in (0, 1):
        staging = tmp_path / f"w{seed}.safetensors"
        save_file({"w": torch.full((4,), float(seed))}, staging)
        data = staging.read_bytes()
        names[seed] = hashlib.sha256(data).hexdigest()
        (blobs / names[seed]).write_bytes(data)
    snapshots = {}
    for revision, seed in (("a", 0), ("b", 0), ("c", 1)):
        snapshot = tmp_path / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (snapshot / "model.safetensors").symlink_to(Path("../../blobs") / names[seed])
        snapshots[revision] = snapshot
    digest = {r: weights_hash(s) for r, s in snapshots.items()}
    assert digest["a"] == digest["b"] != digest["c"]
    blob = blobs / names[0]
    blob.write_bytes(blob.read_bytes()[:-4] + bytes([0, 0, 0, 1]))  # same name, other bytes
    assert weights_hash(snapshots["a"]) == digest["a"]  # named, not re-hashed
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model.safetensors").write_bytes((blobs / names[1]).read_bytes())
    assert weights_hash(plain) != digest["c"]  # a local folder: its bytes are hashed


def test_pythia_revisions_sharing_a_blob_are_found_through_the_hub_cache(tmp_path, monkeypatch):
    """A hub cache laid out as huggingface_hub writes it (refs → snapshots → links into blobs/)
    where step2000 re-serves step0's weights blob: verify finds the pair from the blob names;
    the final revision, not cached, is reported as not checked."""
    from huggingface_hub import constants
    from safetensors.torch import save_file

    from tangentlens.models.shapes import pythia_config

    repo = tmp_path / "hub" / "models--EleutherAI--pythia-14m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    config = json.dumps(pythia_config("EleutherAI/pythia-14m"))  # the published one

    def blob(data: bytes) -> Path:
        path = repo / "blobs" / hashlib.sha256(data).hexdigest()
        path.write_bytes(data)
        return path

    weights = {}
    for seed in (0, 1):
        save_file({"w": torch.full((8,), float(seed))}, tmp_path / "w.safetensors")
        weights[seed] = blob((tmp_path / "w.safetensors").read_bytes())
    config_blob = blob(config.encode())
    for revision, seed in (("step0", 0), ("step1000", 1), ("step2000", 0)):
        commit = hashlib.sha1(revision.encode()).hexdigest()
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "model.safetensors").symlink_to(Path("../..") / "blobs" / weights[seed].name)
        (snapshot / "config.json").symlink_to(Path("../..") / "blobs" / config_blob.name)
        (repo / "refs" / revision).write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    suite = PythiaSuite("EleutherAI/pythia-14m", offline=True)
    report = suite.verify([0, 1000, 2000])
    assert [(d.previous, d.step) for d in report.duplicates] == [(0, 2000)]
    assert report.not_checked == [143000] and report.damaged == {} and not report.problems()
    assert suite.weights_hash(0) == suite.weights_hash(2000) != suite.weights_hash(1000)


def test_an_offline_sweep_names_uncached_revisions_and_how_to_fetch_them(fake_hf_cache):
    suite = PythiaSuite("EleutherAI/pythia-14m", offline=True)
    suite.check_available([0, 1000])  # both cached
    with pytest.raises(ValueError) as caught:
        suite.check_available([0, 2000, 3000])
    message = str(caught.value)
    assert "EleutherAI/pythia-14m at step(s) 2000, 3000 is not in the local" in message
    assert "hf download EleutherAI/pythia-14m --revision step2000" in message
    PythiaSuite("EleutherAI/pythia-14m", offline=False).check_available([2000])  # it would fetch


def test_an_offline_sweep_refuses_uncached_revisions_before_any_unit(
    fake_hf_cache, tmp_path, monkeypatch
):
    from tangentlens.core.recipe import load_recipe
    from tangentlens.sweep.runner import run_sweep

    recipe = load_recipe(
        "quickstart",
        [
            "suite.name='EleutherAI/pythia-14m'",
            "suite.offline=true",
            "suite.steps='0,2000'",
            "data.corpus='shakespeare'",
        ],
    )
    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path / "cache"))  # the commands' file
    with pytest.raises(ValueError, match=r"downloads this sweep needs are not in the local") as e:
        run_sweep(recipe, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    script = Path(re.search(r"every command is in (\S+) ", str(e.value)).group(1)).read_text()
    assert "hf download EleutherAI/pythia-14m --revision step2000\n" in script  # scored
    assert "--revision step0\n" not in script  # cached
