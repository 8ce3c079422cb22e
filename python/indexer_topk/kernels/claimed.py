"""Claimed slots: candidate buffers appended by atomic slot claims, with no block-wide step.

Stream mode 2 of the fused kernel. Each row of the program's pair owns a buffer of ``CAP``
entries and a counter in scratch. A lane whose score reaches the row's gate claims the next
slot with a relaxed atomic increment of the counter and stores its (key, position) there: no
prefix sum, no barrier. The buffer is therefore in claim order, not position order, so a cut
ranks the 64-bit composite ``key << 32 | (position ^ 0xFFFFFFFF)`` (higher score first, then
the lower position: the contract's order, with no ties).

The program reads the counters only when a buffer could next overflow: with ``c`` entries at
a check, ``(CAP - c) // BLOCK_N`` more blocks fit whatever they hold, so the next check comes
then, and a buffer is cut only when fewer than ``BLOCK_N`` slots are left.
"""

import triton
import triton.language as tl

from .common import COMP_MIN, LOW32
from .select import tile_threshold

INT64_MAX = tl.constexpr(2**63 - 1)


@triton.jit
def claim(cnt_ptr, buf_key, buf_pos, key, pos, take, BLOCK_N: tl.constexpr):
    """Store the taken lanes' entries at slots claimed from the row's counter."""
    slot = tl.atomic_add(
        cnt_ptr + tl.zeros([BLOCK_N], tl.int32), tl.full([BLOCK_N], 1, tl.int32), mask=take, sem="relaxed"
    )
    tl.store(buf_key + slot, key, mask=take)
    tl.store(buf_pos + slot, pos, mask=take)


@triton.jit
def cut_if_over(buf_key, buf_pos, cnt_ptr, gate, limit, TOPK: tl.constexpr, CAP: tl.constexpr):
    """Read the row's count (where the atomics are performed; callers barrier first) and cut
    the buffer when it holds more than ``limit`` entries. Returns ``(count, gate)``."""
    count = tl.atomic_add(cnt_ptr, 0, sem="relaxed")
    if count > limit:
        gate = cut_claimed(buf_key, buf_pos, cnt_ptr, count, gate, TOPK, CAP)
        count = tl.zeros([], dtype=tl.int32) + TOPK
    return count, gate


@triton.jit
def cut_claimed(buf_key, buf_pos, cnt_ptr, count, gate, TOPK: tl.constexpr, CAP: tl.constexpr):
    """Cut a buffer of ``count > TOPK`` entries in claim order to its top ``TOPK`` (packed at the
    front, any order) and reset the counter to ``TOPK``. Returns the row's new gate.

    Positions of one work item only grow, so a later key equal to the k-th loses to it: the gate
    is the k-th key plus one, or the floor of the boundary bucket when the radix stopped before
    reaching the position bits.
    """
    offs = tl.arange(0, CAP)
    valid = offs < count
    key = tl.load(buf_key + offs, mask=valid, other=0)
    pos = tl.load(buf_pos + offs, mask=valid, other=0)
    comp = (key.to(tl.int64) << 32) | (pos.to(tl.int64) ^ LOW32)
    # composites are distinct, so the boundary bucket is always taken whole
    tb, shift, _ = tile_threshold(comp ^ COMP_MIN, valid, TOPK, 64)
    t = tb ^ COMP_MIN
    take = valid & ((comp >> shift) >= (t >> shift))
    take_i = take.to(tl.int32)
    dst = tl.cumsum(take_i, axis=0) - take_i
    tl.debug_barrier()
    tl.store(buf_key + dst, key, mask=take)
    tl.store(buf_pos + dst, pos, mask=take)
    tl.atomic_xchg(cnt_ptr, TOPK, sem="relaxed")
    t_key = (t >> 32).to(tl.int32)
    floor_key = (((t >> shift) << shift) >> 32).to(tl.int32)
    new_gate = tl.where(shift >= 32, floor_key, t_key + 1)
    return tl.maximum(gate, new_gate)


@triton.jit
def order_by_position(buf_key, buf_pos, count, TOPK: tl.constexpr):
    """Rewrite the first ``count <= TOPK`` entries in position order (what the final write and
    the merge of split rows expect)."""
    offs = tl.arange(0, TOPK)
    valid = offs < count
    key = tl.load(buf_key + offs, mask=valid, other=0)
    pos = tl.load(buf_pos + offs, mask=valid, other=0)
    by_pos = (pos.to(tl.int64) << 32) | (key.to(tl.int64) & LOW32)
    by_pos = tl.sort(tl.where(valid, by_pos, INT64_MAX))
    tl.debug_barrier()
    tl.store(buf_key + offs, (by_pos & LOW32).to(tl.int32), mask=valid)
    tl.store(buf_pos + offs, (by_pos >> 32).to(tl.int32), mask=valid)
