"""The fused streaming kernel: score key blocks and keep only bounded candidate sets.

A persistent grid of programs pulls work items from an atomic counter; an item is a pair of
query rows and one context split. For each key block the program computes the pair's scores
with the shared tile (:mod:`.score`) and turns them into order keys. Every key that reaches the
row's gate goes into the row's candidate buffer in global scratch (program-private,
L2-resident), in position order, so equal scores resolve to the lower position without carrying
the position in the key. When a buffer could overflow it is cut back to exactly ``TOPK`` entries
as one register tile (:func:`.select.compact_tile`) and the row's gate rises to the k-th key
found: the gate only ever rises.

Three ways to feed the buffers (``STREAM_MODE``):

* 1 (default), staged: each block's keys are stored to a per-row staging strip of ``STAGE_N``
  keys (plain coalesced stores, no cross-warp step); every ``STAGE_N / BLOCK_N`` blocks the strip
  is filtered against the gate and appended with one prefix sum over the whole strip. The
  block-wide scans and barriers are paid once per strip instead of once per block.
* 0, per block: the survivors of every block are appended at once with a block-wide prefix sum.
* 2, claimed slots (:mod:`.claimed`): each survivor claims a buffer slot with an atomic
  increment, so the buffer is in claim order and cut by the 64-bit (key, position) composite;
  the counters are read only when a buffer could next overflow. Exact on the H200, and slower
  there than the staged stream (FP8 10.6 vs 8.7 ms at the reference shape): the 64-bit cuts
  cost more than the scans they replace.

At the end of an item the row's top ``TOPK`` is either sorted and written as the contract's
outputs (one split per row) or stored in position order for the merge kernel
(:func:`.select.select_rows_kernel`, segment mode). Scratch per program is two rows of
``CAP`` keys and ``CAP`` positions (int32), plus ``2 * STAGE_N`` keys in stream mode 1 or two
counters in stream mode 2, plus ``rows * SPLITS * (TOPK * 8 + 4)`` bytes for split rows:
independent of the context length.
"""

import triton
import triton.language as tl

from .score import load_row_pair, score_pair
from .claimed import claim, cut_if_over, order_by_position
from .select import compact_tile, finalize_row
from .common import KEY_MIN, ordered_key


@triton.jit
def _append(buf_key, buf_pos, count, key, pos, take, n_taken):
    """Store the ``n_taken`` taken entries after the buffer's first ``count``, in order."""
    take_i = take.to(tl.int32)
    dst = count + tl.cumsum(take_i, axis=0) - take_i
    tl.store(buf_key + dst, key, mask=take)
    tl.store(buf_pos + dst, pos, mask=take)
    return count + n_taken


@triton.jit
def _flush(stage, buf_key, buf_pos, cnt, gate, base, end, TOPK: tl.constexpr, CAP: tl.constexpr, STAGE_N: tl.constexpr):
    """Append the strip's keys that reach the gate (positions ``base ..``, valid below ``end``)
    to the row's buffer; cut the buffer first if they would not fit. Returns ``(cnt, gate)``.

    After a cut ``cnt == TOPK`` and ``STAGE_N <= CAP - TOPK``, so the strip always fits then.
    """
    offs = tl.arange(0, STAGE_N)
    pos = base + offs
    key = tl.load(stage + offs)
    live = pos < end
    take = live & (key >= gate)
    n = tl.sum(take.to(tl.int32), axis=0)
    if cnt + n > CAP:
        cnt, gate = compact_tile(buf_key, buf_pos, cnt, TOPK, CAP)
        take = live & (key >= gate)
        n = tl.sum(take.to(tl.int32), axis=0)
    if n > 0:
        cnt = _append(buf_key, buf_pos, cnt, key, pos, take, n)
    return cnt, gate


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
            buf_key, buf_pos, tl.minimum(tl.minimum(seq_len, TOPK), count), seq_len, pt_ptr + row64 * stride_pt,
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
    weight_scale, buf_key_all, buf_pos_all, stage_all, claim_all, queue, n_items, split_span,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
    LAYOUT: tl.constexpr, BLOCK_N: tl.constexpr, TOPK: tl.constexpr, CAP: tl.constexpr,
    SPLITS: tl.constexpr, SCORE_ONLY: tl.constexpr, INTERPRET: tl.constexpr,
    STREAM_MODE: tl.constexpr, STAGE_N: tl.constexpr,
):
    pid = tl.program_id(0)
    buf0_key = buf_key_all + pid.to(tl.int64) * (2 * CAP)
    buf0_pos = buf_pos_all + pid.to(tl.int64) * (2 * CAP)
    buf1_key = buf0_key + CAP
    buf1_pos = buf0_pos + CAP
    stage0 = stage_all + pid.to(tl.int64) * (2 * STAGE_N)
    stage1 = stage0 + STAGE_N
    claim0 = claim_all + pid.to(tl.int64) * 2
    claim1 = claim0 + 1
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
            tl.atomic_xchg(claim0, 0, sem="relaxed")
            tl.atomic_xchg(claim1, 0, sem="relaxed")
            tl.debug_barrier()
            # Runs of blocks with no barrier inside (so the key loads can be pipelined): a run
            # is as many blocks as fit in the fuller buffer whatever they hold, then the
            # counters are read and a buffer with fewer than BLOCK_N free slots is cut.
            start = lo
            run = CAP // BLOCK_N
            while start < hi:
                stop = tl.minimum(start + run * BLOCK_N, hi)
                for b in range(start, stop, BLOCK_N):
                    pos, u0, u1, take0, take1 = _block_keys(
                        b, end0, end1, gate0, gate1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1,
                        weight_scale, LAYOUT, BLOCK_N, INTERPRET,
                    )
                    claim(claim0, buf0_key, buf0_pos, u0, pos, take0, BLOCK_N)
                    claim(claim1, buf1_key, buf1_pos, u1, pos, take1, BLOCK_N)
                tl.debug_barrier()  # every claim and store of the program has landed
                cnt0, gate0 = cut_if_over(buf0_key, buf0_pos, claim0, gate0, CAP - BLOCK_N, TOPK, CAP)
                cnt1, gate1 = cut_if_over(buf1_key, buf1_pos, claim1, gate1, CAP - BLOCK_N, TOPK, CAP)
                run = tl.maximum((CAP - tl.maximum(cnt0, cnt1)) // BLOCK_N, 1)
                tl.debug_barrier()
                start = stop
            tl.debug_barrier()
            cnt0, gate0 = cut_if_over(buf0_key, buf0_pos, claim0, gate0, TOPK, TOPK, CAP)
            cnt1, gate1 = cut_if_over(buf1_key, buf1_pos, claim1, gate1, TOPK, TOPK, CAP)
            tl.debug_barrier()
            order_by_position(buf0_key, buf0_pos, cnt0, TOPK)
            order_by_position(buf1_key, buf1_pos, cnt1, TOPK)
        elif STREAM_MODE == 1:
            # The strip's blocks are an inner loop with no barrier in it, so the compiler can
            # software-pipeline the key loads (asynchronous copies issued blocks ahead); a
            # barrier anywhere in a loop body rules that out.
            for base in range(lo, hi, STAGE_N):
                for b in range(base, tl.minimum(base + STAGE_N, hi), BLOCK_N):
                    pos, u0, u1, _take0, _take1 = _block_keys(
                        b, end0, end1, gate0, gate1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1,
                        weight_scale, LAYOUT, BLOCK_N, INTERPRET,
                    )
                    lanes = (b - base) + tl.arange(0, BLOCK_N)
                    tl.store(stage0 + lanes, u0)
                    tl.store(stage1 + lanes, u1)
                tl.debug_barrier()  # the whole strip, from every warp, is in place
                if not SCORE_ONLY:  # measurement variant: strips written, never read
                    cnt0, gate0 = _flush(stage0, buf0_key, buf0_pos, cnt0, gate0, base, end0, TOPK, CAP, STAGE_N)
                    cnt1, gate1 = _flush(stage1, buf1_key, buf1_pos, cnt1, gate1, base, end1, TOPK, CAP, STAGE_N)
                tl.debug_barrier()  # no warp refills the strip before every warp has read it
        else:
            # One innermost loop over the blocks (a nested loop scored measurably slower); a
            # buffer about to overflow is cut back in registers by the loop-free compact_tile.
            for b in range(lo, hi, BLOCK_N):
                pos, u0, u1, take0, take1 = _block_keys(
                    b, end0, end1, gate0, gate1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1, weight_scale,
                    LAYOUT, BLOCK_N, INTERPRET,
                )
                if SCORE_ONLY:
                    # Measurement variant: every score is consumed (the running largest key
                    # is stored), nothing is kept. A count of gate passes would not do: the
                    # gate stays at KEY_MIN here, so the test is always true and the compiler
                    # could drop the scoring.
                    cnt0 = tl.maximum(cnt0, tl.max(tl.where(pos < end0, u0, KEY_MIN), axis=0))
                    cnt1 = tl.maximum(cnt1, tl.max(tl.where(pos < end1, u1, KEY_MIN), axis=0))
                else:
                    # Most blocks of a long row hold no survivor once the gates have risen: one
                    # reduction for both rows spares them the prefix sums of the append.
                    if tl.max((take0 | take1).to(tl.int32), axis=0) > 0:
                        cnt0 = _append(buf0_key, buf0_pos, cnt0, u0, pos, take0, tl.sum(take0.to(tl.int32), axis=0))
                        cnt1 = _append(buf1_key, buf1_pos, cnt1, u1, pos, take1, tl.sum(take1.to(tl.int32), axis=0))
                    if tl.maximum(cnt0, cnt1) > CAP - BLOCK_N:
                        tl.debug_barrier()
                        if cnt0 > CAP - BLOCK_N:
                            cnt0, gate0 = compact_tile(buf0_key, buf0_pos, cnt0, TOPK, CAP)
                        if cnt1 > CAP - BLOCK_N:
                            cnt1, gate1 = compact_tile(buf1_key, buf1_pos, cnt1, TOPK, CAP)
                        tl.debug_barrier()
        # every stream leaves each row's candidates in position order, at most TOPK of them
        # unless the final cut of _finish_row is still due (stream modes 0 and 1)
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
