"""One backend on one workload: a checked call, then timing and peak memory, as one record.

:func:`run_backend` is what the benchmark grid and the CLI's ``demo`` run, on CPU and GPU alike.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ..compare import bitwise_equal
from ..contract import IndexerTopKResult, allocate_result
from ..errors import describe_exception, failure_reason, failure_status
from ..workload import Workload
from .timing import effective_tflops, median_ms, peak_memory_mib, synchronize, time_call

MATCH_RULE = "all four outputs bitwise equal to legacy's (values compared as int32 bits)"


@dataclass
class BackendRun:
    """The record of one backend on one workload, and its outputs (``None`` if it did not run)."""

    record: dict
    outputs: Optional[IndexerTopKResult]

    @property
    def ok(self) -> bool:
        return self.record.get("status") == "ok"


def workload_record(w: Workload) -> dict:
    """The workload fields of a record: ``layout``, ``rows``, ``context_tokens`` (the longest
    request's), ``requests``, ``c4_len``, ``topk``, ``pattern``."""
    ctx = list(w.context_tokens)
    return {
        "layout": w.layout.value,
        "rows": w.rows,
        "context_tokens": max(ctx) if ctx else 0,
        "requests": len(ctx),
        "c4_len": w.c4_len,
        "topk": w.topk,
        "pattern": w.pattern,
    }


def _fused_workspace(w: Workload, device) -> torch.Tensor:
    from ..api import workspace_size

    nbytes = int(workspace_size(w.rows, w.topk, w.layout.value, device=torch.device(device)))
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)


def run_backend(
    w: Workload,
    backend: str,
    *,
    warmup: int = 3,
    iters: int = 10,
    device=None,
    baseline: Optional[IndexerTopKResult] = None,
    measure_memory: bool = True,
    time_first_call: bool = False,
) -> BackendRun:
    """Run ``backend`` on workload ``w``: one checked call, then timing and peak memory.

    Parameters
    ----------
    w : Workload
        Inputs (see :func:`indexer_topk.make_workload`).
    backend : str
        ``"reference"``, ``"legacy"``, ``"fused"`` or ``"aiter"``.
    warmup, iters : int
        Untimed and timed calls after the first (checked) call; ``iters=0`` skips timing.
    device : torch.device or str, optional
        Defaults to the workload's device.
    baseline : IndexerTopKResult, optional
        The legacy backend's outputs on ``w``; sets ``matches_legacy`` (bitwise rule).
    measure_memory : bool
        Measure ``peak_mib`` (CUDA only).
    time_first_call : bool
        With ``iters=0``, report the wall time of the first (checked) call as ``median_ms``;
        meant for the Triton interpreter, where one call takes seconds and every call costs
        the same.

    Returns
    -------
    BackendRun
        ``record`` is a dict with the workload fields, ``backend``, ``status`` (``"ok"``,
        ``"unavailable"`` or ``"error"``), ``reason`` (why not ok), ``median_ms``, ``min_ms``,
        ``tflops``, ``peak_mib``, ``matches_legacy`` (bool or ``None`` when there is no
        baseline), and ``workspace_mib`` for the fused backend. ``outputs`` are a copy of the
        first call's outputs, or ``None``. :class:`indexer_topk.errors.BackendUnavailable`
        marks the backend unavailable; any other exception (out of memory, a CUDA fault, a
        bug) is an error. Nothing is raised.
    """
    from ..api import indexer_topk

    device = torch.device(device) if device is not None else w.q.device
    rec = workload_record(w)
    rec.update(
        backend=backend, status="ok", reason=None, median_ms=None, min_ms=None, tflops=None,
        peak_mib=None, matches_legacy=None,
    )
    try:
        out = allocate_result(w.rows, w.topk, device)
        ws = None
        if backend == "fused":
            ws = _fused_workspace(w, device)
            rec["workspace_mib"] = ws.numel() / 2**20
    except Exception as exc:
        rec.update(status=failure_status(exc), reason=describe_exception(exc))
        return BackendRun(rec, None)

    args, kwargs = w.args(), w.kwargs()

    def call(check_values: bool = False):
        return indexer_topk(*args, **kwargs, backend=backend, out=out, workspace=ws, check_values=check_values)

    try:
        t0 = time.perf_counter()
        call(True)
        synchronize(device)
        first_ms = (time.perf_counter() - t0) * 1e3
        outputs = IndexerTopKResult(*(t.clone() for t in out))
    except Exception as exc:
        rec.update(status=failure_status(exc), reason=failure_reason(exc))
        return BackendRun(rec, None)

    if backend == "legacy":
        rec["matches_legacy"] = True
    elif baseline is not None:
        rec["matches_legacy"] = bitwise_equal(outputs, baseline)

    try:
        if iters > 0:
            times = time_call(call, warmup=warmup, iters=iters, device=device)
            rec["median_ms"] = statistics.median(times)
            rec["min_ms"] = min(times)
        elif time_first_call:
            rec["median_ms"] = rec["min_ms"] = first_ms
            rec["timed_calls"] = "first call only (wall clock, includes input validation)"
        if rec["median_ms"] is not None:
            rec["tflops"] = effective_tflops(w.rows, w.c4_len, rec["median_ms"])
        if measure_memory:
            rec["peak_mib"] = peak_memory_mib(call, device)
    except Exception as exc:
        rec.update(status="error", reason=failure_reason(exc))
    return BackendRun(rec, outputs)


def time_legacy_stages(w: Workload, *, warmup: int = 3, iters: int = 10, device=None) -> dict:
    """Time the legacy path's two stages separately on one logits buffer allocated once.

    Returns ``score_ms`` (:func:`legacy_score` writing the 4-byte ``[rows, width]`` score
    matrix), ``select_ms`` (:func:`legacy_select` on it), ``torch_topk_ms``
    (``torch.topk(logits, topk, dim=1, sorted=False)`` on the same matrix, as legacy stores it:
    ``logits_dtype``) and ``logits_mib``; on failure ``stage_error`` too, with the times
    measured before it.
    """
    device = torch.device(device) if device is not None else w.q.device
    res: Dict[str, object] = {"score_ms": None, "select_ms": None, "torch_topk_ms": None}
    try:
        from ..backends.legacy import legacy_score, legacy_select

        inputs = w.inputs()
        logits = legacy_score(inputs, row_start=0, row_count=w.rows)
        out = allocate_result(w.rows, w.topk, device)
        res["logits_mib"] = logits.numel() * logits.element_size() / 2**20
        res["logits_dtype"] = str(logits.dtype).replace("torch.", "")

        def score():
            legacy_score(inputs, keys=logits, row_start=0, row_count=w.rows)

        def select():
            legacy_select(logits, w.seq_lens, w.page_table, topk=w.topk, out=out, row_start=0)

        timing = dict(warmup=warmup, iters=iters, device=device)
        res["score_ms"] = median_ms(score, **timing)
        res["select_ms"] = median_ms(select, **timing)
        res["torch_topk_ms"] = median_ms(lambda: torch.topk(logits, w.topk, dim=1, sorted=False), **timing)
    except Exception as exc:
        res["stage_error"] = failure_reason(exc)
    return res


__all__ = ["MATCH_RULE", "BackendRun", "run_backend", "time_legacy_stages", "workload_record"]
