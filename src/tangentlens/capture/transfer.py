"""Host → device copies on the capture's hot path.

The capture keeps its bookkeeping — token ids, masks, frequency bins, row ids, orders and
reservoir slots — on the host and sends small index tensors to the model's device every batch.
From pageable host memory a CUDA copy first waits for every kernel queued before it (a stream
synchronisation), which serialises the host's work with the device's; from pinned (page-locked)
memory it is queued like a kernel. :func:`upload` pins what it sends (PyTorch caches pinned
blocks, so this costs a copy into a cached buffer) and returns at once; :func:`upload_many`
sends several integer vectors in one such copy (one pinned buffer, one transfer, views of it on
the device), so a batch's bookkeeping costs one copy, not one per index.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["upload", "upload_many"]


def upload(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``: from the host to an accelerator through pinned memory without
    waiting (the tensor is copied first, so the caller may reuse it at once); otherwise
    ``tensor.to(device)``."""
    device = torch.device(device)
    if device.type != "cpu" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def upload_many(tensors: Sequence[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Host int64 tensors (any shapes) on ``device`` in one copy: concatenated, uploaded
    (:func:`upload`) and split into views of their shapes; on the CPU, the tensors as they
    are."""
    device = torch.device(device)
    if device.type == "cpu" or not tensors:
        return [t.to(device) for t in tensors]
    flat = torch.cat([t.reshape(-1).to(torch.int64) for t in tensors])
    sent = upload(flat, device)
    out, start = [], 0
    for t in tensors:
        out.append(sent[start : start + t.numel()].view(t.shape))
        start += t.numel()
    return out
