"""Top-k of key-matrix rows that reads each row once.

The legacy path's select stage. A persistent grid of programs takes rows in turn; a row is read
in register tiles of ``TILE`` keys, in position order:

* a row of at most ``TILE`` keys is one tile: its k-th key is found in registers and the tile's
  selected entries are written, in position order, straight to the row's outputs;
* a longer row streams its tiles through a candidate pool of ``CAP = 2 * TOPK`` entries (the
  program's slice of scratch, L2-resident). A tile's keys that reach the row's gate are appended
  with one prefix sum; when they would not fit, the pool is first cut to its best ``TOPK``,
  which raises the gate, and a tile that alone still holds more entrants than fit is cut to its
  own best ``TOPK`` in registers first. After the last tile the pool is cut to ``TOPK``.

The k-th key of a tile is searched with 5-bit radix digits (32-bin histograms; the last digit is 2 bits) from the top,
stopping once the boundary bucket is taken whole: ``tl.histogram`` counts a bin with a ballot
per digit bit and a popcount per bin a lane owns, so its cost grows with the bins, and seven
passes of 32 bins cost a third of four passes of 256.

Storage order is position order everywhere (tiles are read in order, cuts keep order), so the
tie rule is the select stage's: every key above the k-th, then the first keys equal to it. A
later entry enters a cut pool only if it beats the k-th strictly (:func:`.select.next_gate`).
The selection is the contract's and :func:`.select.finalize_row` sorts and writes it.
"""

import triton
import triton.language as tl

from .common import KEY_MIN
from .select import finalize_row, next_gate, take_mask

@triton.jit
def digit_pass(b, valid, tb, need, SH: tl.constexpr, W: tl.constexpr, BINS: tl.constexpr):
    """One radix step on the ``W``-bit digit at ``SH`` of the biased keys ``b`` that share the
    threshold prefix ``tb`` above it: returns ``(need, tb, whole)`` as :func:`.select.radix_update`."""
    m = valid
    if SH + W < 32:
        m = m & ((b >> (SH + W)) == (tb >> (SH + W)))
    # entries left out count in bin 0 and are taken back out: a histogram of BINS bins, not
    # 2 * BINS with a sentinel bin, costs half the ballots' popcounts
    hist = tl.histogram(tl.where(m, (b >> SH) & (BINS - 1), 0), BINS)
    bins = tl.arange(0, BINS)
    left_out = tl.sum((m == 0).to(tl.int32), axis=0)
    hist = hist - tl.where(bins == 0, left_out, 0)
    ge = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    digit = tl.max(tl.where(ge >= need, bins, -1), axis=0)
    above = tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    bucket = tl.sum(tl.where(bins == digit, hist, 0), axis=0)
    need = need - above
    return need, tb | (digit << SH), bucket == need


@triton.jit
def tile_kth(key, valid, k):
    """The k-th largest valid key of a register tile (int32 keys; needs more than ``k`` valid).

    Returns ``(t, shift, need)``: the top k are the keys whose ``key >> shift`` exceeds
    ``t >> shift`` and the first ``need`` (storage order) with ``key >> shift == t >> shift``;
    ``shift`` is 0 unless the boundary bucket was taken whole (see :func:`.select.take_mask`).
    """
    b = key ^ KEY_MIN  # sign bit flipped: unsigned order is key order
    zero = tl.zeros([], dtype=tl.int32)
    tb = zero
    need = zero + k
    shift = zero
    done = zero
    # digits of 5 bits from bit 27 down, then the last 2: seven passes at most
    for p in tl.static_range(7):
        SH: tl.constexpr = 27 - 5 * p if p < 6 else 0
        W: tl.constexpr = 5 if p < 6 else 2
        BINS: tl.constexpr = 32 if p < 6 else 4
        if done == 0:
            need, tb, whole = digit_pass(b, valid, tb, need, SH, W, BINS)
            shift = zero + SH
            if whole:
                done = zero + 1
    return tb ^ KEY_MIN, shift, need


@triton.jit
def append(dst_key, dst_pos, count, key, pos, take):
    """Write the taken entries of a tile at ``dst[count ..]``, in storage order; returns their number."""
    take_i = take.to(tl.int32)
    dst = count + tl.cumsum(take_i, axis=0) - take_i
    tl.store(dst_key + dst, key, mask=take)
    tl.store(dst_pos + dst, pos, mask=take)
    return tl.sum(take_i, axis=0)


@triton.jit
def cut_pool(pool_key, pool_pos, count, dst_key, dst_pos, TOPK: tl.constexpr, CAP: tl.constexpr):
    """Cut a pool of ``TOPK < count <= CAP`` entries (storage order) to its best ``TOPK``,
    written in storage order to ``dst`` (which may be the pool). Returns the gate a later entry
    must reach."""
    offs = tl.arange(0, CAP)
    valid = offs < count
    key = tl.load(pool_key + offs, mask=valid, other=0)
    pos = tl.load(pool_pos + offs, mask=valid, other=0)
    t, shift, need = tile_kth(key, valid, TOPK)
    take, _eq = take_mask(key, valid, t, shift, need, 0)
    tl.debug_barrier()  # every entry is read before the cut writes over the pool
    append(dst_key, dst_pos, 0, key, pos, take)
    return next_gate(t, shift)


@triton.jit
def select_row(src, n, out_key, out_pos, pool_key, pool_pos, TOPK: tl.constexpr, TILE: tl.constexpr):
    """Write the best ``min(n, TOPK)`` of the ``n`` keys at ``src`` (positions ``0 .. n - 1``) to
    ``out_key`` / ``out_pos`` in position order."""
    CAP: tl.constexpr = 2 * TOPK
    offs = tl.arange(0, TILE)
    if n <= TILE:
        valid = offs < n
        key = tl.load(src + offs, mask=valid, other=0)
        take = valid
        if n > TOPK:
            t, shift, need = tile_kth(key, valid, TOPK)
            take, _eq = take_mask(key, valid, t, shift, need, 0)
        append(out_key, out_pos, 0, key, offs, take)
    else:
        gate = tl.zeros([], dtype=tl.int32) + KEY_MIN
        count = tl.zeros([], dtype=tl.int32)
        for c0 in range(0, n, TILE):
            pos = c0 + offs
            valid = pos < n
            key = tl.load(src + pos, mask=valid, other=0, eviction_policy="evict_first")
            enter = valid & (key >= gate)
            n_in = tl.sum(enter.to(tl.int32), axis=0)
            if count + n_in > CAP:
                if count > TOPK:
                    gate = tl.maximum(gate, cut_pool(pool_key, pool_pos, count, pool_key, pool_pos, TOPK, CAP))
                    count = tl.zeros([], dtype=tl.int32) + TOPK
                    enter = enter & (key >= gate)
                    n_in = tl.sum(enter.to(tl.int32), axis=0)
                if count + n_in > CAP:
                    # the tile alone holds more entrants than fit: only its own best TOPK can
                    # enter, and a later entry must beat its TOPK-th
                    t, shift, need = tile_kth(key, enter, TOPK)
                    enter, _eq = take_mask(key, enter, t, shift, need, 0)
                    gate = tl.maximum(gate, next_gate(t, shift))
            count += append(pool_key, pool_pos, count, key, pos, enter)
            tl.debug_barrier()  # the appended entries are seen by every thread of a later cut
        if count > TOPK:
            cut_pool(pool_key, pool_pos, count, out_key, out_pos, TOPK, CAP)
        else:
            m = tl.arange(0, CAP) < count
            key = tl.load(pool_key + tl.arange(0, CAP), mask=m, other=0)
            pos = tl.load(pool_pos + tl.arange(0, CAP), mask=m, other=0)
            append(out_key, out_pos, 0, key, pos, m)


@triton.jit(do_not_specialize=["stride_src", "rows", "row_start"])
def topk_rows_kernel(
    src, stride_src, rows, seq_lens, page_table, stride_pt, out_bits, out_raw, out_phys, out_cnt, row_start,
    scratch, TOPK: tl.constexpr, TILE: tl.constexpr,
):
    """Persistent programs over the ``rows`` rows of a contiguous key matrix (``stride_src``
    keys a row; row ``i`` is the contract's row ``row_start + i``): each row's top ``TOPK``,
    written to the four outputs. ``scratch`` holds ``4 * TOPK`` int32 per program."""
    pid = tl.program_id(0)
    pool_key = scratch + pid.to(tl.int64) * (4 * TOPK)
    pool_pos = pool_key + 2 * TOPK
    programs = tl.num_programs(0)
    for j in range(0, tl.cdiv(rows - pid, programs)):
        i = pid + j * programs
        row = row_start + i
        # an unchecked length past the row (or below 0) must not read, and so select, beyond it
        n = tl.minimum(tl.maximum(tl.load(seq_lens + row), 0), stride_src)
        orow = row.to(tl.int64) * TOPK
        select_row(src + i.to(tl.int64) * stride_src, n, out_bits + orow, out_raw + orow, pool_key, pool_pos, TOPK, TILE)
        tl.debug_barrier()
        finalize_row(
            out_bits + orow, out_raw + orow, tl.minimum(n, TOPK), n, page_table + row.to(tl.int64) * stride_pt,
            out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row, TOPK,
        )
        tl.debug_barrier()  # the pool and the output row are reused by the program's next row
