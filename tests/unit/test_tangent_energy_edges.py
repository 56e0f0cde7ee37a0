"""Edge cells of the tangent-energy probe: a bin without tokens, a bin of one token, a sample of
exactly two sequences, a site without a reservoir, a fraction whose rescaled interval would pass
1, and a capture mixing interval sources."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tangentlens.capture.accumulators import MomentAccumulator
from tangentlens.capture.captured import Capture
from tangentlens.probes import tangent_energy

D, K, SITE = 6, 2, "blocks.0.hook_resid_post"
PROXY = torch.eye(D, dtype=torch.float64)[:, :K]
CONFIG = tangent_energy.TangentEnergyConfig(bootstrap=50)
#: The proxies stage's control frames per measurement and their seed.
CONTROLS = {"draws": 9, "seed": 1}


def _acc(rows: torch.Tensor) -> MomentAccumulator:
    acc = MomentAccumulator(D)
    if rows.shape[0]:
        acc.update(rows)
    return acc


class _Reservoir:
    """The two columns the probe reads, every row kept, ``seq_len`` rows per sequence."""

    def __init__(self, g: torch.Tensor, bins: torch.Tensor, ids: torch.Tensor):
        self._columns = {"G": g.float(), "bin": bins}
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def columns(self) -> dict[str, torch.Tensor]:
        return self._columns


def _capture(bins: list[torch.Tensor], reservoir=None, sequence_energy=None) -> Capture:
    everything = torch.cat(bins)
    site = SimpleNamespace(
        g=_acc(everything),
        g_bins=[_acc(b) for b in bins],
        reservoir=reservoir,
        sequence_energy=sequence_energy,
    )
    return Capture("edges", 3, 0, SimpleNamespace(sites={SITE: site}), {SITE: 0}, 4)


def _rows(capture: Capture, config=CONFIG) -> dict:
    rows = tangent_energy.rows(capture, {SITE: {"pca": PROXY}}, config, **CONTROLS)
    return {(r["freq_bin"], r["metric"]): r for r in rows}


def test_a_bin_without_tokens_has_no_row_and_a_one_token_bin_is_scored():
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(9, D, generator=gen, dtype=torch.float64)
    got = _rows(_capture([g[:0], g[:1], g[1:]]))
    assert not any(b == "0" for b, _ in got)
    one = got[("1", "energy_fraction")]
    assert one["n_tokens"] == 1 and one["probe"] == "tangent_energy"
    assert one["value"] == pytest.approx(float((g[0, :K] ** 2).sum() / (g[0] ** 2).sum()))


def test_a_bin_without_gradient_reads_nan_under_the_probes_name():
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(8, D, generator=gen, dtype=torch.float64)
    got = _rows(_capture([torch.zeros(3, D, dtype=torch.float64), g]))
    (row,) = [r for (b, _), r in got.items() if b == "0"]
    assert math.isnan(row["value"]) and row["metric"] == "energy_fraction"
    assert row["probe"] == "tangent_energy" and row["site"] == SITE and row["rank"] == K


def test_intervals_need_two_sampled_sequences_and_a_reservoir():
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(8, D, generator=gen, dtype=torch.float64)
    bins = torch.zeros(8, dtype=torch.int64)
    two = _Reservoir(g, bins, torch.arange(8))  # rows 0-3 and 4-7: two sequences of 4
    got = _rows(_capture([g], reservoir=two))
    assert got[("all", "energy_fraction")]["ci_low"] is not None
    one = _Reservoir(g[:4], bins[:4], torch.arange(4))
    assert _rows(_capture([g], reservoir=one))[("all", "energy_fraction")]["ci_low"] is None
    assert _rows(_capture([g], reservoir=None))[("all", "energy_fraction")]["ci_low"] is None


def test_a_rescaled_fraction_interval_stays_below_one():
    """Nearly all energy in the proxy, a sample whose own fraction is lower: rescaled onto the
    reported value the interval would pass 1; it is clipped there."""
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(400, D, generator=gen, dtype=torch.float64) * 1e-3
    g[:, :K] += torch.randn(400, K, generator=gen, dtype=torch.float64)
    sample = g[:40].clone()
    sample[:, K:] += 0.3 * torch.randn(40, D - K, generator=gen, dtype=torch.float64)
    reservoir = _Reservoir(sample, torch.zeros(40, dtype=torch.int64), torch.arange(40))
    row = _rows(_capture([g], reservoir=reservoir))[("all", "energy_fraction")]
    assert row["value"] > 0.999
    assert row["ci_high"] == 1.0 and row["ci_low"] < row["value"]


def test_a_capture_mixing_interval_sources_is_refused():
    g = torch.randn(8, D, dtype=torch.float64)
    summed = SimpleNamespace(g=_acc(g), sequence_energy=object())
    plain = SimpleNamespace(g=_acc(g), sequence_energy=None)
    mixed = Capture("edges", 3, 0, SimpleNamespace(sites={"a": summed, "b": plain}), {}, 4)
    with pytest.raises(ValueError, match=r"^some sites kept per-sequence energy sums and some"):
        tangent_energy.interval_source(mixed)
    assert (
        tangent_energy.interval_source(
            Capture("edges", 3, 0, SimpleNamespace(sites={"b": plain}), {}, 4)
        )
        == tangent_energy.INTERVAL_SAMPLE
    )


def test_sequence_energy_config_checks_the_bin_count():
    with pytest.raises(ValueError, match=r"^n_bins must be an integer ≥ 0"):
        tangent_energy.sequence_energy_config({SITE: {"pca": PROXY}}, -1, 4)
    spec = tangent_energy.sequence_energy_config({SITE: {"pca": PROXY}}, 2, 4)
    assert (spec.seq_len, spec.n_bins) == (4, 2)
    # no m̂ among the proxies: no drift sums, the proxy's projector alone
    projectors = spec.projectors[SITE]
    assert projectors.excluded == (None,) and projectors.drift is None
    torch.testing.assert_close(projectors.stacked[0], PROXY @ PROXY.T, rtol=0, atol=1e-15)
