"""``order="position"`` for the finishes that write each row best first (the split select's)."""

from __future__ import annotations

import torch

from ..contract import ORDER_POSITION, IndexerTopKResult
from ..kernels.order import position_order_kernel
from ..replay import launch

ORDER_WARPS = 4


def lay_out_rows(out: IndexerTopKResult, order: str, topk: int, row_start: int, rows: int) -> None:
    """With ``order="position"``, rewrite rows ``row_start .. row_start + rows - 1`` of ``out``
    (written best first) in ascending positions, in place, one program a row; nothing otherwise.
    Called after the finish's launches, which checked that this process's kernels can run."""
    if order != ORDER_POSITION or rows <= 0:
        return
    launch(position_order_kernel, (rows,), out.values.view(torch.int32), out.raw_indices, out.physical_indices,
           row_start, TOPK=topk, num_warps=ORDER_WARPS)
