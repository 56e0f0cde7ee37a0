"""Child process of ``test_loading_peak.py``: load one checkpoint as a sweep unit does and print
JSON ``{"measured", "anon", "weights"}`` (bytes).

argv[1] is JSON: ``{"path": "local", "folder", "warmup", "dtype"}`` (a checkpoint folder, through
:func:`tangentlens.models.loading.load_local_checkpoint`) or ``{"path": "pythia", "model",
"warmup", "step", "dtype"}`` (a Pythia revision from the Hugging Face cache that ``HF_HUB_CACHE``
names, offline, through :func:`tangentlens.models.loading.load_pythia_checkpoint`).
``warmup`` (a folder, or a Pythia model cached at ``step``) is loaded first the same way, so that
the lazily imported modules and library pages are resident before the baseline is taken.

Measured: the process's peak resident memory (``VmHWM``: anonymous and file-backed pages,
the safetensors files mapped included) above its resident memory once the warm-up model is gone;
``anon``: the peak of the anonymous part alone above its baseline (``RssAnon`` sampled every
millisecond: a lower bound, for the report). ``weights``: the loaded TransformerLens model's
parameters and buffers.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import threading
import time
import warnings

from peak_memory import peak_resident, resident, status_bytes


def main(spec: dict) -> dict:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch

    from tangentlens.models.loading import load_local_checkpoint, load_pythia_checkpoint

    torch.set_num_threads(2)
    dtype = getattr(torch, spec["dtype"])

    def load(target: str):
        if spec["path"] == "local":
            return load_local_checkpoint(target, dtype=dtype)
        return load_pythia_checkpoint(target, spec["step"], offline=True, dtype=dtype)

    warm = load(spec["warmup"])
    del warm
    gc.collect()
    baseline, anon_baseline = resident(), status_bytes("RssAnon")
    anon_peak = [anon_baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            anon_peak[0] = max(anon_peak[0], status_bytes("RssAnon"))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    model = load(spec["folder"] if spec["path"] == "local" else spec["model"])
    measured = peak_resident() - baseline
    done.set()
    sampler.join()
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    return {"measured": measured, "anon": anon_peak[0] - anon_baseline, "weights": weights}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
