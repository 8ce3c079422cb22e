"""The reference implementation against an independent brute force, and the order helpers."""

import dataclasses
import math
import struct

import pytest
import torch

from indexer_topk import indexer_topk, make_workload
from indexer_topk.contract import (
    CANONICAL_NAN_BITS,
    HEAD_DIM,
    HEADS,
    PAGE_SIZE,
    allocate_result,
    canonicalize_scores,
    KEY_NAN,
    KEY_NONE,
    order_keys,
    ordered_score_bits,
    scores_from_ordered_bits,
)
from indexer_topk.formats import allocate_k_cache, quantize_query, write_k_cache
from indexer_topk.reference import reference_indexer_topk, reference_scores, reference_with_next_values
from kernel_cases import assert_bitwise, assert_matches_reference

LAYOUTS = ["aiter_mxfp4", "sglang_mxfp4", "sglang_fp8"]
TOPK = 512
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# ---------------------------------------------------------------------------------------------
# Independent brute force: decode the bytes, score in float64, sort in Python
# ---------------------------------------------------------------------------------------------

def _decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 64] -> float64 [..., 128], low nibble first."""
    lut = torch.tensor(E2M1, dtype=torch.float64)
    lo, hi = lut[(packed & 15).long()], lut[(packed >> 4).long()]
    return torch.stack((lo, hi), -1).flatten(-2)


def _apply_exponents(vals: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """float64 [..., 128] times 2**(exps[..., c] - 127) per 32-wide chunk c."""
    scale = torch.pow(2.0, exps.to(torch.float64) - 127).repeat_interleave(32, dim=-1)
    return vals * scale


def decode_keys(layout, k_cache, k_scale, slots):
    """(float64 keys [n, 128], float64 scale [n]) at physical ``slots``, read from raw bytes."""
    slots = torch.tensor(slots, dtype=torch.int64)
    page, off = (slots // PAGE_SIZE)[:, None], (slots % PAGE_SIZE)[:, None]
    if layout == "sglang_fp8":
        flat = k_cache.reshape(k_cache.shape[0], -1)
        payload = flat[page, off * 128 + torch.arange(128)]
        sbytes = flat[page, 64 * 128 + off * 4 + torch.arange(4)]
        k = payload.contiguous().view(torch.float8_e4m3fn).to(torch.float64)
        ks = sbytes.contiguous().view(torch.float32).reshape(-1).to(torch.float64)
        return k, ks
    if layout == "sglang_mxfp4":
        payload = k_cache[page, off * 64 + torch.arange(64)]
        exps = k_cache[page, 64 * 64 + off * 4 + torch.arange(4)]
    else:
        chunk = torch.arange(4)
        payload = k_cache[page, 0, chunk, off].reshape(-1, 64)  # [n, 4, 16] -> [n, 64]
        exps = k_scale[page, 0, chunk, (off % 16) * 4 + off // 16]
    return _apply_exponents(_decode_e2m1(payload), exps), torch.ones(len(slots), dtype=torch.float64)


def decode_query(layout, q, q_scale, r):
    """float64 [64, 128] query of row ``r``."""
    if layout == "sglang_fp8":
        return q[r].to(torch.float64)
    vals = _decode_e2m1(q[r])
    if layout == "sglang_mxfp4":
        words = q_scale[r].to(torch.int64) & 0xFFFFFFFF
        exps = torch.stack([(words >> (8 * c)) & 255 for c in range(4)], dim=-1)
    else:
        h = torch.arange(HEADS)
        exps = q_scale[r, 0][:, h % 16, h // 16].T  # [c, h % 16, h // 16] -> [h, c]
    return _apply_exponents(vals, exps)


def fp32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def brute_scores(layout, q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, weight_scale):
    """Per row, a list of the fp32 scores (as Python floats) of positions 0..seq_len-1; the
    contract takes ``weight_scale`` as the nearest fp32, as the kernels do."""
    out = []
    for r in range(q.shape[0]):
        n = int(seq_lens[r])
        if n == 0:
            out.append([])
            continue
        pt = page_table[r].tolist()
        slots = [pt[j // PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE for j in range(n)]
        k, ks = decode_keys(layout, k_cache, k_scale, slots)
        qr = decode_query(layout, q, q_scale, r)
        w = weights[r].to(torch.float64)
        s = (torch.relu(k @ qr.T) * w).sum(-1) * ks * fp32(weight_scale)
        out.append(s.to(torch.float32).tolist())
    return out


def total_order_key(score: float, pos: int):
    """Ascending Python key for the contract's order: sort with reverse=True."""
    if math.isnan(score):
        return (0, 0.0, 0.0, -pos)
    return (1, score, math.copysign(1.0, score), -pos)


def brute_select(scores, topk, page_row):
    """(values, raw, physical, count) of one row, as Python lists padded to ``topk``."""
    n = len(scores)
    if n <= topk:
        raw = list(range(n))
    else:
        raw = sorted(range(n), key=lambda j: total_order_key(scores[j], j), reverse=True)[:topk]
    vals = [scores[j] for j in raw]
    phys = [page_row[j >> 6] * 64 + (j & 63) for j in raw]
    pad = topk - len(raw)
    return vals + [float("-inf")] * pad, raw + [-1] * pad, phys + [-1] * pad, len(raw)


def fp32_bits(values):
    """int32 bit patterns, every NaN as the canonical quiet NaN."""
    return [CANONICAL_NAN_BITS if math.isnan(v) else struct.unpack("<i", struct.pack("<f", v))[0] for v in values]


def brute_force(args, *, topk, layout, weight_scale):
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens = args
    scores = brute_scores(layout, q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, weight_scale)
    rows = [brute_select(s, topk, page_table[r].tolist()) for r, s in enumerate(scores)]
    return scores, rows


def assert_matches_brute_force(res, args, *, topk, layout, weight_scale):
    """Bit-exact comparison of a result with the brute force; returns the brute-force scores."""
    scores, rows = brute_force(args, topk=topk, layout=layout, weight_scale=weight_scale)
    n_rows = args[0].shape[0]
    assert res.values.shape == (n_rows, topk) and res.values.dtype == torch.float32
    assert res.raw_indices.shape == (n_rows, topk) and res.raw_indices.dtype == torch.int32
    assert res.physical_indices.shape == (n_rows, topk) and res.physical_indices.dtype == torch.int32
    assert res.counts.shape == (n_rows,) and res.counts.dtype == torch.int32
    for r, (vals, raw, phys, count) in enumerate(rows):
        assert res.counts[r].item() == count, f"row {r}"
        assert res.raw_indices[r].tolist() == raw, f"row {r}"
        assert res.physical_indices[r].tolist() == phys, f"row {r}"
        assert res.values[r].view(torch.int32).tolist() == fp32_bits(vals), f"row {r}"
    return scores


def run_reference(wl, **kw):
    return reference_indexer_topk(*wl.args(), topk=wl.topk, layout=wl.layout, weight_scale=wl.weight_scale, **kw)


def check_workload(wl, **kw):
    res = run_reference(wl, **kw)
    scores = assert_matches_brute_force(
        res, wl.args(), topk=wl.topk, layout=wl.layout.value, weight_scale=wl.weight_scale
    )
    return res, scores


# Requests: (raw tokens, rows). Lengths: 0 (raw < 4), short, == topk (2048..2051 raw),
# == topk + 1 (2052..2055 raw), and long rows up to 2000 C4 positions.
RAGGED = dict(context_tokens=(3, 100, 2056, 8000), rows_per_request=(3, 3, 8, 3))


# ---------------------------------------------------------------------------------------------
# Workloads against the brute force
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_ragged_random_rows(layout):
    wl = make_workload(layout, topk=TOPK, seed=1, **RAGGED)
    lens = wl.seq_lens.tolist()
    assert lens[:3] == [0, 0, 0]
    assert {512, 513}.issubset(lens) and max(lens) == 2000 and min(l for l in lens if l) < 512
    res, scores = check_workload(wl)
    # the page table really is scattered: some used page is not the identity
    assert any(wl.page_table[r, p].item() != p for r in range(wl.rows) for p in range(lens[r] // 64))
    for r, n in enumerate(lens):
        c = min(n, TOPK)
        assert res.counts[r].item() == c
        assert bool((res.raw_indices[r, c:] == -1).all()) and bool((res.physical_indices[r, c:] == -1).all())
        assert bool(torch.isneginf(res.values[r, c:]).all())
        if 0 < n <= TOPK:  # short rows: every position, ascending, with its score
            assert res.raw_indices[r, :c].tolist() == list(range(n))
        elif n > TOPK:  # long rows: scores non-increasing, and nothing better was left out
            v = res.values[r].tolist()
            assert v == sorted(v, reverse=True)
            left_out = set(range(n)) - set(res.raw_indices[r].tolist())
            assert max(scores[r][j] for j in left_out) <= v[-1]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_short_rows_around_topk(layout):
    """seq_len < topk, == topk and == topk + 1 in one batch."""
    wl = make_workload(layout, topk=TOPK, seed=2, context_tokens=(2056,), rows_per_request=8)
    assert wl.seq_lens.tolist() == [512, 512, 512, 513, 513, 513, 513, 514]
    res, _ = check_workload(wl)
    assert res.raw_indices[0].tolist() == list(range(512))
    assert res.counts.tolist() == [512] * 8
    # a row of topk + 1 drops exactly one position and is ordered by score
    assert set(res.raw_indices[3].tolist()) < set(range(513))
    assert res.raw_indices[3].tolist() != list(range(512))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_rows_are_all_padding(layout):
    wl = make_workload(layout, topk=TOPK, seed=3, context_tokens=(3, 300), rows_per_request=(3, 2))
    assert wl.seq_lens.tolist() == [0, 0, 0, 74, 75]
    res, _ = check_workload(wl)
    for r in range(3):
        assert res.counts[r].item() == 0
        assert res.raw_indices[r].tolist() == [-1] * TOPK
        assert res.physical_indices[r].tolist() == [-1] * TOPK
        assert bool(torch.isneginf(res.values[r]).all())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_equal_scores_take_the_lowest_positions(layout):
    wl = make_workload(layout, topk=TOPK, seed=4, pattern="equal", context_tokens=(2600, 1000), rows_per_request=(3, 2))
    res, scores = check_workload(wl)
    for r in range(wl.rows):
        n = wl.seq_lens[r].item()
        assert len(set(scores[r])) == 1 and scores[r][0] > 0
        c = min(n, TOPK)
        assert res.raw_indices[r, :c].tolist() == list(range(c))
        assert bool((res.values[r, :c] == scores[r][0]).all())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_plateau(layout):
    wl = make_workload(layout, topk=TOPK, seed=5, pattern="zero_plateau", context_tokens=(8000,), rows_per_request=3)
    res, scores = check_workload(wl)
    for r in range(wl.rows):
        s = scores[r]
        pos = [j for j, v in enumerate(s) if v > 0]
        zeros = [j for j, v in enumerate(s) if v == 0]
        assert 0 < len(pos) < TOPK and len(pos) + len(zeros) == len(s)
        assert all(math.copysign(1.0, s[j]) > 0 for j in zeros)  # the plateau is +0
        expected = sorted(pos, key=lambda j: (-s[j], j)) + zeros[: TOPK - len(pos)]
        assert res.raw_indices[r].tolist() == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nan_rows(layout):
    wl = make_workload(layout, topk=TOPK, seed=6, pattern="nan_rows", context_tokens=(2400, 600), rows_per_request=(4, 2))
    res, scores = check_workload(wl)
    nan_rows = [0, 2, 4]  # every other row of each request
    for r in range(wl.rows):
        c = res.counts[r].item()
        bits = res.values[r, :c].view(torch.int32)
        if r in nan_rows:
            assert all(math.isnan(v) for v in scores[r])
            assert bool((bits == CANONICAL_NAN_BITS).all())
            assert res.raw_indices[r, :c].tolist() == list(range(c))
        else:
            assert not any(math.isnan(v) for v in scores[r])


@pytest.mark.parametrize("layout", ["sglang_mxfp4", "aiter_mxfp4"])
def test_increasing_and_decreasing_scores(layout):
    for pattern in ("increasing", "decreasing"):
        wl = make_workload(layout, topk=TOPK, seed=7, pattern=pattern, context_tokens=(4000,), rows_per_request=2)
        check_workload(wl)


# ---------------------------------------------------------------------------------------------
# Hand-built caches: special values, signed zeros, reversed pages
# ---------------------------------------------------------------------------------------------

def aligned_batch(layout, n_rows, c4_len, *, key_sign, weight, seed=0):
    """Every query head and key along one direction: dot > 0 where ``key_sign`` > 0, < 0 else."""
    g = torch.Generator().manual_seed(seed)
    u = torch.ones(HEAD_DIM)
    pages = list(range(-(-c4_len // PAGE_SIZE)))
    k_cache, k_scale = allocate_k_cache(layout, len(pages))
    pos = torch.arange(c4_len)
    signs = torch.tensor([float(key_sign(j)) for j in range(c4_len)])
    k = signs[:, None] * u * (1 + torch.rand(c4_len, 1, generator=g))
    slots = torch.tensor(pages)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
    write_k_cache(layout, k, slots, k_cache, k_scale)
    q = u.expand(n_rows, HEADS, HEAD_DIM).clone()
    w = torch.tensor(weight, dtype=torch.float32).expand(n_rows, HEADS).clone()
    pack = quantize_query(q, w, layout)
    pt = torch.tensor([pages] * n_rows, dtype=torch.int32)
    lens = torch.full((n_rows,), c4_len, dtype=torch.int32)
    return [pack.q, pack.q_scale, k_cache, k_scale, pack.weights, pt, lens]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_positive_zero_ranks_above_negative_zero(layout):
    """Scores that underflow fp32 keep their sign: +0 (from s > 0 or s == 0) above -0 (s < 0).
    (1e-300 is 0 in fp32, so here every score is a signed zero.)"""
    n = 600
    key_sign = lambda j: 1 if j % 3 else -1  # noqa: E731
    args = aligned_batch(layout, 1, n, key_sign=key_sign, weight=-1.0)
    # weight -1: aligned keys score < 0, opposed keys score exactly 0 (+0)
    res = reference_indexer_topk(*args, topk=TOPK, layout=layout, weight_scale=1e-300)
    scores = assert_matches_brute_force(res, args, topk=TOPK, layout=layout, weight_scale=1e-300)
    plus = [j for j in range(n) if key_sign(j) < 0]
    minus = [j for j in range(n) if key_sign(j) > 0]
    assert all(scores[0][j] == 0 and math.copysign(1, scores[0][j]) > 0 for j in plus)
    assert all(scores[0][j] == 0 and math.copysign(1, scores[0][j]) < 0 for j in minus)
    assert res.raw_indices[0].tolist() == (plus + minus)[:TOPK]
    bits = res.values[0].view(torch.int32).tolist()
    assert bits == [0] * len(plus) + [-(2**31)] * (TOPK - len(plus))

    # a negative weight_scale turns the +0 plateau into -0, below every positive score
    res = reference_indexer_topk(*args, topk=TOPK, layout=layout, weight_scale=-1.0)
    scores = assert_matches_brute_force(res, args, topk=TOPK, layout=layout, weight_scale=-1.0)
    assert all(scores[0][j] > 0 for j in minus)
    assert all(math.copysign(1, scores[0][j]) < 0 and scores[0][j] == 0 for j in plus)
    assert sorted(res.raw_indices[0, : len(minus)].tolist()) == minus
    assert res.raw_indices[0, len(minus) :].tolist() == plus[: TOPK - len(minus)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_head_sum_of_negative_zeros_is_positive_zero(layout):
    """Every head term -0 (negative weight, relu = 0): the head sum starts from +0, so the score is +0."""
    args = aligned_batch(layout, 1, 100, key_sign=lambda j: -1, weight=-1.0)
    s = reference_scores(*args, layout=layout)
    assert s.view(torch.int32).tolist() == [[0] * 100]
    res = reference_indexer_topk(*args, topk=TOPK, layout=layout)
    assert res.values[0, :100].view(torch.int32).tolist() == [0] * 100


def test_special_scores_follow_the_total_order():
    """FP8 key scales set per position produce NaN, +-inf, +-0 and subnormal scores in one row."""
    layout = "sglang_fp8"
    n = 700
    args = aligned_batch(layout, 2, n, key_sign=lambda j: 1, weight=1.0)
    k_cache = args[2]
    names = ["nan", "-inf", "inf", "-0", "+0", "-1", "1e-45", "-1e-45", "2**-140", "2**100"]
    specials = [float("nan"), float("-inf"), float("inf"), -0.0, 0.0, -1.0, 1e-45, -1e-45, 2.0**-140, 2.0**100]
    g = torch.Generator().manual_seed(9)
    where = torch.randperm(n, generator=g)[:200].tolist()
    for i, j in enumerate(where):
        sc = specials[i % len(specials)]
        off = 64 * 128 + (j % 64) * 4
        k_cache[j // 64, off : off + 4] = torch.tensor(list(struct.pack("<f", sc)), dtype=torch.uint8)
    args[4][1] = -args[4][1]  # row 1: negative weights flip every sign
    res = reference_indexer_topk(*args, topk=TOPK, layout=layout)
    assert_matches_brute_force(res, args, topk=TOPK, layout=layout, weight_scale=1.0)
    at = {name: sorted(j for i, j in enumerate(where) if i % len(specials) == k) for k, name in enumerate(names)}
    raw0, raw1 = res.raw_indices[0].tolist(), res.raw_indices[1].tolist()
    bits0, bits1 = res.values[0].view(torch.int32).tolist(), res.values[1].view(torch.int32).tolist()
    inf_bits, nzero_bits = 0x7F800000, -(2**31)
    # row 0 (scores s * scale, s > 0): +inf first, ties by position; then the 2**100 scales
    assert raw0[:20] == at["inf"] and bits0[:20] == [inf_bits] * 20
    assert sorted(raw0[20:40]) == at["2**100"]
    # 500 ordinary positive scores fill the rest: no zero, subnormal, negative, -inf or NaN
    assert not set(raw0) & set(at["+0"] + at["-0"] + at["1e-45"] + at["-1"] + at["-inf"] + at["nan"])
    # row 1 (scores -s * scale): +inf, then s, then subnormal s * 1e-45, then +0, then -0
    assert raw1[:20] == at["-inf"] and bits1[:20] == [inf_bits] * 20
    assert sorted(raw1[20:40]) == at["-1"]
    assert sorted(raw1[40:60]) == at["-1e-45"] and all(0 < b < 0x800000 for b in bits1[40:60])
    assert raw1[60:80] == at["-0"] and bits1[60:80] == [0] * 20
    assert raw1[80:100] == at["+0"] and bits1[80:100] == [nzero_bits] * 20
    # then the negative scores, down to the 2**100 scales at -huge; NaN stays out
    assert all(b < 0 for b in bits1[100:])
    assert not set(raw1) & set(at["nan"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reversed_pages_and_physical_indices(layout):
    c4 = 1300
    n_pages = -(-c4 // 64)
    pages = [n_pages + 2 - p for p in range(n_pages)]  # reversed, offset, page 0..2 unused
    g = torch.Generator().manual_seed(12)
    k_cache, k_scale = allocate_k_cache(layout, n_pages + 3)
    k = torch.randn(c4, HEAD_DIM, generator=g)
    pos = torch.arange(c4)
    write_k_cache(layout, k, torch.tensor(pages)[pos // 64] * 64 + pos % 64, k_cache, k_scale)
    # garbage (but in range) in the unused tail of the page table
    q = torch.randn(3, HEADS, HEAD_DIM, generator=g)
    w = torch.randn(3, HEADS, generator=g)
    pack = quantize_query(q, w, layout)
    pt = torch.tensor([pages + [0, 1]] * 3, dtype=torch.int32)
    lens = torch.tensor([c4, 700, 64], dtype=torch.int32)
    args = [pack.q, pack.q_scale, k_cache, k_scale, pack.weights, pt, lens]
    res = reference_indexer_topk(*args, topk=TOPK, layout=layout, weight_scale=0.125)
    assert_matches_brute_force(res, args, topk=TOPK, layout=layout, weight_scale=0.125)
    for r in range(3):
        for raw, phys in zip(res.raw_indices[r].tolist(), res.physical_indices[r].tolist()):
            if raw < 0:
                assert phys == -1
            else:
                assert phys == pages[raw // 64] * 64 + raw % 64
    # the same keys through the identity page table give the same raw indices and values
    k_cache2, k_scale2 = allocate_k_cache(layout, n_pages)
    write_k_cache(layout, k, pos, k_cache2, k_scale2)
    pt2 = torch.arange(n_pages, dtype=torch.int32).expand(3, n_pages).contiguous()
    args2 = [pack.q, pack.q_scale, k_cache2, k_scale2, pack.weights, pt2, lens]
    res2 = reference_indexer_topk(*args2, topk=TOPK, layout=layout, weight_scale=0.125)
    assert torch.equal(res2.raw_indices, res.raw_indices)
    assert torch.equal(res2.values.view(torch.int32), res.values.view(torch.int32))
    assert torch.equal(res2.physical_indices, res2.raw_indices)


def test_zero_rows_zero_width_page_table_and_empty_cache():
    wl = make_workload("sglang_mxfp4", topk=TOPK, context_tokens=(3,), rows_per_request=2)
    args = list(wl.args())
    args[5] = args[5][:, :0].contiguous()  # no pages at all: every row is empty
    res = indexer_topk(*args, topk=TOPK, layout="sglang_mxfp4", backend="reference")
    assert res.counts.tolist() == [0, 0]
    assert bool((res.raw_indices == -1).all()) and bool((res.physical_indices == -1).all())
    # nor any cache page: empty rows read nothing
    args[2] = args[2][:0]
    args[5] = torch.full((2, 4), 99, dtype=torch.int32)
    res = indexer_topk(*args, topk=TOPK, layout="sglang_mxfp4", backend="reference")
    assert res.counts.tolist() == [0, 0] and bool(torch.isneginf(res.values).all())
    empty = [t[:0] if t is not None else None for t in wl.args()]
    res = reference_indexer_topk(*empty[:2], wl.k_cache, wl.k_scale, *empty[4:], topk=TOPK, layout=wl.layout)
    assert res.values.shape == (0, TOPK) and res.counts.shape == (0,)


@pytest.mark.parametrize("length", [16 * 64 + 600, 2**31 - 1])
def test_unchecked_length_past_the_page_table_is_bounded_by_it(length, monkeypatch):
    """With the value checks off, a length past a 16-column page table (1024 positions), a
    garbage 2**31 - 1 too, is scored only up to the table, as the kernels bound it: no position
    past it is scored (none re-reads the table's last page), the outputs are those of the
    table's length, and legacy's agree with them."""
    from indexer_topk import reference

    wl = make_workload("sglang_fp8", context_tokens=(4 * 64 * 16,), rows_per_request=2, topk=512, page_table_pad=0,
                       seed=7)
    width = wl.page_table.shape[1] * 64
    assert width == 1024
    wl = dataclasses.replace(wl, seq_lens=torch.tensor([length, 1000], dtype=torch.int32))
    unbounded = reference._block_scores

    def bounded(*args):
        pos = args[-1]
        assert int(pos.max()) < width, f"scored position {int(pos.max())} past the page table"
        return unbounded(*args)

    monkeypatch.setattr(reference, "_block_scores", bounded)
    got = indexer_topk(*wl.args(), **wl.kwargs(), backend="reference", check_values=False)
    clamped = dataclasses.replace(wl, seq_lens=torch.tensor([width, 1000], dtype=torch.int32))
    assert_bitwise(got, indexer_topk(*clamped.args(), **clamped.kwargs(), backend="reference"), "vs the table's length")
    legacy = indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", check_values=False)
    assert_matches_reference(legacy, clamped, (got, reference_with_next_values(*clamped.args(), **clamped.kwargs())[1]))


# ---------------------------------------------------------------------------------------------
# Blocking, out=, weight_scale
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_blocking_does_not_change_the_result(layout):
    wl = make_workload(layout, topk=TOPK, seed=13, pattern="zero_plateau", **RAGGED)
    one = run_reference(wl, row_block=10**6, ctx_block=10**7)
    for row_block, ctx_block in ((1, 1000), (5, 128), (3, 300), (7, 511), (16, 777)):
        other = run_reference(wl, row_block=row_block, ctx_block=ctx_block)
        assert_bitwise(one, other, f"row_block {row_block}, ctx_block {ctx_block}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_is_written_in_place(layout):
    wl = make_workload(layout, topk=TOPK, seed=14, context_tokens=(3, 2400), rows_per_request=(2, 3))
    expected = run_reference(wl)
    out = allocate_result(wl.rows, TOPK, "cpu")
    for t in out:
        t.fill_(7)
    ptrs = [t.data_ptr() for t in out]
    got = indexer_topk(*wl.args(), **wl.kwargs(), backend="reference", out=out)
    assert [t.data_ptr() for t in got] == ptrs
    assert_bitwise(out, expected, "in place")
    # a plain tuple works the same way
    out2 = tuple(torch.empty_like(t) for t in out)
    got2 = indexer_topk(*wl.args(), **wl.kwargs(), backend="reference", out=out2)
    assert all(a is b for a, b in zip(got2, out2))
    assert torch.equal(out2[1], expected.raw_indices)


def test_weight_scale_scales_the_scores():
    wl = make_workload("sglang_mxfp4", topk=TOPK, seed=15, context_tokens=(4000,), rows_per_request=2)
    a = reference_indexer_topk(*wl.args(), topk=TOPK, layout=wl.layout, weight_scale=1.0)
    b = reference_indexer_topk(*wl.args(), topk=TOPK, layout=wl.layout, weight_scale=0.25)
    assert torch.equal(a.raw_indices, b.raw_indices)
    assert torch.equal(a.values * 0.25, b.values)


def test_reference_scores_window():
    wl = make_workload("aiter_mxfp4", topk=TOPK, seed=16, context_tokens=(3, 1000), rows_per_request=(1, 2))
    full = reference_scores(*wl.args(), layout=wl.layout, weight_scale=wl.weight_scale)
    assert full.shape == (3, 250)
    assert bool(torch.isneginf(full[0]).all())
    part = reference_scores(*wl.args(), layout=wl.layout, weight_scale=wl.weight_scale, rows=torch.tensor([2]), start=100, stop=300)
    assert part.shape == (1, 200)
    assert torch.equal(part[0, :150], full[2, 100:250])
    assert bool(torch.isneginf(part[0, 150:]).all())
    brute = brute_scores(wl.layout.value, *wl.args(), wl.weight_scale)
    for r in range(3):
        n = wl.seq_lens[r].item()
        assert full[r, :n].tolist() == brute[r]


# ---------------------------------------------------------------------------------------------
# The order helpers
# ---------------------------------------------------------------------------------------------

ASCENDING = [
    float("-inf"), -3.4028234663852886e38, -1.0, -1.1754943508222875e-38, -1e-45, -0.0,
    0.0, 1e-45, 1.1754943508222875e-38, 1.0, 1.0000001192092896, 3.4028234663852886e38, float("inf"),
]


def test_ordered_score_bits_is_monotone():
    vals = torch.tensor([float("nan")] + ASCENDING, dtype=torch.float32)
    keys = ordered_score_bits(vals).tolist()
    assert keys[0] == KEY_NAN == -(2**31) + 1  # NaN's key; KEY_NONE (INT32_MIN) is no score's
    assert all(a < b for a, b in zip(keys, keys[1:]))
    assert keys[6:8] == [-1, 0]  # -0.0 and +0.0 (ASCENDING[5:7])


def test_every_nan_maps_to_the_bottom_and_back_to_the_canonical_nan():
    bits = torch.tensor([0x7FC00000, 0x7F800001, -0x400000, -1, 0x7FFFFFFF], dtype=torch.int32)  # NaNs
    nans = bits.view(torch.float32)
    assert bool(torch.isnan(nans).all())
    assert ordered_score_bits(nans).tolist() == [KEY_NAN] * 5
    assert canonicalize_scores(nans).view(torch.int32).tolist() == [CANONICAL_NAN_BITS] * 5


def test_scores_from_ordered_bits_inverts_exactly():
    g = torch.Generator().manual_seed(17)
    bits = torch.randint(-(2**31), 2**31 - 1, (10000,), generator=g, dtype=torch.int64).to(torch.int32)
    vals = torch.cat([bits.view(torch.float32), torch.tensor(ASCENDING)])
    back = scores_from_ordered_bits(ordered_score_bits(vals))
    finite = ~torch.isnan(vals)
    assert torch.equal(back.view(torch.int32)[finite], vals.view(torch.int32)[finite])
    assert bool((back.view(torch.int32)[~finite] == CANONICAL_NAN_BITS).all())
    # and the other way round on every key that is a score's: KEY_NAN and the keys of numbers
    keys = torch.cat([bits, torch.tensor([KEY_NAN, -1, 0, 2**31 - 1], dtype=torch.int32)])
    keys = keys[keys != KEY_NONE]
    round_trip = ordered_score_bits(scores_from_ordered_bits(keys))
    ok = (keys == KEY_NAN) | ~torch.isnan(scores_from_ordered_bits(keys))
    assert torch.equal(round_trip[ok], keys[ok])
    # "no entry" decodes to the contract's padding value
    none = scores_from_ordered_bits(torch.tensor([KEY_NONE], dtype=torch.int32))
    assert none.view(torch.int32).tolist() == [-8388608]  # -inf
    # the key order agrees with float order on non-NaN values
    v = vals[finite][:2000]
    k = ordered_score_bits(v)
    less = v[:, None] < v[None, :]
    assert bool((less <= (k[:, None] < k[None, :])).all())


def test_order_keys_total_order():
    vals = torch.tensor([float("nan")] + ASCENDING, dtype=torch.float32)
    entries = [(v, p) for v in vals.tolist() for p in (0, 5, 2**31 - 1)]
    v = torch.tensor([e[0] for e in entries], dtype=torch.float32)
    p = torch.tensor([e[1] for e in entries])
    keys = order_keys(v, p)
    assert keys.dtype == torch.int64
    got = [entries[i] for i in torch.argsort(keys, descending=True).tolist()]
    want = sorted(entries, key=lambda e: total_order_key(e[0], e[1]), reverse=True)
    assert [(fp32_bits([a])[0], b) for a, b in got] == [(fp32_bits([a])[0], b) for a, b in want]
    # the score decides before the position: a worse score at position 0 stays below
    two = order_keys(torch.tensor([1.0, 1.0000001192092896]), torch.tensor([0, 2**31 - 1]))
    assert two[1] > two[0]
    # equal scores: the lower position has the larger key
    eq = order_keys(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([9, 3, 100]))
    assert eq[1] > eq[0] > eq[2]
    # NaN at position 0 stays below -inf at the last position
    nn = order_keys(torch.tensor([float("nan"), float("-inf")]), torch.tensor([0, 2**31 - 1]))
    assert nn[1] > nn[0]


def test_outputs_that_require_grad_are_written_as_the_kernels_write_them():
    """An output tensor that requires grad (a leaf) is written in place, not refused after the
    work by autograd: the same bits as into plain outputs (the operator has no gradient)."""
    from indexer_topk.contract import allocate_result

    w = make_workload("sglang_fp8", context_tokens=[3000], rows_per_request=[2], topk=512, seed=3, device="cpu")
    plain = indexer_topk(*w.args(), **w.kwargs(), backend="reference")
    out = allocate_result(w.rows, w.topk, "cpu")
    out = out._replace(values=out.values.requires_grad_())
    got = indexer_topk(*w.args(), **w.kwargs(), backend="reference", out=out)
    assert got.values is out.values and got.values.requires_grad
    assert_bitwise(got, plain, "reference into an output that requires grad")
