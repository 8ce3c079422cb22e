"""Top-k of a few long key-matrix rows, each row spread over many programs.

The legacy path's select stage for batches of few rows (a decode step: one row per request).
One program per row (:mod:`.row_topk`) would leave most SMs idle and read a 196,608-key row at
one SM's pace, so a row is split three ways, one launch each:

1. :func:`gate_rows_kernel`, a program per row: a gate that about ``2.5 * TOPK`` of the row's
   keys reach, the ``r``-th largest of ``SAMPLE`` keys spread evenly over the row
   (:func:`.row_topk.sampled_gate`); it also clears the row's candidate count.
2. :func:`gather_rows_kernel`, ``splits`` programs per row: each reads its run of the row and
   appends the keys that reach the gate (key and position) to the row's candidate buffer of
   ``CAP = 4 * TOPK`` entries, at an offset taken with one atomic add per block of keys. The
   count keeps counting past ``CAP`` (those entries are not stored), so an overflow is seen.
3. :func:`finish_rows_kernel`, a program per row: when the row's count lies in
   ``[TOPK, CAP]``, the buffer holds every key that reaches the gate and the row's best
   ``TOPK`` are among them (a key below the gate loses to ``TOPK`` that reach it); the k-th is
   searched in one register tile (:func:`.row_topk.tile_kth`). The buffer's order is the
   atomics' order, not position order, so keys equal to the k-th are ranked by position with a
   second search over their positions: the lowest positions win, as everywhere in the
   contract. A row the gate misjudged (fewer than ``TOPK`` or more than ``CAP`` reached it:
   ties, plateaus, a sample that missed the row's shape) and a row of at most ``TILE`` keys are
   selected by the one-program row select instead, which is exact whatever the data. Then the
   selection is sorted and written (:func:`.select.finalize_row`).

With about ``2.5 * TOPK`` entrants expected, a sample of 2,048 keys puts the count below
``TOPK`` or above ``4 * TOPK`` about once in a thousand rows of random scores (the sampled
quantile's spread: at 196,608 keys, the gate is the 27th of the sample, so the count's standard
deviation is about a fifth of its mean), so random and trending scores alike take the split
path; only data with many equal keys around the k-th pays the one-program select.
"""

import triton
import triton.language as tl

from .common import COMP_MIN, INT32_MAX, KEY_MIN, LOW32, NEG_INF_BITS, key_to_score_bits
from .row_topk import append, row_length, sampled_gate, select_row, span_kth
from .select import finalize_row, take_mask

GATE_HALVES = tl.constexpr(5)  # the sampled gate lets about GATE_HALVES / 2 * TOPK keys in
PROF_FIELDS = 5  # int64 counters per row of the finishing kernel's PROF build (see there)
_PROF_STRIDE = tl.constexpr(PROF_FIELDS)


@triton.jit
def _clock():
    """This SM's cycle counter (the ``PROF`` build's phase timers)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _stamp(prof_row, field: tl.constexpr, t0, first):
    """The ``PROF`` build's phase boundary: every thread done with the phase, then the cycles
    since ``t0`` stored as counter ``field`` of the row (by its ``first`` program only)."""
    tl.debug_barrier()
    if first:
        tl.store(prof_row + field, _clock() - t0)


@triton.jit(do_not_specialize=["stride_src", "row_start"])
def gate_rows_kernel(
    src, stride_src, seq_lens, row_start, gates, counts,
    TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr, SLACK: tl.constexpr = 0,
):
    """Program ``i``: row ``i``'s gate (rows longer than ``TILE`` only; ``SLACK``: see
    :func:`.row_topk.sampled_gate`) and a zero count."""
    tl.static_assert(SAMPLE <= TILE, "rows longer than the tile are sampled: SAMPLE must not exceed TILE")
    i = tl.program_id(0)
    n = row_length(seq_lens, row_start + i, stride_src)
    tl.store(counts + i, 0)
    if n > TILE:
        tl.store(gates + i, sampled_gate(src + i.to(tl.int64) * stride_src, n, TOPK, SAMPLE, GATE_HALVES, SLACK))


@triton.jit(do_not_specialize=["stride_src", "row_start", "splits"])
def gather_rows_kernel(
    src, stride_src, seq_lens, row_start, gates, counts, cand, splits,
    TOPK: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program ``(i, s)``: the keys of run ``s`` of ``splits`` of row ``i`` that reach the row's
    gate, appended to its candidate buffer (``cand``: ``8 * TOPK`` int32 a row, keys then
    positions)."""
    CAP: tl.constexpr = 4 * TOPK
    i = tl.program_id(0)
    n = row_length(seq_lens, row_start + i, stride_src)
    if n > TILE:
        gate = tl.load(gates + i)
        run = tl.cdiv(tl.cdiv(n, splits), BLOCK) * BLOCK
        lo = tl.program_id(1) * run
        hi = tl.minimum(lo + run, n)
        row = src + i.to(tl.int64) * stride_src
        ck = cand + i.to(tl.int64) * (2 * CAP)
        offs = tl.arange(0, BLOCK)
        for c0 in range(lo, hi, BLOCK):
            pos = c0 + offs
            key = tl.load(row + pos, mask=pos < hi, other=KEY_MIN, eviction_policy="evict_first")
            enter = (pos < hi) & (key >= gate)
            enter_i = enter.to(tl.int32)
            n_in = tl.sum(enter_i, axis=0)
            if n_in > 0:
                dst = tl.atomic_add(counts + i, n_in) + tl.cumsum(enter_i, axis=0) - enter_i
                room = enter & (dst < CAP)
                tl.store(ck + dst, key, mask=room)
                tl.store(ck + CAP + dst, pos, mask=room)


@triton.jit
def _select_candidates(ck, count, out_key, out_pos, TOPK: tl.constexpr, prof_row, t0, first, PROF: tl.constexpr):
    """Write the best ``TOPK`` of the ``TOPK <= count <= CAP`` candidates at ``ck`` (any order) to
    ``out``: every key above the k-th, then the keys equal to it at the lowest positions. (``PROF``:
    counters 0 and 1 of the row, see :func:`finish_rows_kernel`.)"""
    CAP: tl.constexpr = 4 * TOPK
    offs = tl.arange(0, CAP)
    valid = offs < count
    key = tl.load(ck + offs, mask=valid, other=0)
    pos = tl.load(ck + CAP + offs, mask=valid, other=0)
    if PROF:
        _stamp(prof_row, 0, t0, first)
    take = valid
    if count > TOPK:
        t, shift, need = span_kth(key, valid, TOPK)
        above = valid & ((key >> shift) > (t >> shift))
        eq = valid & ((key >> shift) == (t >> shift))
        # the bucket is taken whole unless keys equal to the k-th are more than it needs: then
        # the lowest positions among them, a search over INT32_MAX - position (distinct keys)
        if tl.sum(eq.to(tl.int32), axis=0) > need:
            lowest = INT32_MAX - pos
            t2, shift2, need2 = span_kth(lowest, eq, need)
            eq, _eq = take_mask(lowest, eq, t2, shift2, need2, 0)
        take = above | eq
    if PROF:
        _stamp(prof_row, 1, t0, first)
    append(out_key, out_pos, 0, key, pos, take)


@triton.jit
def _order(key, pos, SORTED):
    """int64 images of ``(key, position)`` entries whose descending order is the output's: the
    contract's composite ``key << 32 | ~position`` for a sorted row, else ascending position."""
    comp = (key.to(tl.int64) << 32) | (pos.to(tl.int64) ^ LOW32)
    return tl.where(SORTED, comp, -pos.to(tl.int64))


@triton.jit
def _rank_write(sel_key, sel_pos, count, n, part, pt_row, out_bits_row, out_raw_row, out_phys_row, out_cnt_ptr,
                TOPK: tl.constexpr, PARTS: tl.constexpr):
    """Part ``part`` of ``PARTS`` of a row's output, from its ``count`` selected entries at
    ``sel`` (any order): entries ``part * C ..`` (``C = TOPK / PARTS``) are written at their ranks,
    counted against every selected entry (the orders are distinct), and the empty slots
    ``part * C ..`` at or past ``count`` get ``-inf`` / ``-1``. The parts write disjoint slots."""
    C: tl.constexpr = TOPK // PARTS
    J: tl.constexpr = min(TOPK, 8192 // C)  # entries compared against a step: [C, J] a step
    mine = part * C + tl.arange(0, C)
    mv = mine < count
    key = tl.load(sel_key + mine, mask=mv, other=0)
    pos = tl.load(sel_pos + mine, mask=mv, other=0)
    is_sorted = n > TOPK
    comp = _order(key, pos, is_sorted)
    rank = tl.zeros([C], dtype=tl.int32)
    for j0 in range(0, count, J):
        jj = j0 + tl.arange(0, J)
        jv = jj < count
        cj = tl.where(jv, _order(tl.load(sel_key + jj, mask=jv, other=0), tl.load(sel_pos + jj, mask=jv, other=0),
                                 is_sorted), COMP_MIN)
        rank += tl.sum((cj[None, :] > comp[:, None]).to(tl.int32), axis=1)
    page = tl.load(pt_row + (pos >> 6), mask=mv, other=0)
    tl.store(out_bits_row + rank, key_to_score_bits(key), mask=mv)
    tl.store(out_raw_row + rank, pos, mask=mv)
    tl.store(out_phys_row + rank, page * 64 + (pos & 63), mask=mv)
    empty = mine >= count
    tl.store(out_bits_row + mine, tl.full([C], NEG_INF_BITS, tl.int32), mask=empty)
    tl.store(out_raw_row + mine, tl.full([C], -1, tl.int32), mask=empty)
    tl.store(out_phys_row + mine, tl.full([C], -1, tl.int32), mask=empty)
    if part == 0:
        tl.store(out_cnt_ptr, count)


@triton.jit(do_not_specialize=["stride_src", "stride_pt", "row_start"])
def finish_rows_kernel(
    src, stride_src, seq_lens, page_table, stride_pt, out_bits, out_raw, out_phys, out_cnt, row_start,
    counts, cand, sel, prof, TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr, PARTS: tl.constexpr = 1,
    PROF: tl.constexpr = False,
):
    """Program ``(i, p)``: row ``i``'s top ``TOPK`` (the contract's row ``row_start + i``), from
    its candidates or, where the gate misjudged the row or the row fits a tile, by the
    one-program row select (:func:`.row_topk.select_row`); then ordered and written to the four
    outputs.

    With ``PARTS == 1`` the program sorts its row's selection (:func:`.select.finalize_row`; the
    row select's pool in the row's candidate buffer). With ``PARTS > 1`` the row's ``PARTS``
    programs each make the same selection in an area of ``sel`` of their own (``6 * TOPK`` int32 a
    program: the selection, then the row select's pool), then write their part of it at its
    ranks (:func:`_rank_write`): the sort's network, one program's long chain of steps, becomes
    ``TOPK / PARTS`` rank counts a program, side by side.

    ``PROF`` (a GPU build for measurements; ``prof``: ``PROF_FIELDS`` int64 per row, written by
    the row's first program, unread otherwise) stores the row's SM cycles from the kernel's start
    to: the candidates loaded, the k-th found (ties ranked), the selection appended, the row
    ordered and written; and 1 where the row was selected from its candidates (0: the
    one-program select, whose cycles fall in the third phase when ``PARTS > 1``, else the last)."""
    # a row of at most TOPK keys keeps position order unsorted (finalize_row), which the
    # buffer's atomic order would not give: such rows must be one tile
    tl.static_assert(TILE >= TOPK, "rows of at most TOPK keys must fit the tile")
    tl.static_assert(TOPK % PARTS == 0, "a row's parts split its TOPK slots evenly")
    CAP: tl.constexpr = 4 * TOPK
    i = tl.program_id(0)
    part = tl.program_id(1)
    row = row_start + i
    n = row_length(seq_lens, row, stride_src)
    orow = row.to(tl.int64) * TOPK
    ck = cand + i.to(tl.int64) * (2 * CAP)
    count = tl.load(counts + i)
    prof_row = prof + i.to(tl.int64) * _PROF_STRIDE
    t0 = tl.zeros([], dtype=tl.int64)
    from_candidates = (n > TILE) & (count >= TOPK) & (count <= CAP)
    first = part == 0  # the program that stores the row's PROF counters
    if PROF:
        tl.debug_barrier()
        t0 = _clock()
        if part == 0:
            tl.store(prof_row + 4, from_candidates.to(tl.int64))
    if PARTS == 1:
        sel_key = out_bits + orow
        sel_pos = out_raw + orow
        pool_key = ck
    else:
        sel_key = sel + (i * PARTS + part).to(tl.int64) * (6 * TOPK)
        sel_pos = sel_key + TOPK
        pool_key = sel_key + 2 * TOPK
    if from_candidates:
        _select_candidates(ck, count, sel_key, sel_pos, TOPK, prof_row, t0, first, PROF)
    else:
        select_row(src + i.to(tl.int64) * stride_src, n, sel_key, sel_pos, pool_key, pool_key + 2 * TOPK,
                   TOPK, TILE, SAMPLE)
    tl.debug_barrier()
    if PROF:
        _stamp(prof_row, 2, t0, first)
    pt_row = page_table + row.to(tl.int64) * stride_pt
    if PARTS == 1:
        finalize_row(sel_key, sel_pos, tl.minimum(n, TOPK), n, pt_row,
                     out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row, TOPK)
    else:
        _rank_write(sel_key, sel_pos, tl.minimum(n, TOPK), n, part, pt_row,
                    out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row, TOPK, PARTS)
    if PROF:
        _stamp(prof_row, 3, t0, first)
