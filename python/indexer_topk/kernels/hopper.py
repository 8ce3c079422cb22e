"""The fused stream for Hopper (sm_90): a warp-specialised Gluon kernel for the ``sglang_fp8`` and
``sglang_mxfp4`` caches.

The plain-Triton fused kernel (:mod:`indexer_topk.kernels.fused`) takes turns: a program scores a
strip of pages, then stops its MMAs to select. Here each persistent program is split into
partitions that run at once and talk through shared-memory rings guarded by mbarriers:

* **load** (1 warp): per visit, the page id from the page table, then one bulk copy of the
  page's 64 keys (e4m3, or packed e2m1) and one of its 64 key scales (fp32, or four ue8m0 bytes
  each) into a ``KSTAGES``-deep ring; per work item (FP8), one bulk copy of the group's queries;
* **score** (``NSCORE`` warpgroups, visit ``g`` on warpgroup ``g mod NSCORE``): the MMA
  ``[64 keys] x [R * 64 heads]`` and the head reduction of the shared tile
  (:func:`tile_scores`, the same operations, layouts and hence bits as
  :func:`indexer_topk.kernels.score.page_scores`), into a ring of ``SLOTS`` ``[64, R]`` tiles of
  order keys. FP8: three warpgroups, e4m3 ``k32`` MMAs with both operands in shared memory.
  MXFP4: two warpgroups (the widened keys need the registers), each widening the page's e2m1
  keys to bf16 in registers exactly as Triton 3.6 lowers the shared tile's ``tl.dot_scaled``
  (:func:`_mx_keys`) and its group's queries once per item (:func:`_mx_queries`), then bf16
  ``k16`` MMAs with the keys from registers;
* **select** (the default warpgroup): takes ``G`` visits' score tiles per step (dealt to its four
  warps), appends the scores that beat their row's gate to the row's candidate buffer (global
  scratch, as in :mod:`indexer_topk.kernels.fused`), cuts a buffer that would overflow to its
  best ``TOPK`` (raising the gate; a radix select by 4-bit digits from the highest digit in which
  the buffer's entries differ), and at the end of an item cuts each row to ``TOPK`` and writes it,
  unordered, to the row's output slot (one split) or split list. :func:`finish_rows_kernel` then
  orders and writes the outputs, and split rows meet in the fused backend's exact merge.

Work items (a group of ``R`` rows and one context split) are dealt round-robin to a grid of one
program per SM; the key stages are a multiple of the three score warpgroups, so that each stage
always returns to the same warpgroup (a stage shared by two lets the later one pass its parity
wait on the earlier visit's phase: stale keys or a deadlock); every partition walks the same items
and visits, so ring slots and barrier phases follow from a running visit count; the score ring
has one barrier pair per selection step. Every release of a ring slot is a fence by each thread,
a partition barrier, then one thread's arrive (:func:`_release`), and a key stage read through
the generic proxy is fenced for the async one before the loader's next copy may overwrite it:
without these fences, runs of one input gave different outputs. Pages are visited in the
golden-ratio order of :mod:`indexer_topk.kernels.fused`. A group whose rows do not share their
pages (``group_pass[g] == R``) is scored once per row, each pass with that row's pages, keeping
only that row's column: the same bits.

Two measurement hooks compile away when off: ``NO_SELECT`` (the selection does no work, outputs
undefined: the loads and MMAs alone) and ``PROF`` (each partition's waits and regions in SM
cycles, ``benchmark/research/hopper_probe.py --profile``). How the configuration was found, build by
build, is in ``benchmark/results/NOTES.md``.

``R = 2`` (one N = 128 MMA on four warps, the legacy tile's configuration) serves prefill, and
``R = 1`` (an N = 64 MMA: the same head reduction, so the same bits) decode steps whose rows each
have their own pages, for the ``sglang_fp8`` and ``sglang_mxfp4`` layouts (``aiter_mxfp4``'s split pages take the plain-Triton
kernel); it needs Triton's Gluon dialect and an sm_90 GPU, for MXFP4 also Triton 3.6 (the
release whose ``tl.dot_scaled`` lowering it repeats), and it cannot run under the interpreter
(the plain-Triton kernel, with the same score tile, is what a CPU tests).
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
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

from ..contract import HEAD_DIM, HEADS, PAGE_SIZE, Layout
from ..versions import MX_STREAM_TRITON
from .common import COMP_MIN, INT32_MAX, INT64_MAX, KEY_MIN, KEY_NAN, LOW32, e2m1_to_f32, ue8m0_to_f32
from .fused import _finish_row, visit_step
from .geometry import CHUNKS, DIM, GEOMETRY, GROUP, MX_Q_ROW, MX_Q_SCALE_ROW, NCHUNKS, NHEADS, PAGE, PDIM
from .score import group_rows, pages_agree

# The score tile: keys on M (4 warps x 16), R * 64 query heads on N, k32 e4m3 steps.
SCORE_WARPS = gl.constexpr(4)
# The cut's radix digits: 4-bit digits in 16 bins took less time than 8-bit ones in 256
CUT_BITS = gl.constexpr(4)


# the visit order of the plain-Triton kernel, the same function compiled as Gluon
_visit_step = gluon.jit(visit_step.fn)
# the queries' exact widening of the shared tile (load_queries), compiled as Gluon
_e2m1_to_f32 = gluon.jit(e2m1_to_f32.fn)
_ue8m0_to_f32 = gluon.jit(ue8m0_to_f32.fn)


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
def _passes(group_pass, r0, R: gl.constexpr):
    """Score passes of the group at row ``r0``: ``group_pass`` of it, or 1 for one-row groups
    (their table is not written: each row has its own pages by definition)."""
    if R == 1:
        return r0 * 0 + 1
    else:
        return gl.load(group_pass + r0 // R)


@gluon.jit
def tile_scores(acc, w, kscale_smem, weight_scale, R: gl.constexpr, MX: gl.constexpr):
    """``[64, R]`` scores from the MMA accumulator ``[64, R * 64]`` and, for the FP8 cache, the
    page's key scales (``[1, 64]`` fp32 in shared memory); see
    :func:`indexer_topk.kernels.score.page_scores`: the same operations on the same layouts, hence
    the same bits."""
    acc = gl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)
    s = gl.sum(gl.reshape(acc * gl.expand_dims(w, 0), [PAGE, R, NHEADS]), axis=2) + 0.0
    if not MX:
        s = s * gl.expand_dims(kscale_smem.reshape([PAGE]).load(gl.SliceLayout(1, s.type.layout)), 1)
    return s * weight_scale


@gluon.jit
def _mx_keys(kpage, kscales, AL: gl.constexpr, PL: gl.constexpr, SPREAD: gl.constexpr, NCH: gl.constexpr):
    """``NCH`` 32-value chunks of a key page of the MXFP4 cache as the MMA's A operand
    ``[64, NCH * 32]`` bf16 in registers (layout ``AL``): ``kpage`` their packed e2m1 bytes
    ``[64, NCH * 16]``, ``kscales`` their ue8m0 bytes ``[64, NCH]`` (shared memory). These are the
    steps, types and layouts Triton 3.6 lowers the shared tile's ``tl.dot_scaled`` to on sm_90
    (``DecomposeScaledBlocked``), hence its bits: the packed bytes in the width-1 A layout ``PL``
    widen exactly to bf16; the scale is the bf16 bits ``e << 7`` (byte 0 gives +0), spread over its
    32 values in ``SPREAD`` ``[64, NCH, 32]``, which reshapes to ``AL``; a bf16 multiply; NaN for
    byte 255."""
    # (Gluon 3.6 gives the widened tensor a linear layout equal to AL but typed apart: the convert is free)
    k = gl.convert_layout(gl.fp4_to_fp(kpage.load(PL), gl.bfloat16, 1), AL)
    e = kscales.load(gl.SliceLayout(2, SPREAD))
    scale = (e.to(gl.int16) << 7).to(gl.bfloat16, bitcast=True)
    scale = gl.where(e == 255, float("nan"), scale)  # a NaN scale makes its 32 values NaN, zeros too
    full, _ = gl.broadcast(gl.expand_dims(scale, 2), gl.zeros([PAGE, NCH, GROUP], gl.bfloat16, layout=SPREAD))
    return k * gl.convert_layout(gl.reshape(full, [PAGE, NCH * GROUP]), AL)


@gluon.jit
def _mx_queries(q_ptr, qs_ptr, qdst, r0, n_rows, R: gl.constexpr):
    """The group's ``R`` MXFP4 query rows widened once to the MMA's B operand ``[128 (d), R * 64
    (row, head)]`` bf16 in ``qdst``, with the operations of
    :func:`indexer_topk.kernels.score.load_queries` (rows at or past ``n_rows`` are zeros)."""
    QL: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [SCORE_WARPS, 1], [1, 0])
    BAND: gl.constexpr = 32  # d rows widened at once: the registers of a quarter of the tile
    for part in gl.static_range(DIM // BAND):
        d = gl.expand_dims(gl.arange(0, BAND, layout=gl.SliceLayout(1, QL)), 1) + part * BAND
        col = gl.expand_dims(gl.arange(0, R * NHEADS, layout=gl.SliceLayout(0, QL)), 0)
        row = (r0 + col // NHEADS).to(gl.int64)
        h = col % NHEADS
        valid = (d * 0 + row) < n_rows
        byte = gl.load(q_ptr + row * MX_Q_ROW + h * PDIM + d // 2, mask=valid, other=0).to(gl.int32)
        code = (byte >> ((d & 1) * 4)) & 0xF
        e = gl.load(qs_ptr + row * MX_Q_SCALE_ROW + h * NCHUNKS + d // GROUP, mask=valid, other=127).to(gl.int32)
        qt = _e2m1_to_f32(code) * _ue8m0_to_f32(e)
        qdst.slice(part * BAND, BAND, dim=0).store(qt.to(gl.bfloat16))


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
def _threshold_from_top(b, comp, valid, k, count, HL: gl.constexpr, BITS: gl.constexpr, SLACK: gl.constexpr):
    """``(tb, shift)``: the ``k``-th largest of the valid biased composites ``b`` (int64, sign bit
    flipped), to the digit at ``shift``, by ``BITS``-bit radix digits in ``2 ** BITS`` bins from the
    highest digit in which two valid composites differ (the digits above it are every entry's),
    until the boundary bucket is taken whole. With ``SLACK`` 0 it takes the same entries as the
    8-bit radix from the top byte of :func:`indexer_topk.kernels.select.tile_threshold`: a pass
    whose bucket already holds every needed entry ends both, and a finer one would keep the whole
    bucket. A ``SLACK`` above 0 ends the search at the first pass whose boundary bucket, taken
    whole, keeps at most ``k + SLACK`` entries. A pass counts the entries outside the boundary
    prefix in bin 0 and takes them out of it again: their count is the last pass's boundary bucket
    (the valid entries before the first), so it costs no reduction."""
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
            if bucket - need <= SLACK:  # the bucket taken whole keeps k + (bucket - need) entries
                done = 1
    return tb, shift


@gluon.jit
def _cut(buf_key, buf_pos, count, TOPK: gl.constexpr, TILE: gl.constexpr, L1: gl.constexpr, HL: gl.constexpr,
         SLACK: gl.constexpr = 0, PROF: gl.constexpr = False):
    """Cut a buffer of ``TOPK < count <= TILE`` entries to its best ``TOPK`` at the front (as
    :func:`indexer_topk.kernels.candidates.cut`), or with ``SLACK`` to its best ``TOPK`` to
    ``TOPK + SLACK`` (a superset of the best ``TOPK``: whatever it drops has ``TOPK`` better entries
    kept). Returns the new gate ``(key, position)`` (the least kept entry), the entries kept and
    (the ``PROF`` build) the cycles to the loaded buffer and in the threshold search."""
    if PROF:
        c0 = _clock()
    offs = gl.arange(0, TILE, layout=L1)
    valid = offs < count
    key = gl.load(buf_key + offs, mask=valid, other=0)
    pos = gl.load(buf_pos + offs, mask=valid, other=0)
    comp = (key.to(gl.int64) << 32) | (pos.to(gl.int64) ^ LOW32)
    if PROF:
        gl.thread_barrier()
        c1 = _clock()
    tb, shift = _threshold_from_top(comp ^ COMP_MIN, comp, valid, TOPK + count * 0, count, HL, CUT_BITS, SLACK)
    t_load = 0
    t_thr = 0
    if PROF:
        c2 = _clock()
        t_load = c1 - c0
        t_thr = c2 - c1
    t = tb ^ COMP_MIN
    take = valid & ((comp >> shift) >= (t >> shift))
    gate = gl.min(gl.where(take, comp, INT64_MAX), axis=0)
    take_i = take.to(gl.int32)
    dst = gl.associative_scan(take_i, 0, _add) - take_i
    gl.thread_barrier()
    gl.store(buf_key + dst, key, mask=take)
    gl.store(buf_pos + dst, pos, mask=take)
    gl.thread_barrier()
    kept = gl.sum(take_i, axis=0)
    return (gate >> 32).to(gl.int32), ((gate & LOW32) ^ LOW32).to(gl.int32), kept, t_load, t_thr


@triton.constexpr_function
def _cut_slack(cap, topk, step_keys):
    """Entries a step's cut may keep beyond ``topk``: an eighth of the pool, and no more than
    leaves room for a step's keys."""
    return max(0, min((cap - topk) // 8, cap - topk - step_keys))


@triton.constexpr_function
def _vector_layout(n, num_warps):
    return gl.BlockedLayout([max(1, n // (32 * num_warps))], [32], [num_warps], [0])


@gluon.jit
def _pick(vec, r, zero):
    return gl.sum(gl.where(gl.arange(0, vec.shape[0], layout=vec.type.layout) == r, vec, zero), axis=0)


@gluon.jit
def _step_barrier(g, SLOTS: gl.constexpr, G: gl.constexpr):
    """``(barrier index, phase)`` of visit ``g``'s score slot: one barrier pair per selection step
    (the step's ``G`` producers arrive on it, the selection waits once)."""
    q = g // G
    return q % (SLOTS // G), (q // (SLOTS // G)) & 1


@gluon.jit
def _take_step(sready, it, SLOTS: gl.constexpr, G: gl.constexpr):
    """Wait until the ``G`` score tiles of the step starting at visit ``it`` are written."""
    b, ph = _step_barrier(it, SLOTS, G)
    mbarrier.wait(sready.index(b), ph)


@gluon.jit
def _free_step(sfree, it, SLOTS: gl.constexpr, G: gl.constexpr):
    """Give the step's slots back to the score warpgroups once every warp's reads of them are
    performed (as :func:`_release`)."""
    _fence_cta()
    gl.thread_barrier()
    b, ph = _step_barrier(it, SLOTS, G)
    mbarrier.arrive(sfree.index(b), count=1)


@gluon.jit
def _globaltimer():
    """The GPU's nanosecond timer, common to all SMs (the ``PROF`` build's program spans)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _prof_start(prof, part):
    """The ``PROF`` build's start time and four zeroed counters of partition ``part``; its start on
    the global timer goes to counter 5."""
    gl.store(prof + (gl.program_id(0) * 5 + part).to(gl.int64) * 8 + 5, _globaltimer())
    t = _clock()
    return t, t * 0, t * 0, t * 0, t * 0


@gluon.jit
def _prof_store(prof, part, a, b, c, d, e):
    """The ``PROF`` build's five counters of partition ``part`` of this program, and its end on the
    global timer (counter 6)."""
    base = prof + (gl.program_id(0) * 5 + part).to(gl.int64) * 8
    gl.store(base + 6, _globaltimer())
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
    G: gl.constexpr, PARTS: gl.constexpr, NO_SELECT: gl.constexpr, prof, PROF: gl.constexpr,
):
    """The selection of every row of each group."""
    NW: gl.constexpr = 4
    GP: gl.constexpr = G // PARTS
    # A step takes G visits' keys as a [PARTS, GP * 64, R] tile: part h holds visits h * GP ..,
    # one warp per (part, row) where the warps allow, so a row's prefix sums stay inside a warp
    # (a scan across warps lost exactness in this kernel, not bisected); the parts' counts meet in
    # one exchange (:func:`_part_counts`). PARTS 1 repeats each row's work on two warps.
    SL: gl.constexpr = gl.BlockedLayout([1, 2 * GP, 1], [1, 32, 1], [PARTS, 1, NW // PARTS], [1, 2, 0])
    HRL: gl.constexpr = gl.SliceLayout(1, SL)  # [PARTS, R]
    RL: gl.constexpr = gl.SliceLayout(0, HRL)  # [R]
    PRL: gl.constexpr = gl.BlockedLayout([PARTS, R], [32, 1], [NW, 1], [1, 0])  # [PARTS, R] in every thread
    L1: gl.constexpr = _vector_layout(TILE, NW)
    TL: gl.constexpr = _vector_layout(TOPK, NW)
    # A step's cut may keep up to SLACK entries beyond TOPK: its threshold search ends passes
    # earlier (a decode cut took 27 K cycles, not 31 K), for slightly less room until the next cut.
    # The step's entrants (at most G pages) still fit beside what it keeps.
    SLACK: gl.constexpr = _cut_slack(CAP, TOPK, G * PAGE)
    HL: gl.constexpr = _vector_layout(1 << CUT_BITS, NW)
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
        t_all, t_take, t_cut, t_end, n_cut = _prof_start(prof, 0)
        t_cload = t_all * 0
        t_cthr = t_all * 0
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        n_pad = (n + G - 1) // G * G
        lens = gl.load(seq_lens + r0 + rr, mask=r0 + rr < n_rows, other=0)
        hi = gl.minimum(gl.minimum(lo + split_span, width), gl.max(lens, axis=0))
        ends = _row_vec(gl.maximum(gl.minimum(lens, hi), lo))
        npass = _passes(group_pass, r0, R)
        if NO_SELECT:  # a timing probe: the selection's work taken out, outputs undefined
            for i in range(0, n_pad * npass, G):
                _take_step(sready, it, SLOTS, G)
                _free_step(sfree, it, SLOTS, G)
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
                _take_step(sready, it, SLOTS, G)
                if PROF:
                    t_take += _clock() - c0
                cur = it
                it += G
                key = steps.index((cur // G) % (SLOTS // G)).load(SL)
                pos, take = _step_entries(v, off, n, lo, lane, ends, active, i, visit)
                take = take & ((key > _row_vec(gate_key)) | ((key == _row_vec(gate_key)) & (pos < _row_vec(gate_pos))))
                n_part = gl.sum(take.to(gl.int32), axis=1)  # [PARTS, R], in-warp
                n_take, first = _part_counts(n_part, count, PRL, HRL, RL)
                if gl.max(count + n_take, axis=0) > CAP:
                    if PROF:
                        c0 = _clock()
                        n_cut += 1
                    gl.thread_barrier()  # every earlier entry is in scratch
                    for r in range(R):  # a loop, not unrolled: one copy of the cut
                        c = _pick(count, r, 0)
                        if c + _pick(n_take, r, 0) > CAP:
                            gkr, gpr, kept, cl, ct = _cut(
                                key_base + r * CAP, pos_base + r * CAP, c, TOPK, TILE, L1, HL, SLACK, PROF
                            )
                            if PROF:
                                t_cload += cl
                                t_cthr += ct
                            gate_key = gl.where(rr == r, gkr, gate_key)
                            gate_pos = gl.where(rr == r, gpr, gate_pos)
                            count = gl.where(rr == r, kept, count)
                    # the ring still holds the step (its slots are given back below): reloading it
                    # keeps the step's tiles out of registers across the cut
                    key = steps.index((cur // G) % (SLOTS // G)).load(SL)
                    pos, take = _step_entries(v, off, n, lo, lane, ends, active, i, visit)
                    take = take & ((key > _row_vec(gate_key)) | ((key == _row_vec(gate_key)) & (pos < _row_vec(gate_pos))))
                    n_part = gl.sum(take.to(gl.int32), axis=1)
                    n_take, first = _part_counts(n_part, count, PRL, HRL, RL)
                    if PROF:
                        t_cut += _clock() - c0
                _free_step(sfree, cur, SLOTS, G)
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
                        _cut(key_base + r * CAP, pos_base + r * CAP, c, TOPK, TILE, L1, HL)
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
        # the step cuts' share loading their buffer and searching the threshold (the rest compacts)
        gl.store(prof + (pid * 5).to(gl.int64) * 8 + 7, t_cload)
        gl.store(prof + (pid * 5 + 1).to(gl.int64) * 8 + 7, t_cthr)


@gluon.jit
def _issue_visit(
    page, real, it, k_desc, s_desc, kbuf, sbuf, kready, kfree, n_pages, t_kfree,
    KSTAGES: gl.constexpr, KEY_ROWS: gl.constexpr, SCALE_COL: gl.constexpr, PROF: gl.constexpr,
):
    """The loader's visit ``it``: once its key stage is free, the bulk copies of ``page`` (a
    ``real`` visit) or an empty token (a padding visit of the item's last selection step).
    Returns the free-stage wait's cycles added to ``t_kfree`` (with ``PROF``)."""
    ok = (page >= 0) & (page < n_pages)
    s = it % KSTAGES
    if PROF:
        c0 = _clock()
    mbarrier.wait(kfree.index(s), ((it // KSTAGES) & 1) ^ 1)
    if PROF:
        t_kfree += _clock() - c0
    if real:
        mbarrier.expect(kready.index(s), k_desc.block_type.nbytes + s_desc.block_type.nbytes)
        # a page outside the cache reads as zeros: a negative coordinate is out of bounds
        tma.async_copy_global_to_shared(
            k_desc, [gl.where(ok, page * KEY_ROWS, -PAGE), 0], kready.index(s), kbuf.index(s)
        )
        tma.async_copy_global_to_shared(
            s_desc, [gl.where(ok, page, -1), SCALE_COL], kready.index(s), sbuf.index(s)
        )
    else:
        mbarrier.arrive(kready.index(s), count=1)
    return t_kfree


@gluon.jit
def _load_partition(
    q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree,
    pt_ptr, stride_pt, n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span, splits,
    R: gl.constexpr, KSTAGES: gl.constexpr, KEY_ROWS: gl.constexpr, SCALE_COL: gl.constexpr, G: gl.constexpr,
    MX: gl.constexpr, prof, PROF: gl.constexpr,
):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    q_i = 0
    t_kfree = 0
    if PROF:  # cycles: all, waiting for a free key stage, waiting for a free query buffer
        t_all, t_kfree, t_qfree, _, _ = _prof_start(prof, 1)
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        npass = _passes(group_pass, r0, R)
        qs = q_i % 2
        if not MX:  # the MXFP4 queries are widened by the score warpgroups
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
            if R == 1:
                # a decode item: a selection step's page ids are read a step ahead, one per lane,
                # and gathered into every lane when their step begins. A bulk copy's coordinate
                # lives in a uniform register; an id loaded straight into a replicated layout was
                # moved there right after its load, so each step waited a global load (a decode
                # row's page table is cold). A per-lane id stays in a vector register until the
                # gather of the next step, which waits only on what has not yet arrived
                LANE: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
                HELD: gl.constexpr = gl.BlockedLayout([G], [32], [1], [0])
                kl = gl.arange(0, G, layout=LANE)
                kh = gl.arange(0, G, layout=HELD)
                nn = gl.maximum(n, 1)
                ids = gl.load(pt_row + (kl * step) % nn, mask=kl < n, other=0)
                vs = (G * step) % nn  # the first visit of the next step
                for i0 in range(0, n, G):
                    nxt = gl.load(pt_row + (vs + kl * step) % nn, mask=i0 + G + kl < n, other=0)
                    vs = (vs + G * step) % nn
                    held = gl.convert_layout(ids, HELD)
                    for j in gl.static_range(G):
                        page = gl.sum(gl.where(kh == j, held, 0), axis=0)
                        t_kfree = _issue_visit(
                            page, i0 + j < n, it, k_desc, s_desc, kbuf, sbuf, kready, kfree, n_pages, t_kfree,
                            KSTAGES, KEY_ROWS, SCALE_COL, PROF,
                        )
                        it += 1
                    ids = nxt
            else:
                # the page ids of the next two visits are read before this visit's copies are issued
                v1 = gl.where(step >= n, step - n, step)
                v2 = gl.where(v1 + step >= n, v1 + step - n, v1 + step)
                page = gl.load(pt_row, mask=n > 0, other=0)
                page1 = gl.load(pt_row + v1, mask=n > 1, other=0)
                for i in range(0, (n + G - 1) // G * G):  # padded to whole selection steps
                    page2 = gl.load(pt_row + v2, mask=i + 2 < n, other=0)
                    v2 += step
                    v2 = gl.where(v2 >= n, v2 - n, v2)
                    t_kfree = _issue_visit(
                        page, i < n, it, k_desc, s_desc, kbuf, sbuf, kready, kfree, n_pages, t_kfree,
                        KSTAGES, KEY_ROWS, SCALE_COL, PROF,
                    )
                    it += 1
                    page = page1
                    page1 = page2
    if PROF:
        _prof_store(prof, 1, _clock() - t_all, t_kfree, t_qfree, t_all * 0, t_all * 0)


@gluon.jit
def _score_partition(
    PAR: gl.constexpr, NSCORE: gl.constexpr, kbuf, sbuf, qbuf, wbuf, ring,
    kready, kfree, qready, qfree, sready, sfree,
    w_ptr, weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, q_ptr, qs_ptr,
    R: gl.constexpr, KSTAGES: gl.constexpr, SLOTS: gl.constexpr, G: gl.constexpr, MX: gl.constexpr,
    prof, PROF: gl.constexpr,
):
    # e4m3: k32 steps, both operands from shared memory; MXFP4: bf16 k16 steps, keys from registers
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[SCORE_WARPS, 1], instr_shape=[16, R * NHEADS, 16 if MX else 32]
    )
    # MXFP4 (see _mx_keys): the widened keys, the packed bytes, the scales
    AL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    PL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=1)
    SPREAD: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [8, 0, 0], [0, 0, 8], [0, 0, 16], [0, 1, 0], [0, 2, 0]],
        lane_bases=[[0, 0, 2], [0, 0, 4], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]],
        block_bases=[],
        shape=[PAGE, NCHUNKS, GROUP],
    )
    WL: gl.constexpr = gl.SliceLayout(0, MMA)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    zero = gl.zeros([PAGE, R * NHEADS], gl.float32, layout=MMA)
    cols = gl.arange(0, R * NHEADS, layout=WL)
    it = 0
    q_i = 0
    if PROF:  # cycles: all, waiting for keys, in the MMA, waiting for a free score slot, in releases
        t_all, t_kready, t_mma, t_sfree, t_rel = _prof_start(prof, 2 + PAR)
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        npass = _passes(group_pass, r0, R)
        wrow = r0 + cols // NHEADS
        w = gl.load(w_ptr + wrow.to(gl.int64) * NHEADS + cols % NHEADS, mask=wrow < n_rows, other=0.0)
        qs = q_i % 2
        if MX:  # each warpgroup widens the group's queries into its own buffer
            # the weights wait in shared memory: registers hold the widened keys beside the accumulator
            wbuf.index(PAR).store(w)
            qt = qbuf.index(PAR)
            _mx_queries(q_ptr, qs_ptr, qt, r0, n_rows, R)
            fence_async_shared()  # written through the generic proxy, read by the MMA's async one
            gl.thread_barrier()
        else:
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
                if MX:
                    kpage = kbuf.index(s)
                    kscales = sbuf.index(s).reshape([PAGE, NCHUNKS])
                    a = _mx_keys(kpage, kscales, AL, PL, SPREAD, NCHUNKS)
                    # the stage was read through the generic proxy; the next copy writes through the async one
                    fence_async_shared()
                    _release(kfree.index(s))
                    acc = warpgroup_mma(a, qt, zero, use_acc=False, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                else:
                    acc = warpgroup_mma(kbuf.index(s), qt, zero, use_acc=False, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                if PROF:
                    c2 = _clock()
                    t_mma += c2 - c1
                if MX:
                    w = wbuf.index(PAR).load(WL)
                sc = tile_scores(acc, w, sbuf.index(s), weight_scale, R, MX)
                if not MX:
                    fence_async_shared()  # as above, for the key scales
                if PROF:
                    c3 = _clock()
                if not MX:
                    _release(kfree.index(s))
                b, ph = _step_barrier(g, SLOTS, G)
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
                b, ph = _step_barrier(g, SLOTS, G)
                mbarrier.wait(sfree.index(b), ph ^ 1)
                _release(sready.index(b))
        it += total
        if not MX:
            _release(qfree.index(qs))
        q_i += 1
    if PROF:
        _prof_store(prof, 2 + PAR, _clock() - t_all, t_kready, t_mma, t_sfree, t_rel)


@gluon.jit
def hopper_stream_kernel(
    q_desc, k_desc, s_desc, w_ptr, pt_ptr, stride_pt, n_pages, width, seq_lens, n_rows, weight_scale,
    group_pass, buf_key_all, buf_pos_all, seg_key, seg_pos, seg_cnt, n_items, split_span, splits, q_ptr, qs_ptr,
    R: gl.constexpr, TOPK: gl.constexpr, CAP: gl.constexpr, TILE: gl.constexpr, KSTAGES: gl.constexpr,
    SLOTS: gl.constexpr, KEY_ROWS: gl.constexpr, SCALE_COL: gl.constexpr, G: gl.constexpr,
    PARTS: gl.constexpr, SCORE_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, NSCORE: gl.constexpr,
    MX: gl.constexpr = False, NO_SELECT: gl.constexpr = False, prof=None, PROF: gl.constexpr = False,
):
    """Per work item and row of its group, the row's best ``min(TOPK, entries)`` (key, position)
    pairs, unordered, at ``seg_key / seg_pos [(row * splits + split) * TOPK ...]`` and their count
    at ``seg_cnt[row * splits + split]`` (see the module docstring). ``MX``: the ``sglang_mxfp4``
    cache (``q_desc`` unused; the queries come widened from ``q_ptr`` / ``qs_ptr``), else the FP8
    one (``q_ptr`` / ``qs_ptr`` unused); ``NSCORE`` score warpgroups."""
    kbuf = gl.allocate_shared_memory(k_desc.dtype, [KSTAGES] + k_desc.block_type.shape, k_desc.layout)
    sbuf = gl.allocate_shared_memory(s_desc.dtype, [KSTAGES] + s_desc.block_type.shape, s_desc.layout)
    if MX:  # one widened copy per score warpgroup: [128 (d), R * 64] bf16, as the shared tile stores it
        qbuf = gl.allocate_shared_memory(
            gl.bfloat16, [NSCORE, DIM, R * NHEADS], gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        )
        wbuf = gl.allocate_shared_memory(gl.float32, [NSCORE, R * NHEADS], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    else:
        qbuf = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
        wbuf = qbuf  # unused: the FP8 tile keeps its weights in registers
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
        mbarrier.init(sready.index(i), count=G)  # a step's G visits arrive
        mbarrier.init(sfree.index(i), count=1)

    # partition arguments spelled out per partition: a tuple of them held in a variable loses its
    # constexprs; the partition list is fixed when traced, hence one call per warpgroup count
    if NSCORE == 3:
        gl.warp_specialize(
            [
                (_select_partition, (
                    ring, sready, sfree, seq_lens, n_rows, width, group_pass, buf_key_all, buf_pos_all, seg_key,
                    seg_pos, seg_cnt, n_items, split_span, splits, R, TOPK, CAP, TILE, SLOTS, G, PARTS, NO_SELECT,
                    prof, PROF,
                )),
                (_load_partition, (
                    q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree, pt_ptr, stride_pt,
                    n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, KEY_ROWS,
                    SCALE_COL, G, MX, prof, PROF,
                )),
                (_score_partition, (
                    0, NSCORE, kbuf, sbuf, qbuf, wbuf, ring, kready, kfree, qready, qfree, sready, sfree, w_ptr,
                    weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, q_ptr, qs_ptr,
                    R, KSTAGES, SLOTS, G, MX, prof, PROF,
                )),
                (_score_partition, (
                    1, NSCORE, kbuf, sbuf, qbuf, wbuf, ring, kready, kfree, qready, qfree, sready, sfree, w_ptr,
                    weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, q_ptr, qs_ptr,
                    R, KSTAGES, SLOTS, G, MX, prof, PROF,
                )),
                (_score_partition, (
                    2, NSCORE, kbuf, sbuf, qbuf, wbuf, ring, kready, kfree, qready, qfree, sready, sfree, w_ptr,
                    weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, q_ptr, qs_ptr,
                    R, KSTAGES, SLOTS, G, MX, prof, PROF,
                )),
            ],
            [1, SCORE_WARPS, SCORE_WARPS, SCORE_WARPS],
            [LOAD_REGS, SCORE_REGS, SCORE_REGS, SCORE_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_select_partition, (
                    ring, sready, sfree, seq_lens, n_rows, width, group_pass, buf_key_all, buf_pos_all, seg_key,
                    seg_pos, seg_cnt, n_items, split_span, splits, R, TOPK, CAP, TILE, SLOTS, G, PARTS, NO_SELECT,
                    prof, PROF,
                )),
                (_load_partition, (
                    q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree, pt_ptr, stride_pt,
                    n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, R, KSTAGES, KEY_ROWS,
                    SCALE_COL, G, MX, prof, PROF,
                )),
                (_score_partition, (
                    0, NSCORE, kbuf, sbuf, qbuf, wbuf, ring, kready, kfree, qready, qfree, sready, sfree, w_ptr,
                    weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, q_ptr, qs_ptr,
                    R, KSTAGES, SLOTS, G, MX, prof, PROF,
                )),
                (_score_partition, (
                    1, NSCORE, kbuf, sbuf, qbuf, wbuf, ring, kready, kfree, qready, qfree, sready, sfree, w_ptr,
                    weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits, q_ptr, qs_ptr,
                    R, KSTAGES, SLOTS, G, MX, prof, PROF,
                )),
            ],
            [1, SCORE_WARPS, SCORE_WARPS],
            [LOAD_REGS, SCORE_REGS, SCORE_REGS],
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
    TOPK: tl.constexpr, TILE: tl.constexpr, POSITION: tl.constexpr = False,
):
    """One program per (row, split): the at most ``TOPK`` unordered entries a streaming kernel left
    for it (in the row's output slots with one split, else in its split list) become the row's
    outputs (in ascending positions with ``POSITION``), or a split list in position order for the
    merge kernel."""
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
    # the stream leaves at most TOPK entries per list (its item end cuts), so no cut here: the
    # registers a cut's tile would hold would halve the programs an SM runs at once
    _finish_row(
        buf_key, buf_pos, tl.minimum(count, TOPK), seq_len, row, split, splits, pt_ptr, stride_pt,
        out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, TOPK, TILE, False, POSITION,
    )


# ---- host side ----


def hopper_descriptors(inputs, cfg) -> "HopperDescriptors":
    """Bulk-copy descriptors of :func:`hopper_stream_kernel` for these inputs (where
    :func:`stream_unfit` found nothing against them).

    FP8: the queries ``[rows * 64, 128]`` e4m3, the key pages ``[64, 128]`` e4m3 and their scales
    ``[1, 64]`` fp32. ``sglang_mxfp4``: the packed key pages ``[64, 64]`` bytes and their scale
    bytes ``[1, 256]`` (the queries are read by pointer and widened in the kernel; the query
    descriptor is the keys', unused)."""
    q, kc = inputs.q, inputs.k_cache
    layout = inputs.layout
    geo = GEOMETRY[layout]
    page_bytes = geo.page_bytes
    pages, rows = kc.shape[0], q.shape[0]
    raw = kc.view(torch.uint8).reshape(-1)[: pages * page_bytes]
    if layout is Layout.SGLANG_MXFP4:
        # the cache as [pages * KEY_ROWS, 64] bytes: page p's packed keys are rows p * KEY_ROWS .. + 63
        key_rows = page_bytes // geo.slot_payload_bytes
        keys = GluonDescriptor(raw.view(pages * key_rows, geo.slot_payload_bytes), [pages * key_rows, geo.slot_payload_bytes],
                               [geo.slot_payload_bytes, 1], [PAGE_SIZE, geo.slot_payload_bytes],
                               gl.NVMMASharedLayout.get_default_for([PAGE_SIZE, geo.slot_payload_bytes], gl.uint8))
        scales = GluonDescriptor(raw.view(pages, page_bytes), [pages, page_bytes], [page_bytes, 1],
                                 [1, PAGE_SIZE * CHUNKS],
                                 gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2))
        return HopperDescriptors(keys, keys, scales, key_rows, geo.scale_offset)

    # the cache as [pages * KEY_ROWS, 128] bytes: page p's keys are rows p * KEY_ROWS .. + 63
    key_rows = page_bytes // HEAD_DIM
    keys = raw.view(pages * key_rows, HEAD_DIM)
    scales = raw.view(torch.float32).view(pages, page_bytes // 4)
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
        geo.scale_offset // 4,
    )


@dataclass(frozen=True)
class HopperDescriptors:
    queries: object
    keys: object
    scales: object
    key_rows: int  # descriptor rows per cache page (128 bytes each for FP8, 64 for MXFP4)
    scale_col: int  # where a page's key scales start: its fp32 word (FP8) or byte (MXFP4)


def stream_unfit(inputs, ka, cfg) -> Optional[str]:
    """Why :func:`hopper_stream_kernel` cannot serve these ``sglang_fp8`` or ``sglang_mxfp4`` inputs
    on a GPU, or ``None``: it needs an sm_90 GPU, the legacy tile's configuration, 16-byte aligned
    contiguous queries and a non-empty 16-byte aligned cache; for MXFP4 also the Triton whose
    ``tl.dot_scaled`` lowering it reproduces (:data:`indexer_topk.versions.MX_STREAM_TRITON`)."""
    if torch.cuda.get_device_capability(ka.kc.device) != (9, 0):
        return "it needs an sm_90 GPU"
    if cfg.rows not in (1, 2) or cfg.num_warps != 4:
        return "it is built for the 1- and 2-row tiles on four warps"
    q, kc = inputs.q, inputs.k_cache
    if not q.is_contiguous() or q.data_ptr() % 16 or kc.data_ptr() % 16 or kc.shape[0] == 0:
        return "it needs contiguous, 16-byte aligned queries and a non-empty, 16-byte aligned cache"
    if inputs.layout is Layout.SGLANG_MXFP4 and not triton.__version__.startswith(MX_STREAM_TRITON):
        return (f"its MXFP4 tile reproduces Triton {MX_STREAM_TRITON}x's tl.dot_scaled on sm_90, and Triton "
                f"{triton.__version__} decodes scales differently")
    return None




@dataclass(frozen=True)
class HopperConfig:
    """The tunables of :func:`hopper_stream_kernel` (each value a separate compile); the defaults
    are the configuration measured fastest on an H200 for the FP8 cache, :meth:`for_layout` gives
    each layout's.

    * ``select_visits`` (a power of two): visits per selection step, at most the pool's pages;
    * ``select_parts`` (1, 2 or 4, at most ``select_visits``): warps per row a step is dealt to;
    * ``score_slots`` (a multiple of ``select_visits``): the score ring's depth in ``[64, R]`` tiles;
    * ``key_stages`` (a multiple of the score warpgroups): the key ring's depth;
    * ``score_groups`` (2 or 3): MMA warpgroups (for FP8 two taking turns left the tensor core idle a
      third of the time);
    * ``score_regs``, ``load_regs`` (multiples of 8): registers per thread of each score warpgroup
      and of the loader; the selection warpgroup gets the rest of the register file;
    * ``finish_warps`` (1 to 16, a power of two): warps of each :func:`finish_rows_kernel` program
      (one per row and split: a decode batch's few programs sort on few warps otherwise).
    """

    select_visits: int = 8
    select_parts: int = 4
    score_slots: int = 256
    key_stages: int = 6
    score_groups: int = 3
    score_regs: int = 104
    load_regs: int = 24
    finish_warps: int = 16

    @classmethod
    def for_layout(cls, layout, rows: int = 2) -> "HopperConfig":
        """The default configuration for ``layout`` and the tile's ``rows`` (``R``: 2 for prefill, 1
        for decode). The MXFP4 tile holds its widened keys in registers beside the accumulator, so
        it runs two score warpgroups with more registers each (three would leave the selection too
        few), and a shorter score ring (the widened queries take the shared memory). The FP8 tile of
        one row holds half the accumulator (``[64, 64]`` fp32: 32 registers a thread), so its score
        warpgroups take 72 registers and the selection the rest (240, where 144 spilled in its cut
        and measured slower at 256 x 128K on an H200); the MXFP4 tile of one row 112 (selection
        168 -> 264, capped at 256, measured faster; benchmark/results/decode/sweep_*_regs_*)."""
        if Layout(layout) is Layout.SGLANG_MXFP4:
            return cls(score_slots=128, score_groups=2, score_regs=112 if rows == 1 else 160)
        if rows == 1:
            return cls(score_regs=72)
        return cls()

    def __post_init__(self):
        v = self.select_visits
        if v < 1 or v & (v - 1):
            raise ValueError(f"select_visits: expected a power of two, got {v}")
        if self.select_parts not in (1, 2, 4) or self.select_parts > v:
            raise ValueError(f"select_parts: expected 1, 2 or 4 and at most select_visits ({v}), got {self.select_parts}")
        if self.score_slots < v or self.score_slots % v:
            raise ValueError(f"score_slots ({self.score_slots}) must be a positive multiple of select_visits ({v})")
        if self.score_groups not in (2, 3):
            raise ValueError(f"score_groups: expected 2 or 3, got {self.score_groups}")
        if self.key_stages < 1 or self.key_stages % self.score_groups:
            # a stage used by two warpgroups lets the later one pass its wait on the earlier visit's
            # phase (the parity test cannot tell the phases apart): stale keys or a deadlock
            raise ValueError(
                f"key_stages ({self.key_stages}) must be a positive multiple of the {self.score_groups} score warpgroups"
            )
        for name in ("score_regs", "load_regs"):
            regs = getattr(self, name)
            if regs < 24 or regs > 256 or regs % 8:
                raise ValueError(f"{name}: expected a multiple of 8 from 24 to 256, got {regs}")
        if self.finish_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"finish_warps: expected 1, 2, 4, 8 or 16, got {self.finish_warps}")
        if self.select_regs < 24:
            raise ValueError(f"score_regs {self.score_regs} and load_regs {self.load_regs} leave the selection no registers")

    def launch_regs(self) -> int:
        """Registers per thread at launch: the CTA's whole register file (64K) over its
        warpgroups (selection, loader padded to a warpgroup, score), in the 8-register steps the
        hardware allocates; ``setmaxnreg`` then moves them between partitions."""
        return REGISTER_FILE // (128 * (2 + self.score_groups)) // 8 * 8

    @property
    def select_regs(self) -> int:
        """Registers per thread left to the selection warpgroup (the loader counts as a warpgroup)."""
        launched = self.launch_regs() * 128 * (2 + self.score_groups)
        free = launched - 128 * (self.load_regs + self.score_groups * self.score_regs)
        return min(free // 128 // 8 * 8, 256)


REGISTER_FILE = 65536  # 32-bit registers per SM, all of them one CTA's
