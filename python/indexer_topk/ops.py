"""The operator as PyTorch operators (``torch.library``), for compiled and captured callers.

Importing :mod:`indexer_topk` registers two operators in the ``indexer_topk`` namespace; both
run :func:`indexer_topk.indexer_topk` (same arguments, same validation, same backends) and have
fake implementations, so ``torch.compile`` traces through them without a graph break and
SGLang-style piecewise capture can keep them inside a captured region:

``torch.ops.indexer_topk.indexer_topk(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, weight_scale=1.0, backend="auto", check_values=True, rows_per_request=None)``
    Returns ``(values, raw_indices, physical_indices, counts)``: ``[rows, topk]`` float32,
    ``[rows, topk]`` int32 twice and ``[rows]`` int32, freshly allocated.

``torch.ops.indexer_topk.indexer_topk_out(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, values, raw_indices, physical_indices, counts, workspace=None, weight_scale=1.0, backend="auto", check_values=False, rows_per_request=None)``
    Writes the caller's outputs in place and returns nothing; with a caller-owned
    ``workspace`` (:func:`indexer_topk.workspace_size`) the fused backend allocates nothing.
    This is the form for CUDA graphs: outputs and scratch live in buffers the graph owns, and
    ``check_values`` defaults to off because checking tensor values needs a device sync.

``q_scale`` and ``k_scale`` are ``None`` where the layout keeps its scales elsewhere, as in
:func:`indexer_topk.indexer_topk`. The operators are not differentiable: a top-k selection has
no gradient.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import api
from .contract import IndexerTopKResult

NAMESPACE = "indexer_topk"

_OUTPUTS = ("values", "raw_indices", "physical_indices", "counts")


@torch.library.custom_op(f"{NAMESPACE}::indexer_topk", mutates_args=())
def indexer_topk_op(
    q: torch.Tensor,
    q_scale: Optional[torch.Tensor],
    k_cache: torch.Tensor,
    k_scale: Optional[torch.Tensor],
    weights: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    layout: str,
    weight_scale: float = 1.0,
    backend: str = "auto",
    check_values: bool = True,
    rows_per_request: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    res = api.indexer_topk(
        q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk, layout=layout,
        weight_scale=weight_scale, backend=backend, check_values=check_values, rows_per_request=rows_per_request,
    )
    return tuple(res)


@indexer_topk_op.register_fake
def _(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, weight_scale=1.0, backend="auto",
      check_values=True, rows_per_request=None):
    rows = q.shape[0]
    return (
        q.new_empty((rows, topk), dtype=torch.float32),
        q.new_empty((rows, topk), dtype=torch.int32),
        q.new_empty((rows, topk), dtype=torch.int32),
        q.new_empty((rows,), dtype=torch.int32),
    )


@torch.library.custom_op(f"{NAMESPACE}::indexer_topk_out", mutates_args=_OUTPUTS + ("workspace",))
def indexer_topk_out_op(
    q: torch.Tensor,
    q_scale: Optional[torch.Tensor],
    k_cache: torch.Tensor,
    k_scale: Optional[torch.Tensor],
    weights: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    layout: str,
    values: torch.Tensor,
    raw_indices: torch.Tensor,
    physical_indices: torch.Tensor,
    counts: torch.Tensor,
    workspace: Optional[torch.Tensor] = None,
    weight_scale: float = 1.0,
    backend: str = "auto",
    check_values: bool = False,
    rows_per_request: Optional[int] = None,
) -> None:
    api.indexer_topk(
        q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk, layout=layout,
        weight_scale=weight_scale, backend=backend, check_values=check_values, rows_per_request=rows_per_request,
        out=IndexerTopKResult(values, raw_indices, physical_indices, counts), workspace=workspace,
    )


@indexer_topk_out_op.register_fake
def _(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, values, raw_indices,
      physical_indices, counts, workspace=None, weight_scale=1.0, backend="auto", check_values=False,
      rows_per_request=None):
    return None


__all__ = ["NAMESPACE", "indexer_topk_op", "indexer_topk_out_op"]
