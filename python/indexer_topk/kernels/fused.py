"""The fused streaming kernel: score key pages and keep only bounded candidate sets.

A persistent grid of programs pulls work items from an atomic counter; an item is a group of
``R`` query rows and one context split. The program scores the split a strip of ``S`` pages at
a time:

* the scoring loop scores each page for the group (``[64, R]``, the shared tile of
  :mod:`.score`) and stores the order keys to the program's staging strip in scratch
  (L2-resident), ``KEY_MIN`` past each row's length. It holds nothing else: no barrier, no
  gate, no data-dependent branch, so the compiler pipelines its bulk key copies and keeps it
  in the registers of the legacy score loop (two programs per SM);
* the flush then takes, for all rows at once, the strip's keys that beat their row's gate and
  appends them to the rows' candidate buffers with one prefix sum; a buffer they would not fit
  is first cut back to its best ``TOPK`` (:mod:`.candidates`), which raises its gate. Counts
  and gates stay in registers.

Pages are visited in a scrambled order: visit ``i`` of the split's ``n`` pages scores page
``(i * step) % n`` with ``step`` near ``n`` times the golden ratio and coprime to ``n``, a
low-discrepancy sequence that spreads the first visits over the whole context. Scores that
trend along the context then enter the candidate sets about as rarely as random ones, instead
of every new page beating the gate. The result does not depend on the visit order: gates and
cuts compare (key, position) composites.

At the end of an item each row is cut to ``TOPK`` and either written as the contract's outputs
(one split per row) or stored in position order for the merge kernel
(:func:`.select.select_rows_kernel`, segment mode). Scratch per program is ``R`` buffers of
``CAP`` keys and ``CAP`` positions and ``R`` strips of ``S * 64`` keys, plus
``rows * splits * (TOPK * 8 + 4)`` bytes for split rows: independent of the context length.
"""

import triton
import triton.language as tl

from .candidates import beats_gate, cut, order_by_position
from .common import INT32_MAX, KEY_MIN, ordered_key, pick
from .geometry import PAGE
from .score import group_rows, load_queries, pages_agree, score_page
from .select import finalize_row

# 0.6180339887 * 2**20: the scrambled visit's step is n * GOLDEN >> 20, nudged to be coprime.
GOLDEN = tl.constexpr(648056)


@triton.jit
def _gcd(a, b):
    while b != 0:
        a, b = b, a % b
    return a


@triton.jit
def visit_step(n):
    """A step coprime to ``n`` near ``n`` times the golden ratio, below ``n`` (1 for ``n <= 2``)."""
    step = tl.maximum((n.to(tl.int64) * GOLDEN >> 20).to(tl.int32), 1)
    while _gcd(n, step) != 1:
        step += 1
    return step


@triton.jit
def _stage(
    i0, i1, v, n, step, lo, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends,
    qt, w, weight_scale, strip,
    R: tl.constexpr, STRIP: tl.constexpr, LAYOUT: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
    UNIFORM: tl.constexpr, STAGES: tl.constexpr,
):
    """Score visits ``i0 .. i1`` (the first at page ``v``) into the strip: row ``r``'s key of
    visit ``i0 + k``, position ``j`` of its page, at ``strip[r * STRIP + k * 64 + j]``. Returns
    the page of visit ``i1``."""
    rows = tl.arange(0, R)[None, :] * STRIP
    lane = tl.arange(0, PAGE)[:, None]
    for i in tl.range(i0, i1, num_stages=STAGES):
        b = lo + v * PAGE
        s = score_page(
            b, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends, qt, w, weight_scale,
            R, LAYOUT, TMA, INTERPRET, UNIFORM,
        )
        key = tl.where(b + lane < ends[None, :], ordered_key(s), KEY_MIN)
        tl.store(strip + rows + (i - i0) * PAGE + lane, key)
        v += step  # the next visit: (v + step) mod n, with step < n
        v = tl.where(v >= n, v - n, v)
    return v


@triton.jit
def _flush(
    strip, filled, v0, n, step, lo, key_base, pos_base, count, gate_key, gate_pos,
    R: tl.constexpr, TOPK: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr, STRIP: tl.constexpr,
):
    """Append the strip's keys that beat their row's gate (the first ``filled`` slots of each
    row, from visits starting at page ``v0``) to the rows' buffers, all rows at once; a row whose
    entrants would not fit is cut first. ``count``, ``gate_key`` and ``gate_pos`` (``[R]``) are
    the rows' states; returns them updated.

    After a cut the buffer holds ``TOPK`` entries and ``STRIP <= CAP - TOPK``, so the strip
    always fits then.
    """
    offs = tl.arange(0, STRIP)
    page = (v0 + (offs // PAGE) * step) % n
    pos = (lo + page * PAGE + offs % PAGE)[None, :]
    rr = tl.arange(0, R)
    key = tl.load(strip + rr[:, None] * STRIP + offs[None, :], mask=offs[None, :] < filled, other=KEY_MIN)
    take = (key != KEY_MIN) & beats_gate(key, pos, gate_key[:, None], gate_pos[:, None])
    n_take = tl.sum(take.to(tl.int32), axis=1)
    if tl.max(count + n_take, axis=0) > CAP:
        for r in range(R):  # a loop, not unrolled: one copy of the cut
            c = pick(count, r, R)
            if c + pick(n_take, r, R) > CAP:
                gk, gp = cut(key_base + r * CAP, pos_base + r * CAP, c, TOPK, TILE)
                gate_key = tl.where(rr == r, gk, gate_key)
                gate_pos = tl.where(rr == r, gp, gate_pos)
                count = tl.where(rr == r, TOPK, count)
            tl.debug_barrier()
        take = take & beats_gate(key, pos, gate_key[:, None], gate_pos[:, None])
        n_take = tl.sum(take.to(tl.int32), axis=1)
    take_i = take.to(tl.int32)
    dst = count[:, None] + tl.cumsum(take_i, axis=1) - take_i
    row_base = rr[:, None] * CAP
    tl.store(key_base + row_base + dst, key, mask=take)
    tl.store(pos_base + row_base + dst, pos + 0 * key, mask=take)
    return count + n_take, gate_key, gate_pos


@triton.jit
def _finish_row(
    buf_key, buf_pos, count, seq_len, row, split, splits, pt_ptr, stride_pt,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
    TOPK: tl.constexpr, TILE: tl.constexpr, CUT: tl.constexpr = True, POSITION: tl.constexpr = False,
):
    """A row's (or, with ``splits > 1``, a split list's) at most ``CAP`` entries, in any order,
    made the row's outputs (best first; with ``POSITION``, ``order="position"``, in ascending
    positions) or a split list in position order."""
    row64 = row.to(tl.int64)
    seq_len = tl.maximum(seq_len, 0)  # with the value checks off a length may be negative
    if CUT and count > TOPK:
        cut(buf_key, buf_pos, count, TOPK, TILE)
        count = tl.minimum(count, TOPK)
        tl.debug_barrier()
    if splits == 1:
        SORT_BITS: tl.constexpr = 0 if POSITION else 64
        if POSITION:  # the sort by position is the row's only one
            order_by_position(buf_key, buf_pos, count, TOPK)
            tl.debug_barrier()
        elif seq_len <= TOPK:  # the contract keeps a short row's positions in ascending order
            order_by_position(buf_key, buf_pos, count, TOPK)
            tl.debug_barrier()
        finalize_row(
            buf_key, buf_pos, tl.minimum(tl.minimum(seq_len, TOPK), count), seq_len, pt_ptr + row64 * stride_pt,
            out_bits + row64 * TOPK, out_raw + row64 * TOPK, out_phys + row64 * TOPK, out_cnt + row, TOPK, SORT_BITS,
        )
    else:
        order_by_position(buf_key, buf_pos, count, TOPK)
        tl.debug_barrier()
        offs = tl.arange(0, TOPK)
        m = offs < count
        seg = (row64 * splits + split) * TOPK
        tl.store(seg_key + seg + offs, tl.load(buf_key + offs, mask=m, other=0), mask=m)
        tl.store(seg_pos + seg + offs, tl.load(buf_pos + offs, mask=m, other=0), mask=m)
        tl.store(seg_cnt + row64 * splits + split, count)


# Integer arguments take any value without a new compilation (Triton would otherwise specialise
# on 1 and on multiples of 16), and the split count is a run-time value: one binary per layout
# and topk serves every shape, so a server compiles it once, at start-up.
@triton.jit(do_not_specialize=["n_pages", "stride_pt", "width", "n_rows", "n_items", "split_span", "splits"])
def fused_topk_kernel(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_ptr, stride_pt, width, seq_lens, n_rows,
    weight_scale, buf_key_all, buf_pos_all, strip_all, queue, n_items, split_span,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt, splits,
    LAYOUT: tl.constexpr, R: tl.constexpr, TOPK: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr,
    STRIP: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr, STAGES: tl.constexpr,
    POSITION: tl.constexpr = False,
):
    pid = tl.program_id(0).to(tl.int64)
    key_base = buf_key_all + pid * (R * CAP)
    pos_base = buf_pos_all + pid * (R * CAP)
    strip = strip_all + pid * (R * STRIP)
    item = tl.atomic_add(queue, 1)
    while item < n_items:
        group = item // splits
        split = item % splits
        r0 = group * R
        lo = split * split_span
        ends, hi, lead = group_rows(seq_lens, r0, n_rows, lo, tl.minimum(lo + split_span, width), R)
        n = tl.maximum(tl.cdiv(hi - lo, PAGE), 0)
        step = visit_step(n)
        qt, w = load_queries(q_ptr, qs_ptr, w_ptr, r0, n_rows, R, LAYOUT, INTERPRET)
        uniform = pages_agree(pt_ptr, stride_pt, r0, ends, lead, lo, R)
        pt_lead = pt_ptr + lead.to(tl.int64) * stride_pt
        count = tl.zeros([R], tl.int32)
        gate_key = tl.full([R], KEY_MIN, tl.int32)  # every entry beats it
        gate_pos = tl.full([R], INT32_MAX, tl.int32)
        v = tl.zeros([], dtype=tl.int32)  # the page of visit i: (i * step) mod n
        for i in range(0, n, STRIP // PAGE):
            stop = tl.minimum(n, i + STRIP // PAGE)
            v0 = v
            if uniform:
                v = _stage(
                    i, stop, v, n, step, lo, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt,
                    r0, ends, qt, w, weight_scale, strip, R, STRIP, LAYOUT, TMA, INTERPRET, True, STAGES,
                )
            else:
                v = _stage(
                    i, stop, v, n, step, lo, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt,
                    r0, ends, qt, w, weight_scale, strip, R, STRIP, LAYOUT, TMA, INTERPRET, False, 1,
                )
            tl.debug_barrier()  # the whole strip, from every warp, is in place
            count, gate_key, gate_pos = _flush(
                strip, (stop - i) * PAGE, v0, n, step, lo, key_base, pos_base, count, gate_key, gate_pos,
                R, TOPK, CAP, TILE, STRIP,
            )
            tl.debug_barrier()  # no warp refills the strip before every warp has read it
        for r in range(R):
            row = r0 + r
            if row < n_rows:
                # positions past the page table do not exist (a longer length is possible only
                # with the value checks off)
                seq_len = tl.minimum(tl.load(seq_lens + row), width)
                _finish_row(
                    key_base + r * CAP, pos_base + r * CAP, pick(count, r, R), seq_len, row, split, splits,
                    pt_ptr, stride_pt, out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
                    TOPK, TILE, True, POSITION,
                )
                tl.debug_barrier()
        item = tl.atomic_add(queue, 1)


@triton.jit
def clear_queue_kernel(queue):
    """Reset the work queue of :func:`fused_topk_kernel` (a Triton launch rather than a torch
    ``zero_``, so the call's host work stays a replayable sequence of launches)."""
    tl.store(queue, 0)
