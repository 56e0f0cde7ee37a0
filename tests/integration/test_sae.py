"""SAE dictionaries through SAELens: a planted sparse dictionary is recovered; disk round trip."""

import pytest
import torch

from tangentlens.dictionaries import SAE, principal_angles, span_basis


def _sparse_data(n=16384, d=32, n_atoms=12, active=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    atoms = torch.randn(n_atoms, d, generator=gen)
    atoms /= atoms.norm(dim=1, keepdim=True)
    codes = torch.zeros(n, n_atoms)
    chosen = torch.stack([torch.randperm(n_atoms, generator=gen)[:active] for _ in range(n)])
    codes.scatter_(1, chosen, 1 + torch.rand(n, active, generator=gen))
    return codes @ atoms, atoms


@pytest.fixture(scope="module")
def fitted():
    H, atoms = _sparse_data()
    sae = SAE(None, d_sae=24, k=2, training_samples=300_000, batch_size=512, lr=3e-3, seed=0)
    return sae.fit(H), H, atoms


def test_sae_recovers_a_planted_sparse_dictionary(fitted):
    sae, _, atoms = fitted
    learned = sae.directions.float()  # unit decoder rows of every latent
    best = (atoms @ learned.T).max(dim=1).values  # best cosine per true atom
    assert float(best.min()) > 0.95
    assert sae.explained_variance_ > 0.95
    assert sae.l0_ == pytest.approx(2.0, abs=0.01)  # TopK with k = 2


def test_top_latents_span_the_dictionary_and_training_is_seeded(fitted):
    sae, H, atoms = fitted
    top = SAE(12, d_sae=24, k=2, training_samples=300_000, batch_size=512, lr=3e-3, seed=0)
    top.fit(H)
    assert torch.equal(top.sae_.W_dec, sae.sae_.W_dec)  # same seed, same SAE
    angles = principal_angles(top.basis(), span_basis(atoms.double()))
    assert top.basis().shape == (32, 12) and float(angles.max()) < 0.35
    state = torch.random.get_rng_state()
    SAE(2, d_sae=8, k=1, training_samples=2048, batch_size=512, seed=3).fit(H)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched


def test_disk_round_trip_and_width_check(fitted, tmp_path):
    sae, H, _ = fitted
    sae.sae_.save_model(str(tmp_path / "sae"))
    loaded = SAE.from_disk(tmp_path / "sae", rank=12).measure(H)
    assert loaded.explained_variance_ == pytest.approx(sae.explained_variance_, rel=1e-5)
    with pytest.raises(ValueError, match="d_in = 32 but these activations have width 16"):
        SAE.from_disk(tmp_path / "sae").measure(H[:, :16])
    with pytest.raises(ValueError, match=r"no cfg\.json"):
        SAE.from_disk(tmp_path)


def test_bad_input():
    with pytest.raises(ValueError, match="architecture must be one of"):
        SAE(4, architecture="gated")
    with pytest.raises(ValueError, match="at least batch_size"):
        SAE(4, batch_size=512).fit(torch.randn(100, 8))
    with pytest.raises(ValueError, match=r"rank must be an integer in \[1, 7\]"):
        SAE(8, batch_size=16).fit(torch.randn(100, 8))
    with pytest.raises(ValueError, match="not fitted"):
        SAE(4).basis()


def test_an_sae_trains_where_its_activations_are():
    """On an (emulated) accelerator the SAE trains and is measured there — the same weights
    (initialised on the host from the seed), explained variance, L0 and latents as on the CPU —
    and no matrix comes back to the host."""
    from tangentlens.testing import emulated_accelerator

    H, _ = _sparse_data(n=1024, d=16, n_atoms=6)
    settings = {"d_sae": 12, "k": 2, "training_samples": 4096, "batch_size": 256, "seed": 1}
    cpu = SAE(4, **settings).fit(H)
    with emulated_accelerator() as accelerator:
        sae = SAE(4, **settings).fit(H.to(accelerator.device))
        assert sae.sae_.W_dec.device == sae.basis().device == accelerator.device
        moved = accelerator.transfers.matrices()
        basis = sae.basis().cpu()
    assert moved == []
    assert torch.equal(basis, cpu.basis()) and torch.equal(sae.latents_, cpu.latents_)
    assert (sae.explained_variance_, sae.l0_) == (cpu.explained_variance_, cpu.l0_)
