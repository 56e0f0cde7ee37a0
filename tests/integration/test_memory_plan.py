"""The memory plan's modelled terms against what TransformerLens really allocates: parameters and
buffers of models built (on the meta device) from real configs, and the bytes autograd saves per
block, counted with ``saved_tensors_hooks`` — both exactly."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformer, HookedTransformerConfig
from transformer_lens.loading_from_pretrained import convert_hf_model_config

from tangentlens.core.memory import DTYPE_BYTES, saved_per_block
from tangentlens.models.shapes import PYTHIA_CONFIGS, ModelShape
from tests.pages import page

BERT = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
}
LLAMA_GQA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 688,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}


def _tl_config(config: dict, tmp_path, dtype: torch.dtype, **overrides) -> HookedTransformerConfig:
    folder = tmp_path / "config"
    folder.mkdir(exist_ok=True)
    if config["architectures"] == ["BertModel"]:  # loaded as HookedEncoder, head and all
        config = {**config, "architectures": ["BertForMaskedLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    fields = convert_hf_model_config(str(folder))
    fields.update(tokenizer_name=None, device="cpu", init_weights=False, n_devices=1, dtype=dtype)
    fields.update(overrides)
    return HookedTransformerConfig(**fields)


def _build(config: dict, cfg: HookedTransformerConfig) -> torch.nn.Module:
    encoder = config["architectures"][0].startswith("Bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if encoder:
            return HookedEncoder(cfg, move_to_device=False)
        return HookedTransformer(cfg, move_to_device=False)


@pytest.mark.parametrize(
    ("config", "dtype"),
    [
        (PYTHIA_CONFIGS["EleutherAI/pythia-70m"], torch.float32),
        (PYTHIA_CONFIGS["EleutherAI/pythia-1b"], torch.bfloat16),
        (PYTHIA_CONFIGS["EleutherAI/pythia-6.9b"], torch.float16),
        (PYTHIA_CONFIGS["EleutherAI/pythia-12b"], torch.bfloat16),
        (BERT, torch.float32),
        ({**BERT, "architectures": ["BertModel"]}, torch.float32),
        (LLAMA_GQA, torch.bfloat16),
    ],
    ids=["pythia-70m", "pythia-1b", "pythia-6.9b", "pythia-12b", "bert", "bertmodel", "llama"],
)
def test_weights_bytes_are_those_of_the_transformerlens_model(config, dtype, tmp_path) -> None:
    cfg = _tl_config(config, tmp_path, dtype, device="meta")
    with torch.device("meta"):
        model = _build(config, cfg)
    real = sum(p.nbytes for p in model.parameters()) + sum(b.nbytes for b in model.buffers())
    shape = ModelShape.from_hf_config(config)
    itemsize = torch.finfo(dtype).bits // 8
    assert shape.n_parameters() * itemsize + shape.n_buffer_bytes(itemsize) == real


def _saved_bytes(model: torch.nn.Module, tokens: torch.Tensor, encoder: bool) -> int:
    """Bytes of the distinct storages autograd saves in a capture-style forward (frozen
    parameters; every block's output a site whose gradient is asked for), the model's own
    parameters and buffers excluded."""
    for p in model.parameters():
        p.requires_grad_(False)
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    def leaf(t: torch.Tensor, hook: object) -> torch.Tensor:
        return t if t.requires_grad else t.detach().requires_grad_(True)

    n_layers = model.cfg.n_layers
    sites = [(f"blocks.{b}.hook_resid_post", leaf) for b in range(n_layers)]
    with model.hooks(fwd_hooks=sites), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = (
            model.encoder_output(tokens, None, None)
            if encoder
            else model(tokens, stop_at_layer=n_layers)
        )
    del out
    return sum(saved.values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    ("config", "width", "heads", "mlp", "batch", "seq_len"),
    [
        (PYTHIA_CONFIGS["EleutherAI/pythia-70m"], 96, 6, 320, 3, 24),
        (PYTHIA_CONFIGS["EleutherAI/pythia-70m"], 64, 2, 128, 1, 40),
        (BERT, 96, 4, 256, 2, 20),
        (LLAMA_GQA, 128, 4, 200, 2, 16),
    ],
    ids=["pythia-a", "pythia-b", "bert", "llama-gqa"],
)
def test_saved_per_block_is_what_autograd_saves(
    config, width, heads, mlp, batch, seq_len, dtype, tmp_path
) -> None:
    """Blocks above the first site save; the difference of 3 and 2 blocks is one block."""
    torch_dtype = getattr(torch, dtype)
    small = {
        **config,
        "hidden_size": width,
        "num_attention_heads": heads,
        "intermediate_size": mlp,
        "vocab_size": 300,
        "max_position_embeddings": 64,
    }
    if "num_key_value_heads" in small:
        small["num_key_value_heads"] = heads // 2
    encoder = config["architectures"][0].startswith("Bert")
    measured = []
    for n_layers in (2, 3):
        cfg = _tl_config({**small, "num_hidden_layers": n_layers}, tmp_path, torch_dtype)
        torch.manual_seed(0)
        model = _build(small, cfg)
        tokens = torch.randint(0, 300, (batch, seq_len))
        measured.append(_saved_bytes(model, tokens, encoder))
    shape = ModelShape.from_hf_config(small)
    assert measured[1] - measured[0] == saved_per_block(shape, DTYPE_BYTES[dtype], batch, seq_len)


@pytest.mark.parametrize("name", ["pythia_1b", "pythia_6_9b", "olmo_1b", "eurobert_210m"])
def test_large_recipes_state_their_memory_plan(name) -> None:
    """The header comment of the large-model recipes is the plan the sweep prints, and the
    plan fits one 80 GB GPU."""
    from tangentlens.core.recipe import builtin_recipes, load_recipe
    from tangentlens.core.resolve import resolve

    plan = resolve(load_recipe(name)).memory_plan(accelerator=80 * 10**9)
    assert f"# {plan.summary()}\n" in builtin_recipes()[name].read_text()


def _fit_cell(size: str, dtype: str) -> str:
    """The memory page's cell (docs/memory.md): planned peak GiB and passes on one 80 GB GPU
    at pythia_1b's settings with automatic passes, or what would make it fit."""
    from tangentlens.core.memory import GIB
    from tangentlens.core.recipe import load_recipe
    from tangentlens.core.resolve import resolve

    overrides = [
        f"suite.name='EleutherAI/pythia-{size}'",
        f"suite.dtype='{dtype}'",
        "capture.passes=0",
    ]
    recipe = load_recipe("pythia_1b", overrides)
    try:
        plan = resolve(recipe).memory_plan(accelerator=80 * 10**9)
    except ValueError as error:
        batch = re.search(r"data\.batch_size = (\d+) fits", str(error))
        return f"`data.batch_size` ≤ {batch.group(1)}" if batch else "does not fit"
    passes = f"{plan.passes}: one site per pass" if plan.passes == 33 else str(plan.passes)
    return f"{plan.accelerator_peak / GIB:.1f} ({passes})"


def test_the_memory_page_table_of_pythia_sizes_is_the_plan() -> None:
    rows = re.findall(r"^\| pythia-([\d.]+[mb]) \| (.*?) \| (.*?) \|$", page("memory"), flags=re.M)
    assert len(rows) == 6
    for size, float32, bfloat16 in rows:
        assert (float32, bfloat16) == (_fit_cell(size, "float32"), _fit_cell(size, "bfloat16"))


@pytest.mark.parametrize("gradients", [True, False])
def test_reservoir_bytes_are_what_the_reservoir_allocates(gradients) -> None:
    """A filled site reservoir holds exactly the plan's bytes (less the offered batch)."""
    from tangentlens.capture import SiteStatistics, StatisticsConfig
    from tangentlens.core.memory import PlanInputs, reservoir_bytes

    d, capacity, batch, seq_len = 24, 100, 2, 40
    stats = SiteStatistics(
        d, StatisticsConfig(gradients=gradients, n_bins=2, reservoir_size=capacity)
    )
    for start in range(0, 240, batch * seq_len):
        ids = torch.arange(start, start + batch * seq_len)
        g = torch.randn(ids.numel(), d) if gradients else None
        bins = torch.randint(0, 2, (ids.numel(),))
        stats.update(torch.randn(ids.numel(), d), g, ids % 7, ids, bins)
    reservoir = stats.reservoir
    held = sum(t.nbytes for t in [reservoir._ids, reservoir._priority])
    held += sum(t.nbytes for t in reservoir._columns.values())
    shape = ModelShape.from_hf_config(PYTHIA_CONFIGS["EleutherAI/pythia-70m"])
    inputs = PlanInputs(
        shape=dataclasses.replace(shape, d_model=d),
        dtype="float32",
        device="cpu",
        batch=batch,
        seq_len=seq_len,
        sites=(("resid_post", 0),),
        gradients=gradients,
        bins=2,
        bin_moments=False,
        n_types=0,
        reservoir=capacity,
        energy_methods=0,
        n_sequences=6,
    )
    offered = batch * seq_len * (d * 4 * (2 if gradients else 1) + 32)
    assert held == reservoir_bytes(inputs) - offered
