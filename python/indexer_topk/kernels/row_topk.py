"""Top-k of key-matrix rows that reads each row about once.

The legacy path's select stage. A persistent grid of programs takes rows in turn:

* a row of at most ``TILE`` keys is one register tile: its k-th key is found in
  registers and the selected entries are written, in position order, to the row's outputs;
* a longer row first reads ``SAMPLE`` keys spread evenly over it, and takes as its gate a key
  that about ``1.5 * TOPK`` of the row's keys should reach (:func:`sampled_gate`). It then
  streams its tiles, in position order, through a candidate pool of ``CAP = 2 * TOPK``
  entries (the program's slice of scratch, L2-resident): a tile's keys that reach the gate are
  appended with one prefix sum (in the row kernel from ``ROWS_SET_POOL_WIDTH`` keys, in no
  particular order within the tile: :func:`append` ``STRIDED``); when they would not fit, the
  pool is cut to its best ``TOPK``, which raises the gate, and a tile that alone holds more
  entrants than fit is cut to its own best ``TOPK`` in registers first. If fewer than ``TOPK``
  keys reached the sampled gate, the
  row is streamed again from a lower one, then from none. The pool is finally cut to ``TOPK``.

Because the gate comes from a sample of the whole row, scores that trend along the row (every
tile better than the last) enter the pool no more often than random ones.

The k-th key of a tile (a one-tile row, a pool's cut, a long row's sample) is found by one
histogram of the tile's scores in ``BINS`` bins of equal width, then a search over the keys of
the k-th's bin alone (:func:`binned_kth`); a bin too full for its scratch, or ``BINS = 0``, takes
5-bit radix digits over the whole tile (32-bin histograms; the last digit is 2 bits) from the
top, stopping once the boundary bucket is taken whole (:func:`tile_kth`). Triton 3.6's
``tl.histogram`` counts a bin with a ballot per digit bit and a popcount per bin a lane owns, so
its cost grows with the bins; later releases add one shared-memory atomic per key at any count.

A register tile is in position order, so its tie rule is the select stage's: every key above
the k-th, then the first keys equal to it. The row kernel's pools are not (``SET``): tiles enter
in position order, but a tile's entrants in the order of a sum along each thread's registers,
which costs a fraction of a sum in position order. So a cut takes the keys tied at its k-th by
their positions, lowest first (:func:`take_set`), and the row's last ``TOPK`` are put back in
position order by sorting their positions (:func:`in_order`). Either way a later entry enters a
cut pool only if it beats the k-th strictly (:func:`.select.next_gate`). The selection is the
contract's and :func:`.select.finalize_row` sorts and writes it; a one-tile row in position order
scatters its positions and writes its outputs in slot order (:func:`emit_row`).
"""

import triton
import triton.language as tl

from .common import DENSE_SHARE, INT32_MAX, KEY_MIN, compaction_slots, exclusive_sum, key_to_score_bits, sort1d, wait_for_producer
from .select import finalize_row, next_gate, radix_digit, radix_update, take_mask, write_row

@triton.jit
def masked_hist(digit, m, inside, BINS: tl.constexpr):
    """Histogram of the digits ``digit`` (``0 .. BINS - 1``) of the ``inside`` entries ``m`` holds."""
    # entries left out count in bin 0 and are taken back out by their number, known from the
    # pass before: a histogram of BINS bins, not 2 * BINS with a sentinel bin, costs half the
    # ballots' popcounts, and the count costs no reduction
    hist = tl.histogram(tl.where(m, digit, 0), BINS)
    return hist - tl.where(tl.arange(0, BINS) == 0, digit.shape[0] - inside, 0)


@triton.jit
def digit_pass(b, valid, tb, need, inside, SH: tl.constexpr, W: tl.constexpr, BINS: tl.constexpr):
    """One radix step on the ``W``-bit digit at ``SH`` of the biased keys ``b`` that share the
    threshold prefix ``tb`` above it (``inside`` of them): returns ``(need, tb, whole, bucket)``
    as :func:`.select.radix_update`."""
    m = valid
    if SH + W < 32:
        m = m & ((b >> (SH + W)) == (tb >> (SH + W)))
    return radix_update(masked_hist((b >> SH) & (BINS - 1), m, inside, BINS), need, tb, SH)


@triton.jit
def radix_step(b, valid, state, SH: tl.constexpr, W: tl.constexpr, BINS: tl.constexpr):
    """:func:`digit_pass` unless an earlier pass took its boundary bucket whole."""
    tb, need, shift, done, inside = state
    if done == 0:
        need, tb, whole, inside = digit_pass(b, valid, tb, need, inside, SH, W, BINS)
        shift = tl.zeros([], dtype=tl.int32) + SH
        done = whole.to(tl.int32)
    return tb, need, shift, done, inside


@triton.jit
def tile_kth(key, valid, k):
    """The k-th largest valid key of a register tile (int32 keys; needs more than ``k`` valid).

    Returns ``(t, shift, need, whole)``: the top k are the keys whose ``key >> shift`` exceeds
    ``t >> shift`` and the first ``need`` (storage order) with ``key >> shift == t >> shift``;
    ``shift`` is 0 unless the boundary bucket was taken whole, and ``whole`` (int32) says
    whether it was (then ``need`` is all of it; see :func:`.select.take_mask`).
    """
    b = key ^ KEY_MIN  # sign bit flipped: unsigned order is key order
    zero = tl.zeros([], dtype=tl.int32)
    state = (zero, zero + k, zero, zero, tl.sum(valid.to(tl.int32), axis=0))  # (tb, need, shift, done, inside)
    # digits of 5 bits from bit 27 down, then the last 2: seven passes at most
    state = radix_step(b, valid, state, 27, 5, 32)
    state = radix_step(b, valid, state, 22, 5, 32)
    state = radix_step(b, valid, state, 17, 5, 32)
    state = radix_step(b, valid, state, 12, 5, 32)
    state = radix_step(b, valid, state, 7, 5, 32)
    state = radix_step(b, valid, state, 2, 5, 32)
    state = radix_step(b, valid, state, 0, 2, 4)
    tb, need, shift, done, _inside = state
    return tb ^ KEY_MIN, shift, need, done


@triton.jit
def span_kth(key, valid, k):
    """:func:`tile_kth` for a tile whose valid keys lie close together (a gate's entrants, the
    positions of tied keys): the same ``(t, shift, need, whole)`` contract, but the radix digits
    start at the highest bit where the smallest and largest valid keys differ. The bits above it
    are shared by every valid key, so the passes :func:`tile_kth` spends on them (each a histogram
    and its reductions, the boundary bucket holding every key) are skipped; the digit positions are
    runtime values, the search a loop that stops once the boundary bucket is taken whole."""
    lo_key = tl.min(tl.where(valid, key, INT32_MAX), axis=0)
    hi_key = tl.max(tl.where(valid, key, KEY_MIN), axis=0)
    sh = bit_length(lo_key ^ hi_key)
    b = key ^ KEY_MIN  # sign bit flipped: unsigned order is key order
    tb = (lo_key ^ KEY_MIN) & _high_mask(sh)  # the shared bits
    need = tl.zeros([], dtype=tl.int32) + k
    shift = tl.zeros([], dtype=tl.int32)
    done = tl.zeros([], dtype=tl.int32)
    inside = tl.sum(valid.to(tl.int32), axis=0)
    while (done == 0) & (sh > 0):
        lo = tl.maximum(sh - 5, 0)
        m = valid & (((b ^ tb) & _high_mask(sh)) == 0)
        hist = masked_hist((b >> lo) & ((1 << (sh - lo)) - 1), m, inside, 32)
        need, tb, whole, inside = radix_update(hist, need, tb, lo)
        shift = lo
        done = whole.to(tl.int32)
        sh = lo
    return tb ^ KEY_MIN, shift, need, done


@triton.jit
def bit_length(x):
    """Bits of the int32 ``x`` up to its highest set bit (0 for 0, 32 for a negative ``x``), from
    the exponent of ``x`` in fp64, which holds every int32 exactly: a few instructions where a
    shift and test per bit took a hundred."""
    e = ((x.to(tl.float64).to(tl.int64, bitcast=True) >> 52) & 0x7FF).to(tl.int32)
    return tl.where(x < 0, 32, tl.where(x == 0, 0, e - 1022))


@triton.jit
def _min_max(lo_a, hi_a, lo_b, hi_b):
    return tl.minimum(lo_a, lo_b), tl.maximum(hi_a, hi_b)


@triton.jit
def score_of(key):
    """The fp32 score of an order key (:func:`.common.key_to_score_bits`)."""
    return key_to_score_bits(key).to(tl.float32, bitcast=True)


@triton.jit
def bin_of(key, floor, scale, BINS: tl.constexpr):
    """The histogram bin of keys at or above ``floor``: ``floor((score - floor's score) * scale)``
    in fp32, clamped to the bins (the last bin also holds every key past it). Rounded fp32
    steps never invert an order, so a higher key never has a lower bin; a step with no value
    (``inf - inf``, ``0 * inf``: a floor or range at infinity, a range of one value) counts in
    the last bin for a positive key, the first for the rest: that only merges bins, in order.
    Bins linear in the score, not in the key's bits: the bits' order is logarithmic in the
    magnitude and would crowd the keys of a range that spans zero into a few bins."""
    d = (score_of(key) - score_of(floor)) * scale
    d = tl.where(d == d, d, tl.where(key > 0, BINS - 1.0, 0.0))
    return tl.minimum(tl.maximum(d, 0.0), BINS - 1.0).to(tl.int32)


@triton.jit
def binned_kth(key, valid, k, buf, CAND: tl.constexpr, BINS: tl.constexpr, STRIDED: tl.constexpr = False):
    """:func:`tile_kth` by one histogram of the whole tile, then a search over one bin's keys.

    The valid keys' scores are binned in ``BINS`` bins of equal width over their range
    (:func:`bin_of`), and one histogram names the bin that holds the k-th key. When that bin
    holds at most ``CAND`` keys they are compacted to ``buf`` (``CAND`` int32 of scratch; it may
    hold what the tile was loaded from, and is free again once this returns), in storage order, or
    with ``STRIDED`` in the order of :func:`.common.exclusive_sum_strided` (a fraction of the sum's
    instructions; the search needs the keys, not their order),
    and the k-th is searched among them alone (:func:`span_kth`: their keys share their high
    bits); keys of higher bins are all taken, keys of lower ones none. A fuller bin (ties, a
    plateau, a range stretched by a few outliers) takes :func:`tile_kth` over the whole tile.
    Needs more than ``k`` valid keys.

    Returns :func:`tile_kth`'s ``(t, shift, need, whole)`` for the whole tile. A key of a lower
    bin never shares the prefix of a bucket taken whole: a key of the k-th's bin left out lies
    between them.
    """
    inside = tl.sum(valid.to(tl.int32), axis=0)
    lo, hi = tl.reduce((tl.where(valid, key, INT32_MAX), tl.where(valid, key, KEY_MIN)), 0, _min_max)
    scale = BINS / (score_of(hi) - score_of(lo))
    bins = bin_of(key, lo, scale, BINS)
    dstar, above, bucket = radix_digit(masked_hist(bins, valid, inside, BINS), k)
    need = k - above
    in_bin = valid & (bins == dstar)
    shift = tl.zeros([], dtype=tl.int32)
    whole = tl.zeros([], dtype=tl.int32) + 1
    if bucket == need:  # the bin is taken whole: the k-th is its least key
        t = tl.min(tl.where(in_bin, key, INT32_MAX), axis=0)
    elif bucket <= CAND:
        slot = compaction_slots(in_bin.to(tl.int32), STRIDED)
        tl.debug_barrier()  # buf may hold the tile's own source: every thread has read it
        tl.store(buf + slot, key, mask=in_bin)
        tl.debug_barrier()
        c = tl.arange(0, CAND)
        cand = tl.load(buf + c, mask=c < bucket, other=0)
        tl.debug_barrier()  # and read back by every thread before the caller writes buf again
        t, shift, need, whole = span_kth(cand, c < bucket, need)
    else:
        t, shift, need, whole = tile_kth(key, valid, k)
    return t, shift, need, whole


@triton.jit
def search_kth(key, valid, k, buf, CAND: tl.constexpr, BINS: tl.constexpr, STRIDED: tl.constexpr = False):
    """:func:`tile_kth`'s ``(t, shift, need, whole)``, by :func:`binned_kth` where ``BINS > 0``
    (``buf``: ``CAND`` int32 of scratch; ``STRIDED``: its compaction's order), else by
    :func:`tile_kth` itself."""
    if BINS > 0:
        t, shift, need, whole = binned_kth(key, valid, k, buf, CAND, BINS, STRIDED)
    else:
        t, shift, need, whole = tile_kth(key, valid, k)
    return t, shift, need, whole


@triton.jit
def _high_mask(sh):
    """int32 mask of the bits at and above bit ``sh`` (``0 <= sh <= 32``; shifted as int64, where
    a shift by 32 is defined)."""
    return (tl.full([], -1, tl.int64) << sh.to(tl.int64)).to(tl.int32)


@triton.jit
def append(dst_key, dst_pos, count, key, pos, take, STRIDED: tl.constexpr = False):
    """Write the taken entries of a tile at ``dst[count ..]``, in storage order; returns their
    number (a caller that knows it leaves the sum unused, and the compiler drops it).
    ``STRIDED``: in no particular order, at slots from :func:`.common.exclusive_sum_strided` (a
    fraction of a sum in storage order), for a pool whose cuts break ties by position
    (:func:`take_set`) and whose last entries are put back in position order (:func:`in_order`)."""
    take_i = take.to(tl.int32)
    dst = count + compaction_slots(take_i, STRIDED)
    tl.store(dst_key + dst, key, mask=take)
    tl.store(dst_pos + dst, pos, mask=take)
    return tl.sum(take_i, axis=0)


@triton.jit
def take_set(key, pos, valid, t, shift, need, whole):
    """:func:`.select.take_mask` for entries in no particular order, with distinct positions: of
    the entries tied at the threshold, the ``need`` of lowest position (the contract's rule), found
    by a search over those entries' positions (the ``need`` largest of ``~pos``) instead of by
    their storage order. A search over distinct values ends with its boundary bucket taken whole."""
    hi = key >> shift
    t_hi = t >> shift
    if whole:
        take = valid & (hi >= t_hi)
    else:
        eq = valid & (hi == t_hi)  # more than need of them: the bucket was not taken whole
        pt, psh, _pneed, _pwhole = span_kth(~pos, eq, need)
        take = (valid & (hi > t_hi)) | (eq & ((~pos >> psh) >= (pt >> psh)))
    return take


@triton.jit
def in_order(src, from_pos, out_key, out_pos, count, TOPK: tl.constexpr):
    """Write ``count <= TOPK`` entries of the row ``src`` to ``out_key`` / ``out_pos`` in position
    order, from their distinct positions at ``from_pos`` (in no particular order; it may be
    ``out_pos``): the positions sorted (one int32 network), each key read back from the row."""
    offs = tl.arange(0, TOPK)
    m = offs < count
    tl.debug_barrier()  # every position written before any thread reads it
    p = sort1d(tl.load(from_pos + offs, mask=m, other=INT32_MAX), False)
    k = tl.load(src + p, mask=m, other=0)
    tl.debug_barrier()  # and read before it is written over
    tl.store(out_key + offs, k, mask=m)
    tl.store(out_pos + offs, p, mask=m)


@triton.jit
def cut_pool(pool_key, pool_pos, count, dst_key, dst_pos, TOPK: tl.constexpr, CAP: tl.constexpr,
             BINS: tl.constexpr = 0, CAND: tl.constexpr = 512, SET: tl.constexpr = False):
    """Cut a pool of ``TOPK < count <= CAP`` entries (storage order) to its best ``TOPK``,
    written in storage order to ``dst`` (which may be the pool). Returns the gate a later entry
    must reach. ``BINS``: the k-th searched by :func:`binned_kth` (``CAND`` keys of the pool's
    scratch at most), else (0) by :func:`tile_kth`. ``SET``: the pool's entries have distinct
    positions in no particular order (:func:`append` ``STRIDED``), its ties are taken by position
    (:func:`take_set`) and ``dst`` written in no particular order; the gate holds while later
    entries have higher positions than the pool's."""
    offs = tl.arange(0, CAP)
    valid = offs < count
    if SET:
        tl.debug_barrier()  # every append to the pool is seen (those appends keep no barrier)
    key = tl.load(pool_key + offs, mask=valid, other=0)
    pos = tl.load(pool_pos + offs, mask=valid, other=0)
    t, shift, need, whole = search_kth(key, valid, TOPK, pool_key, CAND, BINS, SET)
    if SET:
        take = take_set(key, pos, valid, t, shift, need, whole)
    else:
        take, _eq = take_mask(key, valid, t, shift, need, 0, whole)
    tl.debug_barrier()  # every entry is read before the cut writes over the pool
    # by position even in the unordered pool: a cut keeps half the pool, and strided slots would
    # scatter so dense a tile's stores (common.DENSE_SHARE)
    append(dst_key, dst_pos, 0, key, pos, take)
    if not SET:  # (the unordered pool's next reader, a cut or in_order, starts with a barrier)
        tl.debug_barrier()  # written before any thread reads the pool again
    return next_gate(t, shift)


@triton.jit
def row_sample(src, n, SAMPLE: tl.constexpr):
    """``SAMPLE`` keys spread evenly over a row of ``n >= SAMPLE`` keys."""
    j = tl.arange(0, SAMPLE)
    return tl.load(src + ((j.to(tl.int64) * n) // SAMPLE).to(tl.int32))


@triton.jit
def sample_rank(n, TOPK: tl.constexpr, SAMPLE: tl.constexpr, HALVES: tl.constexpr):
    """The rank in a row's sample of ``SAMPLE`` keys that a gate letting about ``HALVES / 2 *
    TOPK`` of its ``n`` keys in aims at: scaled by ``SAMPLE / n``, at most ``SAMPLE - 1``."""
    return tl.minimum((HALVES * TOPK * SAMPLE) // (2 * n) + 1, SAMPLE - 1)


@triton.jit
def sample_gate(key, n, TOPK: tl.constexpr, HALVES: tl.constexpr, buf=None, CAND: tl.constexpr = 512,
                BINS: tl.constexpr = 0):
    """A gate that about ``HALVES / 2 * TOPK`` of a row's ``n`` keys reach, from its sample
    ``key`` (:func:`row_sample`, ``SAMPLE`` keys): the ``r``-th largest of the sample, ``r`` scaled
    from ``HALVES / 2 * TOPK`` by ``SAMPLE / n`` (at most the sample's second smallest). At least
    ``r`` keys of the row reach it; whether ``TOPK`` do is what the scan that uses it checks.
    ``BINS``: the ``r``-th searched by :func:`binned_kth` (``buf``: ``CAND`` int32 of scratch),
    else (0) by :func:`tile_kth`."""
    SAMPLE: tl.constexpr = key.shape[0]
    r = sample_rank(n, TOPK, SAMPLE, HALVES)
    t, shift, _need, _whole = search_kth(key, tl.arange(0, SAMPLE) < SAMPLE, r, buf, CAND, BINS)
    # the r-th largest itself, also where the search stopped at a bucket taken whole: the
    # bucket's floor can lie far below it (a coarse bucket holds many of the row's keys)
    return tl.min(tl.where((key >> shift) >= (t >> shift), key, INT32_MAX), axis=0)


@triton.jit
def sampled_gate(src, n, TOPK: tl.constexpr, SAMPLE: tl.constexpr, HALVES: tl.constexpr, buf=None,
                 CAND: tl.constexpr = 512, BINS: tl.constexpr = 0):
    """:func:`sample_gate` of the row's :func:`row_sample` (rows of ``n > SAMPLE`` keys)."""
    return sample_gate(row_sample(src, n, SAMPLE), n, TOPK, HALVES, buf, CAND, BINS)


@triton.jit
def scan_row(src, n, pool_key, pool_pos, gate, TOPK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr = 0,
             CAND: tl.constexpr = 512, SET: tl.constexpr = False):
    """Stream the row's tiles through the pool, from the gate ``gate``: returns how many entries
    the pool holds, in position order (``SET``: in no particular order, a tile's entrants
    appended ``STRIDED`` where at most ``1 / DENSE_SHARE`` of it enters and by position where more
    does, and cut by :func:`cut_pool` with ``SET``). When that is ``TOPK`` or more, they hold the
    row's top ``TOPK`` (a key below the gate loses to ``TOPK`` entries that reach it); fewer means
    the gate was too high and nothing is known."""
    CAP: tl.constexpr = 2 * TOPK
    offs = tl.arange(0, TILE)
    count = tl.zeros([], dtype=tl.int32)
    if SET:
        tl.debug_barrier()  # a scan before this one wrote the pool's slots this one writes again
    for c0 in range(0, n, TILE):
        pos = c0 + offs
        valid = pos < n
        key = tl.load(src + pos, mask=valid, other=0, eviction_policy="evict_first")
        enter = valid & (key >= gate)
        n_in = tl.sum(enter.to(tl.int32), axis=0)
        if count + n_in > CAP:
            if count > TOPK:
                gate = tl.maximum(gate, cut_pool(pool_key, pool_pos, count, pool_key, pool_pos, TOPK, CAP, BINS, CAND,
                                                 SET))
                count = tl.zeros([], dtype=tl.int32) + TOPK
                enter = enter & (key >= gate)
                n_in = tl.sum(enter.to(tl.int32), axis=0)
            if count + n_in > CAP:
                # the tile alone holds more entrants than fit: only its own best TOPK can
                # enter, and a later entry must beat its TOPK-th
                t, shift, need, whole = tile_kth(key, enter, TOPK)
                enter, _eq = take_mask(key, enter, t, shift, need, 0, whole)
                gate = tl.maximum(gate, next_gate(t, shift))
                n_in = tl.zeros([], dtype=tl.int32) + TOPK
        if n_in > 0:
            if SET and n_in * DENSE_SHARE <= TILE:
                append(pool_key, pool_pos, count, key, pos, enter, True)  # n_in of them, counted above
            else:
                # a dense tile by position (its strided slots would scatter its stores)
                append(pool_key, pool_pos, count, key, pos, enter, False)
            count += n_in
            if not SET:  # (the unordered pool's next reader, a cut or in_order, starts with a barrier)
                tl.debug_barrier()  # the appended entries are seen by every thread of a later cut
    return count


@triton.jit
def tile_take(src, n, buf, TOPK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr, CAND: tl.constexpr):
    """The row of ``n <= TILE`` keys at ``src`` as one register tile: ``(key, position, take)``,
    ``take`` its best ``min(n, TOPK)``. ``buf``: ``CAND`` int32 of scratch for
    :func:`binned_kth` (``BINS > 0``; else the k-th by :func:`tile_kth`)."""
    offs = tl.arange(0, TILE)
    valid = offs < n
    key = tl.load(src + offs, mask=valid, other=0)
    take = valid
    if n > TOPK:
        # the strided compaction: a one-tile build without spills either way; in the longer
        # rows' ordered build it spilled more (368 B of stack against 328, Triton 3.6)
        t, shift, need, whole = search_kth(key, valid, TOPK, buf, CAND, BINS, True)
        take, _eq = take_mask(key, valid, t, shift, need, 0, whole)
    return key, offs, take


@triton.jit
def emit_row(pos, take, count, src, pt_row, out_bits_row, out_raw_row, out_phys_row, out_cnt_ptr,
             TOPK: tl.constexpr):
    """:func:`.select.finalize_row`'s outputs in position order for a one-tile row of ``src``
    held in registers: the ``count`` entries ``take`` marks among the positions ``pos`` (in
    position order) at slots ``0 .. count - 1``, then ``-inf`` / ``-1`` padding.

    Only the positions are scattered, to ``out_raw_row``; they are read back in slot order with
    their keys (from ``src``, just read) and pages, and the row written in slot order. A
    scatter costs an address and a masked store per key of the tile, a write in slot order one per
    slot (``TOPK`` of them, contiguous), so one scatter and a read back cost fewer instructions
    than three scatters and a page lookup per key."""
    tl.store(out_raw_row + exclusive_sum(take.to(tl.int32)), pos, mask=take)
    tl.debug_barrier()  # every slot written before any thread reads it back
    slot = tl.arange(0, TOPK)
    m = slot < count
    p = tl.load(out_raw_row + slot, mask=m, other=0)
    page = tl.load(pt_row + (p >> 6), mask=m, other=0)
    k = tl.load(src + p, mask=m, other=0)
    # out_raw is written over with the positions it holds, and -1 only where nothing was read:
    # whichever thread writes a slot, no reader can see another value, so no barrier
    write_row(k, p, page, m, slot, count, out_bits_row, out_raw_row, out_phys_row, out_cnt_ptr)


@triton.jit
def select_row(
    src, n, out_key, out_pos, pool_key, pool_pos, TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr,
    BINS: tl.constexpr = 0, CAND: tl.constexpr = 512, ONE_TILE: tl.constexpr = False, SET: tl.constexpr = False,
):
    """Write the best ``min(n, TOPK)`` of the ``n`` keys at ``src`` (positions ``0 .. n - 1``) to
    ``out_key`` / ``out_pos`` in position order. ``BINS``: each k-th searched by
    :func:`binned_kth` over at most ``CAND`` keys of one bin (``CAND <= TOPK``: a one-tile row
    compacts them to ``out_key``), else (0) by :func:`tile_kth`. ``ONE_TILE``: ``n <= TILE``
    always (only that path is compiled). ``SET``: a longer row's pool holds its entries in no
    particular order (:func:`append` ``STRIDED``: cheaper appends, a sort of the last ``TOPK``
    positions); the same outputs."""
    CAP: tl.constexpr = 2 * TOPK
    if ONE_TILE:  # the branch below, chosen at compile time: no longer rows' path is compiled
        key, offs, take = tile_take(src, n, out_key, TOPK, TILE, BINS, CAND)
        append(out_key, out_pos, 0, key, offs, take)
    elif n <= TILE:
        key, offs, take = tile_take(src, n, out_key, TOPK, TILE, BINS, CAND)
        append(out_key, out_pos, 0, key, offs, take)
    else:
        # a gate from a sample lets about 1.5 * TOPK keys into the pool, so the scan rarely
        # cuts, whatever the order of the scores along the row. A sample misjudges a row now
        # and then (the r-th of a sample is a noisy quantile): where fewer than TOPK got in,
        # the row is scanned again from a gate four times as generous, then from none
        # (the pool, empty before each scan, is the sample's scratch)
        gate = sampled_gate(src, n, TOPK, SAMPLE, 3, pool_key, CAND, BINS)
        count = scan_row(src, n, pool_key, pool_pos, gate, TOPK, TILE, BINS, CAND, SET)
        if count < TOPK:
            gate = sampled_gate(src, n, TOPK, SAMPLE, 12, pool_key, CAND, BINS)
            count = scan_row(src, n, pool_key, pool_pos, gate, TOPK, TILE, BINS, CAND, SET)
        if count < TOPK:
            count = scan_row(src, n, pool_key, pool_pos, tl.zeros([], dtype=tl.int32) + KEY_MIN, TOPK, TILE, BINS,
                             CAND, SET)
        if SET:
            chosen = pool_pos  # the scans leave at least TOPK entries: exactly TOPK, or a cut to TOPK
            if count > TOPK:
                cut_pool(pool_key, pool_pos, count, out_key, out_pos, TOPK, CAP, BINS, CAND, SET)
                chosen = out_pos
            in_order(src, chosen, out_key, out_pos, TOPK, TOPK)
        elif count > TOPK:
            cut_pool(pool_key, pool_pos, count, out_key, out_pos, TOPK, CAP, BINS, CAND)
        else:
            m = tl.arange(0, CAP) < count
            key = tl.load(pool_key + tl.arange(0, CAP), mask=m, other=0)
            pos = tl.load(pool_pos + tl.arange(0, CAP), mask=m, other=0)
            append(out_key, out_pos, 0, key, pos, m)


@triton.jit
def row_length(seq_lens, row, stride_src):
    """Row ``row``'s length, clamped to ``[0, stride_src]``: an unchecked length past the key
    matrix's row (or below 0) must not read, and so select, beyond it."""
    return tl.minimum(tl.maximum(tl.load(seq_lens + row), 0), stride_src)


@triton.jit(do_not_specialize=["stride_src", "rows", "row_start"])
def topk_rows_kernel(
    src, stride_src, rows, seq_lens, page_table, stride_pt, out_bits, out_raw, out_phys, out_cnt, row_start,
    scratch, TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr, PDL: tl.constexpr = False,
    SORT_BITS: tl.constexpr = 64, BINS: tl.constexpr = 0, CAND: tl.constexpr = 512, ONE_TILE: tl.constexpr = False,
    SET_POOL: tl.constexpr = False,
):
    """Persistent programs over the ``rows`` rows of a contiguous key matrix (``stride_src``
    keys a row; row ``i`` is the contract's row ``row_start + i``): each row's top ``TOPK``,
    written to the four outputs. ``scratch`` holds ``4 * TOPK`` int32 per program. ``PDL``:
    launched with programmatic dependent launch after the kernel that wrote ``src``.
    ``SORT_BITS``: a row's selection sorted by the 64-bit or the 32-bit network
    (:func:`.select.finalize_row`); the same outputs either way. ``BINS`` / ``CAND``: each k-th
    searched in one bin of a histogram (:func:`binned_kth`), or (``BINS = 0``) by radix digits
    over the whole tile; the same outputs either way. ``ONE_TILE``: the matrix is at most ``TILE``
    keys wide, so every row is one register tile and the longer rows' path is not compiled (its
    registers would crowd the tile's). ``SET_POOL``: a longer row's pool in no particular order
    (:func:`select_row`'s ``SET``); the same outputs."""
    wait_for_producer(PDL)
    tl.static_assert(SAMPLE <= TILE, "rows longer than the tile are sampled: SAMPLE must not exceed TILE")
    pid = tl.program_id(0)
    pool_key = scratch + pid.to(tl.int64) * (4 * TOPK)
    pool_pos = pool_key + 2 * TOPK
    programs = tl.num_programs(0)
    for j in range(0, tl.cdiv(rows - pid, programs)):
        i = pid + j * programs
        row = row_start + i
        n = row_length(seq_lens, row, stride_src)
        orow = row.to(tl.int64) * TOPK
        pt_row = page_table + row.to(tl.int64) * stride_pt
        row_src = src + i.to(tl.int64) * stride_src
        # a one-tile row in position order, written as selected (with ONE_TILE the test folds to a
        # constant and the other branch is not compiled: its registers would crowd this one's)
        if ((n <= TILE) | ONE_TILE) & (SORT_BITS == 0):
            _key, pos, take = tile_take(row_src, n, out_bits + orow, TOPK, TILE, BINS, CAND)
            emit_row(pos, take, tl.minimum(n, TOPK), row_src, pt_row, out_bits + orow, out_raw + orow, out_phys + orow,
                     out_cnt + row, TOPK)
        else:
            select_row(row_src, n, out_bits + orow, out_raw + orow, pool_key, pool_pos, TOPK, TILE, SAMPLE, BINS, CAND,
                       ONE_TILE, SET_POOL)
            tl.debug_barrier()
            finalize_row(
                out_bits + orow, out_raw + orow, tl.minimum(n, TOPK), n, pt_row,
                out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row, TOPK, SORT_BITS,
            )
        tl.debug_barrier()  # the pool and the output row are reused by the program's next row
