"""Quantisers and the three paged cache layouts, checked byte by byte."""

import struct

import pytest
import torch

from indexer_topk.contract import HEAD_DIM, HEADS, PAGE_SIZE
from indexer_topk.formats import (
    allocate_k_cache,
    dequantize_mxfp4,
    dequantize_query,
    pack_ue8m0_int32,
    physical_slots,
    quantize_fp8,
    quantize_mxfp4,
    quantize_query,
    read_k_cache,
    unpack_ue8m0_int32,
    write_k_cache,
)

from kernel_cases import LAYOUTS

MXFP4_LAYOUTS = ["aiter_mxfp4", "sglang_mxfp4"]

# e2m1 magnitude code -> value
E2M1 = {0: 0.0, 1: 0.5, 2: 1.0, 3: 1.5, 4: 2.0, 5: 3.0, 6: 4.0, 7: 6.0}


def f32_next_up(x: float) -> float:
    return struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", x))[0] + 1))[0]


def group(values, fill=0.0):
    """One 32-wide group with ``values`` at its start."""
    g = [fill] * 32
    g[: len(values)] = values
    return g


def quant_group(values):
    """(codes of the 32 elements, biased exponent) of one group through quantize_mxfp4."""
    x = torch.tensor([group(values) * 4], dtype=torch.float32)  # [1, 128]: the group four times
    packed, exps = quantize_mxfp4(x)
    assert exps.shape == (1, 4) and packed.shape == (1, 64)
    assert exps[0].tolist() == [exps[0, 0].item()] * 4
    b = packed[0, :16].tolist()
    codes = []
    for byte in b:
        codes += [byte & 0xF, byte >> 4]
    return codes, int(exps[0, 0])


# ---------------------------------------------------------------------------------------------
# MXFP4 quantiser edge cases
# ---------------------------------------------------------------------------------------------

def test_all_zero_group_takes_exponent_from_the_floor():
    # sf = max(0 / 6, 1e-4) = 1e-4 -> ceil(log2(1e-4)) = -13 -> 127 - 13 = 114
    codes, e = quant_group([])
    assert e == 114
    assert codes == [0] * 32


def test_negative_zero_is_stored_as_code_zero():
    codes, e = quant_group([-0.0] * 32)
    assert e == 114
    assert codes == [0] * 32
    # negative values that round to zero carry no sign either
    codes, e = quant_group([6.0, -0.25, -0.1, -1e-30])
    assert e == 127
    assert codes[:4] == [7, 0, 0, 0]


@pytest.mark.parametrize("n", [-13, -5, -1, 0, 1, 3, 10, 100, 125])
def test_amax_exactly_six_times_power_of_two(n):
    amax = 6.0 * 2.0**n
    codes, e = quant_group([amax, -amax, amax / 2, amax / 3])
    assert e == 127 + n
    assert codes[:4] == [7, 8 | 7, 5, 4]  # 6, -6, 3, 2 in units of 2**n


@pytest.mark.parametrize("n", [-13, -5, 0, 1, 10, 100, 125])
def test_amax_just_above_six_times_power_of_two(n):
    amax = f32_next_up(6.0 * 2.0**n)
    codes, e = quant_group([amax])
    assert e == 127 + n + 1
    assert codes[0] == 5  # 3.0000002 -> 3


def test_floor_overrides_smaller_exponents():
    # amax = 6 * 2**-14 would have exponent -14, but sf = 2**-14 < 1e-4 lifts it to -13
    codes, e = quant_group([6.0 * 2.0**-14, 1.5 * 2.0**-14])
    assert e == 114
    assert codes[:2] == [5, 2]  # 3.0; 0.75 is a tie between 0.5 and 1.0 and goes to 1.0 (code 2)


@pytest.mark.parametrize("amax, code", [(1e-30, 0), (1e-38, 0), (1e-45, 0), (5e-4, 6)])
def test_tiny_groups_take_the_floor_exponent(amax, code):
    # The 1e-4 floor keeps every exponent >= -13 (114), so the low clamp (1) is never reached.
    codes, e = quant_group([amax])
    assert e == 114
    assert codes[0] == code  # 5e-4 / 2**-13 = 4.096 -> 4 (code 6)


def test_huge_groups():
    fmax = torch.finfo(torch.float32).max  # (2 - 2**-23) * 2**127
    codes, e = quant_group([fmax])
    assert e == 127 + 126  # ceil(log2(fmax / 6)) = 126: the largest finite exponent reachable
    assert codes[0] == 6  # fmax / 2**126 = 3.99999976 -> 4
    codes, e = quant_group([1.5 * 2.0**127])  # = 6 * 2**125
    assert e == 127 + 125
    assert codes[0] == 7
    # an infinity: log2(inf) = inf clamps to 254; the infinity saturates to 6, the rest is 0
    codes, e = quant_group([float("inf"), -float("inf"), 1e30])
    assert e == 254
    assert codes[:3] == [7, 15, 0]


@pytest.mark.parametrize("scale_exp", [0, 3, -7])
def test_round_to_nearest_even_at_every_midpoint(scale_exp):
    s = 2.0**scale_exp
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    even = [0, 2, 2, 4, 4, 6, 6]  # the even code of each tie
    vals = [6.0] + mids + [-m for m in mids]
    codes, e = quant_group([v * s for v in vals])
    assert e == 127 + scale_exp
    assert codes[0] == 7
    assert codes[1:8] == even
    assert codes[8:15] == [(8 | c) if c else 0 for c in even]


def test_round_to_nearest_off_the_midpoints():
    eps = 1e-3
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    below = [0, 1, 2, 3, 4, 5, 6]
    above = [1, 2, 3, 4, 5, 6, 7]
    vals = [6.0] + [m - eps for m in mids] + [-(m + eps) for m in mids]
    codes, _ = quant_group(vals)
    assert codes[1:8] == below
    assert codes[8:15] == [8 | c for c in above]
    # exact grid values map to their own codes
    grid = [6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    codes, _ = quant_group(grid)
    assert codes[:14] == [7, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14, 15]


def test_mxfp4_nibble_order_and_dequantise():
    x = torch.zeros(1, 128)
    x[0, 0], x[0, 1], x[0, 2], x[0, 3] = 0.5, 1.0, -6.0, 0.0
    x[0, 127] = -3.0  # alone in chunk 3: amax 3 -> exponent -1, stored as -6
    packed, exps = quantize_mxfp4(x)
    assert packed[0, 0] == 0x21  # element 0 (0.5 -> 1) low nibble, element 1 (1.0 -> 2) high
    assert packed[0, 1] == 0x0F  # element 2 (-6 -> 15) low, element 3 (0) high
    assert packed[0, 63] == 0xF0  # element 126 (0) low, element 127 (-6 -> 15) high
    assert int((packed != 0).sum()) == 3
    assert exps[0].tolist() == [127, 114, 114, 126]
    back = dequantize_mxfp4(packed, exps)
    assert torch.equal(back, x)


def test_mxfp4_quantise_dequantise_error_bound():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 128, generator=g) * torch.exp2(torch.randint(-8, 8, (64, 1), generator=g).float())
    packed, exps = quantize_mxfp4(x)
    back = dequantize_mxfp4(packed, exps)
    scale = torch.exp2(exps.float() - 127).repeat_interleave(32, dim=1)
    # within half a step of the coarsest e2m1 spacing (2 units at the top of the range)
    assert bool(((back - x).abs() <= scale).all())
    assert bool((x.abs().reshape(64, 4, 32).amax(-1) <= 6 * exps.float().sub(127).exp2()).all())
    # dequantised values survive re-quantisation (the exponent may drop where amax rounded down)
    p2, e2 = quantize_mxfp4(back)
    assert torch.equal(dequantize_mxfp4(p2, e2), back)
    assert bool((e2 <= exps).all())


def test_ue8m0_int32_packing():
    e = torch.tensor([[127, 128, 114, 124], [255, 0, 1, 254], [0, 0, 0, 0x80]], dtype=torch.uint8)
    p = pack_ue8m0_int32(e)
    assert p.dtype == torch.int32
    assert p.tolist() == [
        127 | 128 << 8 | 114 << 16 | 124 << 24,
        255 | 0 << 8 | 1 << 16 | (254 << 24) - 2**32,
        -(2**31),
    ]
    assert torch.equal(unpack_ue8m0_int32(p), e)


# ---------------------------------------------------------------------------------------------
# FP8 quantiser edge cases
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [-20, -3, 0, 1, 7])
def test_fp8_scale_amax_exactly_448_times_power_of_two(n):
    x = torch.zeros(1, 128)
    x[0, 5] = 448.0 * 2.0**n
    x[0, 6] = -(2.0**n)
    q, s = quantize_fp8(x)
    assert s.tolist() == [2.0**n]
    b = q.view(torch.uint8)[0]
    assert b[5] == 0x7E  # 448 = 1.75 * 2**8
    assert b[6] == 0xB8  # -1 = sign | exp 7 << 3
    x[0, 5] = f32_next_up(448.0 * 2.0**n)
    q, s = quantize_fp8(x)
    assert s.tolist() == [2.0 ** (n + 1)]
    assert q.view(torch.uint8)[0, 5] == 0x76  # 224.00002 -> 224 = 1.75 * 2**7


def test_fp8_zero_vector_takes_scale_from_the_floor():
    q, s = quantize_fp8(torch.zeros(2, 128))
    # 2**ceil(log2(1e-4 / 448)) = 2**-22
    assert s.tolist() == [2.0**-22, 2.0**-22]
    assert bool((q.view(torch.uint8) == 0).all())


# ---------------------------------------------------------------------------------------------
# Hand-built keys: exact bytes at exact positions of each layout
# ---------------------------------------------------------------------------------------------

def hand_key(variant: int) -> tuple[list, list, list]:
    """(key values [128], expected packed bytes [64], expected biased exponents [4])."""
    k = [0.0] * 128
    payload = [0] * 64
    # chunk 0: amax 6 -> exponent 0 (127); 0.5 -> 1, 1.0 -> 2, -6 -> 15
    k[0], k[1], k[2] = 0.5, 1.0, -6.0
    payload[0], payload[1] = 0x21, 0x0F
    # chunk 1: amax 12 = 6 * 2 -> exponent 1 (128); 3 -> 1.5 (3), -12 -> -6 (15)
    k[32], k[33] = 3.0, -12.0
    payload[16] = 0xF3
    # chunk 2: all zero -> 114
    # chunk 3: amax 0.75 * 2**variant -> exponent variant - 3; 6 (7), 2 (4), -1 (10), 0.5 (1)
    s = 2.0 ** (variant - 3)
    k[96], k[97], k[98], k[99] = 6 * s, 2 * s, -1 * s, 0.5 * s
    k[127] = -4 * s  # element 127: high nibble of byte 63, -4 -> 14
    payload[48], payload[49], payload[63] = 0x47, 0x1A, 0xE0
    return k, payload, [127, 128, 114, 127 + variant - 3]


SLOTS = [(2, 37), (0, 1), (2, 16), (1, 63), (0, 0)]  # (page, slot in page)


@pytest.mark.parametrize("layout", MXFP4_LAYOUTS)
def test_mxfp4_key_bytes_by_hand(layout):
    k_cache, k_scale = allocate_k_cache(layout, 3)
    keys, payloads, exps = [], [], []
    for i in range(len(SLOTS)):
        k, p, e = hand_key(i)
        keys.append(k)
        payloads.append(p)
        exps.append(e)
    slots = torch.tensor([pg * PAGE_SIZE + s for pg, s in SLOTS])
    write_k_cache(layout, torch.tensor(keys), slots, k_cache, k_scale)

    expected = torch.zeros_like(k_cache)
    expected_scale = None if k_scale is None else torch.zeros_like(k_scale)
    for (pg, s), p, e in zip(SLOTS, payloads, exps):
        if layout == "sglang_mxfp4":
            for i in range(64):
                expected[pg, s * 64 + i] = p[i]
            for c in range(4):
                expected[pg, 64 * 64 + s * 4 + c] = e[c]
        else:
            for c in range(4):
                for i in range(16):
                    expected[pg, 0, c, s, i] = p[c * 16 + i]
                expected_scale[pg, 0, c, (s % 16) * 4 + s // 16] = e[c]
    assert torch.equal(k_cache, expected)
    if k_scale is not None:
        assert torch.equal(k_scale, expected_scale)

    if layout == "sglang_mxfp4":
        # the four scale bytes of a slot read as one little-endian int32, chunk 0 in the low byte
        pg, s = SLOTS[0]
        word = k_cache[pg, 4096 + s * 4 : 4096 + s * 4 + 4].clone().view(torch.int32).item()
        e = exps[0]
        assert word == e[0] | e[1] << 8 | e[2] << 16 | e[3] << 24
    else:
        # slot 37 -> column (37 % 16) * 4 + 37 // 16 = 22; slot 16 -> 1; slot 1 -> 4; slot 63 -> 63
        assert k_scale[2, 0, :, 22].tolist() == exps[0]
        assert k_scale[0, 0, :, 4].tolist() == exps[1]
        assert k_scale[2, 0, :, 1].tolist() == exps[2]
        assert k_scale[1, 0, :, 63].tolist() == exps[3]
        assert k_cache[2, 0, 0, 37, :2].tolist() == [0x21, 0x0F]
        assert k_cache[2, 0, 1, 37, 0].item() == 0xF3

    got, scale = read_k_cache(layout, k_cache, k_scale, slots)
    assert torch.equal(got, torch.tensor(keys))  # every hand value is exactly representable
    assert torch.equal(scale, torch.ones(len(SLOTS)))


def test_fp8_key_bytes_by_hand():
    layout = "sglang_fp8"
    k_cache, k_scale = allocate_k_cache(layout, 3)
    assert k_scale is None and k_cache.shape == (3, 64 * 132)
    keys, rows = [], []
    for i, (pg, s) in enumerate(SLOTS):
        sc = 2.0 ** (i - 3)
        k = [0.0] * 128
        k[0] = 448.0 * sc  # -> 448, 0x7E; sets the scale to sc
        k[1] = -1.0 * sc  # -> -1, 0xB8
        k[2] = 0.5 * sc  # -> 0.5 = 2**-1, exponent field 6: 0x30
        k[3] = 2.0**-9 * sc  # smallest subnormal: 0x01
        k[127] = -8.0 * sc  # -> -8 = 2**3, exponent field 10: 0xD0
        keys.append(k)
        payload = [0] * 128
        payload[0], payload[1], payload[2], payload[3], payload[127] = 0x7E, 0xB8, 0x30, 0x01, 0xD0
        rows.append((pg, s, payload, list(struct.pack("<f", sc))))
    slots = torch.tensor([pg * PAGE_SIZE + s for pg, s in SLOTS])
    write_k_cache(layout, torch.tensor(keys), slots, k_cache, None)

    expected = torch.zeros_like(k_cache)
    for pg, s, payload, sbytes in rows:
        expected[pg, s * 128 : s * 128 + 128] = torch.tensor(payload, dtype=torch.uint8)
        expected[pg, 64 * 128 + s * 4 : 64 * 128 + s * 4 + 4] = torch.tensor(sbytes, dtype=torch.uint8)
    assert torch.equal(k_cache, expected)
    # 0.125 as fp32 little endian
    pg, s = SLOTS[0]
    assert k_cache[pg, 8192 + s * 4 : 8192 + s * 4 + 4].tolist() == [0x00, 0x00, 0x00, 0x3E]

    got, scale = read_k_cache(layout, k_cache, None, slots)
    assert scale.tolist() == [2.0 ** (i - 3) for i in range(len(SLOTS))]
    for i in range(len(SLOTS)):
        sc = 2.0 ** (i - 3)
        assert torch.equal(got[i] * sc, torch.tensor(keys[i]))


# ---------------------------------------------------------------------------------------------
# Hand-built queries
# ---------------------------------------------------------------------------------------------

def query_exponent(h: int, c: int) -> int:
    """A distinct unbiased exponent per (head, chunk), spanning values above and below 0."""
    return (h * 4 + c) % 31 - 12


def hand_query(rows=2):
    q = torch.zeros(rows, HEADS, HEAD_DIM)
    for r in range(rows):
        for h in range(HEADS):
            for c in range(4):
                s = 2.0 ** (query_exponent(h, c) + r)
                q[r, h, 32 * c] = 6.0 * s  # code 7
                q[r, h, 32 * c + 1] = -1.5 * s  # code 11
                q[r, h, 32 * c + 31] = 0.5 * s  # code 1, high nibble of the group's last byte
    return q


@pytest.mark.parametrize("layout", MXFP4_LAYOUTS)
def test_mxfp4_query_bytes_by_hand(layout):
    rows = 2
    q = hand_query(rows)
    w = torch.linspace(-2, 2, rows * HEADS).reshape(rows, HEADS)
    pack = quantize_query(q, w, layout)
    assert pack.q.dtype == torch.uint8 and pack.q.shape == (rows, HEADS, 64)
    expected_q = torch.zeros(rows, HEADS, 64, dtype=torch.uint8)
    for c in range(4):
        expected_q[:, :, 16 * c] = 0xB7
        expected_q[:, :, 16 * c + 15] = 0x10
    assert torch.equal(pack.q, expected_q)
    if layout == "aiter_mxfp4":
        assert pack.q_scale.dtype == torch.uint8 and pack.q_scale.shape == (rows, 1, 4, 16, 4)
        assert pack.weights.dtype == torch.bfloat16
        assert torch.equal(pack.weights, w.to(torch.bfloat16))
        for r in range(rows):
            for h in range(HEADS):
                for c in range(4):
                    assert pack.q_scale[r, 0, c, h % 16, h // 16] == 127 + query_exponent(h, c) + r
    else:
        assert pack.q_scale.dtype == torch.int32 and pack.q_scale.shape == (rows, HEADS)
        assert pack.weights.dtype == torch.float32
        assert torch.equal(pack.weights, w)
        for r in range(rows):
            for h in range(HEADS):
                e = [127 + query_exponent(h, c) + r for c in range(4)]
                word = e[0] | e[1] << 8 | e[2] << 16 | e[3] << 24
                if word >= 2**31:
                    word -= 2**32
                assert pack.q_scale[r, h].item() == word
    assert torch.equal(dequantize_query(layout, pack.q, pack.q_scale), q)


def test_fp8_query_bytes_by_hand():
    rows = 2
    q = torch.zeros(rows, HEADS, HEAD_DIM)
    for r in range(rows):
        for h in range(HEADS):
            s = 2.0 ** (h % 9 - 4 + r)
            q[r, h, 0] = 448.0 * s
            q[r, h, 127] = -0.5 * s
    w = torch.linspace(-1, 1, rows * HEADS).reshape(rows, HEADS)
    pack = quantize_query(q, w, "sglang_fp8")
    assert pack.q_scale is None
    assert pack.q.dtype == torch.float8_e4m3fn and pack.q.shape == (rows, HEADS, HEAD_DIM)
    b = pack.q.view(torch.uint8)
    assert bool((b[:, :, 0] == 0x7E).all()) and bool((b[:, :, 127] == 0xB0).all())
    assert int((b != 0).sum()) == 2 * rows * HEADS
    for r in range(rows):
        for h in range(HEADS):
            # the query scale is folded into the fp32 weight
            assert pack.weights[r, h].item() == w[r, h].item() * 2.0 ** (h % 9 - 4 + r)
    deq = dequantize_query("sglang_fp8", pack.q, None)
    assert torch.equal(deq * (pack.weights / w)[..., None], q)


# ---------------------------------------------------------------------------------------------
# Round trips at scattered slots
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_cache_round_trip_at_scattered_slots(layout):
    g = torch.Generator().manual_seed(7)
    num_pages = 6
    n = 150
    slots = torch.randperm(num_pages * PAGE_SIZE, generator=g)[:n]
    k = torch.randn(n, HEAD_DIM, generator=g) * torch.exp2(torch.randint(-6, 6, (n, 1), generator=g).float())
    k[0] = 0.0
    k_cache, k_scale = allocate_k_cache(layout, num_pages)
    write_k_cache(layout, k, slots, k_cache, k_scale)

    got, scale = read_k_cache(layout, k_cache, k_scale, slots.reshape(10, 15))
    assert got.shape == (10, 15, HEAD_DIM) and scale.shape == (10, 15)
    got, scale = got.reshape(n, HEAD_DIM), scale.reshape(n)
    if layout == "sglang_fp8":
        k8, ks = quantize_fp8(k)
        assert torch.equal(got, k8.float())
        assert torch.equal(scale, ks)
        assert bool(((got * scale[:, None] - k).abs() <= k.abs().amax(-1, keepdim=True) / 16).all())
    else:
        packed, exps = quantize_mxfp4(k)
        assert torch.equal(got, dequantize_mxfp4(packed, exps))
        assert torch.equal(scale, torch.ones(n))

    # slots never written read back as zeros
    unused = torch.tensor(sorted(set(range(num_pages * PAGE_SIZE)) - set(slots.tolist())))
    got, _ = read_k_cache(layout, k_cache, k_scale, unused)
    assert bool((got == 0).all())

    # writing again over the same slots is idempotent; overwriting one slot changes only it
    before = (k_cache.clone(), None if k_scale is None else k_scale.clone())
    write_k_cache(layout, k, slots, k_cache, k_scale)
    assert torch.equal(k_cache, before[0])
    write_k_cache(layout, torch.full((1, HEAD_DIM), 3.0), slots[5:6], k_cache, k_scale)
    got, scale = read_k_cache(layout, k_cache, k_scale, slots)
    assert torch.equal(got[5] * scale[5], torch.full((HEAD_DIM,), 3.0))
    keep = torch.arange(n) != 5
    ref, ref_scale = read_k_cache(layout, before[0], before[1], slots)
    assert torch.equal(got[keep], ref[keep]) and torch.equal(scale[keep], ref_scale[keep])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_query_round_trip(layout):
    g = torch.Generator().manual_seed(11)
    rows = 5
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=g) * 3
    w = torch.randn(rows, HEADS, generator=g)
    pack = quantize_query(q, w, layout)
    deq = dequantize_query(layout, pack.q, pack.q_scale)
    if layout == "sglang_fp8":
        q8, qs = quantize_fp8(q)
        assert torch.equal(deq, q8.float())
        assert torch.equal(pack.weights, w * qs)
    else:
        packed, exps = quantize_mxfp4(q)
        assert torch.equal(pack.q, packed)
        assert torch.equal(deq, dequantize_mxfp4(packed, exps))
        # the same query lands in the same bytes whatever the scale layout
        other = "sglang_mxfp4" if layout == "aiter_mxfp4" else "aiter_mxfp4"
        pack2 = quantize_query(q, w, other)
        assert torch.equal(pack2.q, pack.q)
        assert torch.equal(dequantize_query(other, pack2.q, pack2.q_scale), deq)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_allocate_k_cache_shapes(layout):
    k_cache, k_scale = allocate_k_cache(layout, 5)
    assert k_cache.dtype == torch.uint8 and bool((k_cache == 0).all())
    if layout == "aiter_mxfp4":
        assert k_cache.shape == (5, 1, 4, 64, 16)
        assert k_scale.shape == (5, 1, 4, 64) and k_scale.dtype == torch.uint8
    elif layout == "sglang_mxfp4":
        assert k_cache.shape == (5, 64 * 68) and k_scale is None
    else:
        assert k_cache.shape == (5, 64 * 132) and k_scale is None


def test_physical_slots():
    row = torch.tensor([7, 0, 3], dtype=torch.int32)
    pos = torch.tensor([0, 63, 64, 127, 128, 191])
    assert physical_slots(row, pos).tolist() == [448, 511, 0, 63, 192, 255]
