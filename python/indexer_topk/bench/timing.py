"""The benchmark's clocks: per-call times, their median, peak memory and effective TFLOP/s."""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Optional

import torch

from ..contract import HEAD_DIM, HEADS

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


def clock_name(device) -> str:
    """The clock :func:`time_call` uses on ``device``, in words."""
    return "CUDA events" if torch.device(device).type == "cuda" else "time.perf_counter"


def synchronize(device) -> None:
    """Wait for ``device``'s queued work (a no-op on a CPU)."""
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


__all__ = [
    "FLOP_RULE",
    "PEAK_MEMORY_METHOD",
    "TIMING_METHOD",
    "clock_name",
    "effective_tflops",
    "median_ms",
    "peak_memory_mib",
    "synchronize",
    "time_call",
]
