"""The shared score tile: one function both the legacy and the fused kernel call.

Math (per query row ``r``, key position ``j``)::

    acc[j, h]  = sum_d k[j, d] * q[r, h, d]              # one MMA, keys on the M side
    score[j]   = sum_h weights[r, h] * relu(acc[j, h])   # fp32, in registers
    score[j]  *= k_scale[j]                              # sglang_fp8 only
    score[j]  *= weight_scale

Keys sit on the MMA's M side so the 64-head reduction runs along N, inside a thread and its
quad, instead of across warps. A program scores a pair of query rows against one key tile:
in a prefill the rows of a request share its page-table row, so the tile is loaded once for
both; where the two rows disagree on a page the block needs, row 1 is rescored from its own
pages. Each row has its own MMA, so a row's scores never depend on its partner, and the two
kernels that call this tile with the same ``BLOCK_N`` and warp count produce bitwise-equal
scores.

MXFP4: the query is widened once per row to bf16 with its 2**e block scales folded in (exact:
an e2m1 value times a power of two has at most two significant bits); key tiles go to
``tl.dot_scaled`` as packed e2m1 with their ue8m0 scales, which widens them the same exact way
inside the MMA pipeline. FP8 operands feed the fp8 MMA directly. Under the Triton interpreter
every operand is widened to fp32 by hand, because the interpreter's bf16 dot is unreliable.
"""

import triton
import triton.language as tl

from .common import e2m1_to_f32, e4m3_to_f32, ue8m0_to_f32


@triton.jit
def load_query_t(q_ptr, qs_ptr, row, rvalid, LAYOUT: tl.constexpr, INTERPRET: tl.constexpr):
    """Query row ``row`` as the MMA's B operand: ``[128 (d), 64 (h)]``."""
    d = tl.arange(0, 128)[:, None]
    h = tl.arange(0, 64)[None, :]
    row64 = row.to(tl.int64)
    rvalid = (d * 0 + h * 0 + rvalid.to(tl.int32)) != 0  # a full-shape mask
    if LAYOUT == 2:
        raw = tl.load(q_ptr + row64 * 8192 + h * 128 + d, mask=rvalid, other=0)
        if INTERPRET:
            qt = e4m3_to_f32(raw.to(tl.int32))
        else:
            qt = raw.to(tl.float8e4nv, bitcast=True)
    else:
        byte = tl.load(q_ptr + row64 * 4096 + h * 64 + d // 2, mask=rvalid, other=0).to(tl.int32)
        code = (byte >> ((d & 1) * 4)) & 0xF
        chunk = d // 32
        if LAYOUT == 0:
            sidx = chunk * 64 + (h % 16) * 4 + h // 16
        else:
            sidx = h * 4 + chunk
        e = tl.load(qs_ptr + row64 * 256 + sidx, mask=rvalid, other=127).to(tl.int32)
        qt = e2m1_to_f32(code) * ue8m0_to_f32(e)
        if not INTERPRET:
            qt = qt.to(tl.bfloat16)
    return qt


@triton.jit
def load_weights(w_ptr, row, rvalid):
    h = tl.arange(0, 64)
    m = (h * 0 + rvalid.to(tl.int32)) != 0
    return tl.load(w_ptr + row.to(tl.int64) * 64 + h, mask=m, other=0).to(tl.float32)


@triton.jit
def load_key_tile(kc_ptr, kf_ptr, ks_ptr, page, off, m, LAYOUT: tl.constexpr, INTERPRET: tl.constexpr):
    """Keys at (page, off) for a block: ``(operand, block scales, [BLOCK_N] fp32 key scale)``.

    FP8: the e4m3 tile ``[BLOCK_N, 128]`` and the per-key fp32 scale. MXFP4 on a GPU: the packed
    e2m1 tile ``[BLOCK_N, 64]`` and its ue8m0 scales ``[BLOCK_N, 4]`` for ``tl.dot_scaled``;
    under the interpreter: the widened fp32 tile (scales folded in).
    """
    page64 = page.to(tl.int64)[:, None]
    o = off[:, None]
    mm = m[:, None]
    ones = tl.full(off.shape, 1.0, tl.float32)
    if LAYOUT == 2:
        d = tl.arange(0, 128)[None, :]
        raw = tl.load(kc_ptr + page64 * 8448 + o * 128 + d, mask=mm, other=0)
        if INTERPRET:
            k = e4m3_to_f32(raw.to(tl.int32))
        else:
            k = raw.to(tl.float8e4nv, bitcast=True)
        kscale = tl.load(kf_ptr + page.to(tl.int64) * 2112 + 2048 + off, mask=m, other=0.0)
        return k, raw, kscale
    elif INTERPRET:
        d = tl.arange(0, 128)[None, :]
        if LAYOUT == 0:
            pay = page64 * 4096 + (d // 32) * 1024 + o * 16 + (d % 32) // 2
            sc = tl.load(ks_ptr + page64 * 256 + (d // 32) * 64 + (o % 16) * 4 + o // 16, mask=mm, other=127)
        else:
            pay = page64 * 4352 + o * 64 + d // 2
            sc = tl.load(kc_ptr + page64 * 4352 + 4096 + o * 4 + d // 32, mask=mm, other=127)
        byte = tl.load(kc_ptr + pay, mask=mm, other=0).to(tl.int32)
        code = (byte >> ((d & 1) * 4)) & 0xF
        k = e2m1_to_f32(code) * ue8m0_to_f32(sc.to(tl.int32))
        return k, byte, ones
    else:
        j = tl.arange(0, 64)[None, :]  # payload byte
        c = tl.arange(0, 4)[None, :]  # 32-wide chunk
        if LAYOUT == 0:
            packed = tl.load(kc_ptr + page64 * 4096 + (j // 16) * 1024 + o * 16 + j % 16, mask=mm, other=0)
            scales = tl.load(ks_ptr + page64 * 256 + c * 64 + (o % 16) * 4 + o // 16, mask=mm, other=127)
        else:
            packed = tl.load(kc_ptr + page64 * 4352 + o * 64 + j, mask=mm, other=0)
            scales = tl.load(kc_ptr + page64 * 4352 + 4096 + o * 4 + c, mask=mm, other=127)
        return packed, scales, ones


@triton.jit
def row_scores(k, kblk, kscale, qt, w, weight_scale, LAYOUT: tl.constexpr, INTERPRET: tl.constexpr):
    """``[BLOCK_N]`` fp32 scores of one query row against a key tile (see :func:`load_key_tile`)."""
    if INTERPRET:
        acc = tl.dot(k, qt, input_precision="ieee", out_dtype=tl.float32)
    elif LAYOUT == 2:
        acc = tl.dot(k, qt, out_dtype=tl.float32)
    else:
        # e2m1 keys with ue8m0 block scales against the bf16 query (its scales already folded)
        acc = tl.dot_scaled(k, kblk, "e2m1", qt, None, "bf16", out_dtype=tl.float32)
    # relu that keeps NaN (a NaN dot must give a NaN score, as in the reference)
    acc = tl.where(acc < 0, 0.0, acc)
    # + 0.0: a head sum of only -0 terms is +0, as in the reference's sum
    s = tl.sum(acc * w[None, :], axis=1) + 0.0
    if LAYOUT == 2:
        s = s * kscale
    return s * weight_scale


@triton.jit
def load_row_pair(q_ptr, qs_ptr, w_ptr, pt_ptr, stride_pt, r0, n_rows, LAYOUT: tl.constexpr, INTERPRET: tl.constexpr):
    """What a program keeps for its row pair ``(r0, r0 + 1)``: both queries as MMA operands,
    their weights and page-table rows (row 1 may not exist: zeros, and row 0's page table)."""
    r1 = r0 + 1
    v1 = r1 < n_rows
    qt0 = load_query_t(q_ptr, qs_ptr, r0, r0 < n_rows, LAYOUT, INTERPRET)
    qt1 = load_query_t(q_ptr, qs_ptr, r1, v1, LAYOUT, INTERPRET)
    w0 = load_weights(w_ptr, r0, r0 < n_rows)
    w1 = load_weights(w_ptr, r1, v1)
    pt0 = pt_ptr + r0.to(tl.int64) * stride_pt
    pt1 = pt_ptr + tl.where(v1, r1, r0).to(tl.int64) * stride_pt
    return qt0, qt1, w0, w1, pt0, pt1


@triton.jit
def score_pair(
    pos, len0, len1, pt0_ptr, pt1_ptr, kc_ptr, kf_ptr, ks_ptr,
    qt0, qt1, w0, w1, weight_scale,
    LAYOUT: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Scores ``(s0, s1)`` ``[BLOCK_N]`` of the row pair at positions ``pos``.

    ``pt0_ptr`` / ``pt1_ptr`` point at each row's page-table row. Positions a row does not
    need (``pos >= len``) hold unspecified values.
    """
    need0 = pos < len0
    need1 = pos < len1
    col = pos >> 6
    off = pos & 63
    p0 = tl.load(pt0_ptr + col, mask=need0, other=-1)
    p1 = tl.load(pt1_ptr + col, mask=need1, other=-1)
    page = tl.where(need0, p0, p1)
    k, kblk, kscale = load_key_tile(kc_ptr, kf_ptr, ks_ptr, page, off, need0 | need1, LAYOUT, INTERPRET)
    s0 = row_scores(k, kblk, kscale, qt0, w0, weight_scale, LAYOUT, INTERPRET)
    s1 = row_scores(k, kblk, kscale, qt1, w1, weight_scale, LAYOUT, INTERPRET)
    disagree = tl.sum((need0 & need1 & (p0 != p1)).to(tl.int32), axis=0)
    if disagree > 0:
        k1, kblk1, kscale1 = load_key_tile(kc_ptr, kf_ptr, ks_ptr, p1, off, need1, LAYOUT, INTERPRET)
        s1 = row_scores(k1, kblk1, kscale1, qt1, w1, weight_scale, LAYOUT, INTERPRET)
    return s0, s1
