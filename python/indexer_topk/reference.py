"""The contract in plain PyTorch: the spec every other path is tested against.

Obviously correct rather than fast. Scores are computed in float64 from the dequantised
values and ``weight_scale`` rounded to fp32 (as every backend takes it), and rounded once to
fp32; selection uses the contract's total order through
:func:`indexer_topk.contract.order_keys`. Rows and the context are processed in bounded
blocks with a running top-k, so a 768K-token row runs on a GPU without materialising more
than ``row_block * ctx_block`` scores. A row is scored no further than its page table reaches
(:func:`scored_lengths`), as the kernels bound it, whatever an unchecked length says. Inputs
beyond the kernels' fp32 range (:func:`indexer_topk.contract.check_score_range`) are refused
with ``ValueError``, checked values or not: no kernel could be held to their fp64 scores.
"""

from __future__ import annotations

import torch

from .contract import (
    ORDER_POSITION,
    ORDER_SCORE,
    PAGE_SIZE,
    IndexerInputs,
    IndexerTopKResult,
    Layout,
    check_order,
    check_score_range,
    is_count,
    order_keys,
    parse_layout,
    scores_from_ordered_bits,
)
from .formats import dequantize_query, read_k_cache


def scored_lengths(seq_lens: torch.Tensor, page_table: torch.Tensor) -> torch.Tensor:
    """Each row's scored length (int64): ``seq_lens`` within ``[0, page_table.shape[1] * 64]``.

    Positions past the page table do not exist, as in the kernels: a length beyond it (or below
    0) is possible only with the value checks off, and the reference then scores what the
    kernels score instead of re-reading the table's last page for every position beyond it.
    """
    return seq_lens.long().clamp(min=0, max=page_table.shape[1] * PAGE_SIZE)


def reference_scores(
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *, layout, weight_scale=1.0,
    rows=None, start=0, stop=None,
):
    """fp32 scores ``[len(rows), stop - start]`` of positions ``start..stop-1``; ``-inf`` past
    the row's :func:`scored_lengths`.

    ``rows`` selects query rows (default: all); ``stop`` defaults to the longest scored length.
    Used by the reference selection and by tests.
    """
    layout = parse_layout(layout)
    if rows is None:
        rows = torch.arange(q.shape[0], device=k_cache.device)
    lens = scored_lengths(seq_lens[rows], page_table)
    if stop is None:
        stop = int(lens.max()) if lens.numel() else 0
    qf, w = _query_rows(layout, q, q_scale, weights, rows)
    pos = torch.arange(start, stop, device=k_cache.device)
    return _block_scores(layout, qf, w, k_cache, k_scale, page_table[rows].long(), lens, weight_scale, pos)


def reference_scores_at(
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *, layout, weight_scale=1.0, rows, positions,
):
    """fp32 scores of single ``(row, position)`` pairs: ``rows`` and ``positions`` int ``[m]``,
    the result float32 ``[m]``; ``-inf`` for a position outside ``[0, scored length)`` of its row.
    :func:`indexer_topk.compare.compare_to_reference` scores the positions a kernel lists at a
    near-tie selection boundary with it."""
    layout = parse_layout(layout)
    dev = k_cache.device
    rows = torch.as_tensor(rows, device=dev).long().reshape(-1)
    positions = torch.as_tensor(positions, device=dev).long().reshape(-1, 1)
    qf, w = _query_rows(layout, q, q_scale, weights, rows)
    return _block_scores(layout, qf, w, k_cache, k_scale, page_table[rows].long(),
                         scored_lengths(seq_lens[rows], page_table), weight_scale, positions).reshape(-1)


def reference_magnitudes(
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *, layout, weight_scale=1.0, rows, positions,
):
    """float64 ``[R, B]``: the score of row ``rows[i]`` at position ``positions[i, b]`` computed
    on absolute values, over the heads ``relu`` keeps,

        |weight_scale| * |k_scale[j]| * sum_{h: dot_h > -2**-10 * a_h} |weights[r, h]| * a_h
        a_h = sum_d |q[r, h, d] * k[j, d]|,   dot_h = sum_d q[r, h, d] * k[j, d]

    the magnitude an fp32 kernel's rounding errors scale with: each head's dot and the sum over
    heads are accumulated in fp32, so their error is a few units in the last place of this sum,
    however far the signed terms cancel. A head whose dot is negative by more than its own
    rounding could move adds an exact zero. 0 for a position outside ``[0, scored length)``.
    ``rows`` int ``[R]``, ``positions`` int ``[R, B]``;
    :func:`indexer_topk.compare.mma_tolerance` sets its per-row tolerance from them."""
    layout = parse_layout(layout)
    dev = k_cache.device
    rows = torch.as_tensor(rows, device=dev).long().reshape(-1)
    positions = torch.as_tensor(positions, device=dev).long().reshape(len(rows), -1)
    qf, w = _query_rows(layout, q, q_scale, weights, rows)
    lens = scored_lengths(seq_lens[rows], page_table)
    k, ks, valid = _gather_keys(layout, k_cache, k_scale, page_table[rows].long(), lens, positions)
    k = k.double()
    a = torch.einsum("rbd,rhd->rbh", k.abs(), qf.abs())
    kept = torch.einsum("rbd,rhd->rbh", k, qf) > -(2.0**-10) * a
    m = (torch.where(kept, a, 0.0) * w.abs()[:, None, :]).sum(dim=-1) * ks.double().abs() * abs(_fp32(weight_scale))
    return torch.where(valid, m, torch.zeros_like(m))


def _fp32(x: float) -> float:
    """``x`` rounded to the nearest fp32, as the kernels take ``weight_scale``."""
    return float(torch.tensor(float(x), dtype=torch.float32))


def _query_rows(layout, q, q_scale, weights, rows):
    """float64 dequantised queries ``[R, 64, 128]`` and head weights ``[R, 64]`` of ``rows``."""
    qf = dequantize_query(layout, q[rows], None if q_scale is None else q_scale[rows]).double()
    return qf, weights[rows].double()


def _gather_keys(layout, k_cache, k_scale, pt, lens, pos):
    """The dequantised keys of rows already gathered (page table rows ``pt`` int64, lengths
    ``lens``) at positions ``pos`` (``[B]`` shared by every row or ``[R, B]`` per row):
    ``(k float32 [R, B, 128], scale float32 [R, B], valid bool [R, B])``, ``valid`` false
    outside ``[0, seq_len)``, whose keys are read from a page that exists and mean nothing."""
    pos = pos.expand(len(lens), pos.shape[-1])
    valid = (pos >= 0) & (pos < lens[:, None])
    if pt.shape[1] == 0:  # a zero-width page table: every row is empty
        pt = pt.new_zeros((len(lens), 1))
    page_idx = (pos.clamp(min=0) // PAGE_SIZE).clamp(max=pt.shape[1] - 1)
    slots = torch.gather(pt, 1, page_idx) * PAGE_SIZE + pos.clamp(min=0) % PAGE_SIZE  # [R, B]
    slots = torch.where(valid, slots, torch.zeros_like(slots))  # never dereference garbage pages
    k, ks = read_k_cache(layout, k_cache, k_scale, slots)
    return k, ks, valid


def _block_scores(layout, qf, w, k_cache, k_scale, pt, lens, weight_scale, pos):
    """Scores of rows already gathered (page table rows ``pt`` int64, lengths ``lens``, queries
    and weights from :func:`_query_rows`) at positions ``pos``: ``[B]`` shared by every row or
    ``[R, B]`` per row; float32 ``[R, B]``, ``-inf`` outside ``[0, seq_len)``."""
    k, ks, valid = _gather_keys(layout, k_cache, k_scale, pt, lens, pos)
    dots = torch.einsum("rbd,rhd->rbh", k.double(), qf)
    s = (torch.relu(dots) * w[:, None, :]).sum(dim=-1)
    if layout is Layout.SGLANG_FP8:
        s = s * ks.double()
    # weight_scale as the kernels take it: the nearest fp32 (exact in the fp64 product)
    s = (s * _fp32(weight_scale)).to(torch.float32)
    return torch.where(valid, s, torch.full_like(s, float("-inf")))


def reference_indexer_topk(
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *, topk, layout,
    weight_scale=1.0, row_block=16, ctx_block=4096, order=ORDER_SCORE,
) -> IndexerTopKResult:
    """Exact top-k of the contract (see :mod:`indexer_topk.contract`), block by block, each row's
    selection laid out by ``order`` (:func:`indexer_topk.contract.check_order`)."""
    return reference_with_next_values(
        q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk, layout=layout,
        weight_scale=weight_scale, row_block=row_block, ctx_block=ctx_block, order=order,
    )[0]


def reference_with_next_values(
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *, topk, layout,
    weight_scale=1.0, row_block=16, ctx_block=4096, order=ORDER_SCORE,
):
    """``(result, next_values)``: :func:`reference_indexer_topk` and, from the same pass, each
    row's *next value*, its ``(k+1)``-th best score (float32 ``[rows]``, ``-inf`` where the row
    has at most ``topk`` positions), which :func:`indexer_topk.compare.compare_to_reference`
    takes to recognise a near-tie at the selection boundary."""
    layout = parse_layout(layout)
    by_position = check_order(order) == ORDER_POSITION
    # any positive topk has a reference answer (the tests use small ones); the kernels take
    # SUPPORTED_TOPK alone
    if not is_count(topk, 1):
        raise ValueError(f"topk: expected a positive int, got {topk!r}")
    topk = int(topk)
    # the kernels' fp32 range: beyond it no kernel can be held to the fp64 scores
    check_score_range(IndexerInputs(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, layout, topk))
    dev = k_cache.device
    n_rows = q.shape[0]
    values = torch.full((n_rows, topk), float("-inf"), dtype=torch.float32, device=dev)
    raw = torch.full((n_rows, topk), -1, dtype=torch.int32, device=dev)
    phys = torch.full((n_rows, topk), -1, dtype=torch.int32, device=dev)
    next_values = torch.full((n_rows,), float("-inf"), dtype=torch.float32, device=dev)
    all_lens = scored_lengths(seq_lens, page_table)  # unchecked lengths: as the kernels bound them
    counts = all_lens.clamp(max=topk).to(torch.int32)
    neg = torch.iinfo(torch.int64).min
    for r0 in range(0, n_rows, row_block):
        rows = torch.arange(r0, min(r0 + row_block, n_rows), device=dev)
        lens = all_lens[rows]
        pt = page_table[rows].long()
        qf, w = _query_rows(layout, q, q_scale, weights, rows)
        longest = int(lens.max()) if len(rows) else 0
        best = torch.full((len(rows), topk + 1), neg, dtype=torch.int64, device=dev)
        for c0 in range(0, longest, ctx_block):
            c1 = min(c0 + ctx_block, longest)
            pos = torch.arange(c0, c1, device=dev)
            s = _block_scores(layout, qf, w, k_cache, k_scale, pt, lens, weight_scale, pos)
            pos = pos.expand_as(s)
            keys = order_keys(s, pos)
            keys = torch.where(pos < lens[:, None], keys, torch.full_like(keys, neg))
            best = torch.cat([best, keys], dim=1).topk(topk + 1, dim=1, sorted=True).values
        k1 = best[:, topk]
        k1_vals = scores_from_ordered_bits((k1 >> 32).to(torch.int32))
        next_values[rows] = torch.where(k1 != neg, k1_vals, torch.full_like(k1_vals, float("-inf")))
        best = best[:, :topk]
        n = counts[rows].long()
        slot_ok = torch.arange(topk, device=dev)[None, :] < n[:, None]
        # Long rows: best keys in descending order. Short rows hold every position in `best`:
        # reorder them by position (SGLang's rule for rows with seq_len <= topk); every row with
        # order "position"
        low = (1 << 32) - 1
        by_pos = torch.where(best != neg, low - (best & low), torch.full_like(best, low + 1))
        in_positions = (lens <= topk)[:, None] | by_position
        slots = torch.where(in_positions, by_pos.argsort(dim=1), torch.arange(topk, device=dev))
        best = torch.gather(best, 1, slots)
        pos_sel = torch.where(slot_ok, low - (best & low), torch.zeros_like(best))
        vals = scores_from_ordered_bits((best >> 32).to(torch.int32))
        if pt.shape[1] == 0:  # a zero-width page table: every row is empty, p is masked below
            pt = pt.new_zeros((len(rows), 1))
        page = torch.gather(pt, 1, (pos_sel // PAGE_SIZE).clamp(max=pt.shape[1] - 1))
        p = page * PAGE_SIZE + pos_sel % PAGE_SIZE
        values[rows] = torch.where(slot_ok, vals, torch.full_like(vals, float("-inf")))
        raw[rows] = torch.where(slot_ok, pos_sel, torch.full_like(pos_sel, -1)).to(torch.int32)
        phys[rows] = torch.where(slot_ok, p, torch.full_like(p, -1)).to(torch.int32)
    return IndexerTopKResult(values, raw, phys, counts), next_values
