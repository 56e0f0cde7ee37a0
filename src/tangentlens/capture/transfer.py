"""Host → device copies on the capture's hot path.

The capture keeps its bookkeeping — token ids, masks, frequency bins, row ids, orders and
reservoir slots — on the host and sends small index tensors to the model's device every batch.
From pageable host memory a CUDA copy first waits for every kernel queued before it (a stream
synchronisation), which serialises the host's work with the device's; from pinned (page-locked)
memory it is queued like a kernel. :func:`upload` pins what it sends (PyTorch caches pinned
blocks, so this costs a copy into a cached buffer) and returns at once.
"""

from __future__ import annotations

import torch

__all__ = ["upload"]


def upload(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``: from the host to a CUDA device through pinned memory without
    waiting (the tensor is copied first, so the caller may reuse it at once); otherwise
    ``tensor.to(device)``."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
