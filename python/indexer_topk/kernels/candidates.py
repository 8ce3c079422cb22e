"""Candidate buffers of the fused kernel, cut by a 64-bit composite.

Each row of a program's group owns a buffer of ``CAP`` (key, position) entries in scratch. Key
pages may be visited in any order, so buffers are not in position order, and every comparison
uses the composite ``key << 32 | (position ^ 0xFFFFFFFF)``: higher score first, then the lower
position (the contract's order, with no ties between distinct positions).

A cut keeps a buffer's best ``TOPK`` entries and raises the gate to the ``TOPK``-th of them, as
an exact composite ``(key, position)``: a later entry enters only if it beats that one, which is
the test :func:`beats_gate` applies. The gate only rises, so nothing dropped could be needed.

A trim makes room faster than a cut: one histogram of an 8-bit digit placed just below the
highest bit in which the buffer's composites differ, instead of up to eight. It keeps every
entry of the boundary bucket, so it leaves a superset of the best ``TOPK`` (at least ``TOPK``
entries, all at or above the bucket's floor ``F``) and a gate just below ``F``: an entry below
``F`` is beaten by ``TOPK`` kept ones, so nothing dropped could be needed. A caller whose
entrants still do not fit after a trim (a boundary bucket holding most of the buffer) cuts.
"""

import triton
import triton.language as tl

from .common import COMP_MIN, INT32_MAX, INT64_MAX, KEY_MIN, LOW32, sort1d
from .select import radix_digit, tile_threshold



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
def _top_bit(x):
    """Index of the highest set bit of a nonzero int64 scalar (63 for a negative one)."""
    h = tl.zeros([], dtype=tl.int32)
    for i in tl.static_range(6):
        s = 32 >> i
        h = tl.where((x >> (h + s)) != 0, h + s, h)
    return h


@triton.jit
def gate_below(floor):
    """The gate ``(key, position)`` that exactly the composites at or above ``floor`` beat."""
    g = floor - 1
    low = g & LOW32
    # a low word under 2**31 is no position's: every entry with the gate's key beats it then
    gate_pos = tl.where(low < 2147483648, INT32_MAX, (low ^ LOW32).to(tl.int32))
    gate_key = (g >> 32).to(tl.int32)
    everything = floor == COMP_MIN  # floor - 1 would wrap
    return tl.where(everything, KEY_MIN, gate_key), tl.where(everything, INT32_MAX, gate_pos)


@triton.jit
def trim(buf_key, buf_pos, count, TOPK: tl.constexpr, TILE: tl.constexpr):
    """Shrink a buffer of ``TOPK < count <= TILE`` entries (any order) to a superset of its best
    ``TOPK`` with one histogram, packed at the front in any order. Returns ``(count, gate key,
    gate position)``: the entries kept (at least ``TOPK``) and the gate they all beat."""
    offs = tl.arange(0, TILE)
    valid = offs < count
    key = tl.load(buf_key + offs, mask=valid, other=0)
    pos = tl.load(buf_pos + offs, mask=valid, other=0)
    comp = composite(key, pos)
    lo = tl.min(tl.where(valid, comp, INT64_MAX), axis=0)
    hi = tl.max(tl.where(valid, comp, COMP_MIN), axis=0)
    # every composite in [lo, hi] shares the bits above the highest one where lo and hi differ,
    # so the 8 bits ending there order the buffer (biased: unsigned order is composite order)
    shift = tl.maximum(_top_bit(lo ^ hi) - 7, 0)
    digit = (((comp ^ COMP_MIN) >> shift) & 0xFF).to(tl.int32)
    hist = tl.histogram(tl.where(valid, digit, 256), 512)
    d_star, above, bucket = radix_digit(hist, TOPK)
    take = valid & (digit >= d_star)
    above_bits = tl.minimum(shift + 8, 63)
    prefix = tl.where(shift + 8 >= 64, 0, ((hi ^ COMP_MIN) >> above_bits) << above_bits)
    floor = (prefix | (d_star.to(tl.int64) << shift)) ^ COMP_MIN
    take_i = take.to(tl.int32)
    dst = tl.cumsum(take_i, axis=0) - take_i
    tl.debug_barrier()
    tl.store(buf_key + dst, key, mask=take)
    tl.store(buf_pos + dst, pos, mask=take)
    gate_key, gate_pos = gate_below(floor)
    return above + bucket, gate_key, gate_pos


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
