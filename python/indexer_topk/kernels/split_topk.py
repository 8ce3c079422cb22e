"""Top-k of a few long key-matrix rows, each row spread over many programs.

The legacy path's select stage for batches of few rows (a decode step: one row per request)
and for chunks of long rows that leave an SM few of them (``backends.legacy.select_way``).
One program per row (:mod:`.row_topk`) would leave most SMs idle and read a 196,608-key row at
one SM's pace, so a row is split three ways, one launch each:

1. :func:`gate_rows_kernel`, a program per row: a gate that about ``2.5 * TOPK`` of the row's
   keys reach, the ``r``-th largest of ``SAMPLE`` keys spread evenly over the row
   (:func:`.row_topk.sample_gate`), and the bins of a histogram over the scores from the gate up
   (``BINS`` bins of equal width, the sample's range filling ``SPREAD`` of them: a quarter, or
   ``TOPK`` at topk 2048); it also clears the row's candidate count and histogram.
2. :func:`gather_rows_kernel`, ``splits`` programs per row: each reads its run of the row and
   appends the keys that reach the gate (key and position) to the row's candidate buffer of
   ``BUF = 8 * TOPK`` entries, at an offset taken with one atomic add per block of keys, and
   counts each in its bin. The count keeps counting past ``BUF`` (those entries are not
   stored), so an overflow is seen.
3. :func:`finish_rows_kernel`, ``PARTS`` programs per row. When the row's count lies in
   ``[TOPK, BUF]``, the buffer holds every key that reaches the gate and the row's best
   ``TOPK`` are among them (a key below the gate loses to ``TOPK`` that reach it). The
   histogram then names the bin of the k-th key and where each bin's keys start in the output
   (the keys of higher bins first): when no bin from there up holds more than ``MAXSEG`` keys,
   each candidate of those bins is placed in its bin's run of a staging area with an atomic
   add, and ranked inside the run by the contract's order (key, then lowest position) against
   the run's other keys, at most ``MAXSEG`` comparisons: a counting sort by bin, no radix
   search, no sorting network. The bins' runs are dealt to the row's programs by where they
   start, so a few rows finish on many SMs. Otherwise (a bin too full: ties, plateaus, a range
   the bins do not resolve; or ``BINS == 0``) the first program alone searches the k-th in one
   register tile of ``CAP = 4 * TOPK`` candidates (:func:`.row_topk.tile_kth`), keys equal to
   it ranked by position with a second search (the buffer is in the atomics' order), and sorts
   the selection; a row of more than ``CAP`` candidates is first *trimmed* to the entrants of
   its bins from the k-th key's up, where those number at most ``CAP``. A row the gate
   misjudged otherwise (fewer than ``TOPK`` reached it, more than ``BUF``, or more than ``CAP``
   from the k-th key's bin up and a bin too full) and a row of at most ``TILE`` keys are
   selected by the one-program row select instead, exact whatever the data, and sorted
   (:func:`.select.finalize_row`).

With about ``2.5 * TOPK`` entrants expected, a sample of 2,048 keys at 196,608 keys takes as
its gate the 27th largest sampled key, while the row's best ``TOPK`` and ``CAP`` keys hold
about 10.7 and 42.7 of the sample: too few keys reach the gate when 27 sampled keys lie among
the best ``TOPK`` (about one row in 50,000 of random scores, a binomial tail), more than ``CAP`` when
at most 26 lie among the best ``CAP`` (about one row in 260). Were those rows left to the
one-program row select (one program streaming the whole row, several times the rest of the
step), a decode batch of 32 rows would pay it about one step in eight; by bins read from the
whole buffer, only rows past ``BUF`` do (at most 26 sampled among the best 8,192 keys, expected
85: about one row in 10^13). The finish reads the buffer again, not the row: a second read of
the row by one program costs more than the row select. Shorter rows take a smaller sample
(``backends.legacy.split_sample``: 1,024 keys where the best ``TOPK`` hold at least 16 of them:
up to 256K tokens at topk 1024, 128K at 512, 512K at 2048), whose odds are no worse: at 16, too
few reach the gate in about one row in 8 million and more than ``CAP`` in one in 1,100. At
196,608 keys 1,024 sampled keys would hold 5.3 of the best ``TOPK``: too few in one row in 800.
"""

import triton
import triton.language as tl

from .common import DENSE_SHARE, INT32_MAX, KEY_MIN, exclusive_sum_strided, release_dependents, wait_for_producer
from .row_topk import (append, bin_of, row_length, row_sample, sample_gate, sample_rank, score_of, select_row, span_kth,
                       tile_kth)
from .select import composite, finalize_row, radix_digit, store_entries, take_mask

GATE_HALVES = tl.constexpr(5)  # the sampled gate lets about GATE_HALVES / 2 * TOPK keys in
PROF_FIELDS = 5  # int64 counters per row of the finishing kernel's PROF build (see there)
_PROF_STRIDE = tl.constexpr(PROF_FIELDS)
HEADER_FIELDS = 4  # int32 per row ahead of the buffers: gate, count, bin scale (fp32 bits), how finished
BUF_PER_TOPK = 8  # a row's candidate buffer: BUF_PER_TOPK * TOPK keys, then as many positions
# a row's candidate region: its buffer, then the finish's staging area (2 * TOPK keys, then as many
# positions: the runs of the bins from the k-th key's up, at most TOPK + MAXSEG - 1 slots)
CAND_PER_TOPK = 2 * BUF_PER_TOPK + 4
_BUF_PER_TOPK = tl.constexpr(BUF_PER_TOPK)
_CAND_PER_TOPK = tl.constexpr(CAND_PER_TOPK)
# How the finishing kernel selected a row (the header's last field)
HOW_ROW_SELECT = 0  # the one-program row select (short row, or the gate misjudged it)
HOW_SEARCH = 1  # from its candidates, by a radix search and a sort
HOW_BINS = 2  # from its candidates, by the histogram's bins
HOW_TRIMMED = 4  # added to HOW_SEARCH: more than CAP candidates, trimmed first
_ROW_SELECT, _SEARCH, _BINS = tl.constexpr(HOW_ROW_SELECT), tl.constexpr(HOW_SEARCH), tl.constexpr(HOW_BINS)
_TRIMMED = tl.constexpr(HOW_TRIMMED)


@triton.jit
def _clock():
    """This SM's cycle counter (the ``PROF`` build's phase timers)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _stamp(prof_row, field: tl.constexpr, t0, lead):
    """The ``PROF`` build's phase boundary: every thread done with the phase, then the cycles
    since ``t0`` stored as counter ``field`` of the row (by its first part only, ``lead``)."""
    tl.debug_barrier()
    tl.store(prof_row + field, _clock() - t0, mask=lead)


@triton.jit(do_not_specialize=["stride_src", "row_start"])
def gate_rows_kernel(
    src, stride_src, seq_lens, row_start, gates, counts, scales, hist,
    TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr, BINS: tl.constexpr, PDL: tl.constexpr = False,
    SAMPLED: tl.constexpr = False, GATE_BINS: tl.constexpr = 0, SPREAD: tl.constexpr = 0,
):
    """Program ``i``: row ``i``'s gate (rows longer than ``TILE`` only), its histogram's scale
    (fp32 bits) and cleared bins (``BINS > 0``), and a zero count. ``PDL``: this kernel and the
    next two are launched with programmatic dependent launch, each after the one before.
    ``GATE_BINS``: the gate from one histogram of the sample (:func:`binned_gate`), not the
    sample's exact ``r``-th key (``0``). ``SPREAD``: the bins the sample's range from the gate up
    fills (:func:`open_row`; ``backends.legacy.split_spread``), at least one where ``BINS > 0``.

    ``SAMPLED``: the row's sample is already scored, ``SAMPLE`` keys at the start of its
    candidate region (``src`` is then the candidate regions, ``stride_src`` the key matrix's
    width; :func:`.scored_gate.score_sample_kernel`), and the kernel lets the score kernel
    after it start at once (``PDL``), which waits for it only to gather."""
    if SAMPLED:
        release_dependents(PDL)
    wait_for_producer(PDL)
    tl.static_assert(SAMPLE <= TILE, "rows longer than the tile are sampled: SAMPLE must not exceed TILE")
    i = tl.program_id(0)
    n = row_length(seq_lens, row_start + i, stride_src)
    tl.store(counts + i, 0)
    if n > TILE:
        if SAMPLED:
            key = tl.load(src + i.to(tl.int64) * (_CAND_PER_TOPK * TOPK) + tl.arange(0, SAMPLE))
        else:
            key = row_sample(src + i.to(tl.int64) * stride_src, n, SAMPLE)
        open_row(key, n, i, gates, scales, hist, TOPK, BINS, GATE_BINS, SPREAD)


@triton.jit
def binned_gate(key, n, TOPK: tl.constexpr, HALVES: tl.constexpr, GATE_BINS: tl.constexpr):
    """A gate for the row's ``n`` keys from its sample ``key`` as :func:`.row_topk.sample_gate`
    aims it (its ``r``-th largest sampled key), found by one histogram instead of a radix search.

    The sample's scores are binned linearly between its smallest and largest into
    ``GATE_BINS`` bins; the gate is the smallest sampled key of the bins from the one that holds
    the ``r``-th largest up, so ``r`` or a few more sampled keys reach it. A sample whose range
    has no finite width (ties throughout, infinities, NaN keys at either end) or whose boundary
    bin holds more than ``r / 8 + 2`` keys past the ``r``-th (scores crowded into a few bins)
    takes :func:`.row_topk.sample_gate`'s exact search instead. Every gate is exact, as the scan
    that uses it checks what reached it: this one trades a few more entrants for the search's
    passes, each a histogram of its own."""
    r = sample_rank(n, TOPK, key.shape[0], HALVES)
    s_lo = score_of(tl.min(key, axis=0))
    scale = GATE_BINS / (score_of(tl.max(key, axis=0)) - s_lo)
    d = (score_of(key) - s_lo) * scale
    b = tl.minimum(tl.maximum(tl.where(d == d, d, 0.0), 0.0), GATE_BINS - 1.0).to(tl.int32)
    # keys at or above each bin's, counted from the top; the r-th largest lies in the highest
    # bin whose count reaches r (bin 0's is the whole sample)
    ge = tl.cumsum(tl.histogram(b, GATE_BINS), axis=0, reverse=True)
    bins = tl.arange(0, GATE_BINS)
    star = tl.max(tl.where(ge >= r, bins, 0), axis=0)
    reach = tl.max(tl.where(bins == star, ge, 0), axis=0)
    gate = tl.min(tl.where(b >= star, key, INT32_MAX), axis=0)
    exact = (scale != scale) | (scale <= 0) | (scale == float("inf")) | (reach - r > r // 8 + 2)
    if exact:
        gate = sample_gate(key, n, TOPK, HALVES)
    return gate


@triton.jit
def open_row(key, n, i, gates, scales, hist, TOPK: tl.constexpr, BINS: tl.constexpr, GATE_BINS: tl.constexpr = 0,
             SPREAD: tl.constexpr = 0):
    """Row ``i``'s gate from its sample ``key`` (:func:`.row_topk.row_sample` of its ``n`` keys;
    by :func:`binned_gate` where ``GATE_BINS > 0``), its histogram's scale (fp32 bits: the
    sample's range from the gate up over ``SPREAD`` bins) and
    cleared bins (``BINS > 0``)."""
    if GATE_BINS > 0:
        gate = binned_gate(key, n, TOPK, GATE_HALVES, GATE_BINS)
    else:
        gate = sample_gate(key, n, TOPK, GATE_HALVES)
    tl.store(gates + i, gate)
    if BINS > 0:
        # the sample's scores from the gate up fill SPREAD bins: the row's scores past the
        # sample's largest have the rest before the last bin
        tl.static_assert(SPREAD > 0, "the sample's range must fill at least one bin")
        scale = SPREAD / (score_of(tl.max(key, axis=0)) - score_of(gate))
        tl.store(scales + i, scale.to(tl.int32, bitcast=True))
        tl.store(hist + i.to(tl.int64) * (2 * BINS) + tl.arange(0, BINS), tl.zeros([BINS], dtype=tl.int32))


@triton.jit(do_not_specialize=["stride_src", "row_start", "splits"])
def gather_rows_kernel(
    src, stride_src, seq_lens, row_start, gates, counts, scales, hist, cand, splits,
    TOPK: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr, PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = False, STRIDE: tl.constexpr = 0,
):
    """Program ``(i, s)``: the keys of run ``s`` of ``splits`` of row ``i`` that reach the row's
    gate, appended to its candidate buffer (``cand``: ``CAND_PER_TOPK * TOPK`` int32 a row, the
    buffer's ``BUF = 8 * TOPK`` keys then as many positions first) and counted in their bins
    (``BINS > 0``; ``hist``: ``2 * BINS`` int32 a row, the bins then the finishing kernel's
    counters of where their runs fill). ``PREFETCH``, ``STRIDE``: see :func:`gather_run`."""
    wait_for_producer(PDL)
    i = tl.program_id(0)
    n = row_length(seq_lens, row_start + i, stride_src)
    if n > TILE:
        run = tl.cdiv(tl.cdiv(n, splits), BLOCK) * BLOCK
        lo = tl.program_id(1) * run
        gather_run(src + i.to(tl.int64) * stride_src, lo, tl.minimum(lo + run, n), i, gates, counts, scales, hist,
                   cand, TOPK, BLOCK, BINS, PREFETCH, STRIDE)


@triton.jit
def gather_run(row, lo, hi, i, gates, counts, scales, hist, cand, TOPK: tl.constexpr, BLOCK: tl.constexpr,
               BINS: tl.constexpr, PREFETCH: tl.constexpr = False, STRIDE: tl.constexpr = 0):
    """The keys of ``row[lo:hi]`` (row ``i`` of the key matrix, positions ``lo .. hi - 1``) that
    reach the row's gate, appended to its candidate buffer and counted in its bins (see
    :func:`gather_rows_kernel`). ``PREFETCH``: each block's keys are loaded while the block
    before is appended, so a block's load waits behind the last one's returning atomic add no
    longer; the same appends, block by block, in the same order. ``STRIDE > 0`` (the program's
    thread count): a block's entrants take their slots in the strided order of
    :func:`.common.exclusive_sum_strided` rather than by position; nothing reads the buffer's
    order (the finish ranks by key and position, and blocks land in the atomics' order anyway)."""
    BUF: tl.constexpr = _BUF_PER_TOPK * TOPK
    gate = tl.load(gates + i)
    if BINS > 0:
        scale = tl.load(scales + i).to(tl.float32, bitcast=True)
        hist_row = hist + i.to(tl.int64) * (2 * BINS)
    else:  # unread without bins
        scale = 0.0
        hist_row = hist
    ck = cand + i.to(tl.int64) * (_CAND_PER_TOPK * TOPK)
    offs = tl.arange(0, BLOCK)
    if PREFETCH:
        key = tl.load(row + lo + offs, mask=lo + offs < hi, other=KEY_MIN, eviction_policy="evict_first")
        for c0 in range(lo, hi, BLOCK):
            pos = c0 + offs
            ahead = pos + BLOCK
            following = tl.load(row + ahead, mask=ahead < hi, other=KEY_MIN, eviction_policy="evict_first")
            _gather_block(key, pos, hi, gate, scale, counts, i, ck, hist_row, BUF, BINS, STRIDE)
            key = following
    else:
        for c0 in range(lo, hi, BLOCK):
            pos = c0 + offs
            key = tl.load(row + pos, mask=pos < hi, other=KEY_MIN, eviction_policy="evict_first")
            _gather_block(key, pos, hi, gate, scale, counts, i, ck, hist_row, BUF, BINS, STRIDE)


@triton.jit
def _gather_block(key, pos, hi, gate, scale, counts, i, ck, hist_row, BUF: tl.constexpr, BINS: tl.constexpr,
                  STRIDE: tl.constexpr):
    """A block's keys ``key`` at positions ``pos`` (below ``hi`` taken) that reach ``gate``,
    appended at row ``i``'s count to its buffer ``ck`` (in position order, or strided order
    with ``STRIDE`` where few enter) and counted in its bins."""
    enter = (pos < hi) & (key >= gate)
    enter_i = enter.to(tl.int32)
    n_in = tl.sum(enter_i, axis=0)
    if n_in > 0:
        if STRIDE > 0 and n_in * DENSE_SHARE <= key.shape[0]:  # dense blocks by position
            slot = exclusive_sum_strided(enter_i, STRIDE)
        else:
            slot = tl.cumsum(enter_i, axis=0) - enter_i
        dst = tl.atomic_add(counts + i, n_in) + slot
        room = enter & (dst < BUF)
        tl.store(ck + dst, key, mask=room)
        tl.store(ck + BUF + dst, pos, mask=room)
        if BINS > 0:
            tl.atomic_add(hist_row + bin_of(key, gate, scale, BINS), 1, mask=enter, sem="relaxed")


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
        keep = valid & (bin_of(key, gate, scale, BINS) >= low_bin)
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
def _select_candidates(key, pos, valid, count, out_key, out_pos, TOPK: tl.constexpr, prof_row, t0, lead,
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
        _stamp(prof_row, 1, t0, lead)
    append(out_key, out_pos, 0, key, pos, take)


@triton.jit
def _stage(key, pos, valid, stage, ctr_row, b_lo, b_hi, gate, scale, TOPK: tl.constexpr, BINS: tl.constexpr):
    """Each candidate ``(key, pos)`` of bins ``b_lo..b_hi`` to the next slot of its bin's run in
    the staging area (``stage``: ``2 * TOPK`` keys, then as many positions), from an atomic add
    on the bin's counter in ``ctr_row``."""
    b = bin_of(key, gate, scale, BINS)
    staged = valid & (b >= b_lo) & (b <= b_hi)
    slot = tl.atomic_add(ctr_row + b, 1, mask=staged, sem="relaxed")
    # the runs fit the area where the histogram counts each bin's candidates, as the gathering's
    # does; bounded all the same, so that a histogram that did not could not store past it
    room = staged & (slot < 2 * TOPK)
    tl.store(stage + slot, key, mask=room)
    tl.store(stage + 2 * TOPK + slot, pos, mask=room)


@triton.jit
def _finish_by_bins(key, pos, valid, ck, stage, hist_row, ctr_row, bnd, gate, scale, n, pt_row, out_bits_row,
                    out_raw_row, out_phys_row, out_cnt_ptr, bin_counts, count, part, TOPK: tl.constexpr,
                    BINS: tl.constexpr, MAXSEG: tl.constexpr, PARTS: tl.constexpr, prof_row, t0, PROF: tl.constexpr):
    """Part ``part`` of ``PARTS`` of a row's output from its ``count <= BUF`` candidates (the
    buffer ``ck``, of which ``(key, pos)`` is the first ``CAP`` in registers) by their bins: bin
    ``bnd`` holds the k-th key and no bin from ``bnd`` up holds more than ``MAXSEG``
    (``bin_counts``, the histogram ``hist_row``, which this reads and never writes). A bin's run
    of output slots starts after the candidates of higher bins; the part owns the bins whose runs
    start in its ``TOPK / PARTS`` slots, so that the parts of a row share no bin and need not
    wait for each other. Each candidate of an owned bin takes a slot in its bin's run of the
    staging area ``stage`` (:func:`_stage`; the counters ``ctr_row`` set to the runs' starts by
    their owner), then its rank in the run by the contract's order: the output slot. Run slots
    past ``TOPK`` (the boundary bin's losers) are not written. ``n``: the row's length; the page
    table ``pt_row`` is read for positions below it only."""
    BUF: tl.constexpr = _BUF_PER_TOPK * TOPK
    CAP: tl.constexpr = 4 * TOPK
    SHARE: tl.constexpr = TOPK // PARTS
    SLOTS: tl.constexpr = 2 * SHARE  # an owned run starts in the share and spills at most MAXSEG - 1 past it
    tl.static_assert(MAXSEG <= SHARE, "a part's runs must fit its slot tile")
    tl.static_assert(SHARE * PARTS == TOPK, "the parts' shares must cover the row's slots")
    bins = tl.arange(0, BINS)
    start = count - tl.cumsum(bin_counts, axis=0)  # candidates in higher bins (the bins hold count)
    own = (bins >= bnd) & (start >= part * SHARE) & (start < (part + 1) * SHARE)
    filled = own & (bin_counts > 0)
    s_lo = tl.min(tl.where(filled, start, TOPK), axis=0)  # the part's slots of the staging area
    s_hi = tl.max(tl.where(filled, start + bin_counts, 0), axis=0)
    b_lo = tl.min(tl.where(own, bins, BINS), axis=0)  # its bins
    b_hi = tl.max(tl.where(own, bins, -1), axis=0)
    tl.store(ctr_row + bins, start, mask=own)
    tl.debug_barrier()  # the counters set before any thread adds to them
    _stage(key, pos, valid, stage, ctr_row, b_lo, b_hi, gate, scale, TOPK, BINS)
    if count > CAP:  # the rest of the buffer (BUF = 2 * CAP), a tile at a time
        at = CAP + tl.arange(0, CAP)
        more = at < count
        _stage(tl.load(ck + at, mask=more, other=0), tl.load(ck + BUF + at, mask=more, other=0), more, stage,
               ctr_row, b_lo, b_hi, gate, scale, TOPK, BINS)
    tl.debug_barrier()  # the part's runs are complete, and its counters hold each run's end
    if PROF:
        _stamp(prof_row, 2, t0, part == 0)
    s = s_lo + tl.arange(0, SLOTS)
    live = s < s_hi
    ks = tl.load(stage + s, mask=live, other=0)
    ps = tl.load(stage + 2 * TOPK + s, mask=live, other=0)
    bs = bin_of(ks, gate, scale, BINS)
    # a run's slots, kept inside the staging area and the row's outputs (a bound, not a clamp
    # that changes anything, where the histogram counts each bin's candidates), and positions
    # inside the row: the page table is read only where the row has pages
    hi = tl.minimum(tl.load(ctr_row + bs, mask=live, other=0), 2 * TOPK)
    lo = tl.maximum(hi - tl.load(hist_row + bs, mask=live, other=0), 0)
    cs = composite(ks, ps)
    rank = tl.zeros([SLOTS], dtype=tl.int32)
    for d in tl.static_range(MAXSEG):
        j = lo + d
        m = live & (j < hi)
        cj = composite(tl.load(stage + j, mask=m, other=0), tl.load(stage + 2 * TOPK + j, mask=m, other=0))
        rank += (m & (cj > cs)).to(tl.int32)
    f = lo + rank
    w = live & (f < TOPK) & (ps >= 0) & (ps < n)
    store_entries(ks, ps, f, w, pt_row, out_bits_row, out_raw_row, out_phys_row)
    tl.store(out_cnt_ptr, TOPK, mask=part == 0)


@triton.jit(do_not_specialize=["stride_src", "stride_pt", "row_start"])
def finish_rows_kernel(
    src, stride_src, seq_lens, page_table, stride_pt, out_bits, out_raw, out_phys, out_cnt, row_start,
    gates, counts, scales, hows, hist, cand, prof, TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr,
    BINS: tl.constexpr, MAXSEG: tl.constexpr, PARTS: tl.constexpr = 1, PROF: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Programs ``(i, 0..PARTS-1)``: row ``i``'s top ``TOPK`` (the contract's row ``row_start +
    i``), from its candidates (by their bins; or by a search and a sort, first trimmed where they
    outnumber the registers and the bins allow) or by the one-program row select
    (:func:`.row_topk.select_row`, its pool in the row's candidate buffer), written to the four
    outputs; ``hows[i]``: which (``HOW_*``, plus ``HOW_TRIMMED`` for a trimmed row).

    By bins, the row's ``PARTS`` programs share its output slots, each a ``TOPK / PARTS`` of
    them (:func:`_finish_by_bins`): a few rows then finish on as many SMs as there are parts,
    where one program an SM would rank and write a row's ``TOPK`` keys alone. Every other way is
    the first part's alone; the others return.

    ``PROF`` (a GPU build for measurements; ``prof``: ``PROF_FIELDS`` int64 per row, unread
    otherwise) stores the row's SM cycles, in its first part, from the kernel's start to: the
    candidates loaded, the k-th found (by bins: the histogram read and checked), the selection
    appended (by bins: the part's candidates placed in their runs), the row ordered and written;
    and the ``HOW_*`` taken (the row select's cycles fall in the third phase)."""
    wait_for_producer(PDL)
    # a row of at most TOPK keys keeps position order unsorted (finalize_row), which the
    # buffer's atomic order would not give: such rows must be one tile
    tl.static_assert(TILE >= TOPK, "rows of at most TOPK keys must fit the tile")
    tl.static_assert(MAXSEG <= TOPK, "a bin's run spills at most MAXSEG slots past TOPK")
    CAP: tl.constexpr = 4 * TOPK  # candidates held in registers
    BUF: tl.constexpr = _BUF_PER_TOPK * TOPK  # entries of the row's buffer
    i = tl.program_id(0)
    part = tl.program_id(1)
    lead = part == 0
    row = row_start + i
    n = row_length(seq_lens, row, stride_src)
    orow = row.to(tl.int64) * TOPK
    ck = cand + i.to(tl.int64) * (_CAND_PER_TOPK * TOPK)
    count = tl.load(counts + i)
    prof_row = prof + i.to(tl.int64) * _PROF_STRIDE
    pt_row = page_table + row.to(tl.int64) * stride_pt
    t0 = tl.zeros([], dtype=tl.int64)
    if PROF:
        tl.debug_barrier()
        t0 = _clock()
    # every key that reaches the gate is in the buffer, and the row's best TOPK among them
    in_buffer = (n > TILE) & (count >= TOPK) & (count <= BUF)
    # the candidates' first tile (unread where the row select serves)
    offs = tl.arange(0, CAP)
    valid = offs < tl.where(in_buffer, tl.minimum(count, CAP), 0)
    key = tl.load(ck + offs, mask=valid, other=0)
    pos = tl.load(ck + BUF + offs, mask=valid, other=0)
    if PROF:
        _stamp(prof_row, 0, t0, lead)
    binned = tl.zeros([], dtype=tl.int1)
    if BINS > 0:
        hist_row = hist + i.to(tl.int64) * (2 * BINS)
        bins = tl.arange(0, BINS)
        bin_counts = tl.load(hist_row + bins, mask=bins < tl.where(in_buffer, BINS, 0), other=0)
        bnd, above, bucket = radix_digit(bin_counts, TOPK)
        run_max = tl.max(tl.where(bins >= bnd, bin_counts, 0), axis=0)
        # every candidate is in a bin (else the runs' slots would not be the buffer's)
        whole = tl.sum(bin_counts, axis=0) == count
        binned = in_buffer & (run_max <= MAXSEG) & whole
    # one branch or the other, not two in turn: the candidates' tile then dies where the bins
    # have staged it, not at the kernel's end (the kernel, at its register cap, spilled)
    if binned:
        # never true without bins; the build without them has no histogram to name (the branch
        # is compiled, its condition being a value)
        if BINS > 0:
            if PROF:
                _stamp(prof_row, 1, t0, lead)
            _finish_by_bins(key, pos, valid, ck, ck + 2 * BUF, hist_row, hist_row + BINS, bnd, tl.load(gates + i),
                            tl.load(scales + i).to(tl.float32, bitcast=True), n, pt_row, out_bits + orow,
                            out_raw + orow, out_phys + orow, out_cnt + row, bin_counts, count, part, TOPK, BINS,
                            MAXSEG, PARTS, prof_row, t0, PROF)
            if lead:
                tl.store(hows + i, _BINS)
                if PROF:
                    _stamp(prof_row, 3, t0, lead)
                    tl.store(prof_row + 4, tl.zeros([], dtype=tl.int64) + _BINS)
    elif lead:
        trimmed = tl.zeros([], dtype=tl.int32)
        if BINS > 0:
            if in_buffer & (count > CAP):
                # more candidates than the registers hold, and a bin from the k-th key's up
                # holding more than MAXSEG (ties, plateaus): the search and the sort take the
                # entrants of the bins from the k-th key's up, moved to the buffer's start,
                # where those number at most CAP
                kept = above + bucket
                if (bnd >= 0) & (kept <= CAP) & whole:
                    got = _trim(ck, count, tl.load(gates + i), tl.load(scales + i).to(tl.float32, bitcast=True),
                                bnd, TOPK, BINS)
                    tl.debug_barrier()  # the moved entries are seen by every thread
                    if got == kept:
                        count = kept
                        trimmed += 1
                        valid = offs < count
                        key = tl.load(ck + offs, mask=valid, other=0)
                        pos = tl.load(ck + BUF + offs, mask=valid, other=0)
        from_candidates = in_buffer & (count <= CAP)
        how = tl.where(from_candidates, _SEARCH, _ROW_SELECT) + trimmed * _TRIMMED
        tl.store(hows + i, how)
        if from_candidates:
            _select_candidates(key, pos, valid, count, out_bits + orow, out_raw + orow, TOPK, prof_row, t0, lead,
                               PROF)
        else:
            if PROF:
                _stamp(prof_row, 1, t0, lead)
            select_row(src + i.to(tl.int64) * stride_src, n, out_bits + orow, out_raw + orow, ck, ck + 2 * TOPK,
                       TOPK, TILE, SAMPLE)
        tl.debug_barrier()
        if PROF:
            _stamp(prof_row, 2, t0, lead)
        finalize_row(out_bits + orow, out_raw + orow, tl.minimum(n, TOPK), n, pt_row,
                     out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row, TOPK)
        if PROF:
            _stamp(prof_row, 3, t0, lead)
            tl.store(prof_row + 4, how.to(tl.int64))
