"""Exact top-k selection in Triton: radix select over a sequence in position order, then sort.

The selection works on sequences whose storage order is position order (a logits row, the
fused kernel's candidate buffer, the concatenated per-split candidate lists). That makes the
tie rule cheap: after the k-th largest key ``T`` is found, every key above ``T`` is taken and
the *first* ``need`` keys equal to ``T`` in storage order, which are the lowest positions.

``radix_threshold`` finds ``T`` with up to four 8-bit histogram passes from the top byte,
stopping early once the boundary bucket is taken whole. ``select_into`` then writes the
selected ``(key, position)`` pairs compactly, still in position order. ``finalize_row`` sorts
them under the contract's order (int64 ``key << 32 | ~position``, or a 32-bit network and a
correction, :func:`sort_narrow`) and writes the four outputs.
"""

import triton
import triton.language as tl

from .common import COMP_MIN, KEY_MIN, LOW32, NEG_INF_BITS, exclusive_sum, key_to_score_bits, sort1d

MODE_KEYS = 0  # a key-matrix row: int32 keys, position = offset, valid below n
MODE_SEGMENTS = 1  # per-split lists of TOPK entries, valid below each split's count
# the 32-bit sort's longest run of entries alike in their high bits corrected in place (longer
# ones send the row to the 64-bit network)
NARROW_RUN = tl.constexpr(4)


@triton.jit
def load_entries(src_key, src_pos, seg_cnt_ptr, offs, n, MODE: tl.constexpr, TOPK: tl.constexpr):
    """``(key int32, position int32, valid)`` of the entries at ``offs``."""
    valid = offs < n
    if MODE == 0:
        key = tl.load(src_key + offs, mask=valid, other=0)
        pos = offs
    else:
        c = tl.load(seg_cnt_ptr + offs // TOPK, mask=valid, other=0)
        valid = valid & ((offs % TOPK) < c)
        key = tl.load(src_key + offs, mask=valid, other=0)
        pos = tl.load(src_pos + offs, mask=valid, other=0)
    return key, pos, valid


@triton.jit
def _max3(a0, b0, c0, a1, b1, c1):
    return tl.maximum(a0, a1), tl.maximum(b0, b1), tl.maximum(c0, c1)


@triton.jit
def radix_digit(hist, need):
    """One radix step over a digit histogram (bin ``d`` counts the entries whose digit is ``d``;
    bins no digit reaches hold 0).

    Returns ``(digit, above, bucket)``: the largest digit whose bucket and those above it hold at
    least ``need`` entries, how many lie strictly above it, and how many in it (``-1``, every
    entry and 0 where no digit does).
    """
    bins = tl.arange(0, hist.shape[0]).to(tl.int64)
    ge = tl.cumsum(hist, axis=0, reverse=True)  # entries whose digit is d or above
    # ge does not grow with d, so the digits that qualify are 0 .. digit: the largest of them
    # and its counts come out of one max over (digit << 32 | count), with the total beside it
    # (a reduction, and its barrier, where a max and sums of the histogram took four)
    hit = ge >= need
    at_ge = tl.where(hit, (bins << 32) | ge.to(tl.int64), -1)
    at_above = tl.where(hit, (bins << 32) | (ge - hist).to(tl.int64), -1)
    p_ge, p_above, total = tl.reduce((at_ge, at_above, ge), 0, _max3)
    digit = (p_ge >> 32).to(tl.int32)  # -1 where no digit qualifies
    above = tl.where(digit >= 0, (p_above & LOW32).to(tl.int32), total)
    bucket = tl.where(digit >= 0, (p_ge & LOW32).to(tl.int32) - above, 0)
    return digit, above, bucket


@triton.jit
def digit_histogram(b, valid, tb, SH: tl.constexpr):
    """512-bin histogram of the 8-bit digit at ``SH`` of the valid biased keys ``b`` that share
    the threshold prefix ``tb`` above it (the rest are counted in bin 256, then dropped: bins
    256.. hold 0)."""
    m = valid
    if SH + 8 < b.dtype.primitive_bitwidth:
        m = m & ((b >> (SH + 8)) == (tb >> (SH + 8)))
    hist = tl.histogram(tl.where(m, ((b >> SH) & 0xFF).to(tl.int32), 256), 512)
    return tl.where(tl.arange(0, 512) < 256, hist, 0)


@triton.jit
def radix_update(hist, need, tb, SH):
    """One radix step from a digit histogram: ``(need, tb, done, bucket)`` with the digit's bits
    added to the threshold prefix ``tb``, ``need`` reduced by the entries above it, ``bucket``
    the entries of the boundary bucket and ``done`` when it is taken whole."""
    dstar, above, bucket = radix_digit(hist, need)
    need = need - above
    return need, tb | (dstar.to(tb.dtype) << SH), bucket == need, bucket


@triton.jit
def tile_threshold(b, valid, k, BITS: tl.constexpr):
    """k-th largest of the valid biased keys ``b`` (int32 or int64, sign bit flipped so that
    unsigned order is key order), held as one register tile; needs more than ``k`` valid.

    Returns ``(tb, shift, need)`` with ``tb`` the biased threshold: see :func:`radix_threshold`.
    """
    zero = tl.zeros([], dtype=tl.int32)
    tb = tl.zeros([], dtype=b.dtype)
    need = zero + k
    shift = zero
    done = zero
    for p in tl.static_range(BITS // 8):
        sh = BITS - 8 - 8 * p
        if done == 0:
            need, tb, whole, _bucket = radix_update(digit_histogram(b, valid, tb, sh), need, tb, sh)
            shift = zero + sh
            if whole:
                done = zero + 1
    return tb, shift, need


@triton.jit
def take_mask(key, valid, t, shift, need, eq_seen, whole=0):
    """Which entries the selection ``(t, shift, need)`` takes, given ``eq_seen`` entries equal to
    the threshold earlier in storage order; also returns the equal entries (int32). ``whole``
    (the search's own word, :func:`.row_topk.tile_kth`): the boundary bucket is taken whole, so
    the equal entries need no count in storage order."""
    hi = key >> shift
    t_hi = t >> shift
    eq = valid & (hi == t_hi)
    eq_i = eq.to(tl.int32)
    if whole:
        take = valid & (hi >= t_hi)
    else:
        take = (valid & (hi > t_hi)) | (eq & ((eq_seen + exclusive_sum(eq_i)) < need))
    return take, eq_i


@triton.jit
def next_gate(t, shift):
    """The smallest key a later (higher-position) entry needs to enter a set cut at ``t``: it
    ties with the k-th only at a higher position, so it must beat it strictly; when the
    threshold is known only to ``shift`` bits, the bucket's floor is the safe bound."""
    return tl.where(shift == 0, t + 1, (t >> shift) << shift)


@triton.jit
def radix_threshold(
    src_key, src_pos, seg_cnt_ptr, n, k,
    MODE: tl.constexpr, TOPK: tl.constexpr, CHUNK: tl.constexpr,
):
    """Find the k-th largest key among the valid entries (requires more than ``k`` valid).

    Returns ``(t, shift, need)``: the selected set is every key whose ``key >> shift`` exceeds
    ``t >> shift``, plus the first ``need`` keys (in storage order) with ``key >> shift == t >> shift``.
    ``shift`` is 0 unless the boundary bucket was taken whole.
    """
    zero = tl.zeros([], dtype=tl.int32)
    tb = zero  # biased prefix of the threshold (sign bit flipped: unsigned order)
    need = zero + k
    shift = zero
    done = zero
    for p in tl.static_range(4):
        sh = 24 - 8 * p
        if done == 0:
            hist = tl.zeros([512], dtype=tl.int32)
            for c0 in range(0, n, CHUNK):
                offs = c0 + tl.arange(0, CHUNK)
                key, pos, valid = load_entries(src_key, src_pos, seg_cnt_ptr, offs, n, MODE, TOPK)
                hist += digit_histogram(key ^ KEY_MIN, valid, tb, sh)
            need, tb, whole, _bucket = radix_update(hist, need, tb, sh)
            shift = zero + sh
            if whole:
                done = zero + 1
    return tb ^ KEY_MIN, shift, need


@triton.jit
def select_into(
    src_key, src_pos, seg_cnt_ptr, n, n_valid, k, dst_key, dst_pos,
    MODE: tl.constexpr, TOPK: tl.constexpr, CHUNK: tl.constexpr, KNOWN_T: tl.constexpr, known_t, known_need,
):
    """Write the top ``k`` valid entries (all of them if ``n_valid <= k``) to ``dst`` in storage order.

    ``dst`` may alias ``src`` (in-place compaction never writes ahead of what it has read).
    With ``KNOWN_T`` the k-th largest key ``known_t`` and the number ``known_need`` of keys equal
    to it that belong to the top k are given (from a top-k run elsewhere) instead of searched.
    """
    zero = tl.zeros([], dtype=tl.int32)
    t = zero + KEY_MIN
    shift = zero
    need = zero + n_valid
    if n_valid > k:
        if KNOWN_T:
            t = zero + known_t
            need = zero + known_need
        else:
            t, shift, need = radix_threshold(src_key, src_pos, seg_cnt_ptr, n, k, MODE, TOPK, CHUNK)
    taken = zero
    eq_seen = zero
    for c0 in range(0, n, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        key, pos, valid = load_entries(src_key, src_pos, seg_cnt_ptr, offs, n, MODE, TOPK)
        take, eq_i = take_mask(key, valid, t, shift, need, eq_seen)
        take_i = take.to(tl.int32)
        dst = taken + tl.cumsum(take_i, axis=0) - take_i
        tl.debug_barrier()
        room = take & (dst < k)  # k entries at most, whatever the inputs: dst is k long
        tl.store(dst_key + dst, key, mask=room)
        tl.store(dst_pos + dst, pos, mask=room)
        taken += tl.sum(take_i, axis=0)
        eq_seen += tl.sum(eq_i, axis=0)


@triton.jit
def composite(key, pos):
    """The contract's order of ``(key, position)`` entries as int64 ``key << 32 | ~position``:
    descending is output order (higher keys first, then lower positions)."""
    return (key.to(tl.int64) << 32) | (pos.to(tl.int64) ^ LOW32)


@triton.jit
def sort_narrow(src_key, src_pos, count, key, pos, m, TOPK: tl.constexpr, RUN: tl.constexpr):
    """The ``count`` entries ``(key, pos)`` of one row (position order, ``m`` the slots below
    ``count``, also stored at ``src``) in the contract's order, by a 32-bit network: returns
    ``(key, pos, slot)``, the entries and each one's output slot (entries past ``count`` keep
    their own slot).

    The network sorts ``key >> B << B | (TOPK - 1 - i)`` (``B = log2(TOPK)``, ``i`` the entry's
    index in position order): the key's high bits first, then the index, which is the order of
    the entries up to the ``B`` low bits of their keys. Entries equal in those high bits sit
    together ("runs"), ordered by index rather than by key; each entry's slot is corrected
    within its run by comparing it with the run's other members, at most ``RUN - 1`` slots away
    on either side. A run longer than ``RUN`` (ties and plateaus: many keys alike in their high
    bits) is seen by comparing each slot with the one ``RUN`` after it, and then the row is
    sorted by the 64-bit network instead. ``src`` is overwritten (with the entries in network
    order)."""
    B: tl.constexpr = TOPK.bit_length() - 1
    offs = tl.arange(0, TOPK)
    # valid entries are at i < count: their low bits are TOPK - 1 - i > TOPK - 1 - count >= 0
    # unless count == TOPK, when none is invalid, so KEY_MIN sorts every invalid one last (the
    # arithmetic shift keeps the keys' signed order)
    c = tl.where(m, ((key >> B) << B) | (TOPK - 1 - offs), KEY_MIN)
    c = sort1d(c, True)
    idx = TOPK - 1 - (c & (TOPK - 1))
    key = tl.load(src_key + idx, mask=m, other=0)
    pos = tl.load(src_pos + idx, mask=m, other=0)
    tl.debug_barrier()  # every entry is gathered before the network order is written over src
    tl.store(src_key + offs, key, mask=m)
    tl.store(src_pos + offs, pos, mask=m)
    tl.debug_barrier()
    hi = key >> B
    far = offs + RUN
    far_key = tl.load(src_key + far, mask=far < count, other=0)
    long_run = tl.max((m & (far < count) & ((far_key >> B) == hi)).to(tl.int32), axis=0)
    slot = offs
    if long_run != 0:
        comp = sort1d(tl.where(m, composite(key, pos), COMP_MIN), True)
        key = (comp >> 32).to(tl.int32)
        pos = ((comp & LOW32) ^ LOW32).to(tl.int32)
    else:
        # an entry's slot in its run: its network slot, less the run's earlier entries it
        # comes before, plus the later ones that come before it. Within a run the network
        # order is position order, so of two equal keys the earlier already comes first: the
        # keys alone decide, no composite
        for d in tl.static_range(1, RUN):
            a = offs + d
            ka = tl.load(src_key + a, mask=a < count, other=0)
            slot += (m & (a < count) & ((ka >> B) == hi) & (ka > key)).to(tl.int32)
            b = offs - d
            kb = tl.load(src_key + b, mask=m & (b >= 0), other=0)
            slot -= (m & (b >= 0) & ((kb >> B) == hi) & (kb < key)).to(tl.int32)
    return key, pos, slot


@triton.jit
def store_entries(key, pos, slot, m, pt_row_ptr, out_bits_row, out_raw_row, out_phys_row):
    """The three outputs of the entries ``(key, pos)`` that ``m`` marks, each at its ``slot`` of
    the row: the score's bits, the position, and the physical slot through the row's page table
    (pages of 64)."""
    page = tl.load(pt_row_ptr + (pos >> 6), mask=m, other=0)
    tl.store(out_bits_row + slot, key_to_score_bits(key), mask=m)
    tl.store(out_raw_row + slot, pos, mask=m)
    tl.store(out_phys_row + slot, page * 64 + (pos & 63), mask=m)


@triton.jit
def finalize_row(
    src_key, src_pos, count, seq_len, pt_row_ptr,
    out_bits_row, out_raw_row, out_phys_row, out_cnt_ptr,
    TOPK: tl.constexpr, SORT_BITS: tl.constexpr = 64,
):
    """Write one row's outputs from ``count`` (key, position) pairs in position order.

    Long rows are sorted best first; rows with ``seq_len <= TOPK`` keep ascending positions.
    Slots past ``count`` get ``-inf`` / ``-1``. ``src`` may alias the output row (with
    ``SORT_BITS = 32`` it is written over). ``SORT_BITS``: the 64-bit network over the
    composites, or the 32-bit one of :func:`sort_narrow`; the same outputs. ``SORT_BITS = 0``
    leaves long rows in ascending positions too (``order="position"``: the same entries, unsorted).
    """
    tl.static_assert((SORT_BITS == 0) | (SORT_BITS == 32) | (SORT_BITS == 64), "SORT_BITS is 0, 32 or 64")
    offs = tl.arange(0, TOPK)
    count = tl.maximum(count, 0)  # a negative (unchecked) length is an empty row
    m = offs < count
    key = tl.load(src_key + offs, mask=m, other=0)
    pos = tl.load(src_pos + offs, mask=m, other=0)
    slot = offs
    if seq_len > TOPK:
        if SORT_BITS == 32:
            key, pos, slot = sort_narrow(src_key, src_pos, count, key, pos, m, TOPK, NARROW_RUN)
        elif SORT_BITS == 64:
            comp = sort1d(tl.where(m, composite(key, pos), COMP_MIN), True)
            key = (comp >> 32).to(tl.int32)
            pos = ((comp & LOW32) ^ LOW32).to(tl.int32)
    page = tl.load(pt_row_ptr + (pos >> 6), mask=m, other=0)
    tl.debug_barrier()
    write_row(key, pos, page, m, slot, count, out_bits_row, out_raw_row, out_phys_row, out_cnt_ptr)


@triton.jit
def write_row(key, pos, page, m, slot, count, out_bits_row, out_raw_row, out_phys_row, out_cnt_ptr):
    """A whole row's four outputs: at each ``slot`` the entry ``(key, pos)`` (``page``: its page,
    pages of 64) where ``m`` marks one, ``-inf`` / ``-1`` elsewhere, and the row's ``count``."""
    tl.store(out_bits_row + slot, tl.where(m, key_to_score_bits(key), NEG_INF_BITS))
    tl.store(out_raw_row + slot, tl.where(m, pos, -1))
    tl.store(out_phys_row + slot, tl.where(m, page * 64 + (pos & 63), -1))
    tl.store(out_cnt_ptr, count)


@triton.jit(do_not_specialize=["stride_src", "stride_pt", "row_start"])
def select_rows_kernel(
    src_key, src_pos, seg_cnt, stride_src, seq_lens, page_table, stride_pt,
    out_bits, out_raw, out_phys, out_cnt, row_start, kth_key, kth_need,
    MODE: tl.constexpr, TOPK: tl.constexpr, SPLITS: tl.constexpr, CHUNK: tl.constexpr,
    KNOWN_T: tl.constexpr, SORT_BITS: tl.constexpr = 64,
):
    """One program per row: top-k of a key-matrix row (legacy) or of per-split lists (fused merge).

    A key matrix (``MODE_KEYS``) is contiguous: its rows are ``stride_src`` keys long. With
    ``KNOWN_T``, ``kth_key[i]`` / ``kth_need[i]`` give row ``i``'s k-th key and how many keys
    equal to it are selected (from a stock top-k over the row). ``SORT_BITS``: 64, or 0 for
    rows left in position order (:func:`finalize_row`).
    """
    i = tl.program_id(0)
    row = row_start + i
    seq_len = tl.load(seq_lens + row)
    base = i.to(tl.int64) * stride_src
    if MODE == 0:
        # a key-matrix row holds stride_src keys: an unchecked length past it (or below 0)
        # must not read, and so select, beyond the row
        seq_len = tl.minimum(tl.maximum(seq_len, 0), stride_src)
        n = seq_len
        n_valid = seq_len
        cnt_ptr = seg_cnt
    else:
        n = SPLITS * TOPK
        cnt_ptr = seg_cnt + row.to(tl.int64) * SPLITS
        split_ids = tl.arange(0, SPLITS)
        n_valid = tl.sum(tl.load(cnt_ptr + split_ids), axis=0)
    # never more than were found (fewer only for an unchecked length past the page table)
    count = tl.minimum(tl.minimum(seq_len, TOPK), n_valid)
    orow = row.to(tl.int64) * TOPK
    dst_key = out_bits + orow
    dst_pos = out_raw + orow
    known_t = 0
    known_need = 0
    if KNOWN_T:
        known_t = tl.load(kth_key + i)
        known_need = tl.load(kth_need + i)
    select_into(
        src_key + base, src_pos + base, cnt_ptr, n, n_valid, TOPK, dst_key, dst_pos, MODE, TOPK, CHUNK,
        KNOWN_T, known_t, known_need,
    )
    tl.debug_barrier()
    finalize_row(
        dst_key, dst_pos, count, seq_len, page_table + row.to(tl.int64) * stride_pt,
        out_bits + orow, out_raw + orow, out_phys + orow, out_cnt + row, TOPK, SORT_BITS,
    )


@triton.jit
def merge_lists_kernel(
    src_key, src_pos, src_cnt, dst_key, dst_pos, dst_cnt,
    TOPK: tl.constexpr, FANIN: tl.constexpr, CHUNK: tl.constexpr,
):
    """One level of the split merge: program ``p`` takes the ``FANIN`` lists ``p * FANIN ..``
    (each ``TOPK`` slots, valid below its count, in position order, consecutive lists covering
    consecutive positions of one row) and writes their best ``TOPK`` entries, in position order,
    as list ``p`` of ``dst`` with its count."""
    p = tl.program_id(0).to(tl.int64)
    base = p * (FANIN * TOPK)
    cnt_ptr = src_cnt + p * FANIN
    n_valid = tl.sum(tl.load(cnt_ptr + tl.arange(0, FANIN)), axis=0)
    select_into(
        src_key + base, src_pos + base, cnt_ptr, FANIN * TOPK, n_valid, TOPK, dst_key + p * TOPK,
        dst_pos + p * TOPK, 1, TOPK, CHUNK, False, 0, 0,  # MODE 1: segment lists
    )
    tl.store(dst_cnt + p, tl.minimum(n_valid, TOPK))
