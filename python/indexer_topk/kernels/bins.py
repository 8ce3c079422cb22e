"""Ordering a selection by histogram bins instead of a sorting network.

A selection of ``count`` entries ``(key, position)`` is ordered under the contract's order
(higher key first, then lower position) by a counting sort on bins linear in the score: each
entry's bin, a histogram of the bins (one atomic add an entry, which also gives the entry its
arrival slot in the bin), the run of output slots each bin starts at (the entries of higher
bins come first), and each entry's rank inside its run by comparisons with the run's other
entries. Bins never invert the key order (:func:`bin_of`), so that is the exact order wherever
no bin holds more than ``MAXSEG`` entries; where one does (ties, plateaus, a range the bins do
not resolve), the caller sorts instead.

Triton has no shared-memory histogram or scatter, and ``tl.sort``'s network of ``log2(n) *
(log2(n) + 1) / 2`` steps over 64-bit composites moves every entry through shared memory at
each step across warps; the counting sort moves each entry twice and compares it ``MAXSEG``
times, through a histogram and a staging area in L2-resident scratch.
"""

import triton
import triton.language as tl

from .common import INT32_MAX, KEY_MIN, key_to_score_bits


@triton.jit
def score_of(key):
    """The fp32 score of an order key (:func:`.common.key_to_score_bits`)."""
    return key_to_score_bits(key).to(tl.float32, bitcast=True)


@triton.jit
def bin_of(key, gate, scale, BINS: tl.constexpr):
    """The histogram bin of keys at or above ``gate``: ``floor((score - gate's score) * scale)``
    in fp32, clamped to the bins (the last bin also holds every key past it). Rounded fp32
    steps never invert an order, so a higher key never has a lower bin; a step with no value
    (``inf - inf``, ``0 * inf``: a gate or range at infinity; keys past +inf's, which no score
    has) counts in the last bin for a positive key, the first for the rest: that only merges
    bins, in order. Bins linear in the score, not in the key's bits: the bits' order is
    logarithmic in the magnitude and would crowd the keys of a range that spans zero into a few
    bins."""
    d = (score_of(key) - score_of(gate)) * scale
    d = tl.where(d == d, d, tl.where(key > 0, BINS - 1.0, 0.0))
    return tl.minimum(tl.maximum(d, 0.0), BINS - 1.0).to(tl.int32)


@triton.jit
def bin_slots(key, pos, valid, count, hist, stage_key, stage_pos, BINS: tl.constexpr, MAXSEG: tl.constexpr):
    """Output slots of the ``count`` valid entries ``(key, pos)`` of a register tile under the
    contract's order, by bins over the keys' range (see the module docstring).

    ``key`` / ``pos``: int32 ``[N]`` (order keys, positions distinct among the valid entries);
    ``valid``: int1 ``[N]``; ``count``: int32, exactly the number of valid entries (the runs'
    starts are counted down from it, so a larger one would place slots past ``count - 1``), at
    most ``N <= 2 ** 15`` (a run is packed as ``start << 16 | length`` in an int32).
    ``hist``: ``BINS`` int32 of scratch, all zero on entry, and zero again on return.
    ``stage_key`` / ``stage_pos``: ``count`` int32 each of scratch (they may be the rows the
    entries were loaded from: every thread's loads come before this call's first barrier).
    Returns ``(slot, ordered)``, int32 ``[N]`` and int1: where ``ordered`` (no bin holds more
    than ``MAXSEG`` entries), ``slot`` is each valid entry's place ``0 .. count - 1``, a
    permutation; otherwise nothing is known and the stage is not written."""
    tl.static_assert(key.shape[0] <= 32768, "bin_slots: a run's start must fit 15 bits of its packed counter")
    lo = tl.min(tl.where(valid, key, INT32_MAX), axis=0)
    hi = tl.max(tl.where(valid, key, KEY_MIN), axis=0)
    scale = BINS / (score_of(hi) - score_of(lo))
    b = bin_of(key, lo, scale, BINS)
    arrival = tl.atomic_add(hist + b, 1, mask=valid, sem="relaxed")  # the entry's slot in its bin's run
    tl.debug_barrier()  # every entry counted
    bins = tl.arange(0, BINS)
    filled = tl.load(hist + bins)
    run_max = tl.max(filled, axis=0)
    start = count - tl.cumsum(filled, axis=0)  # entries in higher bins: where the bin's run starts
    tl.debug_barrier()  # every count read before the runs are written over them
    # a run as (start << 16 | length) in its bin's counter: a filled bin's start is below
    # count <= 2 ** 15, so the packed value stays positive and the length fits its 16 bits.
    # Filled bins only: the others must stay zero for the next call.
    tl.store(hist + bins, (start << 16) | filled, mask=filled > 0)
    tl.debug_barrier()
    run = tl.load(hist + b, mask=valid, other=0)
    tl.debug_barrier()  # every run read before the bins are cleared
    tl.store(hist + b, 0, mask=valid)
    run_lo = run >> 16
    run_len = run & 0xFFFF
    slot = tl.zeros_like(key)
    ordered = run_max <= MAXSEG
    if ordered:
        at = run_lo + arrival
        tl.store(stage_key + at, key, mask=valid)
        tl.store(stage_pos + at, pos, mask=valid)
        tl.debug_barrier()  # the runs staged
        # the entry's rank in its run: entries of its bin ahead of it (higher key, or the same
        # key at a lower position)
        rank = tl.zeros_like(key)
        for d in tl.static_range(MAXSEG):
            j = run_lo + d
            m = valid & (d < run_len)
            kj = tl.load(stage_key + j, mask=m, other=0)
            pj = tl.load(stage_pos + j, mask=m, other=0)
            rank += (m & ((kj > key) | ((kj == key) & (pj < pos)))).to(tl.int32)
        slot = run_lo + rank
    return slot, ordered
