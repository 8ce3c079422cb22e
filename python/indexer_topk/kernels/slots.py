"""Lane-private candidate buffers: appending without any cross-warp step per key block.

The fused kernel's block of ``BLOCK_N`` scores is a vector whose element ``p`` (the block's
``p``-th key) always lives in the same threads. In this scheme each lane ``p`` owns ``S``
buffer slots, ``[p * S, p * S + S)``, and a count held in those threads' registers: a
survivor is stored at ``p * S + count[p]`` and the count bumped, with no prefix sum and no
barrier. Every ``CHECK`` blocks the program looks at the largest count (one reduction) and,
where a lane could fill up within the next ``CHECK`` blocks, cuts the row's buffer back to
its top ``TOPK`` and deals the kept entries out evenly over the lanes.

Entries are no longer in position order, so the cut ranks the 64-bit composite
``key << 32 | (position ^ 0xFFFFFFFF)`` (the complement equals ``2**32 - 1 - position``): higher score first, then the lower position, the
contract's order with no ties. Positions of one work item only grow, so after a cut a later
key that ties with the k-th loses, and the row's gate is the k-th key plus one (or the floor
of the boundary bucket when the radix stopped early).
"""

import triton
import triton.language as tl

from .common import COMP_MIN, LOW32, NEG_INF_BITS, key_to_score_bits
from .select import tile_threshold

POS_HI = tl.constexpr(2147483647)


@triton.jit
def _lane_counts(n_taken, BLOCK_N: tl.constexpr):
    lanes = tl.arange(0, BLOCK_N)
    return n_taken // BLOCK_N + (lanes < n_taken % BLOCK_N).to(tl.int32)


@triton.jit
def _load_slots(key_ptr, pos_ptr, cnt, BLOCK_N: tl.constexpr, S: tl.constexpr):
    lanes = tl.arange(0, BLOCK_N)[:, None]
    slot = tl.arange(0, S)[None, :]
    valid = slot < cnt[:, None]
    key = tl.load(key_ptr + lanes * S + slot, mask=valid, other=0)
    pos = tl.load(pos_ptr + lanes * S + slot, mask=valid, other=0)
    comp = (key.to(tl.int64) << 32) | (pos.to(tl.int64) ^ LOW32)
    comp = tl.where(valid, comp, COMP_MIN)
    return tl.reshape(comp, [BLOCK_N * S]), tl.reshape(valid, [BLOCK_N * S])


@triton.jit
def cut_slots(key_ptr, pos_ptr, cnt, gate, TOPK: tl.constexpr, BLOCK_N: tl.constexpr, S: tl.constexpr):
    """Cut one row's lane buffers to its top ``TOPK`` and deal them out evenly over the lanes.

    Returns ``(cnt, gate)`` for the row.
    """
    flat, valid = _load_slots(key_ptr, pos_ptr, cnt, BLOCK_N, S)
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    take = valid
    new_gate = gate
    if n_valid > TOPK:
        # distinct composites: the boundary bucket is always taken whole
        tb, shift, _need = tile_threshold(flat ^ COMP_MIN, valid, TOPK, 64)
        t = tb ^ COMP_MIN
        take = valid & ((flat >> shift) >= (t >> shift))
        t_key = (t >> 32).to(tl.int32)
        floor_key = (((t >> shift) << shift) >> 32).to(tl.int32)
        new_gate = tl.where(shift >= 32, floor_key, t_key + 1)
    take_i = take.to(tl.int32)
    rank = tl.cumsum(take_i, axis=0) - take_i
    dest = (rank % BLOCK_N) * S + rank // BLOCK_N
    key = (flat >> 32).to(tl.int32)
    pos = ((flat & LOW32) ^ LOW32).to(tl.int32)
    tl.debug_barrier()
    tl.store(key_ptr + dest, key, mask=take)
    tl.store(pos_ptr + dest, pos, mask=take)
    tl.debug_barrier()
    n_taken = tl.minimum(n_valid, TOPK)
    return _lane_counts(n_taken, BLOCK_N), new_gate


@triton.jit
def finish_slots(
    key_ptr, pos_ptr, cnt, seq_len, row, split, pt_ptr, stride_pt,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
    TOPK: tl.constexpr, BLOCK_N: tl.constexpr, S: tl.constexpr, SPLITS: tl.constexpr,
):
    """Write a row's result from its lane buffers: sorted outputs (one split) or the split's
    top ``TOPK`` in position order for the merge kernel."""
    N: tl.constexpr = BLOCK_N * S
    flat, valid = _load_slots(key_ptr, pos_ptr, cnt, BLOCK_N, S)
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    count = tl.minimum(n_valid, TOPK)
    ranked = tl.sort(flat, descending=True)  # contract order; the first `count` are the top k
    offs = tl.arange(0, N)
    keep = offs < count
    key = (ranked >> 32).to(tl.int32)
    pos = ((ranked & LOW32) ^ LOW32).to(tl.int32)
    row64 = row.to(tl.int64)
    if (seq_len <= TOPK) | (tl.full([], SPLITS, tl.int32) > 1):
        # position order: short rows list positions ascending; the merge needs it too
        by_pos = ((pos ^ POS_HI).to(tl.int64) << 32) | (key.to(tl.int64) & LOW32)
        by_pos = tl.sort(tl.where(keep, by_pos, COMP_MIN), descending=True)
        pos = (by_pos >> 32).to(tl.int32) ^ POS_HI
        key = (by_pos & LOW32).to(tl.int32)
    if SPLITS == 1:
        page = tl.load(pt_ptr + row64 * stride_pt + (pos >> 6), mask=keep, other=0)
        o = row64 * TOPK
        pad = tl.arange(0, TOPK)
        tl.store(out_bits + o + pad, tl.full([TOPK], NEG_INF_BITS, tl.int32))
        tl.store(out_raw + o + pad, tl.full([TOPK], -1, tl.int32))
        tl.store(out_phys + o + pad, tl.full([TOPK], -1, tl.int32))
        tl.debug_barrier()
        tl.store(out_bits + o + offs, key_to_score_bits(key), mask=keep)
        tl.store(out_raw + o + offs, pos, mask=keep)
        tl.store(out_phys + o + offs, page * 64 + (pos & 63), mask=keep)
        tl.store(out_cnt + row, count)
    else:
        seg = (row64 * SPLITS + split) * TOPK
        tl.store(seg_key + seg + offs, key, mask=keep)
        tl.store(seg_pos + seg + offs, pos, mask=keep)
        tl.store(seg_cnt + row64 * SPLITS + split, count)
