"""Weight files of a Hugging Face checkpoint folder: find them, check them, hash them.

A truncated or corrupted file is reported as a ``ValueError`` naming the file and what is wrong,
before any model library tries to read it; a weight holding NaN or inf is reported by its
parameter's name (:func:`check_finite_weights`), where the files are read and where a
checkpoint is loaded — not later, as non-finite activations at some site. The hash identifies
identical checkpoints (a suite that saved the same weights at two steps).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

__all__ = [
    "WEIGHT_FILE_FORMS",
    "check_finite_files",
    "check_finite_weights",
    "verify_weight_files",
    "weight_files",
    "weights_hash",
]

#: The weight files a checkpoint folder may hold (for error messages).
WEIGHT_FILE_FORMS = (
    "model.safetensors",
    "model-00001-of-0000N.safetensors (+ model.safetensors.index.json)",
    "pytorch_model.bin",
    "pytorch_model-00001-of-0000N.bin (+ pytorch_model.bin.index.json)",
)
_HASH_CHUNK = 8 << 20
_SAFETENSORS_MAX_HEADER = 100 << 20


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder, safetensors preferred, shards in order."""
    folder = Path(folder)
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        index = folder / index_name
        if index.exists():
            return _sharded_files(index)
        if (folder / single).exists():
            return [folder / single]
    raise ValueError(
        f"no weight files in {str(folder)!r}; expected one of: {', '.join(WEIGHT_FILE_FORMS)}"
    )


def _sharded_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            f"shard index {index} is unreadable or has no weight_map: {error}"
        ) from error
    files = [index.parent / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise ValueError(f"shard index {index} names missing files: {missing}")
    return files


def _verify_safetensors(path: Path) -> None:
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ValueError(
                f"weight file {path} is truncated: {size} bytes, no safetensors header"
            )
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_SAFETENSORS_MAX_HEADER, size - 8):
            raise ValueError(
                f"weight file {path} is corrupted or truncated: header length {header_len} does "
                f"not fit in the file ({size} bytes)"
            )
        try:
            header = json.loads(handle.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"weight file {path} has a corrupted header: {error}") from error
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says (corrupted)"
        raise ValueError(f"weight file {path} is {state}: {size} bytes, expected {expected}")


def _verify_bin(path: Path) -> None:
    # torch.save writes a zip archive; its central directory sits at the end, so a truncated
    # file fails here, and testzip checks every member's CRC.
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as error:
        raise ValueError(f"weight file {path} is corrupted or truncated: {error}") from error
    if bad is not None:
        raise ValueError(f"weight file {path} is corrupted: member {bad} fails its CRC check")


def verify_weight_files(folder: Path) -> list[Path]:
    """Check every weight file of ``folder`` for truncation and corruption; returns the files."""
    files = weight_files(folder)
    for path in files:
        if path.suffix == ".safetensors":
            _verify_safetensors(path)
        else:
            _verify_bin(path)
    return files


def _content_id(path: Path) -> str | None:
    """The SHA-256 a Hugging Face cache already names a weight blob by, when ``path`` is a
    snapshot's link into ``blobs/`` (None otherwise: the bytes must be hashed)."""
    if not path.is_symlink():
        return None
    target = path.resolve()
    name = target.name
    if (
        target.parent.name == "blobs"
        and len(name) == 64
        and all(c in "0123456789abcdef" for c in name)
    ):
        return name
    return None


def weights_hash(folder: Path) -> str:
    """Digest of every weight file of ``folder`` (hex, 32 characters): BLAKE2b over each file's
    name and content id — for a Hugging Face cache snapshot the SHA-256 its blob is named by (no
    re-hash of gigabytes per revision), else the file's bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for path in weight_files(folder):
        digest.update(path.name.encode())
        content = _content_id(path)
        if content is not None:
            digest.update(b"sha256:" + content.encode())
            continue
        with path.open("rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


#: Half-precision dtypes, whose narrow range makes an overflow the likely cause of an inf.
_HALF = (torch.float16, torch.bfloat16)
#: Elements checked at once: the check's own memory stays at 4 MiB of flags, not one byte per
#: element of the largest parameter (a pythia-1b embedding: 103 MB above the loading peak).
_FINITE_CHUNK = 1 << 22


def _all_finite(tensor: torch.Tensor) -> torch.Tensor:
    """Whether every element of ``tensor`` is finite, as a 0-d bool tensor on its device (no
    host synchronisation), checked in chunks of :data:`_FINITE_CHUNK` elements."""
    flat = tensor.reshape(-1)  # a view of a contiguous parameter
    return torch.stack([torch.isfinite(chunk).all() for chunk in flat.split(_FINITE_CHUNK)]).all()


def check_finite_weights(named: Iterable[tuple[str, torch.Tensor]], where: str) -> None:
    """Refuse weights holding NaN or inf: a ``ValueError`` naming ``where`` (the checkpoint),
    the first such parameter, how many of its values are non-finite and, in half precision,
    the dtype as a likely cause. One host synchronisation for all parameters on a GPU."""
    named = [(name, tensor) for name, tensor in named if tensor.is_floating_point()]
    if not named:
        return
    with torch.no_grad():
        flags = torch.stack([_all_finite(t) for _, t in named]).tolist()
    bad = [(name, tensor) for (name, tensor), ok in zip(named, flags, strict=True) if not ok]
    if bad:
        raise _non_finite(where, *bad[0], more=len(bad) - 1)


def _non_finite(where: str, name: str, tensor: torch.Tensor, more: int = 0) -> ValueError:
    count = int((~torch.isfinite(tensor)).sum())
    others = f" (and {more} more parameter(s))" if more else ""
    half = (
        f"; it is stored in {str(tensor.dtype).removeprefix('torch.')}, whose range an update "
        "or a conversion may have overflowed"
        if tensor.dtype in _HALF
        else ""
    )
    return ValueError(
        f"{where}: parameter {name} holds {count:,} non-finite value(s) (NaN or inf) of "
        f"{tensor.numel():,}{others}: the checkpoint is broken{half}"
    )


def _file_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The named tensors of one weight file, one at a time (safetensors, or a ``torch.save``
    archive mapped from disk)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not iterable)
                yield key, handle.get_tensor(key)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        yield from state.items()


def check_finite_files(folder: Path, where: str) -> None:
    """Refuse a weight file of ``folder`` holding NaN or inf, naming the parameter as the file
    stores it (read one tensor at a time: memory of the largest tensor)."""
    for path in weight_files(folder):
        for name, tensor in _file_tensors(path):
            if tensor.is_floating_point() and not bool(_all_finite(tensor)):
                raise _non_finite(f"{where} ({path.name})", name, tensor)
