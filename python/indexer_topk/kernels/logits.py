"""The legacy score kernel (the stage SGLang calls "logits"): the ``[rows, width]`` key matrix,
from the shared tile.

The matrix holds each score's int32 order key (:func:`.common.ordered_key`, a bijection of the
fp32 score with the same 4 bytes) rather than the float itself, so the top-k stage can use a
stock integer top-k and still get the contract's order (NaN lowest, ``-0 < +0``). Positions at
or past a row's ``seq_len`` hold ``KEY_MIN``, below every score.
"""

import triton
import triton.language as tl

from .common import KEY_MIN, ordered_key, wait_for_producer
from .geometry import PAGE
from .row_topk import row_length
from .score import group_rows, load_queries, pages_agree, score_page
from .split_topk import gather_run


@triton.jit
def _score_span(
    lo, hi, end, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends, qt, w, weight_scale,
    out_ptrs, live, R: tl.constexpr, LAYOUT: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
    UNIFORM: tl.constexpr, STAGES: tl.constexpr,
):
    for b in tl.range(lo, hi, PAGE, num_stages=STAGES):
        s = score_page(
            b, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends, qt, w, weight_scale,
            R, LAYOUT, TMA, INTERPRET, UNIFORM,
        )
        pos = b + tl.arange(0, PAGE)[:, None]
        key = tl.where(pos < ends[None, :], ordered_key(s), KEY_MIN)
        tl.store(out_ptrs + pos, key, mask=live & (pos < end))


# Integer arguments take any value without a new compilation (see kernels/fused.py).
@triton.jit(do_not_specialize=["n_pages", "stride_pt", "n_rows", "row_start", "stride_keys", "col0", "width", "span"])
def logits_kernel(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_ptr, stride_pt, seq_lens, n_rows, row_start,
    weight_scale, keys, stride_keys, col0, width, span,
    LAYOUT: tl.constexpr, R: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr, STAGES: tl.constexpr,
):
    """Program (group, span): keys of rows ``row_start + R * group + (0 .. R-1)`` over positions
    ``col0 + span * program_id(1) ..`` (below ``width``), at column ``position - col0`` of the
    key matrix ``keys``; rows at or past ``n_rows`` are not written. The legacy path scores a
    whole row (``col0 = 0``); the chunked-stream experiment (``benchmark/research/chunked_stream.py``) one
    context chunk at a time."""
    _score_program(
        q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_ptr, stride_pt, seq_lens, n_rows, row_start,
        weight_scale, keys, stride_keys, col0, width, span, LAYOUT, R, TMA, INTERPRET, STAGES,
    )


@triton.jit(do_not_specialize=["n_pages", "stride_pt", "n_rows", "row_start", "stride_keys", "width", "span"])
def gather_logits_kernel(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_ptr, stride_pt, seq_lens, n_rows, row_start,
    weight_scale, keys, stride_keys, width, span, gates, counts, scales, hist, cand,
    LAYOUT: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr, STAGES: tl.constexpr, TOPK: tl.constexpr,
    TILE: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr, PDL: tl.constexpr = False, R: tl.constexpr = 1,
    PREFETCH: tl.constexpr = False, STRIDE: tl.constexpr = 0,
):
    """:func:`logits_kernel` (``col0 = 0``) that also does the split select's gathering
    (:func:`.split_topk.gather_rows_kernel`) over its own span, for each row of its group: the
    keys it stored that reach the row's gate, read back, appended to the row's candidate buffer
    and counted in its bins. ``R``: rows a group, 1 for one-row requests, 2 for requests of two
    rows (a draft row of multi-token prediction beside each), whose pages the group shares;
    ``PREFETCH``, ``STRIDE``: see :func:`.split_topk.gather_run`. The gate, the zero count and the cleared
    bins come from the kernel before it (:func:`.split_topk.gate_rows_kernel` of a sample scored
    on its own, :func:`.scored_gate.score_sample_kernel`); with ``PDL`` this kernel starts while
    those run and waits for them only once its own keys are scored, so the gate's work hides
    under the scoring, and the gathering's launch and its second pass over the matrix go."""
    _score_program(
        q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_ptr, stride_pt, seq_lens, n_rows, row_start,
        weight_scale, keys, stride_keys, 0, width, span, LAYOUT, R, TMA, INTERPRET, STAGES,
    )
    tl.debug_barrier()  # the program's keys are stored before its threads read each other's back
    wait_for_producer(PDL)  # the rows' gates and their cleared counts and bins
    lo = tl.program_id(1) * span
    for j in tl.static_range(R):
        i = tl.program_id(0) * R + j  # the row's index in the chunk
        if row_start + i < n_rows:  # a last group of an odd chunk has one row
            n = row_length(seq_lens, row_start + i, stride_keys)  # as the gate and the finish take it
            if n > TILE:
                gather_run(keys + i.to(tl.int64) * stride_keys, lo, tl.minimum(lo + span, n), i, gates, counts,
                           scales, hist, cand, TOPK, BLOCK, BINS, PREFETCH, STRIDE)


@triton.jit
def _score_program(
    q_ptr, qs_ptr, w_ptr, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_ptr, stride_pt, seq_lens, n_rows, row_start,
    weight_scale, keys, stride_keys, col0, width, span,
    LAYOUT: tl.constexpr, R: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr, STAGES: tl.constexpr,
):
    """The body of :func:`logits_kernel` (its arguments)."""
    r0 = row_start + tl.program_id(0) * R
    lo = col0 + tl.program_id(1) * span
    end = tl.minimum(lo + span, width)
    ends, hi, lead = group_rows(seq_lens, r0, n_rows, lo, end, R)
    rows = r0 + tl.arange(0, R)
    # column position - col0 of the row's keys: the offset is folded into the row pointers
    out_ptrs = keys + ((rows - row_start).to(tl.int64) * stride_keys - col0)[None, :]
    live = (rows < n_rows)[None, :]
    scored_to = lo
    if lo < hi:
        qt, w = load_queries(q_ptr, qs_ptr, w_ptr, r0, n_rows, R, LAYOUT, INTERPRET)
        pt_lead = pt_ptr + lead.to(tl.int64) * stride_pt
        if pages_agree(pt_ptr, stride_pt, r0, ends, lead, lo, R):
            _score_span(
                lo, hi, end, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends, qt, w,
                weight_scale, out_ptrs, live, R, LAYOUT, TMA, INTERPRET, True, STAGES,
            )
        else:
            _score_span(
                lo, hi, end, kc_ptr, kf_ptr, ks_ptr, kdesc, n_pages, pt_lead, pt_ptr, stride_pt, r0, ends, qt, w,
                weight_scale, out_ptrs, live, R, LAYOUT, TMA, INTERPRET, False, 1,
            )
        scored_to = lo + tl.cdiv(hi - lo, PAGE) * PAGE
    pad = tl.full([PAGE, R], KEY_MIN, tl.int32)
    for b in range(scored_to, end, PAGE):
        pos = b + tl.arange(0, PAGE)[:, None]
        tl.store(out_ptrs + pos, pad, mask=live & (pos < end))
