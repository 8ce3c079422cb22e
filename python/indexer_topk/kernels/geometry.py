"""Where every byte of the three layouts lives: one table, derived from the contract's constants.

The kernels address queries and key pages only through the constexprs below, so a layout's
geometry is stated once (here) and read by the score tile, the legacy score kernel and the
fused kernel alike. All offsets are in bytes unless a name says words (4-byte units).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton.language as tl

from ..contract import HEAD_DIM, HEADS, MX_GROUP, PAGE_SIZE, SGLANG_FP8_SLOT_BYTES, SGLANG_MXFP4_SLOT_BYTES, Layout


@dataclass(frozen=True)
class Geometry:
    """One layout's page and query geometry.

    ``page_bytes`` is the stride between pages of ``k_cache``; a key slot's payload starts at
    ``slot * slot_payload_bytes`` inside its page (or, for aiter_mxfp4, is split in
    ``MX_GROUP / 2``-byte pieces ``chunk_stride_bytes`` apart); ``scale_offset`` is where the
    page's key scales start (in ``k_cache`` for the SGLang layouts, in ``k_scale`` for AITER's);
    ``q_row_bytes`` is the stride between query rows.
    """

    page_bytes: int
    slot_payload_bytes: int
    scale_offset: int
    q_row_bytes: int
    chunk_stride_bytes: int = 0  # aiter_mxfp4: between the four 32-value chunks of a page
    scale_page_bytes: int = 0  # aiter_mxfp4: the stride of k_scale's pages


CHUNKS = HEAD_DIM // MX_GROUP  # MXFP4 scale groups per key or query head
PACKED_DIM = HEAD_DIM // 2  # MXFP4 bytes per key or query head

GEOMETRY = {
    Layout.SGLANG_FP8: Geometry(
        page_bytes=PAGE_SIZE * SGLANG_FP8_SLOT_BYTES,
        slot_payload_bytes=HEAD_DIM,
        scale_offset=PAGE_SIZE * HEAD_DIM,
        q_row_bytes=HEADS * HEAD_DIM,
    ),
    Layout.SGLANG_MXFP4: Geometry(
        page_bytes=PAGE_SIZE * SGLANG_MXFP4_SLOT_BYTES,
        slot_payload_bytes=PACKED_DIM,
        scale_offset=PAGE_SIZE * PACKED_DIM,
        q_row_bytes=HEADS * PACKED_DIM,
    ),
    Layout.AITER_MXFP4: Geometry(
        page_bytes=PAGE_SIZE * PACKED_DIM,
        slot_payload_bytes=MX_GROUP // 2,
        scale_offset=0,
        q_row_bytes=HEADS * PACKED_DIM,
        chunk_stride_bytes=PAGE_SIZE * MX_GROUP // 2,
        scale_page_bytes=PAGE_SIZE * CHUNKS,
    ),
}

_FP8 = GEOMETRY[Layout.SGLANG_FP8]
_SG4 = GEOMETRY[Layout.SGLANG_MXFP4]
_AI4 = GEOMETRY[Layout.AITER_MXFP4]

# Kernel-side names (constexprs) for the table above.
PAGE_SHIFT = tl.constexpr(PAGE_SIZE.bit_length() - 1)
PAGE = tl.constexpr(PAGE_SIZE)
NHEADS = tl.constexpr(HEADS)
DIM = tl.constexpr(HEAD_DIM)
PDIM = tl.constexpr(PACKED_DIM)
NCHUNKS = tl.constexpr(CHUNKS)
GROUP = tl.constexpr(MX_GROUP)
FP8_PAGE_BYTES = tl.constexpr(_FP8.page_bytes)
FP8_PAGE_WORDS = tl.constexpr(_FP8.page_bytes // 4)
FP8_SCALE_WORD = tl.constexpr(_FP8.scale_offset // 4)
FP8_Q_ROW = tl.constexpr(_FP8.q_row_bytes)
SG4_PAGE_BYTES = tl.constexpr(_SG4.page_bytes)
SG4_SCALE_OFFSET = tl.constexpr(_SG4.scale_offset)
MX_Q_ROW = tl.constexpr(_SG4.q_row_bytes)
MX_Q_SCALE_ROW = tl.constexpr(HEADS * CHUNKS)
AI4_PAGE_BYTES = tl.constexpr(_AI4.page_bytes)
AI4_CHUNK_STRIDE = tl.constexpr(_AI4.chunk_stride_bytes)
AI4_PIECE = tl.constexpr(_AI4.slot_payload_bytes)
AI4_SCALE_PAGE = tl.constexpr(_AI4.scale_page_bytes)
# aiter_mxfp4 interleaves 16-slot (or 16-head) groups in its scale tensors: slot s of a chunk
# sits at (s % 16) * 4 + s // 16.
AI4_INTERLEAVE = tl.constexpr(16)
