"""Weight files: discovery, truncation and corruption checks, hashing."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from tangentlens.models.weights import (
    check_finite_files,
    check_finite_weights,
    verify_weight_files,
    weight_files,
    weights_hash,
)


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(64, 32, generator=gen), "b": torch.randn(17, generator=gen)}


def test_safetensors_folder_verifies_and_hashes(tmp_path):
    save_file(_tensors(), tmp_path / "model.safetensors")
    assert verify_weight_files(tmp_path) == [tmp_path / "model.safetensors"]
    assert len(weights_hash(tmp_path)) == 32


def test_identical_weights_hash_equal_and_different_weights_differ(tmp_path):
    for name, seed in (("x", 0), ("y", 0), ("z", 1)):
        (tmp_path / name).mkdir()
        save_file(_tensors(seed), tmp_path / name / "model.safetensors")
    assert weights_hash(tmp_path / "x") == weights_hash(tmp_path / "y")
    assert weights_hash(tmp_path / "x") != weights_hash(tmp_path / "z")


@pytest.mark.parametrize("keep", [0, 5, 100, -1])
def test_truncated_safetensors_is_a_clear_error(tmp_path, keep):
    path = tmp_path / "model.safetensors"
    save_file(_tensors(), path)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(ValueError, match=r"model\.safetensors .*(truncated|corrupted)"):
        verify_weight_files(tmp_path)


def test_safetensors_with_garbage_appended_or_a_broken_header(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(_tensors(), path)
    data = path.read_bytes()
    path.write_bytes(data + b"\0" * 10)
    with pytest.raises(ValueError, match="longer than its header"):
        verify_weight_files(tmp_path)
    path.write_bytes(data[:8] + b"#" * 20 + data[28:])
    with pytest.raises(ValueError, match="corrupted header"):
        verify_weight_files(tmp_path)


def test_pytorch_bin_checks_truncation_and_crc(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save(_tensors(), path)
    assert verify_weight_files(tmp_path) == [path]
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ValueError, match="corrupted or truncated"):
        verify_weight_files(tmp_path)
    middle = len(data) // 2  # flip bytes inside a stored tensor: the CRC catches it
    data[middle : middle + 4] = bytes(255 - b for b in data[middle : middle + 4])
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC"):
        verify_weight_files(tmp_path)


def test_sharded_checkpoint_lists_shards_and_refuses_missing_ones(tmp_path):
    save_file({"a": torch.ones(3)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"b": torch.ones(3)}, tmp_path / "model-00002-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [p.name for p in weight_files(tmp_path)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="missing files"):
        weight_files(tmp_path)


def test_folder_without_weights_names_the_allowed_files(tmp_path):
    with pytest.raises(ValueError, match=r"no weight files .*model\.safetensors"):
        weight_files(tmp_path)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_weight_is_named_with_its_count(tmp_path, bad):
    tensors = _tensors()
    tensors["b"][[3, 5]] = bad
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as error:
        check_finite_files(tmp_path, "step 7")
    assert str(error.value) == (
        "step 7 (model.safetensors): parameter b holds 2 non-finite value(s) (NaN or inf) of "
        "17: the checkpoint is broken"
    )
    with pytest.raises(ValueError, match=r"^step 7: parameter b holds 2 non-finite .* of 17: "):
        check_finite_weights(tensors.items(), "step 7")


def test_finite_weights_and_integer_buffers_pass(tmp_path):
    tensors = {**_tensors(), "ids": torch.arange(4)}
    save_file(tensors, tmp_path / "model.safetensors")
    check_finite_files(tmp_path, "here")
    check_finite_weights(tensors.items(), "here")
    torch.save({"w": torch.ones(3)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    check_finite_files(tmp_path, "here")  # a torch.save archive too


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_overflow_in_half_precision_names_the_dtype(dtype):
    weights = {"w": torch.tensor([1.0, math.inf, -math.inf]).to(dtype)}
    with pytest.raises(ValueError, match=f"2 non-finite .* stored in {str(dtype)[6:]}, whose"):
        check_finite_weights(weights.items(), "step 1")


@pytest.mark.parametrize("where", [0, 4, 9, 16])
def test_the_check_reads_every_chunk_of_a_parameter(where, monkeypatch):
    """The check goes through a parameter in chunks (its memory is a chunk's, not the largest
    parameter's): a NaN in any chunk, the last short one included, is found; an empty or
    non-contiguous tensor is checked too."""
    from tangentlens.models import weights

    monkeypatch.setattr(weights, "_FINITE_CHUNK", 4)
    w = torch.ones(17)
    w[where] = math.nan
    with pytest.raises(ValueError, match="parameter w holds 1 non-finite"):
        check_finite_weights({"w": w}.items(), "step 1")
    strided = torch.ones(5, 6)
    strided[2, 4] = math.inf
    with pytest.raises(ValueError, match="parameter s holds 1 non-finite"):
        check_finite_weights({"s": strided[:, ::2], "e": torch.empty(0)}.items(), "step 1")
    check_finite_weights({"s": strided[:, ::2][:, :2], "e": torch.empty(0)}.items(), "step 1")
