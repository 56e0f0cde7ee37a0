"""The analysis-data file a run keeps (``state/data.npz``): its bytes, and so the manifest's
``data_sha256``, are what every earlier version wrote for the same data, and it never unpickles.
The run in tests/fixtures/pre_proxies_run was written by e6a78c2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tangentlens.core.data import data_sha256, load_analysis_data, save_analysis_data

RUN = Path(__file__).parents[1] / "fixtures" / "pre_proxies_run" / "run"
#: The hash of its data file, as its manifest records it.
RECORDED = json.loads((RUN / "manifest.json").read_text())["data_sha256"]


def test_the_hash_is_the_sha256_of_the_whole_file(tmp_path):
    """Read in blocks: a file of several blocks and an empty one hash as hashlib says."""
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).bytes(3 * 2**20 + 17))
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    for path in (big, empty):
        assert data_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert data_sha256(RUN / "state" / "data.npz") == RECORDED


def test_data_saved_again_has_the_bytes_an_earlier_version_wrote(tmp_path):
    """Same data, same file: two runs of one recipe, made by different versions, record the same
    ``data_sha256`` (the metadata is JSON with sorted keys)."""
    data = load_analysis_data(RUN / "state" / "data.npz", n_bins=3)
    save_analysis_data(data, tmp_path / "again.npz")
    assert data_sha256(tmp_path / "again.npz") == RECORDED


def test_a_data_file_holding_pickled_objects_is_refused(tmp_path):
    """A run directory from elsewhere never runs code when read: object arrays are refused."""
    with np.load(RUN / "state" / "data.npz") as saved:
        counts, meta = saved["counts"], saved["meta"]
    rows = np.empty((1, 2), dtype=object)
    rows[0] = [1, 2]
    np.savez(tmp_path / "pickled.npz", rows=rows, counts=counts, meta=meta)
    with pytest.raises(ValueError, match="allow_pickle"):
        load_analysis_data(tmp_path / "pickled.npz", n_bins=3)
