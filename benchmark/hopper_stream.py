#!/usr/bin/env python3
"""An experiment: a warp-specialised Gluon fused stream for Hopper (exact; beats legacy at long contexts only).

    PYTHONPATH=python python3 benchmark/hopper_probe.py   # exactness sweep and timings on an H200

Measured (``results/hopper/``, NOTES.md): bitwise equal to legacy on every case; at 1024 rows x
768K, 5.46 ms against legacy's 7.47 and SGLang's DeepGEMM logits + top-k 4.36 in one device session
(its loads and MMAs alone: 4.75 ms). With three score warpgroups (``score_groups=3``) the loads and
MMAs alone take 3.77 ms (876 TFLOP/s) and the whole kernel 5.26: the selection is the limit.
Slower than legacy at 64K (0.98 vs 0.84 ms), so it stays here, not in the package.

The plain-Triton fused kernel (:mod:`indexer_topk.kernels.fused`) takes turns: a program scores a strip of pages,
then stops its MMAs to select. Here each program is split into partitions that run at once and
talk through shared-memory rings guarded by mbarriers:

* **load** (1 warp): per visit, the page id from the page table, then one bulk copy of the
  page's 64 e4m3 keys and one of its 64 fp32 key scales into a ``KSTAGES``-deep ring; per work
  item, one bulk copy of the group's queries;
* **score** (``NSCORE`` warpgroups, two or three, visit ``g`` on warpgroup ``g mod NSCORE``): the
  MMA ``[64 keys] x [R * 64 heads]`` and the head reduction of the shared tile
  (:func:`tile_scores`, the same operations, layouts and hence bits as
  :func:`indexer_topk.kernels.score.page_scores`), into a ring of ``SLOTS`` ``[64, R]`` tiles of
  order keys;
* **select** (the default warpgroup): takes ``G`` visits' score tiles per step (dealt to its four
  warps), appends the scores that beat their
  row's gate to the row's candidate buffer (global scratch, as in :mod:`indexer_topk.kernels.fused`), cuts a buffer
  that would overflow to its best ``TOPK`` (raising the gate), and at the end of an item cuts
  each row to ``TOPK`` and writes it, unordered, to the row's output slot (one split) or split
  list. :func:`finish_rows_kernel` then orders and writes the outputs.

Work items (a group of ``R`` rows and one context split) are dealt round-robin to a persistent
grid; the key stages are a multiple of ``NSCORE``, so that each stage always returns to the same
warpgroup (a stage shared by two lets the later one pass its parity wait on the earlier visit's
phase); every partition walks the same items and visits, so ring slots and barrier phases follow
from a running visit count; the score ring has one barrier pair per selection step. Every release
of a ring slot is a fence by each thread, a partition barrier, then one thread's arrive
(:func:`_release`), and a key stage read through the generic proxy is fenced for the async one
before the loader's next copy may overwrite it: without these fences, runs of one input gave
different outputs. Pages are visited in the golden-ratio order of :mod:`indexer_topk.kernels.fused`.
A group whose rows do not share their pages (``group_pass[g] == R``) is scored once per row,
each pass with that row's pages, keeping only that row's column: the same bits.

A ``PROF`` compile times each partition's waits and regions with the SM's cycle counter
(:func:`profile_table`, ``hopper_probe.py --profile``).

Only the ``sglang_fp8`` layout and ``R = 2`` (one N = 128 MMA on four warps, the legacy tile's
configuration) are built here; it needs Gluon and an sm_90 GPU.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from indexer_topk.contract import HEAD_DIM, HEADS, PAGE_SIZE, Layout
from indexer_topk.kernels.common import COMP_MIN, INT32_MAX, INT64_MAX, KEY_MIN, KEY_NAN, LOW32
from indexer_topk.kernels.fused import _finish_row, visit_step
from indexer_topk.kernels.geometry import GEOMETRY, NHEADS, PAGE
from indexer_topk.kernels.score import group_rows, pages_agree

# The score tile: keys on M (4 warps x 16), R * 64 query heads on N, k32 e4m3 steps.
SCORE_WARPS = gl.constexpr(4)
# Registers per thread of the loader; the score warpgroups take ``SCORE_REGS`` (a kernel argument,
# 168 by default) and the selection the rest of the 128 x 16 warps.
SCORE_REGS_LOAD = gl.constexpr(40)


# the visit order of the plain-Triton kernel, the same function compiled as Gluon
_visit_step = gluon.jit(visit_step.fn)


@gluon.jit
def _item(item, splits, split_span, seq_lens, n_rows, width, R: gl.constexpr):
    """Scalars of a work item: ``(r0, split, lo, n, step, lead)`` with ``n`` pages to visit from
    position ``lo`` and ``lead`` a row holding the group's longest length (see
    :func:`indexer_topk.kernels.score.group_rows`)."""
    group = item // splits
    split = item - group * splits
    r0 = group * R
    lo = split * split_span
    longest = gl.load(seq_lens + r0)
    lead = r0
    for r in gl.static_range(1, R):
        ln = gl.load(seq_lens + r0 + r, mask=r0 + r < n_rows, other=0)
        lead = gl.where(ln > longest, r0 + r, lead)
        longest = gl.maximum(ln, longest)
    hi = gl.minimum(gl.minimum(lo + split_span, width), longest)
    n = gl.maximum((hi - lo + PAGE - 1) // PAGE, 0)
    return r0, split, lo, n, _visit_step(n), lead


@gluon.jit
def tile_scores(acc, w, kscale_smem, weight_scale, R: gl.constexpr):
    """``[64, R]`` scores from the MMA accumulator ``[64, R * 64]`` and the page's key scales
    (``[64]`` fp32 in shared memory); see :func:`indexer_topk.kernels.score.page_scores`: the
    same operations on the same layouts, hence the same bits."""
    acc = gl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)
    s = gl.sum(gl.reshape(acc * gl.expand_dims(w, 0), [PAGE, R, NHEADS]), axis=2) + 0.0
    s = s * gl.expand_dims(kscale_smem.load(gl.SliceLayout(1, s.type.layout)), 1)
    return s * weight_scale


@gluon.jit
def _fence_cta():
    """This thread's memory accesses so far are performed, for the CTA, before its later ones."""
    gl.inline_asm_elementwise("fence.acq_rel.cta;\nmov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _release(bar):
    """Arrive on ``bar`` for the whole partition: one thread arrives, so every warp must be done
    with the shared memory the barrier guards first (each thread fences its own accesses, then
    the partition meets)."""
    _fence_cta()
    gl.thread_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _clock():
    """This SM's cycle counter (the ``PROF`` build's partition timers)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _ordered_key(s):
    bits = s.to(gl.int32, bitcast=True)
    key = gl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return gl.where(s != s, KEY_NAN, key)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _threshold(b, valid, k, HL: gl.constexpr):
    """k-th largest of the valid biased composites ``b`` (int64, sign bit flipped), by 8-bit
    radix steps from the top until the boundary bucket is taken whole (as
    :func:`indexer_topk.kernels.select.tile_threshold`). Returns ``(tb, shift)``."""
    bins = gl.arange(0, 512, layout=HL)
    tb = (k * 0).to(gl.int64)
    need = k
    shift = k * 0
    done = k * 0
    for p in range(8):  # a loop, not unrolled: the cut is rare and its code large
        sh = 56 - 8 * p
        if done == 0:
            m = valid & ((sh == 56) | ((b >> (sh + 8)) == (tb >> (sh + 8))))
            hist = gl.histogram(gl.where(m, ((b >> sh) & 0xFF).to(gl.int32), 256), 512, layout=HL)
            hist = gl.where(bins < 256, hist, 0)
            ge = gl.sum(hist, axis=0) - gl.associative_scan(hist, 0, _add) + hist
            digit = gl.max(gl.where((ge >= need) & (bins < 256), bins, -1), axis=0)
            above = gl.sum(gl.where(bins > digit, hist, 0), axis=0)
            bucket = gl.sum(gl.where(bins == digit, hist, 0), axis=0)
            need = need - above
            tb = tb | (digit.to(gl.int64) << sh)
            shift = sh
            if bucket == need:
                done = 1
    return tb, shift


@gluon.jit
def _threshold_from_top(b, comp, valid, k, count, HL: gl.constexpr, BITS: gl.constexpr):
    """:func:`_threshold` by ``BITS``-bit digits (8 or 4) in ``2 ** BITS`` bins, starting at the
    highest digit in which two valid composites differ (the digits above it are every entry's).
    A pass counts the entries outside the boundary prefix in bin 0 and takes them out of it again:
    their count is the last pass's boundary bucket (the valid entries before the first), so it
    costs no reduction. The same entries are taken as by :func:`_threshold`: a pass whose bucket
    already holds every needed entry ends both, and a finer one would keep the whole bucket."""
    NB: gl.constexpr = 1 << BITS
    TOP: gl.constexpr = 64 - BITS
    bins = gl.arange(0, NB, layout=HL)
    hi = gl.max(gl.where(valid, comp, COMP_MIN), axis=0)
    lo = gl.min(gl.where(valid, comp, INT64_MAX), axis=0)
    diff = hi ^ lo
    top = count * 0  # bit offset of the highest differing digit
    for d in gl.static_range(1, 64 // BITS):
        if (diff >> (BITS * d)) != 0:
            top = top * 0 + BITS * d
    above_top = gl.minimum(top + BITS, 63)  # shifts of 64 are clamped; the value is unused at TOP
    tb = gl.where(top == TOP, 0, ((hi ^ COMP_MIN) >> above_top) << above_top)
    need = k
    shift = top
    done = k * 0
    n_match = count
    for p in range(64 // BITS):  # a loop, not unrolled: the cut is rare and its code large
        sh = TOP - BITS * p
        if (done == 0) & (sh <= top):
            m = valid & ((sh == TOP) | ((b >> (sh + BITS)) == (tb >> (sh + BITS))))
            hist = gl.histogram(gl.where(m, ((b >> sh) & (NB - 1)).to(gl.int32), 0), NB, layout=HL)
            ge = gl.sum(hist, axis=0) - gl.associative_scan(hist, 0, _add) + hist
            # bin 0's extra entries only raise ge[0], which already holds at least `need`
            digit = gl.max(gl.where(ge >= need, bins, -1), axis=0)
            above = gl.sum(gl.where(bins > digit, hist, 0), axis=0)
            bucket = gl.sum(gl.where(bins == digit, hist, 0), axis=0)
            bucket = gl.where(digit == 0, bucket - (b.shape[0] - n_match), bucket)
            need = need - above
            tb = tb | (digit.to(gl.int64) << sh)
            shift = sh
            n_match = bucket
            if bucket == need:
                done = 1
    return tb, shift


@gluon.jit
def _cut(buf_key, buf_pos, count, TOPK: gl.constexpr, TILE: gl.constexpr, L1: gl.constexpr, HL: gl.constexpr,
         CUT: gl.constexpr = 0):
    """Cut a buffer of ``TOPK < count <= TILE`` entries to its best ``TOPK`` at the front (as
    :func:`indexer_topk.kernels.candidates.cut`); returns the new gate ``(key, position)``."""
    offs = gl.arange(0, TILE, layout=L1)
    valid = offs < count
    key = gl.load(buf_key + offs, mask=valid, other=0)
    pos = gl.load(buf_pos + offs, mask=valid, other=0)
    comp = (key.to(gl.int64) << 32) | (pos.to(gl.int64) ^ LOW32)
    if CUT == 0:
        tb, shift = _threshold(comp ^ COMP_MIN, valid, TOPK + count * 0, HL)
    else:
        tb, shift = _threshold_from_top(comp ^ COMP_MIN, comp, valid, TOPK + count * 0, count, HL, 8 // CUT)
    t = tb ^ COMP_MIN
    take = valid & ((comp >> shift) >= (t >> shift))
    gate = gl.min(gl.where(take, comp, INT64_MAX), axis=0)
    take_i = take.to(gl.int32)
    dst = gl.associative_scan(take_i, 0, _add) - take_i
    gl.thread_barrier()
    gl.store(buf_key + dst, key, mask=take)
    gl.store(buf_pos + dst, pos, mask=take)
    gl.thread_barrier()
    return (gate >> 32).to(gl.int32), ((gate & LOW32) ^ LOW32).to(gl.int32)


@triton.constexpr_function
def _vector_layout(n, num_warps):
    return gl.BlockedLayout([max(1, n // (32 * num_warps))], [32], [num_warps], [0])


@gluon.jit
def _pick(vec, r, zero):
    return gl.sum(gl.where(gl.arange(0, vec.shape[0], layout=vec.type.layout) == r, vec, zero), axis=0)


@gluon.jit
def _step_barrier(g, SLOTS: gl.constexpr, G: gl.constexpr, STEP_BARRIERS: gl.constexpr):
    """``(barrier index, phase)`` of visit ``g``'s score slot: one barrier pair per selection step
    (``STEP_BARRIERS``: the step's ``G`` producers arrive on it, the selection waits once) or per
    slot."""
    if STEP_BARRIERS:
        q = g // G
        b = q % (SLOTS // G)
        ph = (q // (SLOTS // G)) & 1
    else:
        b = g % SLOTS
        ph = (g // SLOTS) & 1
    return b, ph


@gluon.jit
def _take_step(sready, it, SLOTS: gl.constexpr, G: gl.constexpr, STEP_BARRIERS: gl.constexpr):
    """Wait until the ``G`` score tiles of the step starting at visit ``it`` are written."""
    if STEP_BARRIERS:
        b, ph = _step_barrier(it, SLOTS, G, STEP_BARRIERS)
        mbarrier.wait(sready.index(b), ph)
    else:
        for u in gl.static_range(G):
            b, ph = _step_barrier(it + u, SLOTS, G, STEP_BARRIERS)
            mbarrier.wait(sready.index(b), ph)


@gluon.jit
def _free_step(sfree, it, SLOTS: gl.constexpr, G: gl.constexpr, STEP_BARRIERS: gl.constexpr):
    """Give the step's slots back to the score warpgroups once every warp's reads of them are
    performed (as :func:`_release`, one arrive per slot or per step)."""
    _fence_cta()
    gl.thread_barrier()
    if STEP_BARRIERS:
        b, ph = _step_barrier(it, SLOTS, G, STEP_BARRIERS)
        mbarrier.arrive(sfree.index(b), count=1)
    else:
        for u in gl.static_range(G):
            b, ph = _step_barrier(it + u, SLOTS, G, STEP_BARRIERS)
            mbarrier.arrive(sfree.index(b), count=1)


@gluon.jit
def _prof_store(prof, part, a, b, c, d, e):
    """The ``PROF`` build's five counters of partition ``part`` of this program."""
    base = prof + (gl.program_id(0) * 5 + part).to(gl.int64) * 8
    gl.store(base + 0, a)
    gl.store(base + 1, b)
    gl.store(base + 2, c)
    gl.store(base + 3, d)
    gl.store(base + 4, e)


@gluon.jit
def _part_counts(n_part, count, PRL: gl.constexpr, HRL: gl.constexpr, RL: gl.constexpr):
    """``(n_take [R], first [PARTS, R])`` from the parts' entrant counts: each row's total, and
    where each part's entries start in the row's buffer (``count`` plus the parts before it). One
    exchange across warps (every thread gets every part's count), then sums in registers."""
    parts = gl.convert_layout(n_part, PRL)
    excl = gl.associative_scan(parts, 0, _add) - parts
    first = gl.convert_layout(excl, HRL) + gl.expand_dims(count, 0)
    return gl.convert_layout(gl.sum(parts, axis=0), RL), first


@gluon.jit
def _step_entries(v, off, n, lo, lane, ends, active, i, visit):
    """Positions of a step's keys (visit ``u`` of the step scores page ``(v + off_u) mod n``) and
    which of them lie in their row's range: ``(pos, mask)``."""
    vu = v + off
    pos = lo + gl.where(vu >= n, vu - n, vu) * PAGE + lane
    return pos, (pos < ends) & active & (i + visit < n)


@gluon.jit
def _row_vec(t):
    """``[1, 1, R]`` of an ``[R]`` vector laid out as a row of the selection tile."""
    return gl.expand_dims(gl.expand_dims(t, 0), 1)


@gluon.jit
def _select_partition(
    ring, sready, sfree, seq_lens, n_rows, width, group_pass, buf_key_all, buf_pos_all,
    seg_key, seg_pos, seg_cnt, n_items, split_span, splits,
    R: gl.constexpr, TOPK: gl.constexpr, CAP: gl.constexpr, TILE: gl.constexpr, SLOTS: gl.constexpr,
    G: gl.constexpr, PARTS: gl.constexpr, NO_SELECT: gl.constexpr, STEP_BARRIERS: gl.constexpr,
    prof, PROF: gl.constexpr, CUT: gl.constexpr, XCHG: gl.constexpr, RELOAD: gl.constexpr, SKIP: gl.constexpr,
):
    """The selection of every row of each group."""
    NW: gl.constexpr = 4
    GP: gl.constexpr = G // PARTS
    # A step takes G visits' keys as a [PARTS, GP * 64, R] tile: part h holds visits h * GP ..,
    # one warp per (part, row) where the warps allow, so a row's prefix sums stay inside a warp
    # (a scan across warps lost exactness in this kernel, not bisected); the parts' counts meet in
    # one reduction. PARTS 1 repeats each row's work on two warps.
    SL: gl.constexpr = gl.BlockedLayout([1, 2 * GP, 1], [1, 32, 1], [PARTS, 1, NW // PARTS], [1, 2, 0])
    HRL: gl.constexpr = gl.SliceLayout(1, SL)  # [PARTS, R]
    RL: gl.constexpr = gl.SliceLayout(0, HRL)  # [R]
    PRL: gl.constexpr = gl.BlockedLayout([PARTS, R], [32, 1], [NW, 1], [1, 0])  # [PARTS, R] in every thread
    L1: gl.constexpr = _vector_layout(TILE, NW)
    TL: gl.constexpr = _vector_layout(TOPK, NW)
    HL: gl.constexpr = _vector_layout(512 if CUT == 0 else 1 << (8 // CUT), NW)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    key_base = buf_key_all + pid.to(gl.int64) * (R * CAP)
    pos_base = buf_pos_all + pid.to(gl.int64) * (R * CAP)
    rr = gl.arange(0, R, layout=RL)
    hh = gl.expand_dims(gl.arange(0, PARTS, layout=gl.SliceLayout(1, HRL)), 1)  # [PARTS, 1]
    e = gl.expand_dims(gl.expand_dims(gl.arange(0, GP * PAGE, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL))), 0), 2)
    lane = e % PAGE
    visit = gl.expand_dims(hh, 1) * GP + e // PAGE  # [PARTS, GP * 64, 1]: which of the G visits
    row_off = _row_vec(rr) * CAP
    # the ring's slots of one selection step are consecutive: G visits' tiles as one [PARTS, GP * 64, R]
    steps = ring._reinterpret(
        gl.int32, [SLOTS // G, PARTS, GP * PAGE, R], gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    )
    it = 0
    if PROF:  # cycles: all, waiting for score tiles, in step cuts, in the item's final cuts; cuts
        t_all = _clock()
        t_take = t_all * 0
        t_cut = t_all * 0
        t_end = t_all * 0
        n_cut = t_all * 0
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        n_pad = (n + G - 1) // G * G
        lens = gl.load(seq_lens + r0 + rr, mask=r0 + rr < n_rows, other=0)
        hi = gl.minimum(gl.minimum(lo + split_span, width), gl.max(lens, axis=0))
        ends = _row_vec(gl.maximum(gl.minimum(lens, hi), lo))
        npass = gl.load(group_pass + r0 // R)
        if NO_SELECT:  # a timing probe: the selection's work taken out, outputs undefined
            for i in range(0, n_pad * npass, G):
                _take_step(sready, it, SLOTS, G, STEP_BARRIERS)
                _free_step(sfree, it, SLOTS, G, STEP_BARRIERS)
                it += G
            npass = 0
        for p in range(npass):
            active = _row_vec((rr == p) | (npass == 1))
            count = gl.zeros([R], gl.int32, layout=RL)
            gate_key = gl.full([R], KEY_MIN, gl.int32, layout=RL)
            gate_pos = gl.full([R], INT32_MAX, gl.int32, layout=RL)
            # visit i + u scores page (v + u * step) mod n: this thread's visit u is fixed, so its offset
            # from the step's first page is reduced once per item, not walked u times per step
            n1 = gl.maximum(n, 1)
            off = (visit * step) % n1
            advance = (G * step) % n1
            v = 0
            for i in range(0, n_pad, G):
                if PROF:
                    c0 = _clock()
                _take_step(sready, it, SLOTS, G, STEP_BARRIERS)
                if PROF:
                    t_take += _clock() - c0
                cur = it
                it += G
                key = steps.index((cur // G) % (SLOTS // G)).load(SL)
                if not RELOAD:
                    _free_step(sfree, cur, SLOTS, G, STEP_BARRIERS)
                pos, take = _step_entries(v, off, n, lo, lane, ends, active, i, visit)
                take = take & ((key > _row_vec(gate_key)) | ((key == _row_vec(gate_key)) & (pos < _row_vec(gate_pos))))
                n_part = gl.sum(take.to(gl.int32), axis=1)  # [PARTS, R], in-warp
                if XCHG:
                    n_take, first = _part_counts(n_part, count, PRL, HRL, RL)
                else:
                    n_take = gl.sum(n_part, axis=0)
                if gl.max(count + n_take, axis=0) > CAP:
                    if PROF:
                        c0 = _clock()
                        n_cut += 1
                    gl.thread_barrier()  # every earlier entry is in scratch
                    for r in range(R):  # a loop, not unrolled: one copy of the cut
                        c = _pick(count, r, 0)
                        if c + _pick(n_take, r, 0) > CAP:
                            gkr, gpr = _cut(key_base + r * CAP, pos_base + r * CAP, c, TOPK, TILE, L1, HL, CUT)
                            gate_key = gl.where(rr == r, gkr, gate_key)
                            gate_pos = gl.where(rr == r, gpr, gate_pos)
                            count = gl.where(rr == r, TOPK, count)
                    if RELOAD:  # the ring still holds the step: none of its tiles lives in registers across the cut
                        key = steps.index((cur // G) % (SLOTS // G)).load(SL)
                        pos, take = _step_entries(v, off, n, lo, lane, ends, active, i, visit)
                    take = take & ((key > _row_vec(gate_key)) | ((key == _row_vec(gate_key)) & (pos < _row_vec(gate_pos))))
                    n_part = gl.sum(take.to(gl.int32), axis=1)
                    if XCHG:
                        n_take, first = _part_counts(n_part, count, PRL, HRL, RL)
                    else:
                        n_take = gl.sum(n_part, axis=0)
                    if PROF:
                        t_cut += _clock() - c0
                if RELOAD:
                    _free_step(sfree, cur, SLOTS, G, STEP_BARRIERS)
                # SKIP: a step none of whose entries passes the gate (most steps, once the gate has
                # risen) skips the scan and the stores
                if (gl.max(n_take, axis=0) > 0) | (not SKIP):
                    if not XCHG:  # part h's entries follow those of the parts before it
                        first = gl.expand_dims(count, 0) + gl.zeros([PARTS, R], gl.int32, layout=HRL)
                        for h in gl.static_range(PARTS - 1):
                            first += gl.where(hh > h, gl.expand_dims(gl.sum(gl.where(hh == h, n_part, 0), axis=0), 0), 0)
                    take_i = take.to(gl.int32)
                    dst = gl.expand_dims(first, 1) + gl.associative_scan(take_i, 1, _add) - take_i
                    gl.store(key_base + row_off + dst, key, mask=take)
                    gl.store(pos_base + row_off + dst, pos + row_off * 0, mask=take)
                count = count + n_take
                v += advance
                v = gl.where(v >= n, v - n, v)
            if PROF:
                c0 = _clock()
            gl.thread_barrier()
            for r in range(R):
                row = r0 + r
                c = _pick(count, r, 0)
                if (row < n_rows) & ((npass == 1) | (p == r)):
                    if c > TOPK:
                        _cut(key_base + r * CAP, pos_base + r * CAP, c, TOPK, TILE, L1, HL, CUT)
                        c = TOPK
                    offs = gl.arange(0, TOPK, layout=TL)
                    m = offs < c
                    seg = (row.to(gl.int64) * splits + split) * TOPK
                    gl.store(seg_key + seg + offs, gl.load(key_base + r * CAP + offs, mask=m, other=0), mask=m)
                    gl.store(seg_pos + seg + offs, gl.load(pos_base + r * CAP + offs, mask=m, other=0), mask=m)
                    gl.store(seg_cnt + row.to(gl.int64) * splits + split, c)
            gl.thread_barrier()  # the buffers are read before the next pass refills them
            if PROF:
                t_end += _clock() - c0
    if PROF:
        _prof_store(prof, 0, _clock() - t_all, t_take, t_cut, t_end, n_cut)


@gluon.jit
def _load_partition(
    q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree,
    pt_ptr, stride_pt, n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span, splits,
    R: gl.constexpr, KSTAGES: gl.constexpr, KEY_ROWS: gl.constexpr, SCALE_COL: gl.constexpr, G: gl.constexpr,
    prof, PROF: gl.constexpr,
):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    q_i = 0
    if PROF:  # cycles: all, waiting for a free key stage, waiting for a free query buffer
        t_all = _clock()
        t_kfree = t_all * 0
        t_qfree = t_all * 0
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        npass = gl.load(group_pass + r0 // R)
        qs = q_i % 2
        if PROF:
            c0 = _clock()
        mbarrier.wait(qfree.index(qs), ((q_i // 2) & 1) ^ 1)
        if PROF:
            t_qfree += _clock() - c0
        mbarrier.expect(qready.index(qs), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [r0 * NHEADS, 0], qready.index(qs), qbuf.index(qs))
        q_i += 1
        for p in range(npass):
            src = gl.where(npass == 1, lead, r0 + p)
            pt_row = pt_ptr + src.to(gl.int64) * stride_pt + lo // PAGE
            # the page ids of the next two visits are read before this visit's copies are issued
            v1 = gl.where(step >= n, step - n, step)
            v2 = gl.where(v1 + step >= n, v1 + step - n, v1 + step)
            page = gl.load(pt_row, mask=n > 0, other=0)
            page1 = gl.load(pt_row + v1, mask=n > 1, other=0)
            for i in range(0, (n + G - 1) // G * G):  # padded to whole selection steps
                page2 = gl.load(pt_row + v2, mask=i + 2 < n, other=0)
                v2 += step
                v2 = gl.where(v2 >= n, v2 - n, v2)
                ok = (page >= 0) & (page < n_pages)
                s = it % KSTAGES
                if PROF:
                    c0 = _clock()
                mbarrier.wait(kfree.index(s), ((it // KSTAGES) & 1) ^ 1)
                if PROF:
                    t_kfree += _clock() - c0
                if i < n:
                    mbarrier.expect(kready.index(s), k_desc.block_type.nbytes + s_desc.block_type.nbytes)
                    # a page outside the cache reads as zeros: a negative coordinate is out of bounds
                    tma.async_copy_global_to_shared(
                        k_desc, [gl.where(ok, page * KEY_ROWS, -PAGE), 0], kready.index(s), kbuf.index(s)
                    )
                    tma.async_copy_global_to_shared(
                        s_desc, [gl.where(ok, page, -1), SCALE_COL], kready.index(s), sbuf.index(s)
                    )
                else:  # a padding visit: an empty token through the rings
                    mbarrier.arrive(kready.index(s), count=1)
                it += 1
                page = page1
                page1 = page2
    if PROF:
        _prof_store(prof, 1, _clock() - t_all, t_kfree, t_qfree, t_all * 0, t_all * 0)


@gluon.jit
def _score_partition(
    PAR: gl.constexpr, NSCORE: gl.constexpr, kbuf, sbuf, qbuf, ring,
    kready, kfree, qready, qfree, sready, sfree,
    w_ptr, weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits,
    R: gl.constexpr, KSTAGES: gl.constexpr, SLOTS: gl.constexpr, G: gl.constexpr, STEP_BARRIERS: gl.constexpr,
    prof, PROF: gl.constexpr,
):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[SCORE_WARPS, 1], instr_shape=[16, R * NHEADS, 32]
    )
    WL: gl.constexpr = gl.SliceLayout(0, MMA)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    zero = gl.zeros([PAGE, R * NHEADS], gl.float32, layout=MMA)
    cols = gl.arange(0, R * NHEADS, layout=WL)
    it = 0
    q_i = 0
    if PROF:  # cycles: all, waiting for keys, in the MMA, waiting for a free score slot, in releases
        t_all = _clock()
        t_kready = t_all * 0
        t_mma = t_all * 0
        t_sfree = t_all * 0
        t_rel = t_all * 0
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        npass = gl.load(group_pass + r0 // R)
        wrow = r0 + cols // NHEADS
        w = gl.load(w_ptr + wrow.to(gl.int64) * NHEADS + cols % NHEADS, mask=wrow < n_rows, other=0.0)
        qs = q_i % 2
        mbarrier.wait(qready.index(qs), (q_i // 2) & 1)
        qt = qbuf.index(qs).permute((1, 0))
        n_pad = (n + G - 1) // G * G
        total = n_pad * npass
        for j in range((PAR + NSCORE - it % NSCORE) % NSCORE, total, NSCORE):  # visits it + j = PAR mod NSCORE
            g = it + j
            s = g % KSTAGES
            t = g % SLOTS
            if PROF:
                c0 = _clock()
            mbarrier.wait(kready.index(s), (g // KSTAGES) & 1)
            if PROF:
                c1 = _clock()
                t_kready += c1 - c0
            if j % n_pad < n:
                acc = warpgroup_mma(kbuf.index(s), qt, zero, use_acc=False, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                if PROF:
                    c2 = _clock()
                    t_mma += c2 - c1
                sc = tile_scores(acc, w, sbuf.index(s).reshape([PAGE]), weight_scale, R)
                # the key scales were read through the generic proxy; the next copy writes through the async one
                fence_async_shared()
                if PROF:
                    c3 = _clock()
                _release(kfree.index(s))
                b, ph = _step_barrier(g, SLOTS, G, STEP_BARRIERS)
                if PROF:
                    c4 = _clock()
                    t_rel += c4 - c3
                mbarrier.wait(sfree.index(b), ph ^ 1)
                if PROF:
                    c5 = _clock()
                    t_sfree += c5 - c4
                ring.index(t).store(_ordered_key(sc))  # the order key here: the selection's chain is the limit
                _release(sready.index(b))
                if PROF:
                    t_rel += _clock() - c5
            else:  # a padding visit: nothing to score, the selection masks it
                _release(kfree.index(s))
                b, ph = _step_barrier(g, SLOTS, G, STEP_BARRIERS)
                mbarrier.wait(sfree.index(b), ph ^ 1)
                _release(sready.index(b))
        it += total
        _release(qfree.index(qs))
        q_i += 1
    if PROF:
        _prof_store(prof, 2 + PAR, _clock() - t_all, t_kready, t_mma, t_sfree, t_rel)


@gluon.jit
def hopper_stream_kernel(
    q_desc, k_desc, s_desc, w_ptr, pt_ptr, stride_pt, n_pages, width, seq_lens, n_rows, weight_scale,
    group_pass, buf_key_all, buf_pos_all, seg_key, seg_pos, seg_cnt, n_items, split_span, splits,
    R: gl.constexpr, TOPK: gl.constexpr, CAP: gl.constexpr, TILE: gl.constexpr, KSTAGES: gl.constexpr,
    SLOTS: gl.constexpr, KEY_ROWS: gl.constexpr, SCALE_COL: gl.constexpr, G: gl.constexpr,
    SCORE_REGS: gl.constexpr = 120, PARTS: gl.constexpr = 1, NO_SELECT: gl.constexpr = False,
    NSCORE: gl.constexpr = 2, LOAD_REGS: gl.constexpr = 40, CUT: gl.constexpr = 0,
    XCHG: gl.constexpr = False, RELOAD: gl.constexpr = False, SKIP: gl.constexpr = False,
    STEP_BARRIERS: gl.constexpr = False, prof=None, PROF: gl.constexpr = False,
):
    """Per work item and row of its group, the row's best ``min(TOPK, entries)`` (key, position)
    pairs, unordered, at ``seg_key / seg_pos [(row * splits + split) * TOPK ...]`` and their count
    at ``seg_cnt[row * splits + split]`` (see the module docstring)."""
    kbuf = gl.allocate_shared_memory(k_desc.dtype, [KSTAGES] + k_desc.block_type.shape, k_desc.layout)
    sbuf = gl.allocate_shared_memory(s_desc.dtype, [KSTAGES] + s_desc.block_type.shape, s_desc.layout)
    qbuf = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    ring = gl.allocate_shared_memory(
        gl.int32, [SLOTS, PAGE, R], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    )
    kready = gl.allocate_shared_memory(gl.int64, [KSTAGES, 1], mbarrier.MBarrierLayout())
    kfree = gl.allocate_shared_memory(gl.int64, [KSTAGES, 1], mbarrier.MBarrierLayout())
    qready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    qfree = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    sready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    sfree = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KSTAGES):
        mbarrier.init(kready.index(i), count=1)
        mbarrier.init(kfree.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(qready.index(i), count=1)
        mbarrier.init(qfree.index(i), count=NSCORE)  # every score warpgroup releases the queries
    for i in gl.static_range(SLOTS):
        mbarrier.init(sready.index(i), count=G if STEP_BARRIERS else 1)  # a step's G visits arrive
        mbarrier.init(sfree.index(i), count=1)

    # partition arguments spelled out per call: a tuple of them held in a variable loses its constexprs
    if NSCORE == 2:
        gl.warp_specialize(
            [
                (_select_partition, (
                ring, sready, sfree, seq_lens, n_rows, width, group_pass, buf_key_all, buf_pos_all, seg_key, seg_pos,
                seg_cnt, n_items, split_span, splits, R, TOPK, CAP, TILE, SLOTS, G, PARTS, NO_SELECT, STEP_BARRIERS,
                prof, PROF, CUT, XCHG, RELOAD, SKIP,
            )),
                (_load_partition, (
                q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree, pt_ptr, stride_pt,
                n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, KEY_ROWS,
                SCALE_COL, G, prof, PROF,
            )),
                (_score_partition, (
                0, 2, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
                w_ptr, weight_scale,
                seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, SLOTS, G,
                STEP_BARRIERS, prof, PROF,
            )),
                (_score_partition, (
                1, 2, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
                w_ptr, weight_scale,
                seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, SLOTS, G,
                STEP_BARRIERS, prof, PROF,
            )),
            ],
            [1, SCORE_WARPS, SCORE_WARPS],
            [LOAD_REGS, SCORE_REGS, SCORE_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_select_partition, (
                ring, sready, sfree, seq_lens, n_rows, width, group_pass, buf_key_all, buf_pos_all, seg_key, seg_pos,
                seg_cnt, n_items, split_span, splits, R, TOPK, CAP, TILE, SLOTS, G, PARTS, NO_SELECT, STEP_BARRIERS,
                prof, PROF, CUT, XCHG, RELOAD, SKIP,
            )),
                (_load_partition, (
                q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree, pt_ptr, stride_pt,
                n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, KEY_ROWS,
                SCALE_COL, G, prof, PROF,
            )),
                (_score_partition, (
                0, 3, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
                w_ptr, weight_scale,
                seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, SLOTS, G,
                STEP_BARRIERS, prof, PROF,
            )),
                (_score_partition, (
                1, 3, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
                w_ptr, weight_scale,
                seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, SLOTS, G,
                STEP_BARRIERS, prof, PROF,
            )),
                (_score_partition, (
                2, 3, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
                w_ptr, weight_scale,
                seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, SLOTS, G,
                STEP_BARRIERS, prof, PROF,
            )),
            ],
            [1, SCORE_WARPS, SCORE_WARPS, SCORE_WARPS],
            [LOAD_REGS, SCORE_REGS, SCORE_REGS, SCORE_REGS],
        )


@triton.jit(do_not_specialize=["stride_pt", "width", "n_rows"])
def group_pass_kernel(pt_ptr, stride_pt, width, seq_lens, n_rows, group_pass, R: tl.constexpr):
    """``group_pass[g]``: 1 when the ``R`` rows of group ``g`` name the same pages wherever they
    need them (one key tile serves the group), else ``R`` (each row is scored in its own pass)."""
    g = tl.program_id(0)
    r0 = g * R
    ends, hi, lead = group_rows(seq_lens, r0, n_rows, 0, width, R)
    uniform = pages_agree(pt_ptr, stride_pt, r0, ends, lead, 0, R)
    tl.store(group_pass + g, tl.where(uniform, 1, R))


@triton.jit(do_not_specialize=["stride_pt", "width", "splits"])
def finish_rows_kernel(
    seq_lens, pt_ptr, stride_pt, width, out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, splits,
    TOPK: tl.constexpr, TILE: tl.constexpr,
):
    """One program per (row, split): the at most ``TOPK`` unordered entries a streaming kernel left
    for it (in the row's output slots with one split, else in its split list) become the row's
    outputs, or a split list in position order for the merge kernel."""
    i = tl.program_id(0)
    row = i // splits
    split = i % splits
    row64 = row.to(tl.int64)
    seq_len = tl.minimum(tl.load(seq_lens + row), width)
    if splits == 1:
        buf_key = out_bits + row64 * TOPK
        buf_pos = out_raw + row64 * TOPK
        count = tl.load(out_cnt + row)
    else:
        buf_key = seg_key + i.to(tl.int64) * TOPK
        buf_pos = seg_pos + i.to(tl.int64) * TOPK
        count = tl.load(seg_cnt + i)
    _finish_row(
        buf_key, buf_pos, count, seq_len, row, split, splits, pt_ptr, stride_pt,
        out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, TOPK, TILE,
    )


# ---- host side ----


def hopper_descriptors(inputs, ka, cfg):
    """Bulk-copy descriptors of :func:`hopper_stream_kernel` for these inputs; ValueError where it
    does not apply (it serves the FP8 cache on an sm_90 GPU, the legacy tile's configuration,
    contiguous 16-byte aligned queries and cache)."""
    if inputs.layout is not Layout.SGLANG_FP8 or ka.interpret or not ka.tma or (cfg.rows, cfg.num_warps) != (2, 4):
        raise ValueError("the Hopper stream serves the sglang_fp8 layout on a GPU, with the 2-row tile")
    if torch.cuda.get_device_capability(ka.kc.device) != (9, 0):
        raise ValueError("the Hopper stream needs an sm_90 GPU")
    q, kc = inputs.q, inputs.k_cache
    if not q.is_contiguous() or q.data_ptr() % 16 or kc.data_ptr() % 16 or kc.shape[0] == 0:
        raise ValueError("the Hopper stream needs contiguous, 16-byte aligned queries and a non-empty cache")
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    page_bytes = GEOMETRY[Layout.SGLANG_FP8].page_bytes
    pages, rows = kc.shape[0], q.shape[0]
    # the cache as [pages * KEY_ROWS, 128] bytes: page p's keys are rows p * KEY_ROWS .. + 63
    key_rows = page_bytes // HEAD_DIM
    keys = kc.view(torch.uint8).reshape(-1)[: pages * page_bytes].view(pages * key_rows, HEAD_DIM)
    scales = kc.view(torch.uint8).reshape(-1)[: pages * page_bytes].view(torch.float32).view(pages, page_bytes // 4)
    queries = q.view(torch.uint8).reshape(rows * HEADS, HEAD_DIM)
    fp8 = torch.float8_e4m3fn
    return HopperDescriptors(
        GluonDescriptor(queries.view(fp8), [rows * HEADS, HEAD_DIM], [HEAD_DIM, 1], [cfg.rows * HEADS, HEAD_DIM],
                        gl.NVMMASharedLayout.get_default_for([cfg.rows * HEADS, HEAD_DIM], gl.float8e4nv)),
        GluonDescriptor(keys.view(fp8), [pages * key_rows, HEAD_DIM], [HEAD_DIM, 1], [PAGE_SIZE, HEAD_DIM],
                        gl.NVMMASharedLayout.get_default_for([PAGE_SIZE, HEAD_DIM], gl.float8e4nv)),
        GluonDescriptor(scales, [pages, page_bytes // 4], [page_bytes // 4, 1], [1, PAGE_SIZE],
                        gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)),
        key_rows,
        GEOMETRY[Layout.SGLANG_FP8].scale_offset // 4,
    )


@dataclass(frozen=True)
class HopperDescriptors:
    queries: object
    keys: object
    scales: object
    key_rows: int  # 128-byte rows per cache page
    scale_col: int  # fp32 word of a page's first key scale


def _launch_regs(score_groups: int) -> int:
    """Registers per thread at launch: the CTA's whole register file (64K) over its warpgroups
    (selection, loader, score), in the 8-register steps the hardware allocates; ``setmaxnreg``
    then moves them between partitions."""
    return 65536 // (128 * (2 + score_groups)) // 8 * 8


HOPPER_KEY_STAGES = 4
HOPPER_SCORE_SLOTS = 16
# visits the selection takes per step (at most the pool's pages: a step's entrants must fit beside a cut buffer)
HOPPER_SELECT_VISITS = 16
# warps a step's visits are dealt to, per row (see ``_select_partition``)
HOPPER_SELECT_PARTS = 4


def hopper_indexer_topk(
    inputs, *, out=None, num_splits: Optional[int] = None, pool: Optional[int] = None, no_select: bool = False,
    select_visits: int = HOPPER_SELECT_VISITS, select_parts: int = HOPPER_SELECT_PARTS, step_barriers: bool = True,
    score_slots: Optional[int] = None, one_exchange: bool = False, reload_after_cut: bool = False, cut: int = 0,
    skip_empty: bool = False, score_groups: int = 2,
    key_stages: Optional[int] = None, score_regs: int = 120, load_regs: int = 40,
    profile: Optional[torch.Tensor] = None,
):
    """The contract of :func:`indexer_topk.indexer_topk` for ``sglang_fp8`` inputs on an sm_90 GPU,
    through :func:`hopper_stream_kernel`; plans and scratch as the package's fused backend.

    Build knobs (each a separate compile):

    * ``no_select``: a timing probe; the selection does no work and the outputs are undefined;
    * ``select_visits`` (a power of two): visits per selection step; ``select_parts`` (1, 2 or 4,
      at most ``select_visits``): warps per row a step's visits are dealt to (see
      ``_select_partition``); ``one_exchange``: the parts' counts meet in one exchange across warps
      per step (:func:`_part_counts`) instead of one reduction per part; ``reload_after_cut``: a
      step's slots are given back after its cut test, so that a cut reloads the step's keys from
      the ring instead of holding them in registers across it; ``skip_empty``: a step with no
      entry past the gate skips its scan and stores; ``step_barriers``: one
      barrier pair per step on the score ring, not per slot; ``score_slots`` (a multiple of
      ``select_visits``, four steps by default): its depth;
    * ``score_groups`` (2 or 3): MMA warpgroups; ``key_stages`` (a multiple of it; 4 for two, 6
      for three by default): the key ring's depth;
    * ``score_regs``, ``load_regs``: registers per thread of each score warpgroup and of the
      loader; the selection gets the rest of the register file;
    * ``cut``: 0 for the 512-bin radix from the top byte, 1 or 2 for :func:`_threshold_from_top`
      by 8- or 4-bit digits;
    * ``profile`` (int64 ``[P, 5, 8]``, zeroed, ``P`` at least the programs launched, e.g. the SM
      count): partition timers, in SM cycles (:func:`profile_table`).
    """
    from indexer_topk.backends.fused import _carve, merge_split_lists, plan_fused
    from indexer_topk.contract import allocate_result, as_inputs
    from indexer_topk.kernels.launch import device_sm_count, pack_args, tile_config

    if cut not in (0, 1, 2):
        raise ValueError(f"cut: expected 0, 1 or 2, got {cut}")
    if score_groups not in (2, 3):
        raise ValueError(f"score_groups: expected 2 or 3, got {score_groups}")
    if key_stages is None:
        key_stages = HOPPER_KEY_STAGES if HOPPER_KEY_STAGES % score_groups == 0 else 2 * score_groups
    if key_stages < 1 or key_stages % score_groups:
        # a stage used by two warpgroups lets the later one pass its wait on the earlier visit's
        # phase (the parity test cannot tell the phases apart): stale keys or a deadlock
        raise ValueError(f"key_stages ({key_stages}) must be a positive multiple of score_groups ({score_groups})")
    inputs = as_inputs(inputs)
    ka = pack_args(inputs)
    cfg = tile_config(inputs.layout)
    descs = hopper_descriptors(inputs, ka, cfg)
    rows, topk = ka.q.shape[0], inputs.topk
    if out is None:
        out = allocate_result(rows, topk, ka.kc.device)
    if rows == 0:
        return out
    plan = plan_fused(rows, topk, ka.kc.device, num_splits, pool, cfg.rows)
    workspace = torch.empty(plan.nbytes, dtype=torch.uint8, device=ka.kc.device)
    _, buf_key, buf_pos, strip, seg_key, seg_pos, seg_cnt = _carve(workspace, plan)
    width = ka.page_table.shape[1] * PAGE_SIZE
    span = triton.cdiv(triton.cdiv(max(width, 1), plan.splits), PAGE_SIZE) * PAGE_SIZE
    n_items = triton.cdiv(rows, cfg.rows) * plan.splits
    groups = triton.cdiv(rows, plan.group_rows)
    group_pass = strip[:groups]  # the strips are the plain-Triton kernel's; this kernel has none
    out_bits = out.values.view(torch.int32)
    if plan.splits == 1:  # each row's entries go straight to its output slots
        seg_key, seg_pos, seg_cnt = out_bits, out.raw_indices, out.counts
    group_pass_kernel[(groups,)](
        ka.page_table, ka.page_table.stride(0), width, ka.seq_lens, rows, group_pass, R=plan.group_rows,
    )
    g = min(select_visits, plan.pool // PAGE_SIZE)
    programs = min(device_sm_count(ka.kc.device), n_items)
    if profile is not None and (profile.shape[0] < programs or profile.shape[1:] != (5, 8)):
        raise ValueError(f"profile: expected int64 [at least {programs}, 5, 8], got {tuple(profile.shape)}")
    hopper_stream_kernel[(programs,)](
        descs.queries, descs.keys, descs.scales, ka.w, ka.page_table, ka.page_table.stride(0), ka.pages, width,
        ka.seq_lens, rows, float(inputs.weight_scale), group_pass, buf_key, buf_pos, seg_key, seg_pos, seg_cnt,
        n_items, span, plan.splits,
        R=plan.group_rows, TOPK=plan.topk, CAP=plan.cap, TILE=plan.tile, KSTAGES=key_stages,
        SLOTS=score_slots or max(HOPPER_SCORE_SLOTS, 4 * g), KEY_ROWS=descs.key_rows, SCALE_COL=descs.scale_col,
        G=g, SCORE_REGS=score_regs, PARTS=min(select_parts, g),
        NO_SELECT=no_select, STEP_BARRIERS=step_barriers, prof=seg_cnt if profile is None else profile,
        PROF=profile is not None, NSCORE=score_groups, LOAD_REGS=load_regs,
        CUT=cut, XCHG=one_exchange, RELOAD=reload_after_cut, SKIP=skip_empty, num_warps=4,
        maxnreg=_launch_regs(score_groups),
    )
    if no_select:
        return out
    finish_rows_kernel[(rows * plan.splits,)](
        ka.seq_lens, ka.page_table, ka.page_table.stride(0), width, out_bits, out.raw_indices,
        out.physical_indices, out.counts, seg_key, seg_pos, seg_cnt, plan.splits, TOPK=plan.topk, TILE=plan.tile,
        num_warps=4,
    )
    if plan.splits > 1:
        merge_split_lists(ka, plan, out, seg_key, seg_pos, seg_cnt)
    return out


PROFILE_FIELDS = (
    ("select", ("all", "wait tiles", "step cuts", "item ends", "cuts")),
    ("load", ("all", "wait key stage", "wait queries", "", "")),
    ("score 0", ("all", "wait keys", "mma", "wait slot", "releases")),
    ("score 1", ("all", "wait keys", "mma", "wait slot", "releases")),
    ("score 2", ("all", "wait keys", "mma", "wait slot", "releases")),
)


def profile_means(profile: torch.Tensor) -> torch.Tensor:
    """``[5, 8]``: the ``PROF`` build's counters averaged over the programs that ran (rows of
    ``profile`` beyond the grid stay zero and are left out)."""
    ran = profile[:, :, 0].sum(1) > 0
    return profile[ran].double().mean(0).cpu()


def profile_table(profile: torch.Tensor) -> str:
    """The ``PROF`` build's counters, averaged over programs: each partition's cycles and the share
    of them spent in each timed region."""
    mean = profile_means(profile)
    lines = []
    for part, (name, fields) in enumerate(PROFILE_FIELDS):
        total = mean[part, 0].item()
        if total == 0:  # a partition this build does not have
            continue
        cells = [f"{name:8s} {total / 1e6:8.3f} Mcycles"]
        for k, f in enumerate(fields[1:], 1):
            if f == "cuts":
                cells.append(f"{f} {mean[part, k].item():.1f}")
            elif f:
                cells.append(f"{f} {100 * mean[part, k].item() / max(total, 1):5.1f}%")
        lines.append("  ".join(cells))
    return "\n".join(lines)
