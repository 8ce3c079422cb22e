"""The shared score tile: the functions both the legacy and the fused kernel score with.

Math, for a group of ``R`` query rows ``r`` and one page of 64 keys ``j``::

    acc[j, (r, h)] = sum_d k[j, d] * q[r, h, d]              # one MMA: M = 64 keys, N = R * 64
    score[j, r]    = sum_h weights[r, h] * relu(acc[j, (r, h)]) + 0.0
    score[j, r]   *= k_scale[j]                              # sglang_fp8 only
    score[j, r]   *= weight_scale

Keys sit on the MMA's M side and the ``R`` rows of a group share one MMA along N, so each key
page is read once for ``R * 64`` query heads, and the 64-head reduction runs along N, inside a
thread and its quad, never across warps. A page of 64 keys is the natural tile: contiguous in
every layout, so on a GPU the FP8 page arrives with one bulk tensor copy (a ``TensorDescriptor``
over ``[pages, 64, 128]``, see :func:`indexer_topk.kernels.launch.key_descriptor`).

Bitwise agreement: an MMA output element depends only on its key and its query head, and the
head reduction only on the tile's layout, so a row's scores are the same bits whichever rows
share its group, whenever two kernels use the same ``R`` and warp count. Both kernels take them
from :func:`indexer_topk.kernels.launch.tile_config`.

``relu`` keeps NaN (a NaN dot gives a NaN score, as in the reference); the ``+ 0.0`` makes a sum
of only ``-0`` terms ``+0``, so the sign of a zero never depends on how ``relu`` treats ``-0``.

MXFP4: the query is widened once per group to bf16 with its 2**e block scales folded in (exact:
an e2m1 value times a power of two has at most two significant bits); key pages go to
``tl.dot_scaled`` as packed e2m1 with their ue8m0 scales, which widens them the same exact way.
FP8 operands feed the fp8 MMA directly. Under the Triton interpreter every operand is widened to
fp32 by hand, because the interpreter's bf16 dot is unreliable.
"""

import triton
import triton.language as tl

from .common import LAYOUT_AITER_MXFP4, LAYOUT_SGLANG_FP8, e2m1_to_f32, e4m3_to_f32, pick, ue8m0_to_f32
from .geometry import (
    AI4_CHUNK_STRIDE,
    AI4_INTERLEAVE,
    AI4_PAGE_BYTES,
    AI4_PIECE,
    AI4_SCALE_PAGE,
    DIM,
    FP8_PAGE_BYTES,
    FP8_PAGE_WORDS,
    FP8_Q_ROW,
    FP8_SCALE_WORD,
    GROUP,
    MX_Q_ROW,
    MX_Q_SCALE_ROW,
    NCHUNKS,
    NHEADS,
    PAGE,
    PDIM,
    SG4_PAGE_BYTES,
    SG4_SCALE_OFFSET,
)

FP8 = tl.constexpr(LAYOUT_SGLANG_FP8)
AGREE_CHUNK = tl.constexpr(256)  # page-table columns compared at once
AITER = tl.constexpr(LAYOUT_AITER_MXFP4)


@triton.jit
def load_queries(q_ptr, qs_ptr, w_ptr, r0, n_rows, R: tl.constexpr, LAYOUT: tl.constexpr, INTERPRET: tl.constexpr):
    """Rows ``r0 .. r0 + R - 1`` as the MMA's B operand ``[128 (d), R * 64 (row, head)]`` and
    their weights ``[R * 64]`` fp32; rows at or past ``n_rows`` are zeros."""
    d = tl.arange(0, DIM)[:, None]
    col = tl.arange(0, R * NHEADS)[None, :]
    row = (r0 + col // NHEADS).to(tl.int64)
    h = col % NHEADS
    valid = (d * 0 + row) < n_rows
    if LAYOUT == FP8:
        raw = tl.load(q_ptr + row * FP8_Q_ROW + h * DIM + d, mask=valid, other=0)
        if INTERPRET:
            qt = e4m3_to_f32(raw.to(tl.int32))
        else:
            qt = raw.to(tl.float8e4nv, bitcast=True)
    else:
        byte = tl.load(q_ptr + row * MX_Q_ROW + h * PDIM + d // 2, mask=valid, other=0).to(tl.int32)
        code = (byte >> ((d & 1) * 4)) & 0xF
        chunk = d // GROUP
        if LAYOUT == AITER:
            sidx = chunk * NHEADS + (h % AI4_INTERLEAVE) * NCHUNKS + h // AI4_INTERLEAVE
        else:
            sidx = h * NCHUNKS + chunk
        e = tl.load(qs_ptr + row * MX_Q_SCALE_ROW + sidx, mask=valid, other=127).to(tl.int32)
        qt = e2m1_to_f32(code) * ue8m0_to_f32(e)
        if not INTERPRET:
            qt = qt.to(tl.bfloat16)
    wrow = r0 + tl.arange(0, R * NHEADS) // NHEADS
    w = tl.load(w_ptr + wrow.to(tl.int64) * NHEADS + tl.arange(0, R * NHEADS) % NHEADS, mask=wrow < n_rows, other=0)
    return qt, w.to(tl.float32)


@triton.jit
def load_page(
    kc_ptr, kf_ptr, ks_ptr, kdesc, page, n_pages, LAYOUT: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
):
    """The 64 keys of ``page``: ``(operand, block scales, [64] fp32 key scale)``. A page id outside
    ``[0, n_pages)`` (possible only with the value checks off) reads as zeros, never outside the cache.

    FP8: the e4m3 tile ``[64, 128]`` (one bulk copy through ``kdesc`` when ``TMA``) and the
    per-key fp32 scale. MXFP4 on a GPU: the packed e2m1 tile ``[64, 64]`` and its ue8m0 scales
    ``[64, 4]`` for ``tl.dot_scaled``; under the interpreter: the widened fp32 tile (scales
    folded in). The unused outputs are placeholders.
    """
    ok = (page >= 0) & (page < n_pages)
    page64 = tl.where(ok, page, 0).to(tl.int64)
    o = tl.arange(0, PAGE)[:, None]
    m = (o * 0 + ok.to(tl.int32)) != 0  # full-shape masks
    m1 = (tl.arange(0, PAGE) * 0 + ok.to(tl.int32)) != 0
    ones = tl.full([PAGE], 1.0, tl.float32)
    if LAYOUT == FP8:
        kscale = tl.load(kf_ptr + page64 * FP8_PAGE_WORDS + FP8_SCALE_WORD + tl.arange(0, PAGE), mask=m1, other=0.0)
        if TMA:
            k = tl.reshape(kdesc.load([page, 0, 0]), [PAGE, DIM])
        else:
            d = tl.arange(0, DIM)[None, :]
            raw = tl.load(kc_ptr + page64 * FP8_PAGE_BYTES + o * DIM + d, mask=m, other=0)
            if INTERPRET:
                k = e4m3_to_f32(raw.to(tl.int32))
            else:
                k = raw.to(tl.float8e4nv, bitcast=True)
        return k, kscale, kscale
    elif INTERPRET:
        d = tl.arange(0, DIM)[None, :]
        c = d // GROUP
        if LAYOUT == AITER:
            pay = page64 * AI4_PAGE_BYTES + c * AI4_CHUNK_STRIDE + o * AI4_PIECE + (d % GROUP) // 2
            sc = tl.load(
                ks_ptr + page64 * AI4_SCALE_PAGE + c * PAGE + (o % AI4_INTERLEAVE) * NCHUNKS + o // AI4_INTERLEAVE,
                mask=m, other=127,
            )
        else:
            pay = page64 * SG4_PAGE_BYTES + o * PDIM + d // 2
            sc = tl.load(kc_ptr + page64 * SG4_PAGE_BYTES + SG4_SCALE_OFFSET + o * NCHUNKS + c, mask=m, other=127)
        byte = tl.load(kc_ptr + pay, mask=m, other=0).to(tl.int32)
        code = (byte >> ((d & 1) * 4)) & 0xF
        k = e2m1_to_f32(code) * ue8m0_to_f32(sc.to(tl.int32))
        return k, byte, ones
    else:
        j = tl.arange(0, PDIM)[None, :]  # payload byte
        c = tl.arange(0, NCHUNKS)[None, :]
        if LAYOUT == AITER:
            packed = tl.load(
                kc_ptr + page64 * AI4_PAGE_BYTES + (j // AI4_PIECE) * AI4_CHUNK_STRIDE + o * AI4_PIECE + j % AI4_PIECE,
                mask=m, other=0,
            )
            scales = tl.load(
                ks_ptr + page64 * AI4_SCALE_PAGE + c * PAGE + (o % AI4_INTERLEAVE) * NCHUNKS + o // AI4_INTERLEAVE,
                mask=m, other=127,
            )
        else:
            packed = tl.load(kc_ptr + page64 * SG4_PAGE_BYTES + o * PDIM + j, mask=m, other=0)
            scales = tl.load(kc_ptr + page64 * SG4_PAGE_BYTES + SG4_SCALE_OFFSET + o * NCHUNKS + c, mask=m, other=127)
        return packed, scales, ones


@triton.jit
def page_scores(
    k, kblk, kscale, qt, w, weight_scale,
    R: tl.constexpr, LAYOUT: tl.constexpr, INTERPRET: tl.constexpr,
):
    """``[64, R]`` fp32 scores of the group's rows against one key page (see :func:`load_page`)."""
    if INTERPRET:
        # numpy's fp32 matmul sums in an order that depends on the tile's shape; float64 products
        # and sums of these operands are exact (for FP8 always, for MXFP4 unless block scales far
        # apart meet in one dot), so one row per tile and two give the same bits, as compiled MMAs do
        acc = tl.dot(k.to(tl.float64), qt.to(tl.float64), input_precision="ieee", out_dtype=tl.float64)
        acc = acc.to(tl.float32)
    elif LAYOUT == FP8:
        acc = tl.dot(k, qt, out_dtype=tl.float32)
    else:
        # e2m1 keys with ue8m0 block scales against the bf16 queries (their scales folded)
        acc = tl.dot_scaled(k, kblk, "e2m1", qt, None, "bf16", out_dtype=tl.float32)
    acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)
    s = tl.sum(tl.reshape(acc * w[None, :], [PAGE, R, NHEADS]), axis=2) + 0.0
    if LAYOUT == FP8:
        s = s * kscale[:, None]
    return s * weight_scale


@triton.jit
def group_rows(seq_lens, r0, n_rows, lo, hi_cap, R: tl.constexpr):
    """Per-row facts of the group at ``r0`` over the span ``[lo, hi_cap)``.

    Returns ``(ends [R], hi, lead)``: each row's last needed position + 1 inside the span (0 for
    rows past ``n_rows``), the span's end for the group (the longest row's), and the row holding
    the longest length (its page-table row names every page the group needs).
    """
    rows = r0 + tl.arange(0, R)
    lens = tl.load(seq_lens + rows, mask=rows < n_rows, other=0)
    hi = tl.minimum(hi_cap, tl.max(lens, axis=0))
    ends = tl.maximum(tl.minimum(lens, hi), lo)
    lead = r0 + tl.argmax(lens, axis=0)
    return ends, hi, lead


@triton.jit
def pages_agree(pt_ptr, stride_pt, r0, ends, lead, lo, R: tl.constexpr):
    """Whether every row of the group names, for each page it needs in ``[lo, end)``, the same
    page as the lead row: then one key tile serves the whole group."""
    pt_lead = pt_ptr + lead.to(tl.int64) * stride_pt
    bad = tl.zeros([], dtype=tl.int32)
    for r in range(R):
        end = pick(ends, r, R)
        pt_r = pt_ptr + (r0 + r).to(tl.int64) * stride_pt
        col_end = (end + PAGE - 1) // PAGE
        for c0 in range(lo // PAGE, col_end, AGREE_CHUNK):
            cols = c0 + tl.arange(0, AGREE_CHUNK)
            m = cols < col_end
            a = tl.load(pt_r + cols, mask=m, other=0)
            b = tl.load(pt_lead + cols, mask=m, other=0)
            bad += tl.sum((a != b).to(tl.int32), axis=0)
    return bad == 0


@triton.jit
def score_page(
    b, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends, qt, w, weight_scale,
    R: tl.constexpr, LAYOUT: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
    UNIFORM: tl.constexpr,
):
    """``[64, R]`` scores of the group at the page starting at position ``b``.

    ``UNIFORM``: the rows share their pages (:func:`pages_agree`), so the lead row's page serves
    all. Otherwise each row needing the page scores its own (the same MMA, its column kept), so
    its bits equal the uniform case's. Rows not needing the page hold unspecified values.
    """
    if UNIFORM:
        page = tl.load(pt_lead + b // PAGE)
        k, kblk, kscale = load_page(kc_ptr, kf_ptr, ks_ptr, kdesc, page, n_pages, LAYOUT, TMA, INTERPRET)
        s = page_scores(k, kblk, kscale, qt, w, weight_scale, R, LAYOUT, INTERPRET)
    else:
        s = tl.zeros([PAGE, R], dtype=tl.float32)
        col = tl.arange(0, R)[None, :]
        for r in range(R):
            end = pick(ends, r, R)
            if b < end:
                page = tl.load(pt_ptr + (r0 + r).to(tl.int64) * stride_pt + b // PAGE)
                k, kblk, kscale = load_page(kc_ptr, kf_ptr, ks_ptr, kdesc, page, n_pages, LAYOUT, TMA, INTERPRET)
                s_r = page_scores(k, kblk, kscale, qt, w, weight_scale, R, LAYOUT, INTERPRET)
                s = tl.where(col == r, s_r, s)
    return s
