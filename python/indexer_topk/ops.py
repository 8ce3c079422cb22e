"""The operator as PyTorch operators (``torch.library``), for compiled and captured callers.

Importing :mod:`indexer_topk` registers two operators in the ``indexer_topk`` namespace; both
run :func:`indexer_topk.indexer_topk` (same arguments, same validation, same backends) and have
fake implementations, so ``torch.compile`` traces through them without a graph break and
SGLang-style piecewise capture can keep them inside a captured region:

``torch.ops.indexer_topk.indexer_topk(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, weight_scale=1.0, backend="auto", check_values=True, rows_per_request=None, order="score")``
    Returns ``(values, raw_indices, physical_indices, counts)``: ``[rows, topk]`` float32,
    ``[rows, topk]`` int32 twice and ``[rows]`` int32, freshly allocated.

``torch.ops.indexer_topk.indexer_topk_out(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, values, raw_indices, physical_indices, counts, workspace=None, weight_scale=1.0, backend="auto", check_values=False, rows_per_request=None, order="score")``
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
from .contract import IndexerTopKResult, check_metadata

NAMESPACE = "indexer_topk"

# Defined with torch.library.Library rather than torch.library.custom_op: the decorator's
# Python wrapper costs several microseconds per call, which an eager prefill pays on every
# layer (the operator's own host path is a few tens of microseconds).
_LIB = torch.library.Library(NAMESPACE, "DEF")
_LIB.define(
    "indexer_topk(Tensor q, Tensor? q_scale, Tensor k_cache, Tensor? k_scale, Tensor weights, Tensor page_table, "
    "Tensor seq_lens, SymInt topk, str layout, float weight_scale=1., str backend=\"auto\", bool check_values=True, "
    "SymInt? rows_per_request=None, str order=\"score\") -> (Tensor, Tensor, Tensor, Tensor)"
)
_LIB.define(
    "indexer_topk_out(Tensor q, Tensor? q_scale, Tensor k_cache, Tensor? k_scale, Tensor weights, Tensor page_table, "
    "Tensor seq_lens, SymInt topk, str layout, Tensor(a9!) values, Tensor(a10!) raw_indices, "
    "Tensor(a11!) physical_indices, Tensor(a12!) counts, Tensor(a13!)? workspace=None, float weight_scale=1., "
    "str backend=\"auto\", bool check_values=False, SymInt? rows_per_request=None, str order=\"score\") -> ()"
)


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
    order: str = "score",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    res = api.indexer_topk(
        q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk, layout=layout,
        weight_scale=weight_scale, backend=backend, check_values=check_values, rows_per_request=rows_per_request,
        order=order,
    )
    return tuple(res)


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
    order: str = "score",
) -> None:
    api.indexer_topk(
        q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk, layout=layout,
        weight_scale=weight_scale, backend=backend, check_values=check_values, rows_per_request=rows_per_request,
        out=IndexerTopKResult(values, raw_indices, physical_indices, counts), workspace=workspace, order=order,
    )


for _key in ("CPU", "CUDA"):  # ROCm builds dispatch HIP tensors under the CUDA key
    _LIB.impl("indexer_topk", indexer_topk_op, _key)
    _LIB.impl("indexer_topk_out", indexer_topk_out_op, _key)


def _only_fake_or_meta(*tensors) -> None:
    """The fake implementations stand in for the operator where no data exists: under fake
    tensors (``torch.compile``) or on meta tensors alone. A call that mixes meta tensors with
    real ones reaches them too (the dispatcher picks the meta kernel); it would get
    uninitialised outputs, so it is refused as the Python API refuses it."""
    from torch._subclasses.fake_tensor import FakeTensor

    for t in tensors:
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and t.device.type != "meta":
            devices = sorted({str(x.device) for x in tensors if isinstance(x, torch.Tensor)})
            raise ValueError(
                f"indexer_topk: tensors on {' and '.join(devices)} in one call: a meta tensor has no data to "
                "read; pass every tensor on one GPU (or the CPU), or all on the meta device for shapes alone"
            )


def _check_call(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, weight_scale, backend,
                check_values, rows_per_request, order, out=None) -> None:
    """What the call checks before it runs that needs no data: so that a traced or meta call
    with an unsupported ``topk``, an unknown layout or backend, or a tensor of the wrong shape
    fails where it is traced, not when the compiled graph first runs."""
    # a value torch.compile made symbolic is checked at its traced value (the guard this adds
    # recompiles for another: there are three topk values)
    topk, rows_per_request = (int(x) if isinstance(x, torch.SymInt) else x for x in (topk, rows_per_request))
    weight_scale = float(weight_scale) if isinstance(weight_scale, torch.SymFloat) else weight_scale
    api.check_backend(backend)
    api.check_rows_per_request(rows_per_request)
    check_metadata(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk, layout=layout,
                   weight_scale=weight_scale, out=out, check_values=check_values, order=order)


@torch.library.register_fake(f"{NAMESPACE}::indexer_topk")
def _(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, weight_scale=1.0, backend="auto",
      check_values=True, rows_per_request=None, order="score"):
    _only_fake_or_meta(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens)
    _check_call(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, weight_scale, backend,
                check_values, rows_per_request, order)
    rows = q.shape[0]
    return (
        q.new_empty((rows, topk), dtype=torch.float32),
        q.new_empty((rows, topk), dtype=torch.int32),
        q.new_empty((rows, topk), dtype=torch.int32),
        q.new_empty((rows,), dtype=torch.int32),
    )


@torch.library.register_fake(f"{NAMESPACE}::indexer_topk_out")
def _(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, values, raw_indices,
      physical_indices, counts, workspace=None, weight_scale=1.0, backend="auto", check_values=False,
      rows_per_request=None, order="score"):
    _only_fake_or_meta(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, values, raw_indices,
                       physical_indices, counts, workspace)
    _check_call(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, layout, weight_scale, backend,
                check_values, rows_per_request, order, IndexerTopKResult(values, raw_indices, physical_indices, counts))
    return None


__all__ = ["NAMESPACE", "indexer_topk_op", "indexer_topk_out_op"]
