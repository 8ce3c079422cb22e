"""A measured experiment: the chunked stream, exact score + top-k in two launches per context chunk.

Not part of the package's paths: at the reference shape (FP8, 1024 rows, 768K tokens, topk
1024) it measured 7.6-9.0 ms within 16 MiB of scratch, against 7.4 for legacy and 7.8 for the
fused kernel (``benchmark/results/NOTES.md``, "The chunked stream"). Kept, with its probe
(``stream_probe.py``) and an interpreted test, because it wins at decode shapes (8 rows x 768K:
0.28 vs 0.49 ms), where it is the starting point of a decode path.

The context is cut into chunks of ``chunk`` positions. For a step of up to ``rows_per_step``
rows, each chunk is scored into a small key matrix ``[rows_per_step, chunk]`` by the legacy
score kernel (the same tile, so the same bits) and folded into each row's candidate set by
:func:`chunk_select_kernel`, one program per row; the last chunk's fold writes the outputs.
Chunks are visited in a scrambled order, ``(i * step) mod n`` with ``step`` near ``n`` times the
golden ratio and coprime to ``n``; the result does not depend on the order.

A row keeps, between launches, a candidate buffer of ``CAP`` (key, position) entries and three
int32 of state: its count and its gate, the exact composite ``(key, position)`` every later entry
must beat (:func:`indexer_topk.kernels.candidates.beats_gate`). A fold reads the row's chunk
``SPAN`` keys at a time and appends those that beat the gate with one prefix sum; where a span's
entrants would not fit, it goes through the span ``BLOCK`` keys at a time and cuts the buffer
back to its best ``TOPK`` (raising the gate) before a block that would not fit
(``CAP >= TOPK + BLOCK``).

What limits it (H200): chunking costs the score 20% (4.5 vs 3.7 ms: a launch per chunk, each
program's pipeline restarts), and a fold step lasts as long as its slowest row, which is
almost always one that cuts (a 64-bit radix cut of a 2048-entry buffer takes tens of
microseconds): about 40 us per step, 98 steps.
"""

from __future__ import annotations


import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from indexer_topk.backends.fused import _next_pow2
from indexer_topk.contract import PAGE_SIZE, IndexerTopKResult, Layout, allocate_result, as_inputs, check_workspace
from indexer_topk.kernels.candidates import beats_gate, cut, order_by_position
from indexer_topk.kernels.common import INT32_MAX, KEY_MIN
from indexer_topk.kernels.launch import device_sm_count, launches_kernels, pack_args, tile_config
from indexer_topk.kernels.logits import logits_kernel
from indexer_topk.kernels.row_topk import append
from indexer_topk.kernels.select import finalize_row

STATE_WORDS = tl.constexpr(4)  # count, gate key, gate position, (padding)


@triton.jit
def _append(buf_key, buf_pos, count, key, pos, take):
    """Append the taken entries after the buffer's ``count``; returns the new count."""
    return count + append(buf_key, buf_pos, count, key, pos, take)


@triton.jit(do_not_specialize=["stride_keys", "col0", "ncols", "row_start", "n_rows", "width", "stride_pt", "first", "last"])
def chunk_select_kernel(
    keys, stride_keys, col0, ncols, seq_lens, row_start, n_rows, width,
    buf_key_all, buf_pos_all, state, page_table, stride_pt,
    out_bits, out_raw, out_phys, out_cnt, first, last,
    TOPK: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr, SPAN: tl.constexpr,
):
    """Program ``i``: row ``row_start + i`` (none at or past ``n_rows``) takes positions
    ``col0 .. col0 + ncols - 1``, whose keys are ``keys[i * stride_keys + 0 .. ncols - 1]``
    (``KEY_MIN`` where the row has no score). ``first``: the row's state starts empty;
    ``last``: the row's outputs are written (``width``: the page table's width in positions,
    which bounds an unchecked length)."""
    i = tl.program_id(0)
    row = row_start + i
    if row < n_rows:
        i64 = i.to(tl.int64)
        buf_key = buf_key_all + i64 * CAP
        buf_pos = buf_pos_all + i64 * CAP
        st = state + i64 * STATE_WORDS
        if first != 0:
            count = tl.zeros([], dtype=tl.int32)
            gate_key = tl.full([], KEY_MIN, tl.int32)  # every entry beats it
            gate_pos = tl.full([], INT32_MAX, tl.int32)
        else:
            count = tl.load(st)
            gate_key = tl.load(st + 1)
            gate_pos = tl.load(st + 2)
        row_keys = keys + i64 * stride_keys
        for s0 in range(0, ncols, SPAN):
            # fast path: the whole span's entrants fit the buffer, one prefix sum appends them
            offs = s0 + tl.arange(0, SPAN)
            key = tl.load(row_keys + offs, mask=offs < ncols, other=KEY_MIN)
            take = (key != KEY_MIN) & beats_gate(key, col0 + offs, gate_key, gate_pos)
            n_take = tl.sum(take.to(tl.int32), axis=0)
            if count + n_take <= CAP:
                if n_take > 0:
                    count = _append(buf_key, buf_pos, count, key, col0 + offs, take)
            else:
                # BLOCK keys at a time, cutting the buffer when a block's entrants do not fit
                for b0 in range(s0, tl.minimum(s0 + SPAN, ncols), BLOCK):
                    offs_b = b0 + tl.arange(0, BLOCK)
                    key_b = tl.load(row_keys + offs_b, mask=offs_b < ncols, other=KEY_MIN)
                    pos_b = col0 + offs_b
                    take_b = (key_b != KEY_MIN) & beats_gate(key_b, pos_b, gate_key, gate_pos)
                    if count + tl.sum(take_b.to(tl.int32), axis=0) > CAP:
                        tl.debug_barrier()  # every earlier append is in place before the cut reads
                        gate_key, gate_pos = cut(buf_key, buf_pos, count, TOPK, TILE)
                        count = tl.full([], TOPK, tl.int32)
                        take_b = take_b & beats_gate(key_b, pos_b, gate_key, gate_pos)
                    count = _append(buf_key, buf_pos, count, key_b, pos_b, take_b)
        if last != 0:
            tl.debug_barrier()
            # positions past the page table do not exist (an unchecked length may say otherwise)
            seq_len = tl.minimum(tl.maximum(tl.load(seq_lens + row), 0), width)
            if count > TOPK:
                cut(buf_key, buf_pos, count, TOPK, TILE)
                count = tl.full([], TOPK, tl.int32)
                tl.debug_barrier()
            if seq_len <= TOPK:  # the contract keeps a short row's positions in ascending order
                order_by_position(buf_key, buf_pos, count, TOPK)
                tl.debug_barrier()
            row64 = row.to(tl.int64)
            finalize_row(
                buf_key, buf_pos, tl.minimum(tl.minimum(seq_len, TOPK), count), seq_len,
                page_table + row64 * stride_pt, out_bits + row64 * TOPK, out_raw + row64 * TOPK,
                out_phys + row64 * TOPK, out_cnt + row, TOPK,
            )
        else:
            tl.store(st, count)
            tl.store(st + 1, gate_key)
            tl.store(st + 2, gate_pos)


STREAM_BUDGET_BYTES = 16 << 20
MAX_STEP_ROWS = 256  # measured best within the budget (7.59 ms; 512 rows: 8.12)
MAX_SPAN = 4096
# Score programs resident per SM (the legacy score kernel on sm_90: FP8 at 128 registers and
# 34 KB of shared memory; MXFP4 at 255 registers), used to size a launch to whole waves.
SCORE_PROGRAMS_PER_SM = {Layout.SGLANG_FP8: 4, Layout.SGLANG_MXFP4: 2, Layout.AITER_MXFP4: 2}
SELECT_WARPS = 8
# Register cap of the fold (None: the compiler's, 255). Its cut, unrolled, takes them all and
# leaves one fold per SM, yet a cap measured slower: 96 spilled (8.95 vs 8.12 ms), 64 more so.
SELECT_MAXNREG = None
ENTRY_BYTES = 8  # an int32 key and an int32 position
STATE_BYTES = 4 * STATE_WORDS.value
GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class StreamPlan:
    """Geometry of one chunked-stream call; ``rows_per_step``, ``chunk`` and ``block`` fix the
    workspace layout."""

    topk: int
    rows_per_step: int
    chunk: int  # positions per chunk (a multiple of the 64-key page)
    block: int  # keys a fold reads at once; a row's buffer holds topk + block

    @property
    def cap(self) -> int:
        return self.topk + self.block

    @property
    def tile(self) -> int:
        return _next_pow2(self.cap)

    @property
    def span(self) -> int:
        """Keys a fold reads in one load (a power of two, at most :data:`MAX_SPAN`)."""
        return min(MAX_SPAN, max(self.block, _next_pow2(self.chunk)))

    @property
    def nbytes(self) -> int:
        return self.rows_per_step * (4 * self.chunk + ENTRY_BYTES * self.cap + STATE_BYTES)


def plan_stream(rows: int, topk: int, group_rows: int = 2, budget: int = STREAM_BUDGET_BYTES,
                block: Optional[int] = None, rows_per_step: Optional[int] = None) -> StreamPlan:
    """Rows per step and chunk width for ``rows`` rows within ``budget`` bytes of scratch.

    ``block`` (default ``topk``) and ``rows_per_step`` (default up to :data:`MAX_STEP_ROWS`)
    override the defaults, for tests and measurement; every choice gives the same bits.
    """
    if block is None:
        block = topk
    if block < 1 or block & (block - 1):
        raise ValueError(f"block: expected a power of two, got {block}")
    if rows_per_step is None:
        rows_per_step = min(MAX_STEP_ROWS, max(rows, 1))
    rows_per_step = -(-rows_per_step // group_rows) * group_rows
    per_row = budget // rows_per_step - ENTRY_BYTES * (topk + block) - STATE_BYTES
    chunk = per_row // 4 // PAGE_SIZE * PAGE_SIZE
    if chunk < PAGE_SIZE:
        raise ValueError(f"budget: {budget} bytes cannot hold a step of {rows_per_step} rows at topk {topk}")
    return StreamPlan(topk, rows_per_step, chunk, block)


def chunk_geometry(plan: StreamPlan, width: int) -> tuple[int, int]:
    """``(chunk, n_chunks)``: the positions per chunk a call over ``width`` positions uses (the
    plan's, or fewer when the whole context is shorter) and how many chunks cover it."""
    chunk = min(plan.chunk, max(PAGE_SIZE, triton.cdiv(width, PAGE_SIZE) * PAGE_SIZE))
    return chunk, max(1, triton.cdiv(width, chunk))


def chunk_order(n: int) -> list[int]:
    """The scrambled visit order of ``n`` chunks (a permutation of ``range(n)``)."""
    step = max(1, int(n * GOLDEN))
    while math.gcd(n, step) != 1:
        step += 1
    return [(i * step) % n for i in range(n)]


def _carve(workspace: torch.Tensor, plan: StreamPlan):
    ws = workspace.view(-1)
    n = plan.rows_per_step
    sizes = (n * plan.chunk, n * plan.cap, n * plan.cap, n * STATE_BYTES // 4)
    parts, off = [], 0
    for size in sizes:
        parts.append(ws[off : off + 4 * size].view(torch.int32))
        off += 4 * size
    return parts


@launches_kernels
def stream_indexer_topk(
    inputs, *, topk=None, layout=None, weight_scale=None, out: Optional[IndexerTopKResult] = None,
    workspace: Optional[torch.Tensor] = None, block: Optional[int] = None, rows_per_step: Optional[int] = None,
    budget: int = STREAM_BUDGET_BYTES, launch=("score", "fold"),
) -> IndexerTopKResult:
    """Chunked-stream top-k (the contract of :func:`indexer_topk.indexer_topk`).

    ``workspace``: uint8, at least the plan's ``nbytes`` (at most ``budget``), allocated per call when
    omitted; two concurrent calls must not share one. ``block``, ``rows_per_step`` and
    ``budget`` override the plan (see :func:`plan_stream`); all give the same bits. ``launch``
    names the launches to issue: a measurement can time the score or the fold launches alone
    (their outputs are then meaningless).
    """
    inputs = as_inputs(inputs, topk=topk, layout=layout, weight_scale=weight_scale)
    topk, layout = inputs.topk, inputs.layout
    ka = pack_args(inputs)
    rows = inputs.rows
    device = ka.kc.device
    if out is None:
        out = allocate_result(rows, topk, device)
    if rows == 0:
        return out
    cfg = tile_config(layout)
    plan = plan_stream(rows, topk, cfg.rows, budget, block, rows_per_step)
    check_workspace(workspace, plan.nbytes, device)
    if workspace is None:
        workspace = torch.empty(plan.nbytes, dtype=torch.uint8, device=device)
    keys, buf_key, buf_pos, state = _carve(workspace, plan)
    pt = ka.page_table
    width = pt.shape[1] * PAGE_SIZE
    chunk, n_chunks = chunk_geometry(plan, width)
    order = chunk_order(n_chunks)
    slots = device_sm_count(device) * SCORE_PROGRAMS_PER_SM[layout]
    out_bits = out.values.view(torch.int32)
    weight_scale = float(inputs.weight_scale)
    score = Relaunch(logits_kernel, dict(LAYOUT=ka.layout, R=cfg.rows, TMA=ka.tma, INTERPRET=ka.interpret,
                                         STAGES=cfg.logits_stages),
                     dict(num_warps=cfg.num_warps, num_stages=cfg.logits_stages))
    fold = Relaunch(chunk_select_kernel, dict(TOPK=topk, CAP=plan.cap, TILE=plan.tile, BLOCK=plan.block, SPAN=plan.span),
                    dict(num_warps=SELECT_WARPS, **({} if ka.interpret or not SELECT_MAXNREG else {"maxnreg": SELECT_MAXNREG})))
    for r0 in range(0, rows, plan.rows_per_step):
        n = min(plan.rows_per_step, rows - r0)
        groups = triton.cdiv(n, cfg.rows)
        span = triton.cdiv(triton.cdiv(chunk, max(1, slots // groups)), PAGE_SIZE) * PAGE_SIZE
        for i, c in enumerate(order):
            col0 = c * chunk
            ncols = max(0, min(chunk, width - col0))
            if "score" in launch:
                score((groups, max(1, triton.cdiv(ncols, span))), ka.q, ka.qs, ka.w, ka.kc, ka.kf, ka.ks, ka.kdesc, ka.pages,
                      pt, pt.stride(0), ka.seq_lens, r0 + n, r0, weight_scale, keys, chunk, col0, col0 + ncols, span)
            if "fold" in launch:
                fold((n,), keys, chunk, col0, ncols, ka.seq_lens, r0, r0 + n, width, buf_key, buf_pos, state, pt, pt.stride(0),
                     out_bits, out.raw_indices, out.physical_indices, out.counts, int(i == 0), int(i == n_chunks - 1))
    return out


class Relaunch:
    """One kernel launched many times in a call with the same compile-time arguments (the
    chunked stream launches two kernels per context chunk).

    The first launch goes through the JIT (compiling or loading the binary); later ones call the
    compiled kernel's launcher directly with the arguments in the kernel's order, which skips
    the JIT's per-launch argument binding and cache lookup (tens of microseconds of host time
    per launch, more than a chunk's GPU time). Run-time arguments must keep the types and
    alignments of the first launch: integers that vary belong in the kernel's
    ``do_not_specialize``. Under the interpreter, or where the compiled kernel does not expose
    its launcher, every launch goes through the JIT.
    """

    def __init__(self, fn, constexprs: dict, options: dict):
        self.fn, self.constexprs, self.options = fn, constexprs, options
        self.kernel = None
        self.stream = None

    def __call__(self, grid, *args):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        k = self.kernel
        if k is None:
            k = self.fn[grid](*args, **self.constexprs, **self.options)
            if _relaunchable(k):
                self.kernel = k
                self.stream = torch.cuda.current_stream(args[0].device).cuda_stream
            return
        full = (*args, *(self.constexprs[name] for name in self.fn.arg_names[len(args):]))
        k.run(grid[0], grid[1], grid[2], self.stream, k.function, k.packed_metadata,
              k.launch_metadata(grid, self.stream, *full), _knobs.runtime.launch_enter_hook,
              _knobs.runtime.launch_exit_hook, *full)


try:
    from triton import knobs as _knobs
    from triton.compiler.compiler import CompiledKernel as _CompiledKernel
except ImportError:  # a Triton without these: every launch goes through the JIT
    _knobs = _CompiledKernel = None


def _relaunchable(kernel) -> bool:
    return _CompiledKernel is not None and isinstance(kernel, _CompiledKernel) and hasattr(kernel, "packed_metadata")
