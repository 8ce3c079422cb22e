"""``order="position"`` for the finishes that write each row best first (the split select's)."""

from __future__ import annotations

import torch

from ..contract import ORDER_POSITION, IndexerTopKResult
from ..kernels.launch import check_runnable
from ..kernels.order import position_order_kernel
from ..replay import launch

ORDER_WARPS = 4


def lay_out_rows(out: IndexerTopKResult, order: str, topk: int, row_start: int, rows: int) -> None:
    """With ``order="position"``, rewrite rows ``row_start .. row_start + rows - 1`` of ``out``
    (written best first) in ascending positions, in place, one program a row; nothing otherwise."""
    if order != ORDER_POSITION or rows <= 0:
        return
    check_runnable(out.raw_indices.device)
    launch(position_order_kernel, (rows,), out.values.view(torch.int32), out.raw_indices, out.physical_indices,
           row_start, TOPK=topk, num_warps=ORDER_WARPS)


def position_order_free(backend: str, rows: int, width: int, device) -> bool:
    """Whether ``order="position"`` costs ``backend`` no more than ``"score"`` on a call of
    ``rows`` rows over ``width`` C4 positions a page-table row: the fused finishes and legacy's row
    select lay a row out by position in place of sorting it; legacy's split select (few rows, or
    few long ones: :func:`.legacy.select_way`) sorts it, then lays it out in a further pass; AITER
    and the reference, a pass of torch ops."""
    if backend == "fused":
        return True
    if backend != "legacy":
        return False
    from ..kernels.launch import device_sm_count
    from .legacy import select_way

    return select_way(rows, width, device_sm_count(device)) == "rows"
