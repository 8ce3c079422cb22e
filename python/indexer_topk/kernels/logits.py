"""The legacy score kernel: the FP32 ``[rows, width]`` logits matrix, from the shared tile."""

import triton
import triton.language as tl

from .score import load_query_t, load_weights, score_pair


@triton.jit
def logits_kernel(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, pt_ptr, stride_pt, seq_lens, n_rows, row_start,
    weight_scale, logits, stride_logits, span,
    LAYOUT: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Program (pair, chunk): logits of rows ``row_start + 2 * pair + {0, 1}`` over one span.

    Only positions below each row's ``seq_len`` are written; the top-k stage never reads more.
    """
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    r0 = row_start + pair * 2
    r1 = r0 + 1
    v1 = r1 < n_rows
    len0 = tl.load(seq_lens + r0)
    len1 = tl.load(seq_lens + r1, mask=v1, other=0)
    lo = chunk * span
    hi = tl.minimum(lo + span, tl.maximum(len0, len1))
    if lo < hi:
        qt0 = load_query_t(q_ptr, qs_ptr, r0, r0 < n_rows, LAYOUT, INTERPRET)
        qt1 = load_query_t(q_ptr, qs_ptr, r1, v1, LAYOUT, INTERPRET)
        w0 = load_weights(w_ptr, r0, r0 < n_rows)
        w1 = load_weights(w_ptr, r1, v1)
        pt0 = pt_ptr + r0.to(tl.int64) * stride_pt
        pt1 = pt_ptr + tl.where(v1, r1, r0).to(tl.int64) * stride_pt
        out0 = logits + (r0 - row_start).to(tl.int64) * stride_logits
        out1 = out0 + stride_logits
        for b in range(lo, hi, BLOCK_N):
            pos = b + tl.arange(0, BLOCK_N)
            s0, s1 = score_pair(
                pos, len0, len1, pt0, pt1, kc_ptr, kf_ptr, ks_ptr, qt0, qt1, w0, w1, weight_scale,
                LAYOUT, INTERPRET,
            )
            tl.store(out0 + pos, s0, mask=pos < len0)
            tl.store(out1 + pos, s1, mask=pos < len1)
