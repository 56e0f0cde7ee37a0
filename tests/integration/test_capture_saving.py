"""Saving and loading a capture's statistics: a capture of the tiny float64 decoder with every
feature on (gradients, frequency bins with gradient bin moments, type sums, a reservoir,
attention, per-sequence energy sums) survives the round trip bit for bit, in this process and
in another, merges after loading like a fresh one, and bad files or failed saves are refused
cleanly."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from tangentlens.capture import (
    CaptureConfig,
    CaptureStatistics,
    EnergyProjectors,
    MomentAccumulator,
    SequenceEnergyConfig,
    StatisticsConfig,
    capture_statistics,
    load_statistics,
    save_statistics,
)
from tangentlens.capture import saving as capture_saving
from tangentlens.data import FrequencyTable, SpecialTokens, iter_batches

DECODER_SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
SITES = ("hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post")
ENERGY_SITES = SITES[1:]  # hook_embed keeps no per-sequence sums
N_BINS, SEQ_LEN, N_SEQ, BATCH, VOCAB, D = 3, 12, 8, 3, 50, 16


def _rows() -> np.ndarray:
    """(N_SEQ, SEQ_LEN) token rows with BOS, an inner EOS and padding (excluded positions)."""
    rows = np.random.default_rng(0).integers(2, VOCAB, size=(N_SEQ, SEQ_LEN))
    rows[:, 0] = DECODER_SPECIAL.bos_id
    rows[1, 5] = DECODER_SPECIAL.eos_id
    rows[2, -3:] = DECODER_SPECIAL.pad_id
    return rows


def _projectors(seed: int) -> EnergyProjectors:
    """Projectors of two random orthonormal proxies (d × 3), one with controls outside a
    random direction, one with controls in all of ℝ^d."""
    gen = torch.Generator().manual_seed(seed)
    f64 = {"dtype": torch.float64, "generator": gen}
    proxies = {m: torch.linalg.qr(torch.randn(D, 3, **f64)).Q for m in ("pca", "seminmf")}
    m = torch.linalg.qr(torch.randn(D, 1, **f64)).Q
    proxies["pca"] = torch.linalg.qr(proxies["pca"] - m @ (m.T @ proxies["pca"])).Q
    return EnergyProjectors.from_proxies(proxies, {"pca": m, "seminmf": None})


@dataclasses.dataclass
class Setup:
    model: torch.nn.Module
    rows: np.ndarray
    config: CaptureConfig
    statistics: StatisticsConfig
    bins: Any

    def capture(
        self,
        rows: slice = slice(None),
        config: CaptureConfig | None = None,
        statistics: StatisticsConfig | None = None,
    ) -> CaptureStatistics:
        """A fresh capture of ``self.rows[rows]`` (the default configs unless given)."""
        return capture_statistics(
            self.model,
            iter_batches(self.rows[rows], BATCH),
            config or self.config,
            DECODER_SPECIAL,
            statistics or self.statistics,
            bins=self.bins,
            first_sequence=rows.start or 0,
        )


@pytest.fixture(scope="module")
def setup(tiny_decoder) -> Setup:
    rows = _rows()
    frequencies = FrequencyTable.from_rows(rows, VOCAB, DECODER_SPECIAL, causal=True)
    energy = SequenceEnergyConfig(
        seq_len=SEQ_LEN,
        projectors={s: _projectors(i) for i, s in enumerate(ENERGY_SITES)},
        n_bins=N_BINS,
    )
    statistics = StatisticsConfig(
        n_bins=N_BINS,
        gradient_bin_moments=True,
        type_sums=True,
        vocab_size=VOCAB,
        type_ids=tuple(range(2, VOCAB, 3)),
        reservoir_size=40,  # fewer than the kept rows: the sample evicted some
        seed=5,
        sequence_energy=energy,
    )
    config = CaptureConfig(sites=SITES, attention_layers=(0, 1), seed=3)
    return Setup(tiny_decoder, rows, config, statistics, frequencies.bins(N_BINS))


# ------------------------------------------------------------------------------ comparisons


def _assert_tensor(a: torch.Tensor, b: torch.Tensor) -> None:
    assert isinstance(b, torch.Tensor) and b.device.type == "cpu"
    assert (a.dtype, a.shape) == (b.dtype, b.shape)
    assert torch.equal(a, b)


def _assert_moments(a: MomentAccumulator, b: MomentAccumulator) -> None:
    assert (a.d, a.count, a.n_nonzero) == (b.d, b.count, b.n_nonzero)
    for name in ("sum", "sum_unit", "sum_norms", "sum_sq_norms"):
        _assert_tensor(getattr(a, name), getattr(b, name))
    assert (a.second_moment is None) == (b.second_moment is None)
    if a.second_moment is not None:
        _assert_tensor(a.second_moment, b.second_moment)


def _assert_statistics_config(a: StatisticsConfig, b: StatisticsConfig) -> None:
    """Equal in value (the sequence-energy config itself compares by identity)."""
    assert dataclasses.replace(a, sequence_energy=None) == dataclasses.replace(
        b, sequence_energy=None
    )
    ea, eb = a.sequence_energy, b.sequence_energy
    assert (ea is None) == (eb is None)
    if ea is not None:
        assert (ea.seq_len, ea.n_bins) == (eb.seq_len, eb.n_bins)
        assert list(ea.projectors) == list(eb.projectors)
        for site, pa in ea.projectors.items():
            pb = eb.projectors[site]
            assert pa.methods == pb.methods
            assert len(pa.bases) == len(pb.bases) == len(pa.excluded) == len(pb.excluded)
            for x, y in zip(pa.bases, pb.bases, strict=True):
                _assert_tensor(x, y)
            for x, y in zip(pa.excluded, pb.excluded, strict=True):
                assert (x is None) == (y is None)
                if x is not None:
                    _assert_tensor(x, y)
            _assert_tensor(pa.stacked, pb.stacked)


def _assert_same(a: CaptureStatistics, b: CaptureStatistics) -> None:
    """Every count, tensor and config of ``a`` and ``b`` equal, bit for bit."""
    assert a.config == b.config
    _assert_statistics_config(a.statistics, b.statistics)
    assert type(b.excluded) is Counter and a.excluded == b.excluded
    assert (a.n_positions, a.n_sequences, a.n_scored) == (b.n_positions, b.n_sequences, b.n_scored)
    assert (a.loss_sum, a.mean_loss, a.n_tokens) == (b.loss_sum, b.mean_loss, b.n_tokens)
    assert list(a.sites) == list(b.sites) == list(SITES)
    for name, sa in a.sites.items():
        sb = b.sites[name]
        assert (sa.d, sa.count) == (sb.d, sb.count)
        _assert_statistics_config(sa.config, sb.config)
        assert (len(sa.h_bins), len(sa.g_bins)) == (len(sb.h_bins), len(sb.g_bins)) == (3, 3)
        moments = [(s.h, s.g, *s.h_bins, *s.g_bins) for s in (sa, sb)]
        for ma, mb in zip(*moments, strict=True):
            _assert_moments(ma, mb)
        ta, tb = sa.types, sb.types
        assert ta.vocab_size == tb.vocab_size
        for field in ("ids", "count", "sum", "sum_sq_norms"):
            _assert_tensor(getattr(ta, field), getattr(tb, field))
        _assert_tensor(tb.rows_of(ta.ids), torch.arange(len(ta.ids)))
        ra, rb = sa.reservoir, sb.reservoir
        assert (ra.capacity, ra.seed, len(ra)) == (rb.capacity, rb.seed, len(rb))
        _assert_tensor(ra.ids, rb.ids)
        ca, cb = ra.columns(), rb.columns()
        assert sorted(ca) == sorted(cb) == ["G", "H", "bin", "token"]
        for column in ca:
            _assert_tensor(ca[column], cb[column])
        ea, eb = sa.sequence_energy, sb.sequence_energy
        assert (ea is None) == (eb is None) == (name not in ENERGY_SITES)
        if ea is not None:
            assert (ea.seq_len, ea.methods) == (eb.seq_len, eb.methods)
            for field in ("sequences", "total", "inside", "drift"):
                _assert_tensor(getattr(ea, field), getattr(eb, field))
            b = torch.linspace(-1.0, 1.0, D, dtype=torch.float64)  # any drift coefficient
            for j, method in enumerate(ea.methods):
                coefficient = None if ea.projectors.excluded[j] is None else b
                for bin_index in [None, *range(N_BINS)]:
                    for x, y in zip(
                        ea.sums(method, bin_index, coefficient),
                        eb.sums(method, bin_index, coefficient),
                        strict=True,
                    ):
                        _assert_tensor(x, y)
    assert list(a.attention) == list(b.attention) == [0, 1]
    for layer, aa in a.attention.items():
        ab = b.attention[layer]
        assert aa.count == ab.count
        for field in ("sum_q", "sum_k", "entropy_sum"):
            _assert_tensor(getattr(aa, field), getattr(ab, field))


# ------------------------------------------------------------------------------ the tests


def test_round_trip_keeps_every_statistic_exactly(setup, tmp_path):
    stats = setup.capture()
    energy = stats.sites[ENERGY_SITES[0]].sequence_energy
    chunks = len(energy._chunks)
    assert chunks == math.ceil(N_SEQ / BATCH)  # one per batch, not consolidated yet
    assert len(stats.sites[SITES[0]].reservoir) == 40 < stats.n_tokens
    assert set(stats.excluded) >= {"bos", "padding", "no_target", "total"}
    path = tmp_path / "capture.pt"
    save_statistics(stats, path)
    assert len(energy._chunks) == chunks  # saving left the capture as it was
    loaded, extra = load_statistics(str(path))
    assert extra == {}
    assert len(loaded.sites[ENERGY_SITES[0]].sequence_energy._chunks) == chunks
    _assert_same(stats, loaded)
    # what the code compares by identity is shared inside the loaded capture, as it was
    for name, site in loaded.sites.items():
        assert site.config is loaded.statistics
        if name in ENERGY_SITES:
            assert (
                site.sequence_energy.projectors
                is (loaded.statistics.sequence_energy.projectors[name])
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture.pt"]  # no temporary left


def test_extra_round_trips_plain_values(setup, tmp_path):
    extra = {
        "row_labels": ["a", "b"],
        "layers": {"hook_embed": None, "blocks.0.hook_resid_post": 0},
        "seq_len": SEQ_LEN,
        "ratio": 0.5,
        "missing": math.nan,
        "flag": True,
        "pair": (1, "x", (2.0, None)),
        "counts": np.arange(6, dtype=np.int32).reshape(2, 3),
        "scalar": np.int64(7),
        "weights": torch.arange(4, dtype=torch.float32),
        "window": torch.arange(1000.0)[10:14],  # a view: saved without its whole storage
        "nested": [{"deep": [1, {"x": frozenset({3})}]}],
    }
    path = tmp_path / "capture.pt"
    save_statistics(setup.capture(slice(0, 3)), path, extra)
    _, loaded = load_statistics(path)
    assert list(loaded) == list(extra)
    for key in ("row_labels", "layers", "seq_len", "ratio", "flag", "pair", "nested"):
        assert loaded[key] == extra[key] and type(loaded[key]) is type(extra[key]), key
    assert type(loaded["flag"]) is bool and math.isnan(loaded["missing"])
    assert isinstance(loaded["counts"], np.ndarray) and loaded["counts"].dtype == np.int32
    np.testing.assert_array_equal(loaded["counts"], extra["counts"])
    assert type(loaded["scalar"]) is np.int64 and loaded["scalar"] == 7
    _assert_tensor(extra["weights"], loaded["weights"])
    _assert_tensor(extra["window"], loaded["window"])
    assert loaded["window"].untyped_storage().nbytes() == 4 * 4


def test_loaded_capture_merges_like_a_fresh_one(setup, tmp_path):
    first, second = slice(0, 4), slice(4, None)
    reference = setup.capture(first)
    reference.merge(setup.capture(second))
    save_statistics(setup.capture(first), tmp_path / "first.pt")
    loaded, _ = load_statistics(tmp_path / "first.pt")
    # a capture continued in the new process, with the loaded configs
    loaded.merge(setup.capture(second, loaded.config, loaded.statistics))
    _assert_same(reference, loaded)
    # the per-sequence energy config compares by identity: the live one is another object
    again, _ = load_statistics(tmp_path / "first.pt")
    with pytest.raises(ValueError, match="equal capture configs"):
        again.merge(setup.capture(second))


def test_a_saved_capture_loads_in_another_process(setup, tmp_path):
    stats = setup.capture()
    extra = {"seq_len": SEQ_LEN, "counts": np.arange(5)}
    save_statistics(stats, tmp_path / "capture.pt", extra)
    script = textwrap.dedent(
        """
        import sys

        from tangentlens.capture import load_statistics, save_statistics

        stats, extra = load_statistics(sys.argv[1])
        save_statistics(stats, sys.argv[2], extra)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, tmp_path / "capture.pt", tmp_path / "again.pt"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded, loaded_extra = load_statistics(tmp_path / "again.pt")
    _assert_same(stats, loaded)
    assert loaded_extra["seq_len"] == SEQ_LEN
    np.testing.assert_array_equal(loaded_extra["counts"], extra["counts"])


def test_files_that_are_not_captures_are_refused(setup, tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(2)}, weights)
    text = tmp_path / "notes.txt"
    text.write_text("not a torch file")
    for path in (weights, text):
        with pytest.raises(ValueError, match=rf"{path.name} is not a tangentlens capture"):
            load_statistics(path)
    good = tmp_path / "capture.pt"
    save_statistics(setup.capture(slice(0, 3)), good)
    payload = torch.load(good, weights_only=True)
    newer = tmp_path / "newer.pt"
    torch.save({**payload, "version": capture_saving.FORMAT_VERSION + 1}, newer)
    with pytest.raises(
        ValueError, match=r"newer\.pt holds .* format version 4; .* reads version 3"
    ):
        load_statistics(newer)
    payload["statistics"]["state"]["sites"]["values"][0]["class"] = "Unpickler"
    corrupt = tmp_path / "corrupt.pt"
    torch.save(payload, corrupt)
    with pytest.raises(ValueError, match=r"corrupt\.pt holds corrupt .*unknown class 'Unpickler'"):
        load_statistics(corrupt)


class _Opaque:
    """A class the saver does not know."""


def test_failed_saves_leave_no_file(setup, tmp_path, monkeypatch):
    stats = setup.capture(slice(0, 3))
    path = tmp_path / "capture.pt"
    with pytest.raises(ValueError, match=r"cannot save extra\['labels'\]\[1\]: .*_Opaque"):
        save_statistics(stats, path, {"labels": ["a", _Opaque()]})
    stats.sites[SITES[1]].types = _Opaque()  # type: ignore[assignment]
    with pytest.raises(
        ValueError, match=r"statistics\.sites\['blocks\.0\.hook_resid_post'\]\.types"
    ):
        save_statistics(stats, path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        save_statistics(setup.capture(slice(0, 3)), tmp_path / "missing" / "capture.pt")
    assert list(tmp_path.iterdir()) == []
    # a save that fails while writing leaves the previous file whole and no temporary
    save_statistics(setup.capture(slice(0, 3)), path)
    before = path.read_bytes()

    def fail_midway(payload, file):
        file.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(capture_saving.torch, "save", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        save_statistics(setup.capture(slice(3, 6)), path)
    assert [p.name for p in tmp_path.iterdir()] == ["capture.pt"]
    assert path.read_bytes() == before


class _Malicious:
    """Unpickled, it would create the folder ``marker`` (os.makedirs)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_loading_reads_weights_only(setup, tmp_path):
    path = tmp_path / "capture.pt"
    save_statistics(setup.capture(slice(0, 3)), path, {"counts": np.arange(3)})
    payload = torch.load(path, weights_only=True)
    assert (payload["format"], payload["version"]) == (capture_saving.FORMAT, 3)
    # a file that names a Python callable is refused without running it
    hostile = tmp_path / "hostile.pt"
    marker = tmp_path / "unpickled"
    torch.save({**payload, "extra": _Malicious(str(marker))}, hostile)
    with pytest.raises(ValueError, match=r"hostile\.pt is not a .*weights_only=True"):
        load_statistics(hostile)
    assert not marker.exists()
