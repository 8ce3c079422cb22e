"""The split select's gate from keys scored on their own, ahead of the score kernel (FP8 decode).

A decode step through the split select (:mod:`.split_topk`) runs four kernels: the score kernel
writes the key matrix, the gate kernel reads a sample of each row back from it, the gathering
kernel reads every row again for the keys that reach the gate, and the finish selects from
them. At one to eight requests each of the three after the first is a few microseconds of one
or a few SMs, paid in turn. Here the gate does not wait for the matrix: it scores the sample's
own keys, the same positions :func:`.row_topk.row_sample` would read from the matrix, straight
from the cache. Then the score kernel can gather (:func:`.logits.gather_logits_kernel`), and
with programmatic dependent launch it scores while the gate runs, waiting for the gate only
before its gathering.

A sampled key's score has the bits the score kernel gives it (one query row, the same warps:
each key's MMA column and head reduction do not depend on the other keys of the tile,
:mod:`.score`), so the gate, the histogram's scale, and so every candidate and every output are
those of the four-kernel step. Exactness does not rest on that: any gate is exact, as the
finish checks what reached it.
"""

import triton
import triton.language as tl

from .common import e4m3_to_f32, ordered_key, release_dependents
from .geometry import DIM, FP8_PAGE_BYTES, FP8_PAGE_WORDS, FP8_SCALE_WORD, PAGE
from .row_topk import row_length
from .score import FP8, load_queries, page_scores
from .split_topk import _CAND_PER_TOPK


@triton.jit
def _sampled_keys(kc_ptr, kf_ptr, n_pages, pt_row, pos, qt, w, weight_scale, INTERPRET: tl.constexpr):
    """``[PAGE]`` order keys of the FP8 keys at positions ``pos`` (``[PAGE]``, each below the
    row's length; ``pt_row``: the row's page-table row). A page id outside ``[0, n_pages)``
    reads as zeros, as :func:`.score.load_page` reads it."""
    page = tl.load(pt_row + pos // PAGE)
    ok = (page >= 0) & (page < n_pages)
    key_at = tl.where(ok, page, 0).to(tl.int64) * FP8_PAGE_BYTES + (pos % PAGE) * DIM
    raw = tl.load(kc_ptr + key_at[:, None] + tl.arange(0, DIM)[None, :], mask=ok[:, None], other=0)
    kscale = tl.load(kf_ptr + tl.where(ok, page, 0).to(tl.int64) * FP8_PAGE_WORDS + FP8_SCALE_WORD + pos % PAGE,
                     mask=ok, other=0.0)
    if INTERPRET:
        k = e4m3_to_f32(raw.to(tl.int32))
    else:
        k = raw.to(tl.float8e4nv, bitcast=True)
    s = page_scores(k, kscale, kscale, qt, w, weight_scale, 1, FP8, INTERPRET)
    return tl.reshape(ordered_key(s), [PAGE])


@triton.jit(do_not_specialize=["n_pages", "stride_pt", "n_rows", "row_start", "width"])
def score_sample_kernel(
    q_ptr, w_ptr, kc_ptr, kf_ptr, n_pages, pt_ptr, stride_pt, seq_lens, n_rows, row_start, weight_scale, width, cand,
    TOPK: tl.constexpr, TILE: tl.constexpr, SAMPLE: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program ``(i, t)``: keys ``64 t .. 64 t + 63`` of the sample of row ``i`` of a key matrix of
    ``width`` columns (the contract's row ``row_start + i``, one query row with pages of its
    own, FP8 keys; rows longer than ``TILE`` only), scored from the cache at the positions
    :func:`.row_topk.row_sample` reads, stored at the start of the row's candidate region in
    ``cand`` (which the gathering fills only after the gate has read them). A program a page
    of the sample: one program of the whole sample would score it a page after another, several
    times the score kernel's time. ``PDL``: the kernels after it may start at once
    (:func:`.common.release_dependents`)."""
    release_dependents(PDL)
    tl.static_assert(SAMPLE <= _CAND_PER_TOPK * TOPK, "the sample passes through the row's candidate region")
    tl.static_assert(SAMPLE % 64 == 0, "a program scores a page (64 keys) of the sample, positions below n")
    i = tl.program_id(0)
    row = row_start + i
    n = row_length(seq_lens, row, width)
    if n > TILE:
        qt, w = load_queries(q_ptr, q_ptr, w_ptr, row, n_rows, 1, FP8, INTERPRET)
        j = tl.program_id(1) * PAGE + tl.arange(0, PAGE)
        pos = ((j.to(tl.int64) * n) // SAMPLE).to(tl.int32)  # row_sample's positions
        keys = _sampled_keys(kc_ptr, kf_ptr, n_pages, pt_ptr + row.to(tl.int64) * stride_pt, pos, qt, w, weight_scale,
                             INTERPRET)
        tl.store(cand + i.to(tl.int64) * (_CAND_PER_TOPK * TOPK) + j, keys)
