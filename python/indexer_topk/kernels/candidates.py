"""Candidate buffers of the fused kernel, cut by a 64-bit composite.

Each row of a program's group owns a buffer of ``CAP`` (key, position) entries in scratch. Key
pages may be visited in any order, so buffers are not in position order, and every comparison
uses the composite ``key << 32 | (position ^ 0xFFFFFFFF)``: higher score first, then the lower
position (the contract's order, with no ties between distinct positions).

A cut keeps a buffer's best ``TOPK`` entries and raises the gate to the ``TOPK``-th of them, as
an exact composite ``(key, position)``: a later entry enters only if it beats that one, which is
the test :func:`beats_gate` applies. The gate only rises, so nothing dropped could be needed.
"""

import triton
import triton.language as tl

from .common import COMP_MIN, INT64_MAX, LOW32, sort1d
from .select import tile_threshold



@triton.jit
def composite(key, pos):
    """int64 whose order is the contract's: key, then the lower position."""
    return (key.to(tl.int64) << 32) | (pos.to(tl.int64) ^ LOW32)


@triton.jit
def beats_gate(key, pos, gate_key, gate_pos):
    """Whether ``(key, pos)`` comes before the gate ``(gate_key, gate_pos)`` in the contract's order."""
    return (key > gate_key) | ((key == gate_key) & (pos < gate_pos))


@triton.jit
def cut(buf_key, buf_pos, count, TOPK: tl.constexpr, TILE: tl.constexpr):
    """Cut a buffer of ``TOPK < count <= TILE`` entries (any order) to its best ``TOPK``, packed at
    the front in any order. Returns the new gate ``(key, position)``: the ``TOPK``-th best entry."""
    offs = tl.arange(0, TILE)
    valid = offs < count
    key = tl.load(buf_key + offs, mask=valid, other=0)
    pos = tl.load(buf_pos + offs, mask=valid, other=0)
    comp = composite(key, pos)
    # composites are distinct, so exactly TOPK reach the threshold's prefix
    tb, shift, _ = tile_threshold(comp ^ COMP_MIN, valid, TOPK, 64)
    t = tb ^ COMP_MIN
    take = valid & ((comp >> shift) >= (t >> shift))
    gate = tl.min(tl.where(take, comp, INT64_MAX), axis=0)
    take_i = take.to(tl.int32)
    dst = tl.cumsum(take_i, axis=0) - take_i
    tl.debug_barrier()
    tl.store(buf_key + dst, key, mask=take)
    tl.store(buf_pos + dst, pos, mask=take)
    return (gate >> 32).to(tl.int32), ((gate & LOW32) ^ LOW32).to(tl.int32)


@triton.jit
def order_by_position(buf_key, buf_pos, count, TOPK: tl.constexpr):
    """Rewrite the first ``count <= TOPK`` entries in position order (what the final write of a
    short row and the merge of split rows expect)."""
    offs = tl.arange(0, TOPK)
    valid = offs < count
    key = tl.load(buf_key + offs, mask=valid, other=0)
    pos = tl.load(buf_pos + offs, mask=valid, other=0)
    by_pos = (pos.to(tl.int64) << 32) | (key.to(tl.int64) & LOW32)
    by_pos = sort1d(tl.where(valid, by_pos, INT64_MAX), False)
    tl.debug_barrier()
    tl.store(buf_key + offs, (by_pos & LOW32).to(tl.int32), mask=valid)
    tl.store(buf_pos + offs, (by_pos >> 32).to(tl.int32), mask=valid)
