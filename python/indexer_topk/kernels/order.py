"""Rows of finished outputs laid out again in ascending positions (``order="position"``).

Most finishes honour ``order="position"`` themselves: the row select, the key-matrix select and
the fused merge hold a row's selection in position order before they sort it, so they do not sort
(:func:`.select.finalize_row`, ``SORT_BITS = 0``), and the fused finish of a one-split row sorts
it by position instead of by score. The split select's finish (decode batches, by bins or by a
search) places entries best first; this kernel then moves each row's entries to ascending
positions in place: the same entries, hence the same bits.
"""

import triton
import triton.language as tl

from .common import INT32_MAX, LOW32, sort1d


@triton.jit(do_not_specialize=["row_start"])
def position_order_kernel(out_bits, out_raw, out_phys, row_start, TOPK: tl.constexpr):
    """Program ``i``: row ``row_start + i`` of the three ``[rows, TOPK]`` int32 outputs (values
    as fp32 bits), entries sorted by position, unused slots (position ``-1``) kept last. Launched
    in stream order after the finish (no programmatic dependent launch): it reads what that wrote."""
    base = (row_start + tl.program_id(0)).to(tl.int64) * TOPK
    offs = tl.arange(0, TOPK)
    raw = tl.load(out_raw + base + offs)
    # positions are distinct and non-negative: the slot in the low half only carries the entry
    by_pos = (tl.where(raw < 0, INT32_MAX, raw).to(tl.int64) << 32) | offs.to(tl.int64)
    slot = (sort1d(by_pos, False) & LOW32).to(tl.int32)
    bits = tl.load(out_bits + base + slot)
    raw = tl.load(out_raw + base + slot)
    phys = tl.load(out_phys + base + slot)
    tl.debug_barrier()  # every entry is read before the row is written over
    tl.store(out_bits + base + offs, bits)
    tl.store(out_raw + base + offs, raw)
    tl.store(out_phys + base + offs, phys)
