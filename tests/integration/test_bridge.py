"""TransformerLens' ``TransformerBridge`` as tangentlens' second loader: the same sites, tensors
and table as the hooked path (``HookedTransformer`` / ``HookedEncoder``) on the micro suites and
every local architecture, within the tolerances of :mod:`tests.integration.bridge_parity`; raw
weights, offline; what a bridge does not expose is refused in one line before any capture.

The two loaders are compared in float64 (both sides): in float32 they differ by float32
rounding in another operation order, which no tolerance bounds on every CPU
(:mod:`tests.numerics`). Where the bridge runs exactly Hugging Face's modules, it is compared
with them bit for bit (the same arithmetic)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformer
from transformer_lens.model_bridge import TransformerBridge
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    MambaConfig,
    MambaForCausalLM,
)

import tangentlens as tl
from tangentlens.capture import CaptureConfig, capture_batch
from tangentlens.core.recipe import Recipe, SuiteSpec
from tangentlens.data import special_tokens_of
from tangentlens.models import DEFAULT_LOADERS, lens_model
from tangentlens.models.hub import hf_offline_mode
from tangentlens.models.loading import boot_bridge, load_local_checkpoint
from tangentlens.models.suites import LocalSuite, PythiaSuite
from tangentlens.probes.qk_drift import QKDriftConfig
from tangentlens.registry import builtin_probes
from tangentlens.sweep.runner import plan_sweep
from tests.integration.bridge_parity import (
    TOLERANCES,
    SampleRecorder,
    keyed,
    mismatches,
    tolerance_class,
)
from tests.integration.conftest import SMALL, decoder_tokenizer, encoder_tokenizer
from tests.numerics import (
    FLOAT64_PARITY,
    assert_float64_parity,
    hugging_face_in_float64,
    share_rotary_tables,
)

F64 = torch.float64
DRAWS = 40
PER_STEP_PROBES = [name for name, probe in builtin_probes().items() if probe.per_step]
PROBES = {name: {} for name in PER_STEP_PROBES}
PROBES["tangent_energy"] = {"bootstrap": 100}
FIT = {"rank": 4, "draws": DRAWS}  # the proxies stage
SETTINGS = {"seq_len": 32, "max_tokens": 2048, "n_bins": 3, "reservoir": 512, "embed": True,
            "sites": ["resid_pre", "resid_post", "attn_out", "mlp_out"]}  # fmt: skip
ROW_KINDS = ("embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


def _refuse(*args, **kwargs):
    raise OSError("network access attempted")


def _models(source, loader_source, step=None):
    """``{loader: model}`` of a micro suite (its step) or a checkpoint folder, in float64."""
    if isinstance(loader_source, LocalSuite):
        step = loader_source.steps[-1] if step is None else step
        return {x: loader_source.load(step, loader=x, dtype=F64) for x in ("hooked", "bridge")}
    return {
        x: load_local_checkpoint(loader_source, loader=x, dtype=F64) for x in ("hooked", "bridge")
    }


def _in_float64(hooked, *bridges):
    """The context in which a float64 hooked model and float64 bridges compute in float64
    throughout: Hugging Face's float32 parts (eager softmax, Llama-like RMSNorms) in float64,
    and the hooked model given the bridge's rotary tables (Hugging Face computes them in
    float32) once its own are checked against them (:mod:`tests.numerics`)."""
    originals = [bridge.original_model for bridge in bridges]
    rotary = getattr(originals[0].base_model, "rotary_emb", None) if originals else None
    if rotary is not None and hooked is not None:
        with torch.no_grad():
            share_rotary_tables(hooked, rotary, hooked.cfg.n_ctx)
    return hugging_face_in_float64(*originals)


@pytest.fixture(params=["micro-pythia", "micro-bert", "gpt_neox", "llama", "mistral", "qwen2",
                        "bert"])  # fmt: skip
def both(request, hf_checkpoint):
    """The same checkpoint through both loaders: ``(models, tokenizer)``."""
    if request.param.startswith("micro-"):
        suite = request.getfixturevalue(request.param.replace("-", "_"))
        return _models(None, suite), suite.tokenizer()
    folder = hf_checkpoint(request.param)
    return _models(None, folder), AutoTokenizer.from_pretrained(folder)


def _tokens(tokenizer, special, shape=(3, 24), seed=0):
    first = max(special.all_ids()) + 1
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(first, len(tokenizer), shape, generator=gen)
    if special.cls_id is not None:
        tokens[:, 0], tokens[:, -1] = special.cls_id, special.sep_id
    return tokens


def test_loaders_give_the_same_tensors_at_every_site(both) -> None:
    """Same site kinds; at every kind and block the same activations and gradients of the
    model's own loss, the same loss, the same per-head query, key and entropy sums (float64,
    within float64 rounding)."""
    models, tokenizer = both
    hooked, bridge = lens_model(models["hooked"]), lens_model(models["bridge"])
    assert isinstance(bridge.module, TransformerBridge) and bridge.family == hooked.family
    assert hooked.site_kinds == bridge.site_kinds
    special = special_tokens_of(tokenizer, hooked.family)
    tokens = _tokens(tokenizer, special)
    loss = "next_token" if hooked.family == "decoder" else "mlm"
    layers = tuple(range(hooked.n_layers))
    out = {}
    with _in_float64(models["hooked"], models["bridge"]):
        for lens in (hooked, bridge):
            sites = tuple(
                lens.hook_name(kind, layer)
                for kind in lens.site_kinds
                if kind in ROW_KINDS
                for layer in ([None] if kind == "embed" else layers)
            )
            config = CaptureConfig(sites=sites, loss=loss, attention_layers=layers)
            out[lens.loader] = sites, capture_batch(lens, tokens, config, special)
    (sites_h, a), (sites_b, b) = out["hooked"], out["bridge"]
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.keep, b.keep)
    assert a.n_scored == b.n_scored > 0
    assert b.loss == pytest.approx(a.loss, rel=FLOAT64_PARITY)
    for site_h, site_b in zip(sites_h, sites_b, strict=True):
        assert hooked.parse_site(site_h) == bridge.parse_site(site_b)
        assert_float64_parity(b.activations[site_b], a.activations[site_h], site_h)
        assert_float64_parity(b.gradients[site_b], a.gradients[site_h], site_h)
        assert a.gradients[site_h].abs().max() > 1e-4  # a real gradient, not two zeros
    for layer in layers:
        x, y = a.attention[layer], b.attention[layer]
        assert x.count == y.count > 0
        for field in ("sum_q", "sum_k", "entropy_sum"):
            assert_float64_parity(getattr(y, field), getattr(x, field), f"{layer} {field}")


@pytest.mark.parametrize("name", ["micro_pythia", "micro_bert"])
def test_bridge_gradients_are_autograd_of_the_models_own_loss(request, name) -> None:
    """The bridge's captured ``G`` at every block output is ``torch.autograd.grad`` of the
    Hugging Face model's own summed loss (next-token, or MLM at the capture's corrupted inputs)
    with respect to that block's output hidden state — the plain Hugging Face model, loaded
    apart from the bridge (whose wrappers also record hidden states), with eager attention; both
    in float64, within float64 rounding."""
    suite = request.getfixturevalue(name)
    step = suite.steps[-1]
    model = suite.load(step, loader="bridge", dtype=F64)
    bridge = lens_model(model)
    special = special_tokens_of(suite.tokenizer(), bridge.family)
    tokens = _tokens(suite.tokenizer(), special, shape=(2, 20))
    loss = "next_token" if bridge.family == "decoder" else "mlm"
    sites = tuple(bridge.residual_sites())
    auto = AutoModelForCausalLM if bridge.family == "decoder" else AutoModelForMaskedLM
    hf = auto.from_pretrained(suite.folder(step), attn_implementation="eager", dtype=F64).eval()
    with hugging_face_in_float64(model.original_model, hf):
        batch = capture_batch(bridge, tokens, CaptureConfig(sites=sites, loss=loss), special)
        out = hf(batch.inputs, output_hidden_states=True)
    assert len(out.hidden_states) == bridge.n_layers + 1
    logits = out.logits
    if loss == "next_token":
        logits, targets = logits[:, :-1], batch.tokens[:, 1:]
        scored = batch.scored[:, :-1]
    else:
        targets, scored = batch.tokens, batch.scored
    reference_loss = torch.nn.functional.cross_entropy(
        logits[scored], targets[scored], reduction="sum"
    )
    assert batch.loss == pytest.approx(reference_loss.item(), rel=FLOAT64_PARITY)
    # decoders: HF's last hidden state is after the final norm; encoders: the last block's output
    last = bridge.n_layers if bridge.family == "encoder" else bridge.n_layers - 1
    states = [out.hidden_states[layer + 1] for layer in range(last)]
    with hugging_face_in_float64(hf):
        grads = torch.autograd.grad(reference_loss, states)
    for layer, grad in enumerate(grads):
        assert_float64_parity(batch.gradients[sites[layer]], grad, sites[layer])


@pytest.mark.parametrize("name", ["micro_pythia", "micro_bert"])
def test_measure_gives_the_hooked_table_through_the_bridge(request, name, monkeypatch) -> None:
    """Every per-step probe, both loaders in float64: identical row sets (sites matched by kind
    and block), equal labels and token counts, every value and interval within its tolerance
    class (the rows read from the float32 row sample and semi-NMF whenever the two samples are
    bit for bit equal: :mod:`tests.integration.bridge_parity`); the tolerances tell two
    checkpoints apart (a neighbouring step fails most rows)."""
    suite = request.getfixturevalue(name)
    texts = suite.analysis_corpus().texts()
    step, earlier = suite.steps[-1], suite.steps[-2]
    models = {
        "hooked": suite.load(step, loader="hooked", dtype=F64),
        "bridge": suite.load(step, loader="bridge", dtype=F64),
        "other": suite.load(earlier, loader="bridge", dtype=F64),
    }
    recorder = SampleRecorder(monkeypatch)
    tables = {}
    with _in_float64(models["hooked"], models["bridge"], models["other"]):
        for loader, model in models.items():
            lens = lens_model(model)
            with recorder.run(loader):
                table = tl.measure(model, texts, probes=PROBES, fit=FIT, step=step, **SETTINGS)
            tables[loader] = keyed(table.to_pylist(), lambda site, lens=lens: _site_key(lens, site))
    hooked, bridge = tables["hooked"], tables["bridge"]
    assert len(hooked) > 500
    assert {k[1] for k in hooked} >= {*PER_STEP_PROBES, "capture", "proxy_fit"}
    classes = {tolerance_class(row) for row in hooked.values()}
    assert classes == set(TOLERANCES)
    assert mismatches(hooked, bridge, sampled=recorder.same("hooked", "bridge")) == []
    if name == "micro_bert":  # the encoder's sites are named as the bridge names them
        assert any(k[0] == ("resid_post", 1) for k in bridge)
        assert all(r["site"] != "blocks.1.hook_normalized_resid_post" for r in bridge.values())
    moments = [k for k, row in hooked.items() if tolerance_class(row) == "moments"]
    other = mismatches(hooked, tables["other"])
    assert len(set(other) & set(moments)) > 0.5 * len(moments)


def _site_key(lens, site: str):
    try:
        return lens.parse_site(site)
    except ValueError:  # rows about no single site ("-", cross-layer labels)
        return site


def test_suites_load_through_either_loader_raw_and_offline(micro_pythia, monkeypatch) -> None:
    """``loader`` picks the class; None / "auto" the family's default; an unknown name is one
    line naming the allowed ones. The bridge boots without the network, with the suite's
    tokenizer, name and step, and computes what the Hugging Face model computes from the raw
    weights (no LayerNorm folding, no centring)."""
    step = micro_pythia.steps[-1]
    monkeypatch.setattr("socket.socket.connect", _refuse)
    bridge = micro_pythia.load(step, loader="bridge")
    assert isinstance(bridge, TransformerBridge)
    assert isinstance(micro_pythia.load(step, loader="hooked"), HookedTransformer)
    default = HookedTransformer if DEFAULT_LOADERS["decoder"] == "hooked" else TransformerBridge
    assert isinstance(micro_pythia.load(step), default)
    assert isinstance(micro_pythia.load(step, loader="auto"), default)
    with pytest.raises(
        ValueError, match=r"^loader must be one of \('auto', 'hooked', 'bridge', 'hf'"
    ):
        micro_pythia.load(step, loader="brige")
    lens = lens_model(bridge)
    assert (lens.model_name, lens.checkpoint) == ("micro-pythia", step)
    assert lens.tokenizer.get_vocab() == micro_pythia.tokenizer().get_vocab()
    assert bridge.original_model.config._attn_implementation == "eager"
    hf = AutoModelForCausalLM.from_pretrained(
        micro_pythia.folder(step), attn_implementation="eager"
    ).eval()  # the modules the bridge runs: the same arithmetic, so equal bit for bit
    weight, bias = lens.unembedding()  # not centred; the bridge's zero bias for embed_out
    assert torch.equal(weight, hf.get_output_embeddings().weight.T) and not bias.any()
    assert torch.equal(bridge.W_E, hf.get_input_embeddings().weight)
    tokens = torch.randint(2, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    sites = lens.residual_sites()[:-1]
    with torch.no_grad():
        reference = hf(tokens, output_hidden_states=True)
        logits, cache = bridge.run_with_cache(tokens, names_filter=sites)
    assert torch.equal(logits, reference.logits)
    for layer, site in enumerate(sites):  # LayerNorms not folded into the blocks
        assert torch.equal(cache[site], reference.hidden_states[layer + 1])


def test_headless_checkpoint_through_the_bridge(tmp_path) -> None:
    """A plain ``BertModel`` boots into ``BertForMaskedLM`` with a head the checkpoint does not
    hold: it is NaN and the model headless; its activations equal the hooked path's (float64,
    within float64 rounding), and gradient probes are refused in one line."""
    folder = tmp_path / "bert-model"
    torch.manual_seed(0)
    BertModel(BertConfig(**SMALL, vocab_size=320), add_pooling_layer=False).save_pretrained(folder)
    encoder_tokenizer().save_pretrained(folder)
    models = _models(None, folder)
    hooked, bridge = lens_model(models["hooked"]), lens_model(models["bridge"])
    assert not hooked.has_lm_head and not bridge.has_lm_head
    embedding = bridge.module.original_model.get_input_embeddings().weight
    head = [p for p in bridge.module.original_model.cls.parameters() if p is not embedding]
    assert head and all(p.isnan().all() for p in head)
    assert torch.isfinite(embedding).all()
    special = special_tokens_of(bridge.tokenizer, "encoder")
    tokens = _tokens(bridge.tokenizer, special)
    captured = []
    with _in_float64(models["hooked"], models["bridge"]):
        for lens in (hooked, bridge):
            sites = (lens.hook_name("resid_post", 1),)
            config = CaptureConfig(sites=sites, loss="none", gradients=False)
            captured.append(capture_batch(lens, tokens, config, special).activations[sites[0]])
    assert_float64_parity(captured[1], captured[0], "resid_post 1")
    with pytest.raises(ValueError, match="no language-modelling head") as error:
        tl.measure(models["bridge"], tokens, probes=["tangent_energy"])
    assert "\n" not in str(error.value)


def _save(model, folder, tokenizer):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_bridge_without_attention_hooks_measures_the_residual_stream_only(tmp_path) -> None:
    """A bridged state-space model (Mamba: no attention) offers its block outputs: the residual
    probes run on it; ``qk_drift`` is refused in one line before any capture."""
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=320, hidden_size=32, num_hidden_layers=2, state_size=4)
    folder = _save(MambaForCausalLM(config), tmp_path / "mamba", decoder_tokenizer())
    with hf_offline_mode():
        bridge = boot_bridge(folder)
    lens = lens_model(bridge)
    assert lens.family == "decoder" and "resid_post" in lens.templates
    assert not {"q", "k", "pattern"} & set(lens.templates)
    tokens = torch.randint(2, 320, (4, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^probe\(s\) qk_drift cannot run: .*Mamba") as error:
        tl.measure(bridge, tokens, probes=["qk_drift", "cosine_drift"])
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"site 'q' does not exist .*allowed"):
        lens.hook_name("q", 0)
    table = tl.measure(bridge, tokens, probes=["cosine_drift"], n_bins=1)
    assert {r["site"] for r in table.where(metric="cosine_anisotropy").to_pylist()} == {
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_post",
    }


def test_grouped_query_attention_refuses_qk_drift_on_both_loaders_and_at_planning(
    tmp_path,
) -> None:
    """Fewer key/value heads than query heads: per-head query/key drift is refused in one line
    by ``measure`` (either loader) and by ``plan_sweep`` from ``config.json`` alone."""
    torch.manual_seed(0)
    config = LlamaConfig(**{**SMALL, "num_key_value_heads": 2}, vocab_size=320)
    folder = _save(LlamaForCausalLM(config), tmp_path / "suite" / "step0", decoder_tokenizer())
    tokens = torch.randint(2, 320, (2, 16), generator=torch.Generator().manual_seed(0))
    for loader in ("hooked", "bridge"):
        model = load_local_checkpoint(folder, loader=loader)
        with pytest.raises(ValueError, match=r"grouped-query attention \(4 query heads, 2 key"):
            tl.measure(model, tokens, probes=["qk_drift"])
    recipe = Recipe(
        name="gqa",
        suite=SuiteSpec(name=str(tmp_path / "suite"), steps="all"),
        probes={"qk_drift": QKDriftConfig()},
    )
    with pytest.raises(
        ValueError, match=r"^probe\(s\) qk_drift cannot run: .* uses grouped-query attention"
    ) as error:
        plan_sweep(recipe)
    assert "\n" not in str(error.value)


def test_pythia_revisions_boot_through_the_bridge_offline(fake_hf_cache) -> None:
    """A Pythia revision from the local hub cache: the same logits as the hooked path (float64,
    within float64 rounding), its step recorded; a missing revision is the hooked path's
    one-line error."""
    suite = PythiaSuite("EleutherAI/pythia-14m", offline=True)
    bridge = suite.load(1000, loader="bridge", dtype=F64)
    hooked = suite.load(1000, loader="hooked", dtype=F64)
    assert isinstance(bridge, TransformerBridge) and lens_model(bridge).checkpoint == 1000
    tokens = torch.randint(2, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), _in_float64(hooked, bridge):
        assert_float64_parity(bridge(tokens), hooked(tokens), "logits")
    with pytest.raises(ValueError, match=r"pythia-14m at step 2000 .*hf download"):
        suite.load(2000, loader="bridge")


def test_models_of_no_supported_kind_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="HookedTransformer, HookedEncoder or TransformerBridge"):
        lens_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="HookedTransformer, HookedEncoder or TransformerBridge"):
        tl.measure(torch.nn.Linear(2, 2), torch.zeros(2, 4, dtype=torch.long))


def test_a_copied_folder_loads_the_same_through_the_bridge(micro_bert, tmp_path) -> None:
    """A local folder of a mini suite's checkpoint: ``LocalSuite`` names it by its folder and
    loads the encoder through the bridge as ``BertForMaskedLM`` with the MLM loss."""
    root = tmp_path / "copy"
    shutil.copytree(micro_bert.folder(micro_bert.steps[-1]), root / "step7")
    (root / "suite.json").write_text(json.dumps({"tokens_per_step": 4}))
    suite = LocalSuite(root)
    bridge = lens_model(suite.load(7, loader="bridge"))
    assert bridge.family == "encoder" and bridge.has_lm_head
    assert bridge.architecture == "BertForMaskedLM"
    assert (bridge.model_name, bridge.checkpoint) == ("copy", 7)
    assert isinstance(suite.load(7, loader="hooked"), HookedEncoder)


def test_a_bridge_with_processed_weights_is_refused(micro_pythia) -> None:
    """Folding and centring delete the mean direction tangentlens measures: a bridge whose
    weights were processed is refused in one line, before any capture."""
    bridge = micro_pythia.load(micro_pythia.steps[-1], loader="bridge")
    bridge.process_weights()
    tokens = torch.randint(2, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"weights were processed .*mean direction") as error:
        tl.measure(bridge, tokens, probes=["cosine_drift"])
    assert "\n" not in str(error.value)
