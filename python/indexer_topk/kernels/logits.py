"""The legacy score kernel (the stage SGLang calls "logits"): the ``[rows, width]`` key matrix,
from the shared tile.

The matrix holds each score's int32 order key (:func:`.common.ordered_key`, a bijection of the
fp32 score with the same 4 bytes) rather than the float itself, so the top-k stage can use a
stock integer top-k and still get the contract's order (NaN lowest, ``-0 < +0``). Positions at
or past a row's ``seq_len`` hold ``KEY_MIN``, below every score.
"""

import triton
import triton.language as tl

from .common import KEY_MIN, ordered_key
from .score import load_row_pair, score_pair


@triton.jit
def logits_kernel(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, pt_ptr, stride_pt, seq_lens, n_rows, row_start,
    weight_scale, keys, stride_keys, width, span,
    LAYOUT: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Program (pair, chunk): keys of rows ``row_start + 2 * pair + {0, 1}`` over one span."""
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    r0 = row_start + pair * 2
    r1 = r0 + 1
    v1 = r1 < n_rows
    len0 = tl.load(seq_lens + r0)
    len1 = tl.load(seq_lens + r1, mask=v1, other=0)
    lo = chunk * span
    end = tl.minimum(lo + span, width)
    hi = tl.minimum(end, tl.maximum(len0, len1))
    end1 = tl.where(v1, end, 0)  # row 1 may not exist
    out0 = keys + (r0 - row_start).to(tl.int64) * stride_keys
    out1 = out0 + stride_keys
    scored_to = lo
    if lo < hi:
        qt0, qt1, w0, w1, pt0, pt1 = load_row_pair(
            q_ptr, qs_ptr, w_ptr, pt_ptr, stride_pt, r0, n_rows, LAYOUT, INTERPRET
        )
        for b in range(lo, hi, BLOCK_N):
            pos = b + tl.arange(0, BLOCK_N)
            s0, s1 = score_pair(
                pos, len0, len1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1, weight_scale,
                LAYOUT, INTERPRET,
            )
            tl.store(out0 + pos, tl.where(pos < len0, ordered_key(s0), KEY_MIN), mask=pos < end)
            tl.store(out1 + pos, tl.where(pos < len1, ordered_key(s1), KEY_MIN), mask=pos < end1)
        scored_to = lo + tl.cdiv(hi - lo, BLOCK_N) * BLOCK_N
    pad = tl.full([BLOCK_N], KEY_MIN, tl.int32)
    for b in range(scored_to, end, BLOCK_N):
        pos = b + tl.arange(0, BLOCK_N)
        tl.store(out0 + pos, pad, mask=pos < end)
        tl.store(out1 + pos, pad, mask=pos < end1)
