"""Edge cases of the split select's binned gate (``SPLIT_GATE_BINS``), the gate ahead of the
score kernel (``INDEXER_TOPK_SCORED_GATE``, ``legacy.scored_split``) and the two switches' parsing.

The binned gate's arithmetic against its own specification on samples that stress a linear
binning (random bits, magnitudes from denormals to 1e38, signed zeros, infinities, one outlier);
the split select with the binned gate on special-value rows and at the aimed rank's cap; the gate
ahead on extreme weight scales, on the patterns its binned test leaves out, and at a ``topk``
whose candidate region cannot hold the gate's sample; unreadable values of the two switches.
"""

import pytest
import torch

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.contract import KEY_NAN, KEY_NONE, ordered_score_bits
from indexer_topk.envs import envs
from indexer_topk.guards import unwritten_slots
from indexer_topk.kernels.split_topk import CAND_PER_TOPK, gate_rows_kernel
from indexer_topk.workload import make_workload

from kernel_cases import assert_bitwise
from test_row_topk import assert_same_bits, set_settings
from test_scored_gate import assert_same_step, small_split  # noqa: F401 - a fixture
from test_split_topk import (  # noqa: F401 - a fixture
    assert_binned_reach, binned_slack, gates_and_reach, sample_rank, split_way, torch_way)

# the bins' fp32 steps meet inf and NaN by design; the interpreter's numpy warns on each
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def test_gate_ahead_leaves_a_small_topk_to_the_four_kernels(monkeypatch, device):
    """A ``topk`` whose candidate region is smaller than the gate's sample (``SPLIT_SAMPLE >
    CAND_PER_TOPK * topk``: 16, 32 and 64 with the shipped sample of 2,048) cannot take the gate
    ahead, whose sample is stored in that region: with the switch on, such a decode call keeps
    the four-kernel step and its bits (the public API takes 512, 1024 and 2048 only; the legacy
    backend and its benchmarks take others)."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "split")
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    topk = 64
    assert legacy_backend.SPLIT_SAMPLE > CAND_PER_TOPK * topk  # the shipped constants
    wl = make_workload("sglang_fp8", context_tokens=[4 * 4200, 4 * 300], rows_per_request=[1, 1], topk=topk,
                       seed=1, device=device)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "0")
    four = legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=1)
    assert unwritten_slots(four) == []
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    width = legacy_backend.key_matrix_width(wl.page_table)
    assert not legacy_backend.scored_gate_way(wl.inputs(), 1, wl.rows, width)
    assert_bitwise(legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=1), four, "topk = 64, switch on")
    wl = make_workload("sglang_fp8", context_tokens=[4 * 4200, 4 * 300], rows_per_request=[1, 1], topk=128,
                       seed=1, device=device)
    assert legacy_backend.scored_gate_way(wl.inputs(), 1, wl.rows, width)  # 2,048 <= 20 * 128


def _score_of_keys(keys):
    """The kernels' ``key_to_score_bits`` as fp32 (``KEY_NAN`` and below: the canonical NaN)."""
    bits = torch.where(keys < 0, keys ^ 0x7FFFFFFF, keys)
    bits = torch.where(keys <= KEY_NAN, torch.full_like(bits, 0x7FC00000), bits)
    return bits.view(torch.float32)


def _binned_gate_spec(sample, n, topk, gate_bins):
    """:func:`.split_topk.binned_gate` as its docstring states it, in torch's fp32: ``(gate, the
    search's gate, whether the search's was taken, r)``."""
    r = sample_rank(n, topk, sample.numel())
    search = int(sample.sort(descending=True).values[r - 1])
    s_lo = _score_of_keys(sample.min().view(1))
    s_hi = _score_of_keys(sample.max().view(1))
    scale = torch.tensor([float(gate_bins)], dtype=torch.float32) / (s_hi - s_lo)
    d = (_score_of_keys(sample) - s_lo) * scale
    b = torch.where(d == d, d, torch.zeros_like(d)).clamp(0, gate_bins - 1).to(torch.int64)
    ge = torch.bincount(b, minlength=gate_bins).flip(0).cumsum(0).flip(0)
    star = int((ge >= r).nonzero().max())
    reach = int(ge[star])
    s = float(scale)
    exact = s != s or s <= 0 or s == float("inf") or reach - r > binned_slack(r)
    return (search if exact else int(sample[b >= star].min())), search, exact, r


def _adversarial_rows(kind, rows, width, gen):
    """int32 order keys of ``rows`` rows that stress a linear binning of their sample."""
    if kind == "random_bits":  # NaN bit patterns at both ends, KEY_NONE and KEY_NAN included
        return torch.randint(-(2**31), 2**31 - 1, (rows, width), generator=gen, dtype=torch.int32)
    if kind == "magnitudes":  # each row its own scale, from subnormal to near fp32's largest
        scale = 10.0 ** torch.randint(-44, 38, (rows, 1), generator=gen).float()
        return ordered_score_bits(torch.randn((rows, width), generator=gen) * scale)
    if kind == "subnormals":  # a range whose reciprocal overflows
        return ordered_score_bits(torch.randint(-3, 4, (rows, width), generator=gen).float() * 1e-45)
    if kind == "signed_zeros":  # -0.0 and +0.0: distinct keys, one score
        v = torch.where(torch.rand((rows, width), generator=gen) < 0.5, torch.tensor(0.0), torch.tensor(-0.0))
        v[:, 5::61] = torch.rand(v[:, 5::61].shape, generator=gen)
        return ordered_score_bits(v)
    if kind == "infinities":  # +inf and fp32's most negative: a range with no finite width, or overflowing
        v = torch.randn((rows, width), generator=gen)
        v[:, ::5] = float("inf")
        v[:, 1::7] = -3.4e38
        v[1::2, ::5] = 3.4e38  # odd rows: (max - min) overflows fp32
        return ordered_score_bits(v)
    if kind == "one_apart":  # every key equal but one (above in even rows, below in odd rows)
        v = torch.zeros((rows, width))
        v[0::2, width // 3] = 1.0
        v[1::2, width // 3] = -1.0
        return ordered_score_bits(v)
    if kind == "log_normal":  # most of the sample crowded near the bottom of its range
        return ordered_score_bits(torch.exp(torch.randn((rows, width), generator=gen) * 5))
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random_bits", "magnitudes", "subnormals", "signed_zeros", "infinities",
                                  "one_apart", "log_normal"])
def test_binned_gate_is_its_specification(kind, device):
    """The gate kernel's binned gate, key for key, equals its docstring's specification computed
    here in torch's fp32, on samples that stress a linear binning, for rows of lengths from just
    past the tile (the aimed rank at its cap ``SAMPLE - 1``) to eight tiles: at least ``r``
    sampled keys reach it, and where it is not the search's no more than ``r / 8 + 2`` past
    ``r`` do. (The existing tests check the reach bounds through the whole select; none checks
    the gate itself.)"""
    gen = torch.Generator().manual_seed(sum(map(ord, kind)))
    tile, sample, topk, gate_bins, width = 256, 256, 128, 64, 2048
    lens = torch.tensor([tile + 1, 300, 322, 323, 555, 1000, 2047, width], dtype=torch.int32)
    rows = len(lens)
    keys = _adversarial_rows(kind, rows, width, gen)
    gates = torch.zeros(rows, dtype=torch.int32, device=device)
    counts, scales = torch.zeros_like(gates), torch.zeros_like(gates)
    hist = torch.zeros(rows * 2 * 64, dtype=torch.int32, device=device)
    gate_rows_kernel[(rows,)](keys.to(device), width, lens.to(device), 0, gates, counts, scales, hist, TOPK=topk,
                              TILE=tile, SAMPLE=sample, BINS=64, GATE_BINS=gate_bins, SPREAD=16, num_warps=4)
    gates = gates.cpu()
    assert all(n > tile for n in lens.tolist())
    how = []
    for r, n in enumerate(lens.tolist()):
        sampled = keys[r, (torch.arange(sample) * n) // sample]
        want, search, exact, rank = _binned_gate_spec(sampled, n, topk, gate_bins)
        got = int(gates[r])
        assert got == want, (r, n, got, want, search, exact)
        how.append("search" if exact else "binned")
        reach = int((sampled >= got).sum())
        assert reach >= rank, (r, reach, rank)
        assert got == search or reach <= rank + binned_slack(rank), (r, reach, rank)
    if kind in ("random_bits", "subnormals", "infinities", "one_apart"):  # NaN or inf at an end, no
        assert how == ["search"] * rows, how  # finite scale, or every sampled key in one bin
    elif kind in ("magnitudes", "log_normal"):
        assert "binned" in how, how
    # the first three rows' rank at its cap, the fourth's one below
    assert [sample_rank(n, topk, sample) for n in lens.tolist()[:4]] == [sample - 1] * 3 + [sample - 2]


def _special_rows(kind, lens, width, gen):
    keys = torch.full((len(lens), width), KEY_NONE, dtype=torch.int32)
    for r, n in enumerate(lens):
        if kind == "one_high":
            v = torch.zeros(n)
            v[n // 2] = 1.0
        elif kind == "one_low":
            v = torch.ones(n)
            v[n // 3] = -1.0
        elif kind == "subnormals":
            v = torch.randint(-200, 200, (n,), generator=gen).float() * 1.4e-45
        elif kind == "signed_zeros":
            v = torch.where(torch.rand(n, generator=gen) < 0.5, torch.tensor(0.0), torch.tensor(-0.0))
            v[::97] = torch.rand(v[::97].shape, generator=gen)
        elif kind == "inf_sampled":  # +inf at a sampled position, -inf at another
            v = torch.randn(n, generator=gen)
            v[0] = float("inf")
            v[(n * 3) // legacy_backend.SPLIT_SAMPLE] = float("-inf")
        elif kind == "overflowing_range":
            v = torch.randn(n, generator=gen) * 3e38
        elif kind == "close_huge":  # a range a few ulps wide at fp32's top
            v = 1e38 + torch.randn(n, generator=gen) * 1e31
        elif kind == "none_and_nan_inside":  # KEY_NONE, KEY_NAN, +NaN bits and INT32_MAX inside the row
            k = torch.randint(-1000, 1000, (n,), generator=gen, dtype=torch.int32)
            pick = torch.randint(0, 6, (n,), generator=gen)
            for code, value in ((0, KEY_NONE), (1, KEY_NAN), (2, 2**31 - 1), (3, 0x7F800000)):
                k = torch.where(pick == code, torch.tensor(value, dtype=torch.int32), k)
            keys[r, :n] = k
            continue
        else:
            raise ValueError(kind)
        keys[r, :n] = ordered_score_bits(v)
    return keys


@pytest.mark.parametrize("kind", ["one_high", "one_low", "subnormals", "signed_zeros", "inf_sampled",
                                  "overflowing_range", "close_huge", "none_and_nan_inside"])
def test_split_binned_gate_on_special_rows(kind, split_way, monkeypatch, device):
    """The split select with ``SPLIT_GATE_BINS = 256`` on rows whose sample has every key equal
    but one, subnormal or overflowing ranges, signed zeros, infinities where the sample reads,
    and keys of no score inside the rows: the torch way's bits, every slot written, nothing past
    the scratch, at least the aimed rank of sampled keys reaching each gate."""
    width = 4096
    lens = [width, 4000, 2049, 1025]
    keys = _special_rows(kind, lens, width, torch.Generator().manual_seed(sum(map(ord, kind)))).to(device)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    got, _counts, _hows, reach = gates_and_reach(keys, lens_t, 128, monkeypatch, 256)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, 128, monkeypatch))
    assert all(n >= r for _gate, n, r in reach), reach


@pytest.mark.parametrize("pattern", ["scores", "increasing", "one_high"])
def test_split_binned_gate_at_the_rank_cap(pattern, split_way, monkeypatch, device):
    """``topk = 512`` over rows just past the tile (1,025 to 1,283 keys of a 1,024-key sample):
    the aimed rank reaches its cap ``SAMPLE - 1`` (but in the last row), where the binned gate
    may be the sample's smallest key, below anything the search takes. The torch way's bits,
    every slot written, the gate reached by at least ``r`` sampled keys and by no more than the
    slack past ``r`` where it is not the search's (at the cap: the sample's smallest key)."""
    set_settings(monkeypatch, SPLIT_TILE=1024, SPLIT_SAMPLE=1024)  # on a GPU too: the rows just past the tile
    topk, width = 512, 1536
    lens = [1025, 1100, 1282, 1283]
    sample = legacy_backend.split_sample(width, topk)
    assert [sample_rank(n, topk, sample) for n in lens] == [sample - 1] * 3 + [sample - 2]
    gen = torch.Generator().manual_seed(2)
    keys = torch.full((len(lens), width), KEY_NONE, dtype=torch.int32)
    for r, n in enumerate(lens):
        if pattern == "scores":
            v = torch.randn(n, generator=gen)
        elif pattern == "increasing":
            v = torch.arange(n).float()
        else:
            v = torch.zeros(n)
            v[n // 2] = 1.0
        keys[r, :n] = ordered_score_bits(v)
    keys, lens_t = keys.to(device), torch.tensor(lens, dtype=torch.int32, device=device)
    got, _counts, _hows, reach = gates_and_reach(keys, lens_t, topk, monkeypatch, 256)
    _got, _counts, _hows, searched = gates_and_reach(keys, lens_t, topk, monkeypatch, 0)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, topk, monkeypatch))
    assert_binned_reach(reach, searched)
    # at the cap, the binned gate is the search's (the second smallest sampled key) or the smallest
    smallest = [int(keys[r, (torch.arange(sample, device=device) * n) // sample].min()) for r, n in enumerate(lens)]
    assert all(a == b or a[0] == low for a, b, low in zip(reach[:3], searched[:3], smallest[:3])), (reach, searched)


DECODE_LENS = [5000, 4096, 1025, 1024, 129, 128, 127, 1, 0, 3000]


@pytest.mark.parametrize("weight_scale", [0.0, -1.0, 1e38, float("nan")], ids=["zero", "negative", "huge", "nan"])
def test_gate_ahead_on_extreme_weight_scales(weight_scale, small_split, monkeypatch, device):  # noqa: F811
    """A weight scale of zero (every score a signed zero), a negative one (the order reversed),
    one that overflows scores to infinity and NaN: the gate ahead with the binned gate gives
    the four-kernel step's outputs, key matrix and header bits."""
    monkeypatch.setattr(legacy_backend, "SPLIT_GATE_BINS", 256)
    wl = make_workload("sglang_fp8", context_tokens=[4 * n for n in DECODE_LENS], rows_per_request=[1] * 10,
                       topk=128, seed=5, device=device, weight_scale=weight_scale)
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []


@pytest.mark.parametrize("pattern", ["decreasing", "equal", "nan_rows"])
def test_gate_ahead_with_a_binned_gate_on_the_other_patterns(pattern, small_split, monkeypatch, device):  # noqa: F811
    """The patterns ``test_gate_ahead_with_a_binned_gate`` leaves out (falling scores, every
    score equal, NaN rows), with the binned gate on both steps: the same bits."""
    monkeypatch.setattr(legacy_backend, "SPLIT_GATE_BINS", 256)
    wl = make_workload("sglang_fp8", context_tokens=[4 * n for n in DECODE_LENS], rows_per_request=[1] * 10,
                       topk=128, seed=6, device=device, pattern=pattern)
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []


@pytest.mark.parametrize("raw,on", [("", False), ("  ", False), ("2", False), ("enable", False), ("on!", False),
                                    ("y", False), (" ON ", True), ("Yes", True), ("true\n", True)])
def test_scored_gate_switch_spellings(raw, on, monkeypatch):
    """``INDEXER_TOPK_SCORED_GATE`` set but empty, or to anything but the switch's spellings,
    keeps the gate after the score kernel (its fail-safe value); the spellings turn it on
    whatever their case and surrounding spaces."""
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 1024)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    wl = make_workload("sglang_fp8", context_tokens=[256, 256], rows_per_request=[1, 1], topk=128, seed=0,
                       device="cpu")
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", raw)
    assert envs.INDEXER_TOPK_SCORED_GATE.get() is on
    assert legacy_backend.scored_gate_way(wl.inputs(), 1, 2, 1024) is on


@pytest.mark.parametrize("raw", ["-1", "1.5", "1e3", "0x10", "2048MiB", "- 5"])
def test_unreadable_logits_budget_takes_the_default(raw, monkeypatch):
    """``INDEXER_TOPK_LOGITS_BUDGET_MB`` that is negative, fractional, in exponent or hex form, or
    carries a unit: read as the default 2,048 MiB, so the chunk's rows are the default's."""
    from indexer_topk.backends.key_matrix import chunk_rows

    width = 196608
    monkeypatch.delenv("INDEXER_TOPK_LOGITS_BUDGET_MB", raising=False)
    default_rows = chunk_rows(4096, width)
    monkeypatch.setenv("INDEXER_TOPK_LOGITS_BUDGET_MB", raw)
    assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get() == 2048
    assert chunk_rows(4096, width) == default_rows == (2048 << 20) // (width * 4)
