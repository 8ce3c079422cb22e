"""Which ``order`` an engine asks for: the layout of a row's selection that costs least.

``order="score"`` returns each row best first; ``order="position"`` the same entries in ascending
positions (:func:`indexer_topk.contract.check_order`). SGLang's sparse attention reads a row's
selection as a set and its own CUDA top-k leaves rows unordered, so either serves it; the SGLang
plugin and the serving mix ask :func:`serving_order` which one a call takes.
"""

from __future__ import annotations

from .contract import ORDER_POSITION, ORDER_SCORE, Layout, parse_layout


def position_order_free(backend: str, rows: int, width: int, device) -> bool:
    """Whether ``order="position"`` costs ``backend`` no more than ``"score"`` on a call of
    ``rows`` rows over ``width`` C4 positions a page-table row: the fused finishes and legacy's row
    select lay a row out by position in place of sorting it; legacy's split select (few rows, or
    few long ones: :func:`indexer_topk.backends.legacy.select_way`) sorts it, then lays it out in a
    further pass; AITER and the reference, a pass of torch ops."""
    if backend == "fused":
        return True
    if backend != "legacy":
        return False
    from .backends.legacy import select_way
    from .kernels.launch import device_sm_count

    return select_way(rows, width, device_sm_count(device)) == "rows"


def serving_order(layout, backend: str, rows: int, width: int, device, decode: bool) -> str:
    """The ``order`` an engine asks of ``backend`` for a call of ``rows`` rows over ``width`` C4
    positions a page-table row: ascending positions for a prefill call where the backend's finish
    gives them in place of its sort (:func:`position_order_free`); best first for a decode step
    (whose split select finishes so), on AITER's layout (AITER's own order) and elsewhere."""
    if decode or parse_layout(layout) is Layout.AITER_MXFP4 or not position_order_free(backend, rows, width, device):
        return ORDER_SCORE
    return ORDER_POSITION
