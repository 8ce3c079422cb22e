"""The fused streaming kernel: score key pages and keep only bounded candidate sets.

A persistent grid of programs pulls work items from an atomic counter; an item is a group of
``R`` query rows and one context split. For each page of 64 keys the program computes the
group's ``[64, R]`` scores with the shared tile (:mod:`.score`), turns them into order keys, and
every key that beats its row's gate claims a slot in the row's candidate buffer
(:mod:`.candidates`). The scoring loop holds no barrier, so the compiler pipelines its key
copies; it runs in stretches short enough that no buffer can overflow (``free // 64`` pages,
each page adding at most 64 entries to a row). Between stretches the counters are read and a
buffer with fewer than ``MIN_FREE`` free slots is cut back to ``TOPK``, raising its gate.

Pages are visited in a scrambled order: page ``i`` of the split's ``n`` is
``(i * step) % n`` with ``step`` near ``n`` times the golden ratio and coprime to ``n``, a
low-discrepancy sequence that spreads the first visits over the whole context. Scores that
trend along the context then enter the candidate sets about as rarely as random ones, instead
of every new page beating the gate. The result does not depend on the visit order: gates and
cuts compare (key, position) composites.

At the end of an item each row is cut to ``TOPK`` and either written as the contract's outputs
(one split per row) or stored in position order for the merge kernel
(:func:`.select.select_rows_kernel`, segment mode). Scratch per program is ``R`` buffers of
``CAP`` keys and ``CAP`` positions and ``R`` counters, plus ``rows * SPLITS * (TOPK * 8 + 4)``
bytes for split rows: independent of the context length.
"""

import triton
import triton.language as tl

from .candidates import beats_gate, claim, cut, no_gate, order_by_position, read_count
from .geometry import PAGE
from .score import group_rows, load_queries, pages_agree, score_page
from .select import finalize_row
from .common import KEY_MIN, ordered_key

# 0.6180339887 * 2**20: the scrambled visit's step is n * GOLDEN >> 20, nudged to be coprime.
GOLDEN = tl.constexpr(648056)
AGREE_CHUNK = tl.constexpr(256)


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
def _stretch(
    i0, i1, v, n, step, lo, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends,
    qt, w, weight_scale, gate_key, gate_pos, counters, key_base, pos_base,
    R: tl.constexpr, CAP: tl.constexpr, LAYOUT: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
    UNIFORM: tl.constexpr, STAGES: tl.constexpr,
):
    """Score visits ``i0 .. i1`` (the first at page ``v`` of the split) and claim slots for every
    key beating its row's gate; returns the page of visit ``i1``."""
    for _ in tl.range(i0, i1, num_stages=STAGES):
        b = lo + v * PAGE
        s = score_page(
            b, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends, qt, w, weight_scale,
            R, LAYOUT, TMA, INTERPRET, UNIFORM,
        )
        pos = b + tl.arange(0, PAGE)[:, None]
        key = ordered_key(s)
        take = (pos < ends[None, :]) & beats_gate(key, pos, gate_key[None, :], gate_pos[None, :])
        entrants = tl.where(take, key, KEY_MIN)
        # a page with no entrant skips the claims, whose memory operations need the entrants
        # moved out of the tile's layout
        if tl.max(tl.max(entrants, axis=1), axis=0) > KEY_MIN:
            claim(counters, key_base, pos_base, entrants, b, R, CAP, PAGE)
        v += step  # the next visit: (v + step) mod n, with step < n
        v = tl.where(v >= n, v - n, v)
    return v


@triton.jit
def _finish_row(
    buf_key, buf_pos, cnt_ptr, count, seq_len, row, split, pt_ptr, stride_pt,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
    TOPK: tl.constexpr, TILE: tl.constexpr, SPLITS: tl.constexpr,
):
    row64 = row.to(tl.int64)
    seq_len = tl.maximum(seq_len, 0)  # with the value checks off a length may be negative
    if count > TOPK:
        cut(buf_key, buf_pos, cnt_ptr, count, TOPK, TILE)
        count = tl.minimum(count, TOPK)
        tl.debug_barrier()
    if SPLITS == 1:
        if seq_len <= TOPK:  # the contract keeps a short row's positions in ascending order
            order_by_position(buf_key, buf_pos, count, TOPK)
            tl.debug_barrier()
        finalize_row(
            buf_key, buf_pos, tl.minimum(seq_len, TOPK), seq_len, pt_ptr + row64 * stride_pt,
            out_bits + row64 * TOPK, out_raw + row64 * TOPK, out_phys + row64 * TOPK, out_cnt + row, TOPK,
        )
    else:
        order_by_position(buf_key, buf_pos, count, TOPK)
        tl.debug_barrier()
        offs = tl.arange(0, TOPK)
        m = offs < count
        seg = (row64 * SPLITS + split) * TOPK
        tl.store(seg_key + seg + offs, tl.load(buf_key + offs, mask=m, other=0), mask=m)
        tl.store(seg_pos + seg + offs, tl.load(buf_pos + offs, mask=m, other=0), mask=m)
        tl.store(seg_cnt + row64 * SPLITS + split, count)


@triton.jit
def fused_topk_kernel(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_ptr, stride_pt, width, seq_lens, n_rows,
    weight_scale, buf_key_all, buf_pos_all, counters_all, queue, n_items, split_span,
    out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
    LAYOUT: tl.constexpr, R: tl.constexpr, TOPK: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr,
    MIN_FREE: tl.constexpr, SPLITS: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
    STAGES: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rr = tl.arange(0, R)
    key_base = buf_key_all + pid * (R * CAP)
    pos_base = buf_pos_all + pid * (R * CAP)
    counters = counters_all + pid * R
    item = tl.atomic_add(queue, 1)
    while item < n_items:
        group = item // SPLITS
        split = item % SPLITS
        r0 = group * R
        lo = split * split_span
        ends, hi, lead = group_rows(seq_lens, r0, n_rows, lo, tl.minimum(lo + split_span, width), R)
        n = tl.maximum(tl.cdiv(hi - lo, PAGE), 0)
        step = visit_step(n)
        qt, w = load_queries(q_ptr, qs_ptr, w_ptr, r0, n_rows, R, LAYOUT, INTERPRET)
        uniform = pages_agree(pt_ptr, stride_pt, r0, ends, lead, lo, R, AGREE_CHUNK)
        pt_lead = pt_ptr + lead.to(tl.int64) * stride_pt
        tl.atomic_xchg(counters + rr, tl.zeros([R], tl.int32), sem="relaxed")
        gate_key, gate_pos = no_gate(R)
        fullest = tl.zeros([], dtype=tl.int32)
        tl.debug_barrier()
        i = tl.zeros([], dtype=tl.int32)
        v = tl.zeros([], dtype=tl.int32)  # the page visit i scores: (i * step) mod n
        while i < n:
            # pages that fit whatever they hold: each adds at most 64 entries to a row
            stop = tl.minimum(n, i + (CAP - fullest) // PAGE)
            if uniform:
                v = _stretch(
                    i, stop, v, n, step, lo, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends,
                    qt, w, weight_scale, gate_key, gate_pos, counters, key_base, pos_base,
                    R, CAP, LAYOUT, TMA, INTERPRET, True, STAGES,
                )
            else:
                v = _stretch(
                    i, stop, v, n, step, lo, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends,
                    qt, w, weight_scale, gate_key, gate_pos, counters, key_base, pos_base,
                    R, CAP, LAYOUT, TMA, INTERPRET, False, 1,
                )
            i = stop
            tl.debug_barrier()  # every claim and store of the program has landed
            fullest = tl.zeros([], dtype=tl.int32)
            for r in range(R):  # a loop, not unrolled: one copy of the cut in the binary
                count = read_count(counters + r)
                if count > CAP - MIN_FREE:
                    gk, gp = cut(key_base + r * CAP, pos_base + r * CAP, counters + r, count, TOPK, TILE)
                    gate_key = tl.where(rr == r, gk, gate_key)
                    gate_pos = tl.where(rr == r, gp, gate_pos)
                    count = tl.zeros([], dtype=tl.int32) + TOPK
                fullest = tl.maximum(fullest, count)
            tl.debug_barrier()
        for r in range(R):
            row = r0 + r
            if row < n_rows:
                count = read_count(counters + r)
                # positions past the page table do not exist (a longer length is possible only
                # with the value checks off)
                seq_len = tl.minimum(tl.load(seq_lens + row), width)
                _finish_row(
                    key_base + r * CAP, pos_base + r * CAP, counters + r, count, seq_len, row, split,
                    pt_ptr, stride_pt, out_bits, out_raw, out_phys, out_cnt, seg_key, seg_pos, seg_cnt,
                    TOPK, TILE, SPLITS,
                )
                tl.debug_barrier()
        item = tl.atomic_add(queue, 1)
