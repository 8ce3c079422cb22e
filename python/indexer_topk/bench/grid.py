"""The benchmark grid: which cases a sweep runs, and running them into records."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Sequence

import torch

from ..errors import failure_reason
from ..options import K, LAYOUTS, format_tokens
from ..workload import Workload, make_workload
from .environment import environment
from .runs import MATCH_RULE, run_backend, time_legacy_stages
from .timing import FLOP_RULE, PEAK_MEMORY_METHOD, TIMING_METHOD, clock_name

KNOWN_BACKENDS = ("reference", "legacy", "fused", "aiter")
DEFAULT_BACKENDS = ("legacy", "fused")
DEFAULT_CONTEXTS = (64 * K, 256 * K, 768 * K, 1024 * K)
DEFAULT_ROWS = (1024, 4096)
DEFAULT_TOPKS = (512, 1024)
# The adversarial extra set: V4-Pro topk at the context where the legacy score matrix
# (768 MiB per 1024 rows) is what SGLang's 2 GiB slab was sized for.
EXTRA_PATTERNS = ("increasing",)
EXTRA_SHAPE = {"rows": 1024, "context_tokens": 768 * K, "topk": 1024}
QUICK_GRID = {"contexts": (16 * K, 64 * K), "rows": (256,), "topks": (512, 1024)}
QUICK_EXTRA_SHAPE = {"rows": 256, "context_tokens": 64 * K, "topk": 1024}


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
    meta = {
        **env,
        "warmup": warmup,
        "iters": iters,
        "timing_method": TIMING_METHOD.format(iters=iters, warmup=warmup, clock=clock_name(device)),
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


__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_CONTEXTS",
    "DEFAULT_ROWS",
    "DEFAULT_TOPKS",
    "EXTRA_PATTERNS",
    "EXTRA_SHAPE",
    "KNOWN_BACKENDS",
    "QUICK_EXTRA_SHAPE",
    "QUICK_GRID",
    "BenchCase",
    "bench_workload",
    "build_grid",
    "run_cases",
]
