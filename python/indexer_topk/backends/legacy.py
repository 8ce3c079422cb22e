"""The legacy two-stage path: a ``[rows, width]`` score matrix, then an exact top-k stage.

This is what serving engines run today (SGLang: a score kernel writing ``[rows, width]`` FP32
logits into a 2 GiB slab, then a radix top-k that also maps positions to physical slots), in
Triton, for all three layouts. Rows are processed in chunks so the matrix never exceeds a byte
budget, as SGLang chunks rows under its slab. It is the baseline the fused path is measured
against and the fallback the policy keeps for decode and graph capture.

The matrix is a *key matrix*: it stores each score as its int32 order key (the same 4 bytes
as the fp32 score, see :mod:`indexer_topk.kernels.logits`), so the top-k stage can rank
integers. It runs ``torch.topk`` on each row to learn the k-th key, then one exact pass per row
takes every key above it and the lowest positions among keys equal to it, and sorts the result
under the contract's order.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import triton

from ..contract import PAGE_SIZE, IndexerInputs, IndexerTopKResult, allocate_result, as_inputs, check_workspace
from ..kernels.launch import SELECT_CHUNK, SELECT_WARPS, check_runnable, launches_kernels, pack_args, tile_config
from ..kernels.logits import logits_kernel
from ..kernels.select import MODE_KEYS, select_rows_kernel

# Positions per score program: long enough to amortise the query load, short enough to spread
# a few rows over every SM.
SCORE_SPAN = 8192

logger = logging.getLogger(__name__)
# Budgets already warned about as below the two-row floor: a server calls this per layer, so
# each budget is said once.
_BELOW_FLOOR_WARNED: set = set()


def key_matrix_width(page_table: torch.Tensor) -> int:
    """Columns of the key matrix: the page table's width in C4 positions, as SGLang pads its
    logits."""
    return page_table.shape[1] * PAGE_SIZE


def rows_per_chunk(width: int, budget_bytes: int) -> int:
    """Rows of the key matrix (4 bytes per position) that fit the budget (an even number, at
    least 2). The select pass works on pairs of rows, so a budget below two rows is exceeded:
    the chunk is two rows, with one warning per such budget."""
    row_bytes = max(1, width * 4)
    if budget_bytes < 2 * row_bytes:
        _warn_below_floor(budget_bytes, width)
    rows = max(2, budget_bytes // row_bytes)
    return rows - rows % 2


def _warn_below_floor(budget_bytes: int, width: int) -> None:
    if budget_bytes in _BELOW_FLOOR_WARNED:
        return
    _BELOW_FLOOR_WARNED.add(budget_bytes)
    floor = 2 * max(1, width * 4)
    logger.warning(
        "INDEXER_TOPK_LOGITS_BUDGET_MB: the legacy score-matrix budget of %s is below two rows of the matrix "
        "(%s at %s positions per row); a chunk holds at least two rows, so the matrix takes %s, above the budget",
        _size(budget_bytes), _size(floor), f"{width:,}", _size(floor))


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.4g} MiB" if nbytes >= 2**20 else f"{nbytes:,} bytes"


def chunk_rows(rows: int, width: int, budget_bytes: Optional[int] = None) -> int:
    """Rows of the key matrix one call allocates: every row (rounded up to a pair) or, past the
    budget (default ``INDEXER_TOPK_LOGITS_BUDGET_MB``), as many as fit, and never fewer than
    two (see :func:`rows_per_chunk`)."""
    if budget_bytes is None:
        from ..envs import envs

        budget_bytes = envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get() << 20
    return min(rows + rows % 2, rows_per_chunk(width, budget_bytes))


def key_matrix_bytes(rows: int, page_table_columns: int, budget_bytes: Optional[int] = None) -> int:
    """Bytes of the score matrix the legacy path allocates for a call (0 for no rows)."""
    if rows == 0:
        return 0
    width = max(page_table_columns * PAGE_SIZE, 1)
    return chunk_rows(rows, width, budget_bytes) * width * 4


@launches_kernels
def legacy_score(inputs: IndexerInputs, *, keys=None, row_start=0, row_count=None) -> torch.Tensor:
    """Score stage: the int32 key matrix ``[row_count, width]`` of rows ``row_start ..``.

    ``keys`` (int32 or float32 storage of that shape, reinterpreted as
    int32) is written in full: score keys below each row's ``seq_len``, ``KEY_NONE`` past it.
    Decode a key with :func:`indexer_topk.contract.scores_from_ordered_bits`.
    """
    ka = pack_args(inputs)
    rows = inputs.rows
    if row_count is None:
        row_count = rows - row_start
    width = key_matrix_width(ka.page_table)
    if keys is None:
        keys = torch.empty((row_count, width), dtype=torch.int32, device=ka.kc.device)
    keys = keys.view(torch.int32)
    if row_count == 0 or width == 0:
        return keys
    cfg = tile_config(inputs.layout)
    span = SCORE_SPAN
    grid = (triton.cdiv(row_count, cfg.rows), triton.cdiv(width, span))
    logits_kernel[grid](
        ka.q, ka.qs, ka.w, ka.kc, ka.kf, ka.ks, ka.kdesc, ka.pages, ka.page_table, ka.page_table.stride(0),
        ka.seq_lens, min(rows, row_start + row_count), row_start, inputs.weight_scale, keys, keys.stride(0), 0,
        width, span, LAYOUT=ka.layout, R=cfg.rows, TMA=ka.tma, INTERPRET=ka.interpret, STAGES=cfg.logits_stages,
        num_warps=cfg.num_warps, num_stages=cfg.logits_stages,
    )
    return keys


def kth_keys(keys: torch.Tensor, topk: int):
    """Each row's k-th largest key and how many keys equal to it the top k holds (int32 ``[rows]``)."""
    if keys.shape[1] < topk:  # every row is shorter than topk: the select pass takes all
        z = torch.zeros(keys.shape[0], dtype=torch.int32, device=keys.device)
        return z, z
    top = torch.topk(keys, topk, dim=1, sorted=False).values
    kth = top.min(dim=1).values
    need = topk - (top > kth[:, None]).sum(dim=1, dtype=torch.int32)
    return kth, need


@launches_kernels
def legacy_select(keys, seq_lens, page_table, *, topk, out: IndexerTopKResult, row_start=0) -> None:
    """Top-k stage over a key matrix from :func:`legacy_score` (contiguous, ``[rows, width]``),
    written to ``out`` rows ``row_start..``. A row is read no further than ``width``, whatever
    its ``seq_len``."""
    keys = keys.view(torch.int32)
    if not keys.is_contiguous():
        raise ValueError("keys: expected a contiguous key matrix")
    row_count = keys.shape[0]
    if row_count == 0:
        return
    check_runnable(keys.device)
    kth, need = kth_keys(keys, topk)
    select_rows_kernel[(row_count,)](
        keys, keys, seq_lens, keys.shape[1], seq_lens, page_table, page_table.stride(0),
        out.values.view(torch.int32), out.raw_indices, out.physical_indices, out.counts, row_start, kth, need,
        MODE=MODE_KEYS, TOPK=topk, SPLITS=1, CHUNK=SELECT_CHUNK, KNOWN_T=True, num_warps=SELECT_WARPS,
    )


@launches_kernels
def legacy_indexer_topk(
    inputs, *, topk=None, layout=None, weight_scale=None, out: Optional[IndexerTopKResult] = None,
    workspace: Optional[torch.Tensor] = None, budget_bytes: Optional[int] = None,
) -> IndexerTopKResult:
    """Score all rows into a key matrix (chunked by rows under the budget), then select.

    ``inputs``: :class:`~indexer_topk.contract.IndexerInputs` (or a tuple, see
    :func:`~indexer_topk.contract.as_inputs`). A ``workspace`` of at least two rows of the
    matrix (``2 * width * 4`` bytes) is used as its storage (its size sets the chunk); a
    smaller one, e.g. sized for the fused path by :func:`indexer_topk.workspace_size` on a
    call the policy sent here, is left untouched. Without one, a ``[chunk_rows, width]``
    buffer is allocated for the call, ``budget_bytes`` (default
    ``INDEXER_TOPK_LOGITS_BUDGET_MB``) bounding it down to two rows.
    """
    inputs = as_inputs(inputs, topk=topk, layout=layout, weight_scale=weight_scale)
    page_table, seq_lens = inputs.page_table, inputs.seq_lens
    rows, topk, device = inputs.rows, inputs.topk, inputs.device
    if out is None:
        out = allocate_result(rows, topk, device)
    if rows == 0:
        return out
    width = key_matrix_width(page_table)
    check_workspace(workspace, 0, device)
    if workspace is not None and workspace.numel() < 2 * width * 4:
        workspace = None
    if workspace is not None:
        budget_bytes = workspace.numel()
    chunk = chunk_rows(rows, width, budget_bytes)
    if workspace is not None:
        storage = workspace.view(-1)[: chunk * width * 4].view(torch.int32).view(chunk, width)
    else:
        storage = torch.empty((chunk, width), dtype=torch.int32, device=device)
    for r0 in range(0, rows, chunk):
        n = min(chunk, rows - r0)
        keys = storage[:n]
        legacy_score(inputs, keys=keys, row_start=r0, row_count=n)
        legacy_select(keys, seq_lens, page_table, topk=topk, out=out, row_start=r0)
    return out

