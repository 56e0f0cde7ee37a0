"""The emulated accelerator (tangentlens.testing): it refuses what a GPU refuses and records
what crosses back to the host, so the device path is tested on a machine without one."""

from __future__ import annotations

import pytest
import torch

from tangentlens.seeding import seeded_generator, seeded_generators
from tangentlens.testing import emulated_accelerator


def test_values_are_the_cpus_and_stay_on_the_device():
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(4, 3)
    with emulated_accelerator() as accelerator:
        on = x.to(accelerator.device)
        values, vectors = torch.linalg.eigh(on.T @ on)
        zeros = torch.zeros(3, dtype=torch.float64, device=on.device)
        made = torch.tensor([1.0, 2.0], device=on.device)
        assert {t.device.type for t in (on, values, vectors, zeros, made)} == {"meta"}
        assert torch.equal(values.cpu(), torch.linalg.eigh(x.T @ x).eigenvalues)
        on.add_(1)  # in place: the same tensor, its values changed
        assert float(on[0, 0]) == float(x[0, 0] + 1)
    assert [t.shape for t in accelerator.transfers.copies] == [(3,)]
    assert accelerator.transfers.scalars == 1


def test_a_gpu_refusal_is_a_refusal_here():
    with emulated_accelerator() as accelerator:
        on = torch.ones(3, 2).to(accelerator.device)
        with pytest.raises(RuntimeError, match="same device"):
            on @ torch.ones(2, 2)  # a host matrix in a device op
        with pytest.raises(TypeError, match="numpy"):
            on.numpy()
        assert float((on * torch.tensor(2.0)).sum()) == 12.0  # a 0-d host tensor is a scalar
        assert on[torch.tensor([0, 2])].shape == (2, 2)  # host indices index a device tensor
        with pytest.raises(RuntimeError, match="same device"):  # not device indices a host one
            torch.ones(3, 2)[torch.tensor([0, 2]).to(accelerator.device)]
        with pytest.raises(RuntimeError, match="generator"):  # a host generator drew on it
            torch.randn(2, generator=seeded_generator(1), device=accelerator.device)
        with pytest.raises(RuntimeError, match="index with a tensor"):  # unseen by the emulation
            on[[0, 1], [0, 1]] = 0


def test_copies_to_the_host_are_recorded_with_their_caller():
    with emulated_accelerator() as accelerator:
        on = torch.ones(5, 4).to(accelerator.device)
        on.cpu()
        on[0].tolist()
        torch.empty(5, 4).copy_(on)
    copies = accelerator.transfers.copies
    assert [t.shape for t in copies] == [(5, 4), (4,), (5, 4)]
    assert all("test_emulated_device.py" in t.where for t in copies)
    assert [t.shape for t in accelerator.transfers.matrices()] == [(5, 4), (5, 4)]


def test_device_generators_stand_in_with_the_same_seeds():
    """The emulated device's generators are seeded exactly as the CPU's, so a draw made on the
    device path equals the CPU path's draw value for value."""
    host = [torch.randn(3, generator=g) for g in seeded_generators(4, 5, count=3)]
    with emulated_accelerator() as accelerator:
        device = [
            torch.randn(3, generator=g, device=accelerator.device).cpu()
            for g in seeded_generators(4, 5, count=3, device=accelerator.device)
        ]
    assert all(torch.equal(a, b) for a, b in zip(host, device, strict=True))
    assert torch.equal(
        torch.randn(3, generator=seeded_generator(4, 5, device="cpu")),
        torch.randn(3, generator=seeded_generator(4, 5)),
    )


def test_the_module_example_runs():
    import doctest

    from tangentlens import testing

    assert doctest.testmod(testing).failed == 0


def test_every_wait_a_cuda_device_makes_is_counted_with_its_kind():
    """Scalar reads, copies back, ops whose output size the host must read, linear algebra
    checking its info on the host and pageable uploads are syncs; a pinned non-blocking upload
    and the ``*_ex`` forms without error checks are not."""
    a = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with emulated_accelerator() as accelerator:
        x = (a @ a.T + torch.eye(4, dtype=torch.float64)).to(accelerator.device)  # pageable
        syncs = accelerator.transfers.syncs
        mask = x > 0
        pinned = torch.arange(4).pin_memory().to(accelerator.device, non_blocking=True)
        torch.linalg.cholesky_ex(x)  # no info check
        torch.linalg.qr(x)
        x[pinned]  # a device index
        assert [s.kind for s in syncs] == ["pageable_upload"] and accelerator.transfers.uploads == 1
        x[mask]
        torch.nonzero(mask)
        torch.unique(pinned)
        torch.linalg.eigh(x)
        torch.linalg.cholesky(x)
        x[torch.tensor([0, 1])]  # a host index PyTorch copies from pageable memory
        float(x[0, 0])
        x[0].tolist()
        x.cpu()
    kinds = [s.kind for s in syncs]
    assert kinds == [
        "pageable_upload",
        "boolean_mask",
        "nonzero",
        "unique",
        "linalg_info",
        "linalg_info",
        "pageable_upload",
        "scalar",
        "tolist",
        "to_host",
    ]
    assert all("test_emulated_device.py" in s.where for s in syncs)
