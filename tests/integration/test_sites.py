"""Family-aware hook-site names, asked of the lens: every name exists in the model, missing sites
are refused."""

import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformer, HookedTransformerConfig

from tangentlens.models import SITE_KINDS, lens_model


def _config(**overrides) -> HookedTransformerConfig:
    base = dict(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=40, n_ctx=16,
                act_fn="gelu", normalization_type="LN", device="cpu")  # fmt: skip
    return HookedTransformerConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def models():
    pythia = HookedTransformer(_config(parallel_attn_mlp=True, positional_embedding_type="rotary",
                                       rotary_dim=4))  # fmt: skip
    sequential = HookedTransformer(_config())
    encoder = HookedEncoder(_config(attention_dir="bidirectional"))
    return {
        name: lens_model(model)
        for name, model in (("pythia", pythia), ("sequential", sequential), ("encoder", encoder))
    }


@pytest.mark.parametrize("name", ["pythia", "sequential", "encoder"])
def test_every_site_name_exists_in_the_model(models, name):
    lens = models[name]
    for kind in lens.site_kinds:
        for layer in [None] if kind == "embed" else range(lens.n_layers):
            full = lens.hook_name(kind, layer)
            assert full in lens.module.hook_dict, full
            assert lens.parse_site(full) == (kind, layer)


def test_residual_stream_names_by_family(models):
    assert models["pythia"].residual_sites() == [
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_post",
    ]
    assert models["encoder"].residual_sites() == [
        "blocks.0.hook_normalized_resid_post",
        "blocks.1.hook_normalized_resid_post",
    ]
    assert models["encoder"].family == "encoder"
    assert models["pythia"].family == "decoder"


def test_encoder_block_output_is_the_normalized_residual(models):
    lens = models["encoder"]
    encoder = lens.module
    for p in encoder.parameters():  # HookedEncoder leaves its weights uninitialised
        torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 40, (1, 8), generator=torch.Generator().manual_seed(0))
    _, cache = encoder.run_with_cache(tokens)
    # The input of block 1 is the output of block 0.
    torch.testing.assert_close(
        cache[lens.hook_name("resid_post", 0)], cache[lens.hook_name("resid_pre", 1)]
    )


def test_sites_a_family_lacks_are_refused_with_the_valid_ones(models):
    with pytest.raises(ValueError, match=r"no resid_mid.*allowed: \['embed', 'resid_pre'"):
        models["pythia"].hook_name("resid_mid", 0)
    assert models["sequential"].hook_name("resid_mid", 1) == "blocks.1.hook_resid_mid"
    with pytest.raises(ValueError, match="allowed"):
        models["encoder"].hook_name("resid_mid", 0)
    with pytest.raises(ValueError, match="allowed"):
        models["pythia"].hook_name("residual", 0)
    assert set(models["sequential"].site_kinds) == set(SITE_KINDS)


def test_layers_are_validated(models):
    lens = models["pythia"]
    for bad in (-1, 2, 1.0, None, True):
        with pytest.raises(ValueError, match=r"integer in \[0, 2\)"):
            lens.hook_name("resid_post", bad)
    with pytest.raises(ValueError, match="takes no layer"):
        lens.hook_name("embed", 0)
    with pytest.raises(ValueError, match="unknown hook site"):
        lens.parse_site("blocks.7.hook_resid_post")
    with pytest.raises(ValueError, match="HookedTransformer"):
        lens_model(torch.nn.Linear(2, 2))
