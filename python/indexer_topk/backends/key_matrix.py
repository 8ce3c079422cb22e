"""Sizes of the legacy path's key matrix: its width, the rows of a chunk under
``INDEXER_TOPK_LOGITS_BUDGET_MB`` and its bytes.

Plain arithmetic without Triton, so the command line can state the matrix's size where the
legacy backend itself cannot be imported.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from ..contract import PAGE_SIZE

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
    least 2), so a budget below two rows is exceeded: the chunk is two rows, with one warning
    per such budget."""
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
    width = page_table_columns * PAGE_SIZE
    return chunk_rows(rows, width, budget_bytes) * width * 4


__all__ = ["chunk_rows", "key_matrix_bytes", "key_matrix_width", "rows_per_chunk"]
