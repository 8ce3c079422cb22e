"""Top-k of a few long key-matrix rows, each row spread over many programs.

The legacy path's select stage for batches of few rows (a decode step: one row per request)
and for chunks of long rows that leave an SM few of them (``backends.legacy.select_way``).
One program per row (:mod:`.row_topk`) would leave most SMs idle and read a 196,608-key row at
one SM's pace, so a row is split three ways, one launch each:

1. :func:`gate_rows_kernel`, a program per row: a gate that about ``2.5 * TOPK`` of the row's
   keys reach, the ``r``-th largest of ``SAMPLE`` keys spread evenly over the row
   (:func:`.row_topk.sample_gate`), and the bins of a histogram over the scores from the gate up
   (``BINS`` bins of equal width, the sample's range filling a quarter of them); it also
   clears the row's candidate count and histogram.
2. :func:`gather_rows_kernel`, ``splits`` programs per row: each reads its run of the row and
   appends the keys that reach the gate (key and position) to the row's candidate buffer of
   ``BUF = 8 * TOPK`` entries, at an offset taken with one atomic add per block of keys, and
   counts each in its bin. The count keeps counting past ``BUF`` (those entries are not
   stored), so an overflow is seen.
3. :func:`finish_rows_kernel`, a program per row. When the row's count lies in
   ``[TOPK, CAP]``, the buffer holds every key that reaches the gate and the row's best
   ``TOPK`` are among them (a key below the gate loses to ``TOPK`` that reach it). The
   histogram then names the bin of the k-th key and where each bin's keys start in the output
   (the keys of higher bins first): when no bin from there up holds more than ``MAXSEG`` keys,
   each candidate of those bins is placed in its bin's run with an atomic add, and ranked inside
   the run by the contract's order (key, then lowest position) against the run's other keys,
   at most ``MAXSEG`` comparisons: a counting sort by bin, no radix search, no sorting network.
   Otherwise (a bin too full: ties, plateaus, a range the bins do not resolve; or ``BINS == 0``)
   the k-th is searched in one register tile (:func:`.row_topk.tile_kth`), keys equal to it
   ranked by position with a second search (the buffer is in the atomics' order), and the
   selection sorted. The program holds ``CAP = 4 * TOPK`` candidates in registers: a row whose
   count lies in ``(CAP, BUF]`` (the buffer holds every entrant) is first *trimmed* to the
   entrants of its bins from the k-th key's up, where those number at most ``CAP``, and
   finished as above. A row the gate misjudged otherwise (fewer than ``TOPK`` reached it, more
   than ``BUF``, or more than ``CAP`` from the k-th key's bin up: ties, plateaus) and a row of at
   most ``TILE`` keys are selected by the one-program row select instead, exact whatever the
   data, and sorted (:func:`.select.finalize_row`).

With about ``2.5 * TOPK`` entrants expected, a sample of 2,048 keys at 196,608 keys takes as
its gate the 27th largest sampled key, while the row's best ``TOPK`` and ``CAP`` keys hold
about 10.7 and 42.7 of the sample: too few keys reach the gate when 27 sampled keys lie among
the best ``TOPK`` (about one row in 50,000 of random scores, a binomial tail), more than ``CAP`` when
at most 26 lie among the best ``CAP`` (about one row in 260). Were those rows left to the
one-program row select (one program streaming the whole row, several times the rest of the
step), a decode batch of 32 rows would pay it about one step in eight; with the trim, only rows
past ``BUF`` do (at most 26 sampled among the best 8,192 keys, expected 85: about one row in
10^13). A trim reads the buffer again, not the row: a second read of the row by one program
costs more than the row select.
"""

import triton
import triton.language as tl

from .common import INT32_MAX, KEY_MIN, key_to_score_bits, wait_for_producer
from .row_topk import append, row_length, row_sample, sample_gate, select_row, span_kth, tile_kth
from .select import composite, finalize_row, radix_digit, take_mask

GATE_HALVES = tl.constexpr(5)  # the sampled gate lets about GATE_HALVES / 2 * TOPK keys in
PROF_FIELDS = 5  # int64 counters per row of the finishing kernel's PROF build (see there)
_PROF_STRIDE = tl.constexpr(PROF_FIELDS)
HEADER_FIELDS = 4  # int32 per row ahead of the buffers: gate, count, bin scale (fp32 bits), how finished
BUF_PER_TOPK = 8  # a row's candidate buffer: BUF_PER_TOPK * TOPK keys, then as many positions
_BUF_PER_TOPK = tl.constexpr(BUF_PER_TOPK)
# How the finishing kernel selected a row (the header's last field)
HOW_ROW_SELECT = 0  # the one-program row select (short row, or the gate misjudged it)
HOW_SEARCH = 1  # from its candidates, by a radix search and a sort
HOW_BINS = 2  # from its candidates, by the histogram's bins
HOW_TRIMMED = 4  # added to HOW_SEARCH or HOW_BINS: more than CAP candidates, trimmed first
_ROW_SELECT, _SEARCH, _BINS = tl.constexpr(HOW_ROW_SELECT), tl.constexpr(HOW_SEARCH), tl.constexpr(HOW_BINS)
_TRIMMED = tl.constexpr(HOW_TRIMMED)


@triton.jit
def _clock():
    """This SM's cycle counter (the ``PROF`` build's phase timers)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _stamp(prof_row, field: tl.constexpr, t0):
    """The ``PROF`` build's phase boundary: every thread done with the phase, then the cycles
    since ``t0`` stored as counter ``field`` of the row."""
    tl.debug_barrier()
    tl.store(prof_row + field, _clock() - t0)


@triton.jit
def _score_of(key):
    """The fp32 score of an order key (:func:`.common.key_to_score_bits`)."""
    return key_to_score_bits(key).to(tl.float32, bitcast=True)


@triton.jit
def _bin_of(key, gate, scale, BINS: tl.constexpr):
    """The histogram bin of keys at or above ``gate``: ``floor((score - gate's score) * scale)``
    in fp32, clamped to the bins (the last bin also holds every key past it). Rounded fp32
    steps never invert an order, so a higher key never has a lower bin; a step with no value
    (``inf - inf``, ``0 * inf``: a gate or range at infinity; keys past +inf's, which no score
    has) counts in the last bin for a positive key, the first for the rest: that only merges
    bins, in order. Bins linear in the score, not in the key's bits: the bits' order is
    logarithmic in the magnitude and would crowd the keys of a range that spans zero into a few
    bins."""
    d = (_score_of(key) - _score_of(gate)) * scale
    d = tl.where(d == d, d, tl.where(key > 0, BINS - 1.0, 0.0))
    return tl.minimum(tl.maximum(d, 0.0), BINS - 1.0).to(tl.int32)


@triton.jit(do_not_specialize=["stride_src", "row_start"])
def gate_rows_kernel(
    src, stride_src, seq_lens, row_start, gates, counts, scales, hist,
    TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr, BINS: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program ``i``: row ``i``'s gate (rows longer than ``TILE`` only), its histogram's scale
    (fp32 bits) and cleared bins (``BINS > 0``), and a zero count. ``PDL``: this kernel and the
    next two are launched with programmatic dependent launch, each after the one before."""
    wait_for_producer(PDL)
    tl.static_assert(SAMPLE <= TILE, "rows longer than the tile are sampled: SAMPLE must not exceed TILE")
    i = tl.program_id(0)
    n = row_length(seq_lens, row_start + i, stride_src)
    tl.store(counts + i, 0)
    if n > TILE:
        key = row_sample(src + i.to(tl.int64) * stride_src, n, SAMPLE)
        gate = sample_gate(key, n, TOPK, GATE_HALVES)
        tl.store(gates + i, gate)
        if BINS > 0:
            # the sample's scores from the gate up fill a quarter of the bins: the row's scores
            # past the sample's largest have three quarters of them before the last bin
            scale = (BINS / 4) / (_score_of(tl.max(key, axis=0)) - _score_of(gate))
            tl.store(scales + i, scale.to(tl.int32, bitcast=True))
            tl.store(hist + i.to(tl.int64) * (2 * BINS) + tl.arange(0, BINS), tl.zeros([BINS], dtype=tl.int32))


@triton.jit(do_not_specialize=["stride_src", "row_start", "splits"])
def gather_rows_kernel(
    src, stride_src, seq_lens, row_start, gates, counts, scales, hist, cand, splits,
    TOPK: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program ``(i, s)``: the keys of run ``s`` of ``splits`` of row ``i`` that reach the row's
    gate, appended to its candidate buffer (``cand``: ``16 * TOPK`` int32 a row, ``BUF = 8 * TOPK``
    keys then as many positions) and counted in their bins (``BINS > 0``; ``hist``: ``2 * BINS`` int32 a row, the
    bins then the finishing kernel's copy of where their runs start)."""
    wait_for_producer(PDL)
    BUF: tl.constexpr = _BUF_PER_TOPK * TOPK
    i = tl.program_id(0)
    n = row_length(seq_lens, row_start + i, stride_src)
    if n > TILE:
        gate = tl.load(gates + i)
        if BINS > 0:
            scale = tl.load(scales + i).to(tl.float32, bitcast=True)
            hist_row = hist + i.to(tl.int64) * (2 * BINS)
        run = tl.cdiv(tl.cdiv(n, splits), BLOCK) * BLOCK
        lo = tl.program_id(1) * run
        hi = tl.minimum(lo + run, n)
        row = src + i.to(tl.int64) * stride_src
        ck = cand + i.to(tl.int64) * (2 * BUF)
        offs = tl.arange(0, BLOCK)
        for c0 in range(lo, hi, BLOCK):
            pos = c0 + offs
            key = tl.load(row + pos, mask=pos < hi, other=KEY_MIN, eviction_policy="evict_first")
            enter = (pos < hi) & (key >= gate)
            enter_i = enter.to(tl.int32)
            n_in = tl.sum(enter_i, axis=0)
            if n_in > 0:
                dst = tl.atomic_add(counts + i, n_in) + tl.cumsum(enter_i, axis=0) - enter_i
                room = enter & (dst < BUF)
                tl.store(ck + dst, key, mask=room)
                tl.store(ck + BUF + dst, pos, mask=room)
                if BINS > 0:
                    tl.atomic_add(hist_row + _bin_of(key, gate, scale, BINS), 1, mask=enter, sem="relaxed")


# a function of its own in the machine code: inlined, its two tiles raised the finishing
# program's register pressure on every row, and rows that trim nothing paid for it in time
@triton.jit(noinline=True)
def _trim(ck, count, gate, scale, low_bin, TOPK: tl.constexpr, BINS: tl.constexpr):
    """Keep the entries of the candidate buffer ``ck`` (``count <= BUF`` of them, ``BUF = 8 *
    TOPK`` keys then as many positions) whose keys lie in bin ``low_bin`` or above, moved to its
    first slots in buffer order. Returns how many there are (none is stored past ``CAP = 4 *
    TOPK``)."""
    CAP: tl.constexpr = 4 * TOPK
    BUF: tl.constexpr = _BUF_PER_TOPK * TOPK
    offs = tl.arange(0, CAP)
    got = tl.zeros([], dtype=tl.int32)
    # two halves of CAP entries, each a register tile of the finishing program's size (one of
    # BUF entries spills); the first half's slots are written over, so it is read whole first
    for h in tl.static_range(2):
        at = h * CAP + offs
        valid = at < count
        key = tl.load(ck + at, mask=valid, other=0)
        pos = tl.load(ck + BUF + at, mask=valid, other=0)
        keep = valid & (_bin_of(key, gate, scale, BINS) >= low_bin)
        keep_i = keep.to(tl.int32)
        dst = got + tl.cumsum(keep_i, axis=0) - keep_i
        if h == 0:
            tl.debug_barrier()  # every entry of the first half read before any is written over
        room = keep & (dst < CAP)
        tl.store(ck + dst, key, mask=room)
        tl.store(ck + BUF + dst, pos, mask=room)
        got += tl.sum(keep_i, axis=0)
    return got


@triton.jit
def _select_candidates(key, pos, valid, count, out_key, out_pos, TOPK: tl.constexpr, prof_row, t0,
                       PROF: tl.constexpr):
    """Write the best ``TOPK`` of the ``TOPK <= count <= CAP`` candidates ``(key, pos)`` (a
    register tile, any order) to ``out``: every key above the k-th, then the keys equal to it at
    the lowest positions. (``PROF``: counter 1 of the row, see :func:`finish_rows_kernel`.)"""
    take = valid
    if count > TOPK:
        t, shift, need, whole = tile_kth(key, valid, TOPK)
        above = valid & ((key >> shift) > (t >> shift))
        eq = valid & ((key >> shift) == (t >> shift))
        # the bucket is taken whole unless keys equal to the k-th are more than it needs: then
        # the lowest positions among them, a search over INT32_MAX - position (distinct keys,
        # close together: the search starts where they differ)
        if whole == 0:  # no count of the equal keys where the search took them whole
            if tl.sum(eq.to(tl.int32), axis=0) > need:
                lowest = INT32_MAX - pos
                t2, shift2, need2, whole2 = span_kth(lowest, eq, need)
                eq, _eq = take_mask(lowest, eq, t2, shift2, need2, 0, whole2)
        take = above | eq
    if PROF:
        _stamp(prof_row, 1, t0)
    append(out_key, out_pos, 0, key, pos, take)


@triton.jit
def _finish_by_bins(key, pos, valid, ck, hist_row, start_row, bnd, above, bucket, gate, scale, pt_row,
                    out_bits_row, out_raw_row, out_phys_row, out_cnt_ptr, bin_counts, count,
                    TOPK: tl.constexpr, BINS: tl.constexpr, MAXSEG: tl.constexpr, prof_row, t0, PROF: tl.constexpr):
    """A row's output from its candidates ``(key, pos)`` (a register tile) by their bins: bin
    ``bnd`` holds the k-th key (``above`` candidates lie in higher bins, ``bucket`` in it) and no
    bin from ``bnd`` up holds more than ``MAXSEG``. Each candidate of those bins takes a slot in
    its bin's run of the buffer ``ck`` (the run starts after the candidates of higher bins;
    the slot from an atomic add on the bin's counter in ``hist_row``, starting at ``start_row``'s
    copy), then its rank in the run by the contract's order: the output slot. Run slots past
    ``TOPK`` (the boundary bin's losers) are not written."""
    BUF: tl.constexpr = _BUF_PER_TOPK * TOPK
    bins = tl.arange(0, BINS)
    start = count - tl.cumsum(bin_counts, axis=0)  # candidates in higher bins (the bins hold count)
    tl.debug_barrier()  # every thread holds its candidates and bins before both are written over
    tl.store(start_row + bins, start)
    tl.store(hist_row + bins, start)
    tl.debug_barrier()
    b = _bin_of(key, gate, scale, BINS)
    staged = valid & (b >= bnd)
    slot = tl.atomic_add(hist_row + b, 1, mask=staged, sem="relaxed")
    tl.store(ck + slot, key, mask=staged)
    tl.store(ck + BUF + slot, pos, mask=staged)
    tl.debug_barrier()  # the runs are complete, and the counters hold each run's end
    if PROF:
        _stamp(prof_row, 2, t0)
    s = tl.arange(0, 2 * TOPK)  # the staged slots: above + bucket <= TOPK - 1 + MAXSEG of them
    live = s < above + bucket
    ks = tl.load(ck + s, mask=live, other=0)
    ps = tl.load(ck + BUF + s, mask=live, other=0)
    bs = _bin_of(ks, gate, scale, BINS)
    lo = tl.load(start_row + bs, mask=live, other=0)
    hi = tl.load(hist_row + bs, mask=live, other=0)
    cs = composite(ks, ps)
    rank = tl.zeros([2 * TOPK], dtype=tl.int32)
    for d in tl.static_range(MAXSEG):
        j = lo + d
        m = live & (j < hi)
        cj = composite(tl.load(ck + j, mask=m, other=0), tl.load(ck + BUF + j, mask=m, other=0))
        rank += (m & (cj > cs)).to(tl.int32)
    f = lo + rank
    w = live & (f < TOPK)
    page = tl.load(pt_row + (ps >> 6), mask=w, other=0)
    tl.store(out_bits_row + f, key_to_score_bits(ks), mask=w)
    tl.store(out_raw_row + f, ps, mask=w)
    tl.store(out_phys_row + f, page * 64 + (ps & 63), mask=w)
    tl.store(out_cnt_ptr, TOPK)


@triton.jit(do_not_specialize=["stride_src", "stride_pt", "row_start"])
def finish_rows_kernel(
    src, stride_src, seq_lens, page_table, stride_pt, out_bits, out_raw, out_phys, out_cnt, row_start,
    gates, counts, scales, hows, hist, cand, prof, TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr,
    BINS: tl.constexpr, MAXSEG: tl.constexpr, PROF: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Program ``i``: row ``i``'s top ``TOPK`` (the contract's row ``row_start + i``), from its
    candidates (by their bins, or by a search and a sort; first trimmed where they outnumber the
    registers and the bins allow) or by the one-program row select (:func:`.row_topk.select_row`,
    its pool in the row's candidate buffer), written to the four outputs; ``hows[i]``: which
    (``HOW_*``, plus ``HOW_TRIMMED`` for a trimmed row).

    ``PROF`` (a GPU build for measurements; ``prof``: ``PROF_FIELDS`` int64 per row, unread
    otherwise) stores the row's SM cycles from the kernel's start to: the candidates loaded, the
    k-th found (by bins: the histogram read and checked), the selection appended (by bins: the
    candidates placed in their runs), the row ordered and written; and the ``HOW_*`` taken (the
    row select's cycles fall in the third phase)."""
    wait_for_producer(PDL)
    # a row of at most TOPK keys keeps position order unsorted (finalize_row), which the
    # buffer's atomic order would not give: such rows must be one tile
    tl.static_assert(TILE >= TOPK, "rows of at most TOPK keys must fit the tile")
    tl.static_assert(MAXSEG <= TOPK, "a bin's run spills at most MAXSEG slots past TOPK")
    CAP: tl.constexpr = 4 * TOPK  # candidates held in registers
    BUF: tl.constexpr = _BUF_PER_TOPK * TOPK  # entries of the row's buffer
    i = tl.program_id(0)
    row = row_start + i
    n = row_length(seq_lens, row, stride_src)
    orow = row.to(tl.int64) * TOPK
    ck = cand + i.to(tl.int64) * (2 * BUF)
    count = tl.load(counts + i)
    prof_row = prof + i.to(tl.int64) * _PROF_STRIDE
    pt_row = page_table + row.to(tl.int64) * stride_pt
    t0 = tl.zeros([], dtype=tl.int64)
    if PROF:
        tl.debug_barrier()
        t0 = _clock()
    low_bin = tl.zeros([], dtype=tl.int32) - 1  # a trimmed row's k-th bin: none below holds a candidate
    if BINS > 0:
        if (n > TILE) & (count > CAP) & (count <= BUF):
            # more candidates than the registers hold, every one in the buffer and in its bin:
            # trimmed to the bins from the k-th key's up where those hold few enough. The trim
            # reads the histogram itself, and the finish below reads it again: one read shared by
            # both keeps the bins live across the candidates' load, and the kernel, at its
            # register cap, then spills three times as much (compile_report.py, sm_90)
            all_bins = tl.load(hist + i.to(tl.int64) * (2 * BINS) + tl.arange(0, BINS))
            bnd0, above0, bucket0 = radix_digit(all_bins, TOPK)
            kept = above0 + bucket0
            if (bnd0 >= 0) & (kept <= CAP) & (tl.sum(all_bins, axis=0) == count):
                got = _trim(ck, count, tl.load(gates + i), tl.load(scales + i).to(tl.float32, bitcast=True), bnd0,
                            TOPK, BINS)
                tl.debug_barrier()  # the moved entries are seen by every thread
                if got == kept:
                    count = kept
                    low_bin = bnd0
    trimmed = (low_bin >= 0).to(tl.int32)
    from_candidates = (n > TILE) & (count >= TOPK) & (count <= CAP)
    # the candidates (unread where the row select serves)
    offs = tl.arange(0, CAP)
    valid = offs < tl.where(from_candidates, count, 0)
    key = tl.load(ck + offs, mask=valid, other=0)
    pos = tl.load(ck + BUF + offs, mask=valid, other=0)
    if PROF:
        _stamp(prof_row, 0, t0)
    how = tl.where(from_candidates, _SEARCH, _ROW_SELECT)
    if BINS > 0:
        hist_row = hist + i.to(tl.int64) * (2 * BINS)
        bins = tl.arange(0, BINS)
        bin_counts = tl.load(hist_row + bins, mask=(bins >= low_bin) & (bins < tl.where(from_candidates, BINS, 0)),
                             other=0)
        bnd, above, bucket = radix_digit(bin_counts, TOPK)
        run_max = tl.max(tl.where(tl.arange(0, BINS) >= bnd, bin_counts, 0), axis=0)
        # every candidate is in a bin (else the runs' slots would not be the buffer's)
        binned = from_candidates & (run_max <= MAXSEG) & (tl.sum(bin_counts, axis=0) == count)
        how = tl.where(binned, _BINS, how)
        if binned:
            if PROF:
                _stamp(prof_row, 1, t0)
            _finish_by_bins(key, pos, valid, ck, hist_row, hist_row + BINS, bnd, above, bucket, tl.load(gates + i),
                            tl.load(scales + i).to(tl.float32, bitcast=True), pt_row, out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row,
                            bin_counts, count, TOPK, BINS, MAXSEG, prof_row, t0, PROF)
    tl.store(hows + i, how + trimmed * _TRIMMED)
    if how != _BINS:
        if how == _SEARCH:
            _select_candidates(key, pos, valid, count, out_bits + orow, out_raw + orow, TOPK, prof_row, t0, PROF)
        else:
            if PROF:
                _stamp(prof_row, 1, t0)
            select_row(src + i.to(tl.int64) * stride_src, n, out_bits + orow, out_raw + orow, ck, ck + 2 * TOPK,
                       TOPK, TILE, SAMPLE)
        tl.debug_barrier()
        if PROF:
            _stamp(prof_row, 2, t0)
        finalize_row(out_bits + orow, out_raw + orow, tl.minimum(n, TOPK), n, pt_row,
                     out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row, TOPK)
    if PROF:
        _stamp(prof_row, 3, t0)
        tl.store(prof_row + 4, (how + trimmed * _TRIMMED).to(tl.int64))
