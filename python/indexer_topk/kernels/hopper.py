"""The fused stream on Hopper, warp-specialised (Gluon): loads, MMAs and selection overlap.

The plain-Triton fused kernel (:mod:`.fused`) takes turns: a program scores a strip of pages,
then stops its MMAs to select. Here each program is split into partitions that run at once and
talk through shared-memory rings guarded by mbarriers:

* **load** (1 warp): per visit, the page id from the page table, then one bulk copy of the
  page's 64 e4m3 keys and one of its 64 fp32 key scales into a ``KSTAGES``-deep ring; per work
  item, one bulk copy of the group's queries;
* **score** (two warpgroups, even and odd visits): the MMA ``[64 keys] x [R * 64 heads]`` and the
  head reduction of the shared tile (:func:`tile_scores`, the same operations, layouts and
  hence bits as :func:`indexer_topk.kernels.score.page_scores`), into a ring of ``SLOTS``
  ``[64, R]`` score tiles;
* **select** (the default warpgroup): takes each score tile, appends the scores that beat their
  row's gate to the row's candidate buffer (global scratch, as in :mod:`.fused`), cuts a buffer
  that would overflow to its best ``TOPK`` (raising the gate), and at the end of an item cuts
  each row to ``TOPK`` and writes it, unordered, to the row's output slot (one split) or split
  list. :func:`indexer_topk.kernels.fused.finish_rows_kernel` then orders and writes the outputs.

Work items (a group of ``R`` rows and one context split) are dealt round-robin to a persistent
grid; every partition walks the same items and visits, so ring slots and barrier phases follow
from a running visit count. Pages are visited in the golden-ratio order of :mod:`.fused`.
A group whose rows do not share their pages (``group_pass[g] == R``) is scored once per row,
each pass with that row's pages, keeping only that row's column: the same bits.

Only the ``sglang_fp8`` layout and ``R = 2`` (one N = 128 MMA on four warps, the legacy tile's
configuration) are built here; the module is imported only where Gluon and an sm_90 GPU exist.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
import triton.language as tl

from .common import COMP_MIN, INT32_MAX, INT64_MAX, KEY_MIN, KEY_NAN, LOW32
from .fused import GOLDEN
from .geometry import NHEADS, PAGE

# The score tile: keys on M (4 warps x 16), R * 64 query heads on N, k32 e4m3 steps.
SCORE_WARPS = gl.constexpr(4)
# Registers per thread of the worker partitions; the selection gets the rest of the 128 x 16 warps.
SCORE_REGS = gl.constexpr(168)
SCORE_REGS_LOAD = gl.constexpr(40)


@gluon.jit
def _gcd(a, b):
    while b != 0:
        a, b = b, a % b
    return a


@gluon.jit
def _visit_step(n):
    step = gl.maximum((n.to(gl.int64) * GOLDEN >> 20).to(gl.int32), 1)
    while _gcd(n, step) != 1:
        step += 1
    return step


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
def tile_scores(acc, w, kscale, weight_scale, R: gl.constexpr):
    """``[64, R]`` scores from the MMA accumulator ``[64, R * 64]`` (see
    :func:`indexer_topk.kernels.score.page_scores`: the same operations on the same layouts)."""
    acc = gl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)
    s = gl.sum(gl.reshape(acc * gl.expand_dims(w, 0), [PAGE, R, NHEADS]), axis=2) + 0.0
    s = s * gl.expand_dims(gl.convert_layout(kscale, gl.SliceLayout(1, s.type.layout)), 1)
    return s * weight_scale


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
def _cut(buf_key, buf_pos, count, TOPK: gl.constexpr, TILE: gl.constexpr, L1: gl.constexpr, HL: gl.constexpr):
    """Cut a buffer of ``TOPK < count <= TILE`` entries to its best ``TOPK`` at the front (as
    :func:`indexer_topk.kernels.candidates.cut`); returns the new gate ``(key, position)``."""
    offs = gl.arange(0, TILE, layout=L1)
    valid = offs < count
    key = gl.load(buf_key + offs, mask=valid, other=0)
    pos = gl.load(buf_pos + offs, mask=valid, other=0)
    comp = (key.to(gl.int64) << 32) | (pos.to(gl.int64) ^ LOW32)
    tb, shift = _threshold(comp ^ COMP_MIN, valid, TOPK + count * 0, HL)
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
def _select_partition(
    ring, sready, sfree, seq_lens, n_rows, width, group_pass, buf_key_all, buf_pos_all,
    seg_key, seg_pos, seg_cnt, n_items, split_span, splits,
    R: gl.constexpr, TOPK: gl.constexpr, CAP: gl.constexpr, TILE: gl.constexpr, SLOTS: gl.constexpr,
):
    NW: gl.constexpr = 4
    # each row's 64 scores in one warp (two warps per row): the row's scans stay in the warp
    SL: gl.constexpr = gl.BlockedLayout([2, 1], [32, 1], [1, NW], [0, 1])
    RL: gl.constexpr = gl.SliceLayout(0, SL)
    L1: gl.constexpr = _vector_layout(TILE, NW)
    TL: gl.constexpr = _vector_layout(TOPK, NW)
    HL: gl.constexpr = _vector_layout(512, NW)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    key_base = buf_key_all + pid.to(gl.int64) * (R * CAP)
    pos_base = buf_pos_all + pid.to(gl.int64) * (R * CAP)
    rr = gl.arange(0, R, layout=RL)
    lane = gl.expand_dims(gl.arange(0, PAGE, layout=gl.SliceLayout(1, SL)), 1)
    row_off = gl.expand_dims(rr, 0) * CAP
    it = 0
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        lens = gl.load(seq_lens + r0 + rr, mask=r0 + rr < n_rows, other=0)
        hi = gl.minimum(gl.minimum(lo + split_span, width), gl.max(lens, axis=0))
        ends = gl.maximum(gl.minimum(lens, hi), lo)
        npass = gl.load(group_pass + r0 // R)
        for p in range(npass):
            active = (rr == p) | (npass == 1)
            count = gl.zeros([R], gl.int32, layout=RL)
            gate_key = gl.full([R], KEY_MIN, gl.int32, layout=RL)
            gate_pos = gl.full([R], INT32_MAX, gl.int32, layout=RL)
            v = 0
            for i in range(n):
                t = it % SLOTS
                mbarrier.wait(sready.index(t), (it // SLOTS) & 1)
                s = ring.index(t).load(SL)
                mbarrier.arrive(sfree.index(t), count=1)
                it += 1
                key = _ordered_key(s)
                pos = lo + v * PAGE + lane
                gk = gl.expand_dims(gate_key, 0)
                gp = gl.expand_dims(gate_pos, 0)
                take = (pos < gl.expand_dims(ends, 0)) & gl.expand_dims(active, 0)
                take = take & ((key > gk) | ((key == gk) & (pos < gp)))
                n_take = gl.sum(take.to(gl.int32), axis=0)
                if gl.max(count + n_take, axis=0) > CAP:
                    gl.thread_barrier()  # every earlier entry is in scratch
                    for r in range(R):  # a loop, not unrolled: one copy of the cut
                        c = _pick(count, r, 0)
                        if c + _pick(n_take, r, 0) > CAP:
                            gkr, gpr = _cut(key_base + r * CAP, pos_base + r * CAP, c, TOPK, TILE, L1, HL)
                            gate_key = gl.where(rr == r, gkr, gate_key)
                            gate_pos = gl.where(rr == r, gpr, gate_pos)
                            count = gl.where(rr == r, TOPK, count)
                    gk = gl.expand_dims(gate_key, 0)
                    gp = gl.expand_dims(gate_pos, 0)
                    take = take & ((key > gk) | ((key == gk) & (pos < gp)))
                    n_take = gl.sum(take.to(gl.int32), axis=0)
                take_i = take.to(gl.int32)
                dst = gl.expand_dims(count, 0) + gl.associative_scan(take_i, 0, _add) - take_i
                gl.store(key_base + row_off + dst, key, mask=take)
                gl.store(pos_base + row_off + dst, pos + row_off * 0, mask=take)
                count = count + n_take
                v += step
                v = gl.where(v >= n, v - n, v)
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


@gluon.jit
def _load_partition(
    q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree,
    pt_ptr, stride_pt, n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span, splits,
    R: gl.constexpr, KSTAGES: gl.constexpr, KEY_ROWS: gl.constexpr, SCALE_COL: gl.constexpr,
):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    q_i = 0
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        npass = gl.load(group_pass + r0 // R)
        qs = q_i % 2
        mbarrier.wait(qfree.index(qs), ((q_i // 2) & 1) ^ 1)
        mbarrier.expect(qready.index(qs), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [r0 * NHEADS, 0], qready.index(qs), qbuf.index(qs))
        q_i += 1
        for p in range(npass):
            src = gl.where(npass == 1, lead, r0 + p)
            pt_row = pt_ptr + src.to(gl.int64) * stride_pt + lo // PAGE
            v = 0
            page = gl.load(pt_row, mask=n > 0, other=0)
            for i in range(n):
                v_next = v + step
                v_next = gl.where(v_next >= n, v_next - n, v_next)
                # the next page id is read before this page's copies are issued
                page_next = gl.load(pt_row + v_next, mask=i + 1 < n, other=0)
                ok = (page >= 0) & (page < n_pages)
                s = it % KSTAGES
                mbarrier.wait(kfree.index(s), ((it // KSTAGES) & 1) ^ 1)
                mbarrier.expect(kready.index(s), k_desc.block_type.nbytes + s_desc.block_type.nbytes)
                # a page outside the cache reads as zeros: a negative coordinate is out of bounds
                tma.async_copy_global_to_shared(
                    k_desc, [gl.where(ok, page * KEY_ROWS, -PAGE), 0], kready.index(s), kbuf.index(s)
                )
                tma.async_copy_global_to_shared(
                    s_desc, [gl.where(ok, page, -1), SCALE_COL], kready.index(s), sbuf.index(s)
                )
                it += 1
                page = page_next
                v = v_next


@gluon.jit
def _score_partition(
    PAR: gl.constexpr, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
    w_ptr, weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits,
    R: gl.constexpr, KSTAGES: gl.constexpr, SLOTS: gl.constexpr,
):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[SCORE_WARPS, 1], instr_shape=[16, R * NHEADS, 32]
    )
    WL: gl.constexpr = gl.SliceLayout(0, MMA)
    KL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, SCORE_WARPS], [1, 0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    zero = gl.zeros([PAGE, R * NHEADS], gl.float32, layout=MMA)
    cols = gl.arange(0, R * NHEADS, layout=WL)
    it = 0
    q_i = 0
    for item in range(pid, n_items, nprog):
        r0, split, lo, n, step, lead = _item(item, splits, split_span, seq_lens, n_rows, width, R)
        npass = gl.load(group_pass + r0 // R)
        wrow = r0 + cols // NHEADS
        w = gl.load(w_ptr + wrow.to(gl.int64) * NHEADS + cols % NHEADS, mask=wrow < n_rows, other=0.0)
        qs = q_i % 2
        mbarrier.wait(qready.index(qs), (q_i // 2) & 1)
        qt = qbuf.index(qs).permute((1, 0))
        total = n * npass
        for j in range((PAR + 2 - it % 2) % 2, total, 2):
            g = it + j
            s = g % KSTAGES
            mbarrier.wait(kready.index(s), (g // KSTAGES) & 1)
            acc = warpgroup_mma(kbuf.index(s), qt, zero, use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            kscale = gl.reshape(sbuf.index(s).load(KL), [PAGE])
            mbarrier.arrive(kfree.index(s), count=1)
            sc = tile_scores(acc, w, kscale, weight_scale, R)
            t = g % SLOTS
            mbarrier.wait(sfree.index(t), ((g // SLOTS) & 1) ^ 1)
            ring.index(t).store(sc)
            mbarrier.arrive(sready.index(t), count=1)
        it += total
        mbarrier.arrive(qfree.index(qs), count=1)
        q_i += 1


@gluon.jit
def hopper_stream_kernel(
    q_desc, k_desc, s_desc, w_ptr, pt_ptr, stride_pt, n_pages, width, seq_lens, n_rows, weight_scale,
    group_pass, buf_key_all, buf_pos_all, seg_key, seg_pos, seg_cnt, n_items, split_span, splits,
    R: gl.constexpr, TOPK: gl.constexpr, CAP: gl.constexpr, TILE: gl.constexpr, KSTAGES: gl.constexpr,
    SLOTS: gl.constexpr, KEY_ROWS: gl.constexpr, SCALE_COL: gl.constexpr,
):
    """Per work item and row of its group, the row's best ``min(TOPK, entries)`` (key, position)
    pairs, unordered, at ``seg_key / seg_pos [(row * splits + split) * TOPK ...]`` and their count
    at ``seg_cnt[row * splits + split]`` (see the module docstring)."""
    kbuf = gl.allocate_shared_memory(k_desc.dtype, [KSTAGES] + k_desc.block_type.shape, k_desc.layout)
    sbuf = gl.allocate_shared_memory(s_desc.dtype, [KSTAGES] + s_desc.block_type.shape, s_desc.layout)
    qbuf = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    ring = gl.allocate_shared_memory(
        gl.float32, [SLOTS, PAGE, R], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
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
        mbarrier.init(qfree.index(i), count=2)  # both score warpgroups release the queries
    for i in gl.static_range(SLOTS):
        mbarrier.init(sready.index(i), count=1)
        mbarrier.init(sfree.index(i), count=1)

    gl.warp_specialize(
        [
            (
                _select_partition,
                (
                    ring, sready, sfree, seq_lens, n_rows, width, group_pass, buf_key_all, buf_pos_all,
                    seg_key, seg_pos, seg_cnt, n_items, split_span, splits, R, TOPK, CAP, TILE, SLOTS,
                ),
            ),
            (
                _load_partition,
                (
                    q_desc, k_desc, s_desc, kbuf, sbuf, qbuf, kready, kfree, qready, qfree,
                    pt_ptr, stride_pt, n_pages, seq_lens, n_rows, width, group_pass, n_items, split_span,
                    splits, R, KSTAGES, KEY_ROWS, SCALE_COL,
                ),
            ),
            (
                _score_partition,
                (
                    0, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
                    w_ptr, weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits,
                    R, KSTAGES, SLOTS,
                ),
            ),
            (
                _score_partition,
                (
                    1, kbuf, sbuf, qbuf, ring, kready, kfree, qready, qfree, sready, sfree,
                    w_ptr, weight_scale, seq_lens, n_rows, width, group_pass, n_items, split_span, splits,
                    R, KSTAGES, SLOTS,
                ),
            ),
        ],
        [1, SCORE_WARPS, SCORE_WARPS],
        [SCORE_REGS_LOAD, SCORE_REGS, SCORE_REGS],
    )
