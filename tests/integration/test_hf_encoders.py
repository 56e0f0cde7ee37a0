"""The ``"hf"`` loader: EuroBERT and ModernBERT masked-LM encoders (which TransformerLens neither
converts nor bridges) run as the Hugging Face model itself, read through forward hooks. Tiny
random checkpoints laid out as local suites: every site is the module's tensor, the last block's
output is taken before the final norm, gradients are autograd of the model's own MLM loss,
probes give the values computed by hand, a sweep runs, and what this loader cannot do is refused
in one line.

The loader and a plain Hugging Face model are compared in float64 on both sides (the same
modules through another attention kernel and loss order: in float32 they differ by float32
rounding in another order, which no tolerance bounds on every CPU), with the parts Hugging Face
computes in float32 in any dtype run in float64 (:func:`tests.numerics.hugging_face_in_float64`),
within float64 rounding (:func:`tests.numerics.assert_float64_parity`)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    EuroBertConfig,
    EuroBertForMaskedLM,
    EuroBertModel,
    ModernBertConfig,
    ModernBertForMaskedLM,
)

import tangentlens as tl
from tangentlens.capture import CaptureConfig, capture_batch
from tangentlens.core.recipe import Recipe, SuiteSpec, load_recipe
from tangentlens.data import special_tokens_of
from tangentlens.models import lens_model, resolve_loader
from tangentlens.models.catalog import HF_MODEL_TYPES
from tangentlens.models.hf_lens import HF_ENCODERS, HfLens
from tangentlens.models.loading import load_local_checkpoint
from tangentlens.models.suites import LocalSuite
from tangentlens.probes.cosine_drift import CosineDriftConfig
from tangentlens.probes.qk_drift import QKDriftConfig
from tangentlens.sweep.runner import plan_sweep, run_sweep
from tangentlens.sweep.store import read_results
from tests.integration.conftest import TEXT, VOCAB, encoder_tokenizer
from tests.numerics import FLOAT64_PARITY, assert_float64_parity, hugging_face_in_float64

KINDS = ("eurobert", "modernbert")
SHAPE = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": VOCAB}  # fmt: skip
SITE_KINDS = ("embed", "resid_pre", "resid_post", "attn_out", "mlp_out")
F64 = torch.float64


def _model(kind: str, tokenizer, seed: int) -> torch.nn.Module:
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        "eos_token_id": tokenizer.sep_token_id,
    }
    torch.manual_seed(seed)
    if kind == "eurobert":
        config = EuroBertConfig(**SHAPE, **ids, head_dim=8, mask_token_id=tokenizer.mask_token_id)
        return EuroBertForMaskedLM(config)
    # three layers: global, sliding (a 16-token window, narrower than the rows), global
    config = ModernBertConfig(
        **SHAPE,
        **ids,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        local_attention=16,
        global_attn_every_n_layers=2,
    )
    return ModernBertForMaskedLM(config)


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    """``{kind: suite folder}``: step0/ and step1/ (different random weights), tokenizer each."""
    tokenizer = encoder_tokenizer()
    out = {}
    for kind in KINDS:
        root = tmp_path_factory.mktemp(f"{kind}-suite")
        for step in (0, 1):
            _model(kind, tokenizer, seed=step).save_pretrained(root / f"step{step}")
            tokenizer.save_pretrained(root / f"step{step}")
        out[kind] = root
    return out


def _tokens(tokenizer, shape=(3, 32), seed=0) -> torch.Tensor:
    special = special_tokens_of(tokenizer, "encoder")
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(max(special.all_ids()) + 1, len(tokenizer), shape, generator=gen)
    tokens[:, 0], tokens[:, -1] = special.cls_id, special.sep_id
    return tokens


def _record(hf: torch.nn.Module, lens: HfLens, into: dict[str, torch.Tensor]) -> None:
    """Plain forward (pre-)hooks on ``hf``'s modules, written apart from :class:`HfLens`,
    storing each site's tensor under the lens' site name."""
    parts = HF_ENCODERS[hf.config.model_type]

    def output(name):
        def hook(module, args, out):
            into[name] = out[0] if isinstance(out, tuple) else out

        return hook

    hf.get_input_embeddings().register_forward_hook(output(lens.hook_name("embed")))
    for layer, block in enumerate(hf.base_model.layers):
        name = {kind: lens.hook_name(kind, layer) for kind in SITE_KINDS[1:]}
        block.register_forward_pre_hook(
            lambda m, args, n=name["resid_pre"]: into.update({n: args[0]})
        )
        block.register_forward_hook(output(name["resid_post"]))
        getattr(block, parts.attention).register_forward_hook(output(name["attn_out"]))
        getattr(block, parts.mlp).register_forward_hook(output(name["mlp_out"]))


@pytest.mark.parametrize("kind", KINDS)
def test_sites_are_the_modules_tensors_and_gradients_are_autograd_of_the_mlm_loss(
    suites, kind
) -> None:
    """At every site and block: the activations of the plain Hugging Face model (loaded apart,
    eager attention) and ``torch.autograd.grad`` of its own summed MLM loss — its full forward,
    logits of the whole batch, cross-entropy at the capture's scored positions — with respect
    to them; below the last block the outputs are also ``output_hidden_states``' entries."""
    suite = LocalSuite(suites[kind])
    lens = suite.load(1, dtype=F64)  # "auto": the only loader of this model type
    assert isinstance(lens, HfLens) and lens_model(lens) is lens
    assert (lens.model_name, lens.checkpoint, lens.family) == (suites[kind].name, 1, "encoder")
    special = special_tokens_of(lens.tokenizer, "encoder")
    tokens = _tokens(lens.tokenizer)
    sites = tuple(
        lens.hook_name(site, layer)
        for site in SITE_KINDS
        for layer in ([None] if site == "embed" else range(lens.n_layers))
    )
    hf = AutoModelForMaskedLM.from_pretrained(
        suite.folder(1), attn_implementation="eager", dtype=F64
    )
    recorded: dict[str, torch.Tensor] = {}
    _record(hf.eval(), lens, recorded)
    with hugging_face_in_float64(lens.module, hf):
        batch = capture_batch(lens, tokens, CaptureConfig(sites=sites, loss="mlm"), special)
        assert batch.n_scored > 0 and not torch.equal(batch.inputs, batch.tokens)
        out = hf(batch.inputs, output_hidden_states=True)
        loss = torch.nn.functional.cross_entropy(
            out.logits[batch.scored], batch.tokens[batch.scored], reduction="sum"
        )
        grads = torch.autograd.grad(loss, [recorded[site] for site in sites])
    assert batch.loss == pytest.approx(loss.item(), rel=FLOAT64_PARITY)
    for site, grad in zip(sites, grads, strict=True):
        assert_float64_parity(batch.activations[site], recorded[site].detach(), site)
        assert_float64_parity(batch.gradients[site], grad, site)
        assert grad.abs().max() > 1e-5, site  # a real gradient, not two zeros
    for layer in range(lens.n_layers - 1):
        site = lens.hook_name("resid_post", layer)
        assert_float64_parity(batch.activations[site], out.hidden_states[layer + 1], site)


@pytest.mark.parametrize("kind", KINDS)
def test_the_last_block_output_is_taken_before_the_final_norm(suites, kind) -> None:
    """``output_hidden_states``' last entry is the final-normed state; the last site is the
    last layer's own output, which the final norm maps onto that entry."""
    folder = suites[kind] / "step1"
    lens = load_local_checkpoint(folder, loader="hf", dtype=F64)
    special = special_tokens_of(lens.tokenizer, "encoder")
    tokens = _tokens(lens.tokenizer)
    last = lens.hook_name("resid_post", lens.n_layers - 1)
    hf = AutoModelForMaskedLM.from_pretrained(folder, dtype=F64).eval()
    layer_out: list[torch.Tensor] = []
    hf.base_model.layers[-1].register_forward_hook(lambda m, a, o: layer_out.append(o))
    final_norm = getattr(hf.base_model, HF_ENCODERS[kind].final_norm)
    for loss, gradients in (("none", False), ("mlm", True)):
        config = CaptureConfig(sites=(last,), loss=loss, gradients=gradients)
        with hugging_face_in_float64(lens.module, hf):
            batch = capture_batch(lens, tokens, config, special)
            with torch.no_grad():
                states = hf.base_model(batch.inputs, output_hidden_states=True).hidden_states
                normed = final_norm(batch.activations[last])
        assert len(states) == lens.n_layers + 1
        assert_float64_parity(batch.activations[last], layer_out[-1], last)
        assert (batch.activations[last] - states[-1]).abs().max() > 1e-2  # 10⁷ × the tolerance
        assert_float64_parity(normed, states[-1], "final norm")


@pytest.mark.parametrize("kind", KINDS)
def test_measure_gives_the_values_computed_from_the_layer_outputs(suites, kind) -> None:
    """``measure``: finite rows at every block; the mean loss, cosine anisotropy and drift are
    those of the Hugging Face layer outputs at the kept positions of the corrupted inputs."""
    lens = load_local_checkpoint(suites[kind] / "step1", loader="hf", dtype=F64)
    tokens = _tokens(lens.tokenizer, shape=(8, 32), seed=1)
    probes = {"cosine_drift": {}, "tangent_energy": {"bootstrap": 50}}
    special = special_tokens_of(lens.tokenizer, "encoder")
    sites = tuple(lens.residual_sites())
    with hugging_face_in_float64(lens.module):  # the layer outputs computed twice, in float64
        table = tl.measure(lens, tokens, probes=probes, fit={"rank": 4, "draws": 20}, n_bins=1)
        batch = capture_batch(lens, tokens, CaptureConfig(sites=sites, loss="mlm"), special)
    table = table.to_pylist()
    value = {
        (r["probe"], r["site"], r["metric"], r["method"], r["freq_bin"]): r["value"] for r in table
    }
    assert value[("capture", "-", "mean_loss", "-", "all")] == pytest.approx(
        batch.loss / batch.n_scored, rel=FLOAT64_PARITY
    )
    residual = [r for r in table if r["site"] in sites]
    assert {r["probe"] for r in residual} == {"cosine_drift", "tangent_energy", "proxy_fit"}
    assert {r["site"] for r in residual} == set(sites)
    assert [r["metric"] for r in residual if not math.isfinite(r["value"])] == []
    for site in sites:
        h = batch.activations[site][batch.keep].double()
        n = h.shape[0]
        unit = h / h.norm(dim=1, keepdim=True)
        cosine = (unit.sum(0).square().sum() - n) / (n * (n - 1))
        drift = value[("cosine_drift", site, "drift_norm", "-", "all")]
        assert value[("cosine_drift", site, "cosine_anisotropy", "-", "all")] == pytest.approx(
            cosine.item(), rel=FLOAT64_PARITY
        )
        assert drift == pytest.approx(h.mean(0).norm().item(), rel=FLOAT64_PARITY)
        fraction = value[("tangent_energy", site, "energy_fraction", "pca", "all")]
        assert 0 < fraction < 1


def test_a_micro_sweep_through_the_hf_loader(suites, tmp_path) -> None:
    """Both steps of a EuroBERT suite: per-step residual rows and the update alignment across
    the steps (ΔW_E), finite; the manifest records the loader ``"auto"`` resolves to."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXT))
    path = tmp_path / "recipe.toml"
    path.write_text(f"""
[suite]
name = "{suites["eurobert"]}"
steps = "all"
loader = "auto"

[data]
corpus = "{corpus}"
seq_len = 24
max_tokens = 768
batch_size = 8
n_bins = 2

[capture]
sites = ["resid_post"]
embed = true
reservoir = 256
threads = 1

[probes.cosine_drift]

[probes.tangent_energy]
methods = ["pca"]
rank = 4
draws = 5

[probes.update_alignment]
draws = 5
""")
    run_sweep(load_recipe(path), tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["loader"] == "hf"
    rows = read_results(tmp_path / "run").to_pylist()
    residual = [r for r in rows if r["site"].endswith("hook_resid_post")]
    assert {r["step"] for r in residual} == {0, 1}
    assert {r["layer"] for r in residual} == {0, 1, 2}
    assert {r["probe"] for r in residual} >= {"cosine_drift", "tangent_energy"}
    assert all(math.isfinite(r["value"]) for r in residual if r["metric"] == "energy_fraction")
    assert all(math.isfinite(r["value"]) for r in residual if r["probe"] == "cosine_drift")
    alignment = [r for r in rows if r["probe"] == "update_alignment"]
    assert alignment and any(r["site"] == "embed.hook_embed" for r in alignment)


def test_attention_probes_are_refused_in_one_line(suites) -> None:
    lens = load_local_checkpoint(suites["modernbert"] / "step0", loader="hf")
    tokens = _tokens(lens.tokenizer)
    with pytest.raises(ValueError, match=r"^probe\(s\) qk_drift cannot run: .*loader 'hf'") as e:
        tl.measure(lens, tokens, probes=["qk_drift", "cosine_drift"])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"site 'q' does not exist .*loader 'hf'"):
        lens.hook_name("q", 0)
    recipe = Recipe(
        name="hf",
        suite=SuiteSpec(name=str(suites["modernbert"]), steps="all"),  # "auto" resolves to hf
        probes={"qk_drift": QKDriftConfig(), "cosine_drift": CosineDriftConfig()},
    )
    # the suite's refusal, before any checkpoint is loaded: the same line as the model's
    with pytest.raises(
        ValueError, match=r"^probe\(s\) qk_drift cannot run: suite .* through loader 'hf'"
    ) as e:
        plan_sweep(recipe)
    assert "\n" not in str(e.value)


def test_other_loaders_are_refused_on_these_checkpoints_and_hf_on_others(
    suites, hf_checkpoint, tmp_path
) -> None:
    assert set(HF_ENCODERS) == HF_MODEL_TYPES
    for kind in KINDS:
        assert resolve_loader("auto", "encoder", kind) == "hf"
        for loader in ("hooked", "bridge"):
            with pytest.raises(
                ValueError, match=rf"model type '{kind}' load only through loader 'hf'"
            ) as e:
                load_local_checkpoint(suites[kind] / "step0", loader=loader)
            assert "\n" not in str(e.value)
            with pytest.raises(ValueError, match="load only through loader 'hf'"):
                LocalSuite(suites[kind]).load(0, loader=loader)
    with pytest.raises(ValueError, match=r"loader 'hf' loads model types \['eurobert', 'modernb"):
        load_local_checkpoint(hf_checkpoint("bert"), loader="hf")
    headless = tmp_path / "eurobert-model"  # no masked-LM head: no loss to differentiate
    EuroBertModel(_model("eurobert", encoder_tokenizer(), 0).config).save_pretrained(headless)
    encoder_tokenizer().save_pretrained(headless)
    with pytest.raises(ValueError, match=r"loader 'hf' loads \['EuroBertForMaskedLM'"):
        load_local_checkpoint(headless, loader="hf")
