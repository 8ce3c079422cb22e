"""Candidate buffers of the fused kernel: slots claimed atomically, cut by a 64-bit composite.

Each row of a program's group owns a buffer of ``CAP`` (key, position) entries and a counter in
scratch. A score that beats the row's gate claims the next slot with a relaxed atomic increment
and stores its entry there: no prefix sum, no barrier, so the scoring loop stays one pipelined
loop. Buffers are therefore in claim order, and key blocks may be visited in any order, because
every comparison uses the composite ``key << 32 | (position ^ 0xFFFFFFFF)``: higher score first,
then the lower position (the contract's order, with no ties between distinct positions).

A cut keeps a buffer's best ``TOPK`` entries and raises the gate to the ``TOPK``-th of them, as
an exact composite ``(key, position)``: a later entry enters only if it beats that one, which is
the test :func:`beats_gate` applies. The gate only rises, so nothing dropped could be needed.
"""

import triton
import triton.language as tl

from .common import COMP_MIN, KEY_MIN, LOW32
from .select import tile_threshold

INT64_MAX = tl.constexpr(2**63 - 1)
INT32_MAX = tl.constexpr(2**31 - 1)


@triton.jit
def composite(key, pos):
    """int64 whose order is the contract's: key, then the lower position."""
    return (key.to(tl.int64) << 32) | (pos.to(tl.int64) ^ LOW32)


@triton.jit
def no_gate(R: tl.constexpr):
    """Gates that every entry beats: ``(key [R], position [R])``."""
    return tl.full([R], KEY_MIN, tl.int32), tl.full([R], INT32_MAX, tl.int32)


@triton.jit
def beats_gate(key, pos, gate_key, gate_pos):
    """Whether ``(key, pos)`` comes before the gate ``(gate_key, gate_pos)`` in the contract's order."""
    return (key > gate_key) | ((key == gate_key) & (pos < gate_pos))


@triton.jit
def claim(counters, key_base, pos_base, entrants, b, R: tl.constexpr, CAP: tl.constexpr, PAGE: tl.constexpr):
    """Store the entrants of one page at slots claimed from their rows' counters.

    ``entrants`` ``[PAGE, R]``: the key of each position ``b + i`` of row ``r`` that enters,
    ``KEY_MIN`` elsewhere (no score has that key). Row ``r``'s counter is ``counters + r`` and its
    buffer starts at ``key_base / pos_base + r * CAP``. Only ``entrants`` crosses into the layout
    of the memory operations; positions and addresses are built there.
    """
    flat = tl.reshape(entrants, [PAGE * R])  # one layout for the atomic and both stores
    idx = tl.arange(0, PAGE * R)
    take = flat != KEY_MIN
    r = idx % R
    pos = b + idx // R
    slot = tl.atomic_add(counters + r, idx * 0 + 1, mask=take, sem="relaxed")
    tl.store(key_base + r * CAP + slot, flat, mask=take)
    tl.store(pos_base + r * CAP + slot, pos, mask=take)


@triton.jit
def read_count(cnt_ptr):
    """A row's count where the atomics are performed (callers barrier first)."""
    return tl.atomic_add(cnt_ptr, 0, sem="relaxed")


@triton.jit
def cut(buf_key, buf_pos, cnt_ptr, count, TOPK: tl.constexpr, TILE: tl.constexpr):
    """Cut a buffer of ``TOPK < count <= TILE`` entries (any order) to its best ``TOPK``, packed at
    the front in any order, and set its counter to ``TOPK``. Returns the new gate
    ``(key, position)``: the ``TOPK``-th best entry."""
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
    tl.atomic_xchg(cnt_ptr, TOPK, sem="relaxed")
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
    by_pos = tl.sort(tl.where(valid, by_pos, INT64_MAX))
    tl.debug_barrier()
    tl.store(buf_key + offs, (by_pos & LOW32).to(tl.int32), mask=valid)
    tl.store(buf_pos + offs, (by_pos >> 32).to(tl.int32), mask=valid)
