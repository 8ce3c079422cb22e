"""Benchmark harness: time, peak memory, effective TFLOP/s and agreement of the backends.

The GPU benchmark (``benchmark/bench_indexer_topk.py``, ``indexer-topk bench``) sweeps
layouts x raw context (64K-1M tokens) x prefill rows x ``topk``. Each case is one request
whose chunk of ``rows`` query tokens sits at the end of the context, so every row scores
about ``context / 4`` C4 positions; every backend runs on the same inputs.

Measurement rules (also written into every JSON record and the markdown header):

* time: median of per-call CUDA-event timings after warm-up calls, with the outputs and the
  fused workspace preallocated and ``check_values=False`` (no host syncs inside the call);
* peak memory: ``torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats();
  base = torch.cuda.memory_allocated()``, one call, ``(max_memory_allocated() - base) / 2**20``
  -- what the call allocates above its inputs, outputs and workspace (for the legacy path:
  the FP32 score matrix and the top-k scratch);
* effective TFLOP/s: ``2 * rows * c4_len * 64 * 128 / time`` (``c4_len`` the longest row's);
* agreement: ``matches_legacy`` is :func:`indexer_topk.compare.bitwise_equal` against the
  legacy backend's outputs on the same inputs.

The pieces (:func:`run_backend`, :func:`time_legacy_stages`, :func:`write_markdown`, ...) are
reusable; the CLI's ``demo`` uses :func:`run_backend` on CPU and GPU alike.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .contract import HEAD_DIM, HEADS, IndexerTopKResult, Layout, allocate_result
from .compare import bitwise_equal
from .workload import PATTERNS, Workload, make_workload

LAYOUTS = tuple(x.value for x in Layout)
KNOWN_BACKENDS = ("reference", "legacy", "fused", "aiter")
DEFAULT_BACKENDS = ("legacy", "fused")
K = 1024
DEFAULT_CONTEXTS = (64 * K, 256 * K, 768 * K, 1024 * K)
DEFAULT_ROWS = (1024, 4096)
DEFAULT_TOPKS = (512, 1024)
# The adversarial extra set: V4-Pro topk at the context where the legacy score matrix
# (768 MiB per 1024 rows) is what SGLang's 2 GiB slab was sized for.
EXTRA_PATTERNS = ("increasing",)
EXTRA_SHAPE = {"rows": 1024, "context_tokens": 768 * K, "topk": 1024}
QUICK_GRID = {"contexts": (16 * K, 64 * K), "rows": (256,), "topks": (512, 1024)}
QUICK_EXTRA_SHAPE = {"rows": 256, "context_tokens": 64 * K, "topk": 1024}
PLOT_ROWS, PLOT_TOPK = 1024, 1024

TIMING_METHOD = (
    "median of {iters} per-call timings ({clock}) after {warmup} warm-up calls; outputs and the "
    "fused workspace preallocated; check_values=False"
)
PEAK_MEMORY_METHOD = (
    "torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); "
    "base = torch.cuda.memory_allocated(); one call; "
    "peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20 "
    "(memory allocated by the call above its inputs, preallocated outputs and workspace)"
)
FLOP_RULE = "2 * rows * c4_len * 64 heads * 128 head_dim (c4_len = longest row's C4 length)"
MATCH_RULE = "all four outputs bitwise equal to legacy's (values compared as int32 bits)"


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def parse_tokens(text) -> int:
    """Token count from ``"65536"``, ``"64K"``, ``"768k"`` or ``"1M"`` (K = 1024, M = 1024**2)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a token count (e.g. 65536, 64K, 768K, 1M)")
    n = int(m.group(1)) * {"": 1, "k": K, "m": K * K}[m.group(2).lower()]
    if n <= 0:
        raise ValueError(f"token count must be positive, got {text!r}")
    return n


def format_tokens(n: int) -> str:
    """Inverse of :func:`parse_tokens` where exact: 786432 -> ``"768K"``, 1048576 -> ``"1M"``."""
    if n % (K * K) == 0:
        return f"{n // (K * K)}M"
    if n % K == 0:
        return f"{n // K}K"
    return str(n)


def parse_list(text: str, convert: Callable = str, *, name: str = "value") -> list:
    """Comma-separated list; each item through ``convert``; ``ValueError`` naming ``name``."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{name}: empty list")
    out = []
    for x in items:
        try:
            out.append(convert(x))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return out


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    """A :func:`parse_list` converter accepting only ``choices``."""

    def convert(x):
        if x not in choices:
            raise ValueError(f"unknown value {x!r}; expected one of {', '.join(choices)}")
        return x

    return convert


def gpu_slug(name: str) -> str:
    """File-name form of a device name: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "device"


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def package_version(*dists: str) -> str:
    """The installed version of the first of ``dists`` that is installed; ``"installed
    (version unknown)"`` when only its module is found, ``"not installed"`` otherwise."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    for d in dists:
        try:
            return version(d)
        except PackageNotFoundError:
            continue
    for m in (d.replace("-", "_") for d in dists):
        try:
            if find_spec(m) is not None:
                return "installed (version unknown)"
        except (ImportError, ValueError):
            continue
    return "not installed"


def triton_version() -> str:
    return package_version("triton", "pytorch-triton-rocm")


def source_revision() -> Optional[str]:
    """``git describe --always --dirty`` of the checkout this package runs from, if it is one."""
    import subprocess

    try:
        proc = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


ENV_KEYS = ("gpu", "device", "torch_version", "triton_version", "indexer_topk_version", "source_revision", "timestamp")


def environment(device) -> dict:
    """Fields every record carries: ``gpu``, ``device``, ``torch_version``, ``triton_version``,
    ``indexer_topk_version``, ``source_revision`` (git, when run from a checkout), ``timestamp``."""
    from . import __version__

    return {
        "gpu": device_name(device),
        "device": str(torch.device(device)),
        "torch_version": torch.__version__,
        "triton_version": triton_version(),
        "indexer_topk_version": __version__,
        "source_revision": source_revision(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def effective_tflops(rows: int, c4_len: int, ms: Optional[float]) -> Optional[float]:
    """``2 * rows * c4_len * 64 * 128`` FLOP over ``ms`` milliseconds, in TFLOP/s."""
    if not ms or ms <= 0:
        return None
    return 2.0 * rows * c4_len * HEADS * HEAD_DIM / (ms * 1e-3) / 1e12


def time_call(fn: Callable[[], object], *, warmup: int, iters: int, device) -> List[float]:
    """Per-call times in ms of ``iters`` calls of ``fn`` after ``warmup`` untimed ones.

    CUDA: one event pair around each call, read after a single final sync (so host overhead
    between calls is not counted). CPU: ``time.perf_counter`` around each call.
    """
    iters = max(1, int(iters))
    for _ in range(max(0, int(warmup))):
        fn()
    if torch.device(device).type == "cuda":
        synchronize(device)
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in pairs]
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def median_ms(fn: Callable[[], object], *, warmup: int, iters: int, device) -> float:
    """Median of :func:`time_call`'s per-call times, in ms."""
    return statistics.median(time_call(fn, warmup=warmup, iters=iters, device=device))


def peak_memory_mib(fn: Callable[[], object], device) -> Optional[float]:
    """MiB one call of ``fn`` allocates above what is already allocated (CUDA only; ``None`` on CPU)."""
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def describe_exception(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def failure_reason(exc: BaseException) -> str:
    """:func:`describe_exception`, prefixed ``"OOM: "`` when ``exc`` is an out-of-memory error."""
    return ("OOM: " if is_oom(exc) else "") + describe_exception(exc)


def is_unavailable(exc: BaseException) -> bool:
    """Exceptions that mean "this backend cannot run here", not "this backend is wrong".

    ``ImportError`` (module or library missing), ``NotImplementedError``, ``RuntimeError``
    other than out-of-memory, and a ``ValueError`` naming the layout or ``topk`` (a backend
    declining a layout it does not implement, e.g. AITER outside ``aiter_mxfp4``). Inputs come
    from :func:`make_workload` and pass validation, so no other ``ValueError`` is expected.
    """
    if is_oom(exc):
        return False
    if isinstance(exc, ValueError):
        return str(exc).startswith(("layout:", "topk:"))
    return isinstance(exc, (ImportError, NotImplementedError, RuntimeError))


# ---------------------------------------------------------------------------------------------
# One backend on one workload
# ---------------------------------------------------------------------------------------------

@dataclass
class BackendRun:
    """The record of one backend on one workload, and its outputs (``None`` if it did not run)."""

    record: dict
    outputs: Optional[IndexerTopKResult]

    @property
    def ok(self) -> bool:
        return self.record.get("status") == "ok"


def workload_record(w: Workload) -> dict:
    """The workload fields of a record: layout, rows, context_tokens, c4_len, topk, pattern."""
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
    from .api import workspace_size

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
        first call's outputs, or ``None``. First-call ``ImportError`` / ``NotImplementedError`` /
        ``RuntimeError`` mark the backend unavailable; out-of-memory and anything else is an
        error. Nothing is raised.
    """
    from .api import indexer_topk

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
    except Exception as exc:  # workspace_size missing or failing: the backend cannot run
        rec.update(status="unavailable" if is_unavailable(exc) else "error", reason=describe_exception(exc))
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
        status = "unavailable" if is_unavailable(exc) else "error"
        rec.update(status=status, reason=failure_reason(exc))
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
        from .backends.legacy import legacy_score, legacy_select

        args = w.args()
        logits = legacy_score(args, layout=w.layout, weight_scale=w.weight_scale, row_start=0, row_count=w.rows)
        out = allocate_result(w.rows, w.topk, device)
        res["logits_mib"] = logits.numel() * logits.element_size() / 2**20
        res["logits_dtype"] = str(logits.dtype).replace("torch.", "")

        def score():
            legacy_score(args, layout=w.layout, weight_scale=w.weight_scale, logits=logits, row_start=0, row_count=w.rows)

        def select():
            legacy_select(logits, w.seq_lens, w.page_table, topk=w.topk, out=out, row_start=0)

        timing = dict(warmup=warmup, iters=iters, device=device)
        res["score_ms"] = median_ms(score, **timing)
        res["select_ms"] = median_ms(select, **timing)
        res["torch_topk_ms"] = median_ms(lambda: torch.topk(logits, w.topk, dim=1, sorted=False), **timing)
    except Exception as exc:
        res["stage_error"] = failure_reason(exc)
    return res


# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchCase:
    """One benchmark configuration: a single request with ``rows`` query tokens at its end."""

    layout: str
    context_tokens: int
    rows: int
    topk: int
    pattern: str = "random"

    @property
    def name(self) -> str:
        return f"{self.layout}_ctx{format_tokens(self.context_tokens)}_r{self.rows}_k{self.topk}_{self.pattern}"

    @property
    def workload_key(self) -> tuple:
        return (self.layout, self.context_tokens, self.rows, self.pattern)


def build_grid(
    layouts: Sequence[str] = LAYOUTS,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    rows: Sequence[int] = DEFAULT_ROWS,
    topks: Sequence[int] = DEFAULT_TOPKS,
    *,
    pattern: str = "random",
    extra_patterns: Sequence[str] = EXTRA_PATTERNS,
    extra_shape: Optional[dict] = None,
) -> List[BenchCase]:
    """The cartesian grid, plus one case per layout for each extra (adversarial) pattern.

    Extra cases use ``extra_shape`` (default :data:`EXTRA_SHAPE`: 1024 rows, 768K tokens,
    topk 1024); cases are ordered so ones sharing a workload are adjacent.
    """
    shape = dict(EXTRA_SHAPE if extra_shape is None else extra_shape)
    cases = [
        BenchCase(lay, int(c), int(r), int(k), pattern)
        for lay in layouts for c in contexts for r in rows for k in topks
    ]
    for p in extra_patterns:
        if p == pattern:
            continue
        for lay in layouts:
            cases.append(BenchCase(lay, shape["context_tokens"], shape["rows"], shape["topk"], p))
    seen, out = set(), []
    for c in cases:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _workload_for(case: BenchCase, *, seed: int, device) -> Workload:
    return make_workload(
        case.layout, context_tokens=[case.context_tokens], rows_per_request=[case.rows],
        topk=case.topk, seed=seed, device=device, pattern=case.pattern,
    )


def _release(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def bench_workload(
    w: Workload,
    backends: Sequence[str],
    *,
    warmup: int,
    iters: int,
    device,
) -> List[dict]:
    """Records of ``backends`` on one workload: legacy first (its outputs are the baseline,
    computed even when legacy is not among ``backends``), then the others; the legacy record
    gets the stage times, the others ``speedup_vs_legacy``."""
    records = []
    legacy_run = run_backend(
        w, "legacy", warmup=warmup, iters=iters if "legacy" in backends else 0, device=device,
        measure_memory="legacy" in backends,
    )
    baseline = legacy_run.outputs
    legacy_ms = legacy_run.record.get("median_ms")
    for b in backends:
        if b == "legacy":
            rec = legacy_run.record
            if legacy_run.ok:
                rec.update(time_legacy_stages(w, warmup=warmup, iters=iters, device=device))
                _release(device)
        else:
            rec = run_backend(w, b, warmup=warmup, iters=iters, device=device, baseline=baseline).record
            if rec.get("median_ms") and legacy_ms:
                rec["speedup_vs_legacy"] = legacy_ms / rec["median_ms"]
            _release(device)
        records.append(rec)
    return records


def run_cases(
    cases: Sequence[BenchCase],
    backends: Sequence[str],
    *,
    warmup: int = 3,
    iters: int = 10,
    seed: int = 0,
    device="cuda",
    env: Optional[dict] = None,
    on_case: Optional[Callable[[BenchCase, List[dict]], None]] = None,
) -> List[dict]:
    """Benchmark every case; a failing case (OOM, error) becomes records with ``error`` set.

    Cases sharing a workload (same layout, context, rows, pattern) reuse its inputs.
    ``on_case(case, records_so_far)`` is called after each case (progress, partial results).
    """
    env = dict(env or environment(device))
    clock = "CUDA events" if torch.device(device).type == "cuda" else "time.perf_counter"
    meta = {
        **env,
        "warmup": warmup,
        "iters": iters,
        "timing_method": TIMING_METHOD.format(iters=iters, warmup=warmup, clock=clock),
        "peak_memory_method": PEAK_MEMORY_METHOD,
        "flop_rule": FLOP_RULE,
        "match_rule": MATCH_RULE,
    }
    records: List[dict] = []
    cached_key, cached = None, None
    for case in cases:
        try:
            if case.workload_key != cached_key:
                cached = None
                _release(device)
                cached = _workload_for(case, seed=seed, device=device)
                cached_key = case.workload_key
            w = replace(cached, topk=case.topk)
            recs = bench_workload(w, backends, warmup=warmup, iters=iters, device=device)
        except Exception as exc:
            cached_key, cached = None, None
            reason = failure_reason(exc)
            recs = [
                {
                    "layout": case.layout, "rows": case.rows, "context_tokens": case.context_tokens,
                    "c4_len": case.context_tokens // 4, "topk": case.topk, "pattern": case.pattern,
                    "backend": b, "status": "error", "reason": reason, "median_ms": None, "tflops": None,
                    "peak_mib": None, "matches_legacy": None,
                }
                for b in backends
            ]
        for r in recs:
            if r.get("status") != "ok":
                r["error"] = r.get("reason")
            r.update(meta)
            r["case"] = case.name
        records.extend(recs)
        if on_case is not None:
            on_case(case, records)
    _release(device)
    return records


# ---------------------------------------------------------------------------------------------
# Output: JSON, markdown, plot, console table
# ---------------------------------------------------------------------------------------------

TABLE_COLUMNS = ("layout", "rows", "ctx", "topk", "pattern", "backend", "ms", "TFLOP/s", "peak MiB", "matches", "vs legacy", "note")


def _fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def table_rows(records: Iterable[dict]) -> List[Tuple[str, ...]]:
    """Records as display strings in :data:`TABLE_COLUMNS` order."""
    out = []
    for r in records:
        ok = r.get("status") == "ok"
        m = r.get("matches_legacy")
        matches = "-" if m is None else ("yes" if m else "NO")
        if ok and r.get("backend") == "legacy":
            matches = "baseline"
        note = ""
        if not ok:
            note = f"{r.get('status')}: {r.get('reason') or r.get('error')}"
        elif r.get("backend") == "legacy" and r.get("score_ms") is not None:
            note = (
                f"score {r['score_ms']:.2f} + select {_fmt(r.get('select_ms'), '.2f')} ms; "
                f"torch.topk {_fmt(r.get('torch_topk_ms'), '.2f')} ms"
            )
            if r.get("stage_error"):
                note += f"; stages: {r['stage_error']}"
        elif r.get("stage_error"):
            note = f"stages: {r['stage_error']}"
        elif r.get("workspace_mib") is not None:
            note = f"workspace {r['workspace_mib']:.1f} MiB"
        out.append(
            (
                str(r.get("layout")),
                str(r.get("rows")),
                format_tokens(int(r.get("context_tokens") or 0)),
                str(r.get("topk")),
                str(r.get("pattern", "random")),
                str(r.get("backend")),
                _fmt(r.get("median_ms"), ".3f"),
                _fmt(r.get("tflops"), ".1f"),
                _fmt(r.get("peak_mib"), ".1f", "n/a" if ok and r.get("peak_mib") is None else "-"),
                matches,
                _fmt(r.get("speedup_vs_legacy"), ".2f", "-") + ("x" if r.get("speedup_vs_legacy") else ""),
                note,
            )
        )
    return out


def write_json(records: Sequence[dict], path) -> Path:
    """Write ``records`` as a JSON list (one object per backend x case)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(records), indent=1, default=str) + "\n")
    return path


def markdown_table(records: Sequence[dict]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for row in table_rows(records):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)


def write_markdown(records: Sequence[dict], path, *, env: dict, command: str) -> Path:
    """Markdown report: a header (GPU, versions, command, methods) and the results table."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    first = records[0] if records else {}
    timing = first.get("timing_method", TIMING_METHOD.format(iters="?", warmup="?", clock="CUDA events"))
    text = "\n".join(
        [
            f"# indexer-topk benchmark: {env.get('gpu')}",
            "",
            f"- GPU: {env.get('gpu')}",
            f"- torch {env.get('torch_version')}, triton {env.get('triton_version')}, "
            f"indexer-topk {env.get('indexer_topk_version')} (source {env.get('source_revision') or 'unknown'})",
            f"- run at {env.get('timestamp')}",
            f"- command: `{command}`",
            f"- time: {timing}",
            f"- peak memory: `{PEAK_MEMORY_METHOD}`",
            f"- TFLOP/s: {FLOP_RULE}",
            f"- matches: {MATCH_RULE}",
            "- workload: one request; its `rows` query tokens are the last tokens of a `ctx`-token "
            "context, so every row scores about ctx/4 C4 positions",
            "",
            markdown_table(records),
            "",
        ]
    )
    path.write_text(text)
    return path


def _plot_selection(records: Sequence[dict], rows: int, topk: int) -> Tuple[List[dict], int, int]:
    ok = [r for r in records if r.get("status") == "ok" and r.get("pattern", "random") == "random"]
    sel = [r for r in ok if r.get("rows") == rows and r.get("topk") == topk]
    if sel or not ok:
        return sel, rows, topk
    # A grid without (rows, topk) = (1024, 1024), e.g. --quick: plot its most common shape.
    shapes: Dict[Tuple[int, int], int] = {}
    for r in ok:
        shapes[(r["rows"], r["topk"])] = shapes.get((r["rows"], r["topk"]), 0) + 1
    rows, topk = max(shapes, key=lambda s: (shapes[s], s))
    return [r for r in ok if r.get("rows") == rows and r.get("topk") == topk], rows, topk


def write_plot(records: Sequence[dict], path, *, rows: int = PLOT_ROWS, topk: int = PLOT_TOPK, title: str = "") -> Path:
    """Two panels, time and peak memory vs context (log x), one line per layout x backend.

    Uses ``rows`` x ``topk`` records of the random pattern (falling back to the most common
    shape present); the file is written even when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sel, rows, topk = _plot_selection(records, rows, topk)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    series: Dict[Tuple[str, str], List[dict]] = {}
    for r in sel:
        series.setdefault((r["layout"], r["backend"]), []).append(r)
    colours = {lay: f"C{i}" for i, lay in enumerate(sorted({lay for lay, _ in series}))}
    styles = {"fused": "-", "legacy": "--", "aiter": "-.", "reference": ":"}
    for (layout, backend), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["context_tokens"])
        style = styles.get(backend, ":")
        label = f"{layout} / {backend}"
        xs = [r["context_tokens"] for r in rs]
        ts = [r.get("median_ms") for r in rs]
        ms = [r.get("peak_mib") for r in rs]
        if any(t is not None for t in ts):
            ax_t.plot(xs, [float("nan") if t is None else t for t in ts], style, color=colours[layout], marker="o", label=label)
        if any(m is not None for m in ms):
            ax_m.plot(xs, [float("nan") if m is None else m for m in ms], style, color=colours[layout], marker="o", label=label)
    for ax, ylabel in ((ax_t, "median time (ms)"), (ax_m, "peak memory above inputs/outputs (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("raw context (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if sel:
            ticks = sorted({r["context_tokens"] for r in sel})
            ax.set_xticks(ticks)
            ax.set_xticklabels([format_tokens(t) for t in ticks])
            ax.minorticks_off()
    if sel:
        ax_t.legend(fontsize=7)
    else:
        ax_t.text(0.5, 0.5, "no successful records", ha="center", va="center", transform=ax_t.transAxes)
    fig.suptitle(f"{title or 'indexer top-k'}: rows={rows}, topk={topk}, random scores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def render_table(records: Sequence[dict], title: str = "indexer top-k benchmark"):
    """A ``rich.table.Table`` of the records (same columns as the markdown)."""
    from rich.table import Table

    table = Table(title=title)
    for c in TABLE_COLUMNS:
        table.add_column(c, justify="right" if c in ("rows", "ctx", "topk", "ms", "TFLOP/s", "peak MiB", "vs legacy") else "left")
    for row in table_rows(records):
        table.add_row(*row)
    return table


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

NO_GPU_MESSAGE = (
    "the benchmark needs a CUDA or ROCm GPU, and torch.cuda.is_available() is False here "
    "(torch {torch}); run `indexer-topk demo` for the CPU demo"
)


def build_parser(prog: Optional[str] = None, parser_class=argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser_class(
        prog=prog or "bench_indexer_topk.py",
        description="GPU benchmark of the indexer top-k backends (time, peak memory, TFLOP/s, agreement).",
    )
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma list of layouts (default: all three)")
    p.add_argument("--contexts", default=",".join(format_tokens(c) for c in DEFAULT_CONTEXTS),
                   help="comma list of raw context lengths, K/M suffixes allowed (default: 64K,256K,768K,1M)")
    p.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="comma list of prefill rows (default: 1024,4096)")
    p.add_argument("--topk", default=",".join(map(str, DEFAULT_TOPKS)), help="comma list of topk values (default: 512,1024)")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help="comma list from reference,legacy,fused,aiter (default: legacy,fused; "
                        "the fp64 reference is for small --quick grids only)")
    p.add_argument("--pattern", default="random", choices=PATTERNS, help="score pattern of the main grid")
    p.add_argument("--extra-patterns", default=",".join(EXTRA_PATTERNS),
                   help="adversarial patterns run once per layout at rows=1024, 768K, topk=1024 "
                        "('none' to skip; default: increasing)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls before timing (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed calls; the median is reported (default 10)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--out-dir", default="benchmark/results", help="where the json/md/png go (default benchmark/results)")
    p.add_argument("--quick", action="store_true",
                   help="small grid: contexts 16K,64K, rows 256, topk 512,1024; extra set at 64K")
    return p


def _grid_from_args(a, given: set) -> List[BenchCase]:
    layouts = parse_list(a.layouts, one_of(LAYOUTS), name="--layouts")
    contexts = parse_list(a.contexts, parse_tokens, name="--contexts")
    rows = parse_list(a.rows, int, name="--rows")
    topks = parse_list(a.topk, int, name="--topk")
    if any(r <= 0 for r in rows):
        raise ValueError("--rows: rows must be positive")
    extra = [] if a.extra_patterns.strip().lower() in ("", "none") else parse_list(a.extra_patterns, one_of(PATTERNS), name="--extra-patterns")
    extra_shape = None
    if a.quick:
        # --quick replaces only the dimensions the user did not set.
        contexts = contexts if "contexts" in given else list(QUICK_GRID["contexts"])
        rows = rows if "rows" in given else list(QUICK_GRID["rows"])
        topks = topks if "topk" in given else list(QUICK_GRID["topks"])
        extra_shape = QUICK_EXTRA_SHAPE
    return build_grid(layouts, contexts, rows, topks, pattern=a.pattern, extra_patterns=extra, extra_shape=extra_shape)


def main(argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None, parser_class=argparse.ArgumentParser) -> int:
    """Run the benchmark from command-line arguments; returns the exit status.

    2 without a GPU or on a bad option, 1 if any backend disagreed with legacy, else 0.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog, parser_class)
    a = parser.parse_args(argv)
    given = {opt.lstrip("-").split("=")[0].replace("-", "_") for opt in argv if opt.startswith("--")}
    try:
        cases = _grid_from_args(a, given)
        backends = parse_list(a.backends, one_of(KNOWN_BACKENDS), name="--backends")
        if a.warmup < 0 or a.iters < 1:
            raise ValueError("--warmup must be >= 0 and --iters >= 1")
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"{parser.prog}: error: " + NO_GPU_MESSAGE.format(torch=torch.__version__), file=sys.stderr)
        return 2

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    device = torch.device("cuda", torch.cuda.current_device())
    env = environment(device)
    command = " ".join([prog or "python benchmark/bench_indexer_topk.py", shlex.join(argv)]).strip()
    err = Console(stderr=True)
    stem = Path(a.out_dir) / f"bench_{gpu_slug(env['gpu'])}"
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    ) as progress:
        task = progress.add_task("benchmark", total=len(cases))

        def on_case(case, so_far):
            progress.update(task, advance=1, description=case.name)
            # Keep what is measured if a long sweep is stopped part way.
            write_json(so_far, stem.with_suffix(".json"))
            if not err.is_terminal:
                err.print(f"[{progress.tasks[0].completed}/{len(cases)}] {case.name}", highlight=False)

        records = run_cases(cases, backends, warmup=a.warmup, iters=a.iters, seed=a.seed, device=device, env=env, on_case=on_case)

    json_path = write_json(records, stem.with_suffix(".json"))
    md_path = write_markdown(records, stem.with_suffix(".md"), env=env, command=command)
    png_path = write_plot(records, stem.with_suffix(".png"), title=f"indexer top-k on {env['gpu']}")
    console = Console()
    if not console.is_terminal:  # piped output would fold the table at 80 columns
        console = Console(width=200)
    console.print(f"wrote {json_path}, {md_path}, {png_path}")
    console.print(render_table(records, title=f"indexer top-k on {env['gpu']} (torch {env['torch_version']}, triton {env['triton_version']})"))
    disagree = [r for r in records if r.get("matches_legacy") is False]
    return 1 if disagree else 0


__all__ = [
    "BackendRun",
    "BenchCase",
    "build_grid",
    "bench_workload",
    "effective_tflops",
    "environment",
    "format_tokens",
    "gpu_slug",
    "main",
    "markdown_table",
    "parse_tokens",
    "peak_memory_mib",
    "render_table",
    "run_backend",
    "run_cases",
    "time_call",
    "time_legacy_stages",
    "workload_record",
    "write_json",
    "write_markdown",
    "write_plot",
]
