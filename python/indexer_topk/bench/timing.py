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


def time_call(fn: Callable[[], object], *, warmup: int, iters: int, device,
              before: Optional[Callable[[], object]] = None) -> List[float]:
    """Per-call times in ms of ``iters`` calls of ``fn`` after ``warmup`` untimed ones.

    CUDA: one event pair around each call, read after a single final sync (so host overhead
    between calls is not counted). CPU: ``time.perf_counter`` around each call. ``before``:
    called ahead of every call (warm-up ones too) outside its events, on the same stream, so the
    GPU has finished it when the call's start event is reached (:func:`l2_evictor`).
    """
    iters = max(1, int(iters))
    for _ in range(max(0, int(warmup))):
        if before is not None:
            before()
        fn()
    if torch.device(device).type == "cuda":
        synchronize(device)
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in pairs:
            if before is not None:
                before()
            start.record()
            fn()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in pairs]
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def median_ms(fn: Callable[[], object], *, warmup: int, iters: int, device,
              before: Optional[Callable[[], object]] = None) -> float:
    """Median of :func:`time_call`'s per-call times, in ms."""
    return statistics.median(time_call(fn, warmup=warmup, iters=iters, device=device, before=before))


L2_EVICT_FALLBACK_BYTES = 256 << 20  # the buffer where the device does not report its L2 size
# SM cycles the GPU spins ahead of each timed replay (:func:`queue_hold`): 100 us at 2 GHz, 180 at
# 1.1, past what the host takes to enqueue an event, a graph replay and an event
HOLD_CYCLES = 200_000


def queue_hold(device) -> Optional[Callable[[], None]]:
    """A callable that keeps ``device`` busy for :data:`HOLD_CYCLES` cycles (one thread spinning),
    for use as :func:`time_call`'s ``before`` (``None`` on a CPU, or with ``HOLD_CYCLES`` 0: the
    replays then timed as they were before).

    Why: a graph replay of a few tens of microseconds takes about as long as the host needs to
    enqueue it and its two events, so the GPU can reach a call's start event idle and then wait
    for the replay's launch, whose latency the events then count. Identical replays timed that
    way read up to 10 us apart, and some above the same replays timed after the L2 evictor's
    fill (benchmark/results/NOTES.md, "The row select's warps by rows, the gate ahead L2-cold").
    With the GPU spinning ahead of each start event, the host has queued the replay and its end
    event before the start event is reached, and the events time the replay's kernels alone."""
    if not hold_cycles(device):
        return None

    def hold() -> None:
        torch.cuda._sleep(HOLD_CYCLES)

    return hold


def hold_cycles(device) -> int:
    """The cycles :func:`queue_hold` spins ``device`` for ahead of each timed replay: 0 where it
    makes no spin (a CPU, or ``HOLD_CYCLES`` 0 or less); what a run's records say of it."""
    return HOLD_CYCLES if torch.device(device).type == "cuda" and HOLD_CYCLES > 0 else 0


def l2_evictor(device) -> Optional[Callable[[], None]]:
    """A callable that leaves nothing of the timed call's inputs in ``device``'s L2 cache: it
    writes a buffer of twice the L2's bytes (``None`` on a CPU).

    Why: a decode step replayed from a CUDA graph on the same bytes finds its keys in L2 from the
    replay before wherever they fit (a request of 128K tokens holds 4.3 MB of FP8 keys, eight of
    them 35 MB, against an H100's 50 MB of L2), which a server never does: each layer's step
    reads its own layer's cache, last read a whole forward pass ago. Timed after the evictor,
    the step reads its keys from HBM, as in serving. The buffer's dirty lines are written back
    while the step runs, a share of HBM traffic a server's other work also makes."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0))
    buf = torch.empty(2 * l2 or L2_EVICT_FALLBACK_BYTES, dtype=torch.uint8, device=dev)

    def evict() -> None:
        buf.fill_(1)

    return evict


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
    "L2_EVICT_FALLBACK_BYTES",
    "PEAK_MEMORY_METHOD",
    "TIMING_METHOD",
    "clock_name",
    "effective_tflops",
    "l2_evictor",
    "median_ms",
    "peak_memory_mib",
    "synchronize",
    "time_call",
]
