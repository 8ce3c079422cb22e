"""What a demo on a CPU will cost, estimated before it runs: memory, and rough time under the
Triton interpreter.

Under the interpreter every kernel program runs as NumPy on one core, so a kernel's time grows
with the row x position pairs it scores, about :data:`INTERPRETER_S_PER_PAIR` each whatever the
layout or ``topk`` (measured as process CPU time with torch 2.13 and Triton 3.9 on an x86 core,
across the three layouts, 4-16 rows and 1,100-17,600 C4 positions). Building the batch
holds float32 queries several times over before quantising them, about
:data:`BUILD_BYTES_PER_ROW` per query row. The figures are rough, within a small factor on
another machine: they tell a run of seconds from one of hours, and a batch that fits in memory
from one that does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..backends.key_matrix import key_matrix_bytes
from ..contract import PAGE_SIZE, Layout, parse_layout

# Seconds per row x position pair for one interpreted kernel backend (legacy or fused).
INTERPRETER_S_PER_PAIR = 3e-4
# Seconds per row x position pair of the fp64 reference, per pass (the demo runs two: the
# answer and the next values behind the cut).
REFERENCE_S_PER_PAIR = 2.5e-5
# Peak bytes per query row while the batch is built (measured: FP8 149 KiB, MXFP4 402 KiB).
BUILD_BYTES_PER_ROW = {Layout.SGLANG_FP8: 160 << 10, Layout.SGLANG_MXFP4: 420 << 10, Layout.AITER_MXFP4: 420 << 10}
# Peak bytes of building the keys (they are quantised in batches of 65,536 positions, so this
# does not grow with the context; measured: FP8 189 MiB, MXFP4 440 MiB).
BUILD_KEY_BYTES = {Layout.SGLANG_FP8: 200 << 20, Layout.SGLANG_MXFP4: 450 << 20, Layout.AITER_MXFP4: 450 << 20}
# Bytes per output row and kept position: values, raw and physical indices (4 bytes each).
OUTPUT_BYTES_PER_SLOT = 12
# What the process holds before the demo builds anything (torch, Triton, the interpreter).
PROCESS_BYTES = 400 << 20
# The reference's float64 scratch of one 16-row x 4,096-position block (scores per head and
# their intermediates).
REFERENCE_BLOCK_BYTES = 3 * 16 * 4096 * 64 * 8

KERNEL_BACKENDS = ("legacy", "fused")


@dataclass(frozen=True)
class DemoCost:
    """An estimate: ``seconds`` of CPU time and ``memory_bytes`` of peak memory."""

    seconds: float
    memory_bytes: int

    def __str__(self) -> str:
        return f"about {format_seconds(self.seconds)} and {format_bytes(self.memory_bytes)} of memory"


def format_seconds(seconds: float) -> str:
    """``"40 s"``, ``"3.3 min"``, ``"35 h"``, ``"12 days"``: rough durations."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.2g} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.2g} h"
    return f"{seconds / 86400:,.0f} days"


def format_bytes(nbytes: float) -> str:
    """``"512 MiB"``, ``"1.2 GiB"``."""
    if nbytes < 1 << 30:
        return f"{max(1, round(nbytes / 2**20))} MiB"
    return f"{nbytes / 2**30:,.1f} GiB"


def demo_cost(layout, context_tokens: Sequence[int], rows_per_request: Sequence[int], topk: int,
              backends: Sequence[str], *, reference_max_pairs: int, kernel_calls: int = 1) -> DemoCost:
    """Estimate a demo batch built as :func:`indexer_topk.workload.make_workload` builds it and
    run by ``backends`` on a CPU (``"aiter"`` never runs there; the reference runs only up to
    ``reference_max_pairs`` row x position pairs, as the demo decides), each kernel backend
    ``kernel_calls`` times (warm-up and timed calls), the reference once.

    Every row is scored across the page table's width, as the legacy kernel scores it; the fused
    kernel stops at each row's length, so the estimate errs long for mixed lengths.
    """
    layout = parse_layout(layout)
    c4 = [int(c) // 4 for c in context_tokens]
    rows = sum(int(r) for r in rows_per_request)
    pages = max(max(1, -(-n // PAGE_SIZE)) for n in c4) + 1  # make_workload pads one page
    pairs = rows * pages * PAGE_SIZE
    kernels = [b for b in KERNEL_BACKENDS if b in backends]
    reference = "reference" in backends and rows * max(c4) <= reference_max_pairs

    seconds = kernel_calls * len(kernels) * INTERPRETER_S_PER_PAIR * pairs
    outputs = len(kernels)
    memory = PROCESS_BYTES + BUILD_KEY_BYTES[layout] + rows * BUILD_BYTES_PER_ROW[layout]
    if "legacy" in kernels:
        memory += key_matrix_bytes(rows, pages)
    if reference:
        seconds += 2 * REFERENCE_S_PER_PAIR * pairs
        memory += REFERENCE_BLOCK_BYTES
        outputs += 2
    memory += outputs * rows * topk * OUTPUT_BYTES_PER_SLOT
    return DemoCost(seconds=seconds, memory_bytes=int(memory))


def physical_memory_bytes() -> int:
    """This machine's physical memory, or ``0`` where the system does not say."""
    try:
        import os

        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 0


__all__ = ["DemoCost", "demo_cost", "format_bytes", "format_seconds", "physical_memory_bytes"]
