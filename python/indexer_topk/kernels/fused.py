"""The fused streaming kernel: score key blocks and keep only bounded candidate sets.

A persistent grid of programs pulls work items from an atomic counter; an item is a pair of
query rows and one context split. For each key block the program computes the pair's scores
with the shared tile (:mod:`.score`), turns them into order keys and keeps every key that
reaches the row's gate in the row's candidate buffer in global scratch (program-private,
L2-resident). When a buffer could overflow it is cut back to exactly ``TOPK`` entries by radix
select and the row's gate rises to the k-th key found, so the gate only ever rises.

Two ways to keep the candidates (``STREAM_MODE``):

* 0: one buffer per row in position order (``CAP = TOPK + pool`` entries, a power of two),
  appended with a block-wide prefix sum and cut as one register tile
  (:func:`.select.compact_tile`) inside the single streaming loop; position order makes equal
  scores resolve to the lower position without carrying the position in the key.
* 2: lane-private buffers with no cross-warp step per block (:mod:`.slots`).

At the end of an item the row's top ``TOPK`` is either sorted and written as the contract's
outputs (one split per row) or stored in position order for the merge kernel
(:func:`.select.select_rows_kernel`, segment mode). Scratch is ``programs * 2 * CAP * 8`` bytes
plus ``rows * SPLITS * (TOPK * 8 + 4)`` for split rows: independent of the context length.
"""

import triton
import triton.language as tl

from .score import load_row_pair, score_pair
from .select import compact_tile, finalize_row
from .slots import cut_slots, finish_slots
from .common import KEY_MIN, ordered_key


@triton.jit
def _append(buf_key, buf_pos, count, key, pos, take):
    take_i = take.to(tl.int32)
    dst = count + tl.cumsum(take_i, axis=0) - take_i
    tl.store(buf_key + dst, key, mask=take)
    tl.store(buf_pos + dst, pos, mask=take)
    return count + tl.sum(take_i, axis=0)


@triton.jit
def _block_keys(
    b, end0, end1, gate0, gate1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1, weight_scale,
    LAYOUT: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Score the block at ``b`` for the row pair: positions, order keys and who passes the gates."""
    pos = b + tl.arange(0, BLOCK_N)
    s0, s1 = score_pair(
        pos, end0, end1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1, weight_scale, LAYOUT, INTERPRET
    )
    u0 = ordered_key(s0)
    u1 = ordered_key(s1)
    return pos, u0, u1, (pos < end0) & (u0 >= gate0), (pos < end1) & (u1 >= gate1)


@triton.jit
def _finish_row(
    buf_key, buf_pos, count, seq_len, row, split, pt_ptr, stride_pt,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
    TOPK: tl.constexpr, SPLITS: tl.constexpr, CAP: tl.constexpr,
):
    row64 = row.to(tl.int64)
    if count > TOPK:
        count, _gate = compact_tile(buf_key, buf_pos, count, TOPK, CAP)
        tl.debug_barrier()
    if SPLITS == 1:
        finalize_row(
            buf_key, buf_pos, tl.minimum(seq_len, TOPK), seq_len, pt_ptr + row64 * stride_pt,
            out_bits + row64 * TOPK, out_raw + row64 * TOPK, out_phys + row64 * TOPK, out_cnt + row, TOPK,
        )
    else:
        offs = tl.arange(0, TOPK)
        m = offs < count
        seg = (row64 * SPLITS + split) * TOPK
        tl.store(seg_key + seg + offs, tl.load(buf_key + offs, mask=m, other=0), mask=m)
        tl.store(seg_pos + seg + offs, tl.load(buf_pos + offs, mask=m, other=0), mask=m)
        tl.store(seg_cnt + row64 * SPLITS + split, count)


@triton.jit
def fused_topk_kernel(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, pt_ptr, stride_pt, seq_lens, n_rows,
    weight_scale, buf_key_all, buf_pos_all, queue, n_items, split_span,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
    LAYOUT: tl.constexpr, BLOCK_N: tl.constexpr, TOPK: tl.constexpr, CAP: tl.constexpr,
    SPLITS: tl.constexpr, SCORE_ONLY: tl.constexpr, INTERPRET: tl.constexpr,
    STREAM_MODE: tl.constexpr, S: tl.constexpr = 16, CHECK: tl.constexpr = 8,
):
    pid = tl.program_id(0)
    buf0_key = buf_key_all + pid.to(tl.int64) * (2 * CAP)
    buf0_pos = buf_pos_all + pid.to(tl.int64) * (2 * CAP)
    buf1_key = buf0_key + CAP
    buf1_pos = buf0_pos + CAP
    item = tl.atomic_add(queue, 1)
    while item < n_items:
        group = item // SPLITS
        split = item % SPLITS
        r0 = group * 2
        r1 = r0 + 1
        v1 = r1 < n_rows
        len0 = tl.load(seq_lens + r0)
        len1 = tl.load(seq_lens + r1, mask=v1, other=0)
        lo = split * split_span
        hi = tl.minimum(lo + split_span, tl.maximum(len0, len1))
        end0 = tl.minimum(len0, hi)
        end1 = tl.minimum(len1, hi)
        qt0, qt1, w0, w1, pt0, pt1 = load_row_pair(
            q_ptr, qs_ptr, w_ptr, pt_ptr, stride_pt, r0, n_rows, LAYOUT, INTERPRET
        )
        zero = tl.zeros([], dtype=tl.int32)
        cnt0 = zero
        cnt1 = zero
        gate0 = zero + KEY_MIN
        gate1 = zero + KEY_MIN
        if STREAM_MODE == 2:
            # Lane-private buffers (see .slots): no cross-warp step per block.
            lanes = tl.arange(0, BLOCK_N)
            lc0 = tl.zeros([BLOCK_N], dtype=tl.int32)
            lc1 = tl.zeros([BLOCK_N], dtype=tl.int32)
            for b in range(lo, hi, BLOCK_N):
                pos, u0, u1, take0, take1 = _block_keys(
                    b, end0, end1, gate0, gate1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1, weight_scale,
                    LAYOUT, BLOCK_N, INTERPRET,
                )
                tl.store(buf0_key + lanes * S + lc0, u0, mask=take0)
                tl.store(buf0_pos + lanes * S + lc0, pos, mask=take0)
                tl.store(buf1_key + lanes * S + lc1, u1, mask=take1)
                tl.store(buf1_pos + lanes * S + lc1, pos, mask=take1)
                lc0 += take0.to(tl.int32)
                lc1 += take1.to(tl.int32)
                if ((b - lo) // BLOCK_N) % CHECK == CHECK - 1:
                    if tl.max(tl.maximum(lc0, lc1), axis=0) > S - CHECK:
                        tl.debug_barrier()
                        if tl.max(lc0, axis=0) > S - CHECK:
                            lc0, gate0 = cut_slots(buf0_key, buf0_pos, lc0, gate0, TOPK, BLOCK_N, S)
                        if tl.max(lc1, axis=0) > S - CHECK:
                            lc1, gate1 = cut_slots(buf1_key, buf1_pos, lc1, gate1, TOPK, BLOCK_N, S)
            tl.debug_barrier()
            finish_slots(
                buf0_key, buf0_pos, lc0, len0, r0, split, pt_ptr, stride_pt,
                out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, TOPK, BLOCK_N, S, SPLITS,
            )
            if v1:
                finish_slots(
                    buf1_key, buf1_pos, lc1, len1, r1, split, pt_ptr, stride_pt,
                    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, TOPK, BLOCK_N, S, SPLITS,
                )
        else:
            # One innermost loop over the blocks; a buffer about to overflow is cut back in
            # registers (compact_tile has no loops, so the loop stays software-pipelined).
            for b in range(lo, hi, BLOCK_N):
                pos, u0, u1, take0, take1 = _block_keys(
                    b, end0, end1, gate0, gate1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1, weight_scale,
                    LAYOUT, BLOCK_N, INTERPRET,
                )
                if SCORE_ONLY:
                    # Measurement variant: every score is consumed (counted, and the count
                    # stored), nothing is kept.
                    cnt0 += tl.sum(take0.to(tl.int32), axis=0)
                    cnt1 += tl.sum(take1.to(tl.int32), axis=0)
                else:
                    # Most blocks of a long row hold no survivor once the gates have risen: one
                    # reduction for both rows spares them the prefix sums of the append.
                    if tl.max((take0 | take1).to(tl.int32), axis=0) > 0:
                        cnt0 = _append(buf0_key, buf0_pos, cnt0, u0, pos, take0)
                        cnt1 = _append(buf1_key, buf1_pos, cnt1, u1, pos, take1)
                    if tl.maximum(cnt0, cnt1) > CAP - BLOCK_N:
                        tl.debug_barrier()
                        if cnt0 > CAP - BLOCK_N:
                            cnt0, gate0 = compact_tile(buf0_key, buf0_pos, cnt0, TOPK, CAP)
                        if cnt1 > CAP - BLOCK_N:
                            cnt1, gate1 = compact_tile(buf1_key, buf1_pos, cnt1, TOPK, CAP)
                        tl.debug_barrier()
            tl.debug_barrier()
            if SCORE_ONLY:
                tl.store(out_cnt + r0, cnt0)
                tl.store(out_cnt + r1, cnt1, mask=v1)
            else:
                _finish_row(
                    buf0_key, buf0_pos, cnt0, len0, r0, split, pt_ptr, stride_pt,
                    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, TOPK, SPLITS, CAP,
                )
                if v1:
                    _finish_row(
                        buf1_key, buf1_pos, cnt1, len1, r1, split, pt_ptr, stride_pt,
                        out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, TOPK, SPLITS, CAP,
                    )
        tl.debug_barrier()
        item = tl.atomic_add(queue, 1)
