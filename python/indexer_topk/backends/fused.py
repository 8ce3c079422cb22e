"""The fused backend: streaming score + top-k with context-independent scratch.

See :mod:`indexer_topk.kernels.fused` for the algorithm. This module plans the launch
(programs, splits), lays out the caller-owned workspace and launches the fused kernel and,
for split rows, the exact merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton

from ..contract import PAGE_SIZE, IndexerTopKResult, Layout, allocate_result, as_inputs, check_workspace
from ..kernels.fused import fused_topk_kernel
from ..envs import interpreting
from ..kernels.launch import (
    SELECT_CHUNK, SELECT_WARPS, TileConfig, device_sm_count, launches_kernels, pack_args, tile_config,
)
from ..kernels.select import MODE_SEGMENTS, select_rows_kernel

PROGRAMS_PER_SM = 2
MAX_SPLITS = 64
# Split rows only while the per-split candidate lists stay small next to the buffers.
MAX_SPLIT_ROWS = 2048
QUEUE_BYTES = 256


@dataclass(frozen=True)
class FusedPlan:
    """Launch geometry of one fused call; it fixes the workspace layout."""

    rows: int
    topk: int
    programs: int
    splits: int
    cap: int
    stream_mode: int
    stage: int  # staging strip per row (stream mode 1), else 0

    @property
    def buffer_entries(self) -> int:
        return self.programs * 2 * self.cap

    @property
    def stage_entries(self) -> int:
        return self.programs * 2 * self.stage

    @property
    def counters(self) -> int:
        """Claim counters (stream mode 2: one per row slot of every program)."""
        return self.programs * 2 if self.stream_mode == 2 else 0

    @property
    def segment_counts(self) -> int:
        return self.rows * self.splits if self.splits > 1 else 0

    @property
    def segment_entries(self) -> int:
        return self.segment_counts * self.topk

    @property
    def nbytes(self) -> int:
        return QUEUE_BYTES + 4 * (
            2 * self.buffer_entries + self.stage_entries + self.counters + 2 * self.segment_entries
            + self.segment_counts
        )

    def constexprs(self, layout_id: int, block_n: int, score_only: bool, interpret: bool) -> dict:
        """The fused kernel's compile-time arguments for this plan."""
        return dict(
            LAYOUT=layout_id, BLOCK_N=block_n, TOPK=self.topk, CAP=self.cap, SPLITS=self.splits,
            SCORE_ONLY=score_only, INTERPRET=interpret, STREAM_MODE=self.stream_mode,
            STAGE_N=max(self.stage, block_n),  # a strip of one block where none is allocated
        )


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


STREAM_MODES = (0, 1, 2)
DEFAULT_STREAM_MODE = 1
# Stream mode 2 uses the values tensor atomics return; before triton-lang PR 7460 (July 2025)
# threads holding a replicated copy of a lane did not receive them.
CLAIMED_MIN_TRITON = (3, 5)
TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])


def default_pool(topk: int) -> int:
    """Candidate room beyond ``topk`` in each row's buffer. The buffer is cut as one register tile,
    so ``topk + pool`` is a power of two, at least ``topk + 1024``: each cut is then amortised
    over at least 1024 entering scores."""
    return _next_pow2(topk + 1024) - topk


def plan_fused(
    rows: int, topk: int, device=None, num_splits: Optional[int] = None, pool: Optional[int] = None,
    stream_mode: int = DEFAULT_STREAM_MODE, block_n: int = 128,
) -> FusedPlan:
    """Programs and context splits for ``rows`` rows: split rows only when pairs are too few
    to occupy every SM."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    slots = device_sm_count(device) * PROGRAMS_PER_SM
    pairs = max(1, -(-rows // 2))
    if num_splits is None:
        splits = 1
        if pairs < slots:
            splits = min(MAX_SPLITS, _next_pow2(-(-slots // pairs)))
            while splits > 1 and rows * splits > MAX_SPLIT_ROWS:
                splits //= 2
    else:
        splits = num_splits
        if splits < 1 or splits & (splits - 1):
            raise ValueError(f"num_splits: expected a power of two, got {splits}")
    programs = max(1, min(slots, pairs * splits))
    if stream_mode not in STREAM_MODES:
        raise ValueError(f"stream_mode: expected one of {STREAM_MODES}, got {stream_mode}")
    if pool is None:
        pool = default_pool(topk)
    if (topk + pool) & (topk + pool - 1):
        raise ValueError(f"pool: topk + pool must be a power of two, got {topk + pool}")
    if pool < block_n:
        raise ValueError(f"pool: must be at least the block size {block_n}")
    # the strip: the largest power of two that fits beside a freshly cut buffer
    stage = _floor_pow2(pool) if stream_mode == 1 else 0
    return FusedPlan(rows, topk, programs, splits, topk + pool, stream_mode, stage)


def fused_workspace_size(
    rows: int, topk: int, layout=None, device=None, num_splits: Optional[int] = None, pool: Optional[int] = None,
    stream_mode: int = DEFAULT_STREAM_MODE,
) -> int:
    """Exact bytes of scratch a fused call of ``rows`` rows needs (independent of context length).

    ``layout`` does not change the size today; it is accepted so callers need not know that.
    """
    block_n = (tile_config(Layout(layout)) if layout is not None else TileConfig()).block_n
    return plan_fused(rows, topk, device, num_splits, pool, stream_mode, block_n).nbytes


def _carve(workspace: torch.Tensor, plan: FusedPlan):
    ws = workspace.view(-1)
    queue = ws[:QUEUE_BYTES].view(torch.int32)
    off = QUEUE_BYTES

    def take(n):
        nonlocal off
        t = ws[off : off + 4 * n].view(torch.int32)
        off += 4 * n
        return t

    buf_key, buf_pos = take(plan.buffer_entries), take(plan.buffer_entries)
    stage = take(plan.stage_entries) if plan.stage else buf_key  # unused by the kernel but in mode 1
    claims = take(plan.counters) if plan.counters else buf_key  # used in mode 2 only
    if plan.splits > 1:
        seg_key, seg_pos = take(plan.segment_entries), take(plan.segment_entries)
        seg_cnt = take(plan.segment_counts)
    else:
        seg_key = seg_pos = seg_cnt = buf_key  # unused by the kernel when SPLITS == 1
    return queue, buf_key, buf_pos, stage, claims, seg_key, seg_pos, seg_cnt


@launches_kernels
def fused_indexer_topk(
    inputs, *, topk=None, layout=None, weight_scale=None, out: Optional[IndexerTopKResult] = None,
    workspace: Optional[torch.Tensor] = None, num_splits: Optional[int] = None, score_only: bool = False,
    pool: Optional[int] = None, stream_mode: int = DEFAULT_STREAM_MODE,
) -> IndexerTopKResult:
    """Fused streaming top-k (the contract of :func:`indexer_topk.indexer_topk`) of
    :class:`~indexer_topk.contract.IndexerInputs` (or a tuple, see :func:`~indexer_topk.contract.as_inputs`).

    ``workspace``: uint8, at least :func:`fused_workspace_size` bytes; allocated per call when
    omitted. Two concurrent calls must not share one workspace. ``num_splits`` overrides the
    context split count (a power of two); ``pool`` the candidate room beyond ``topk`` per row
    (small pools force frequent cuts, which tests use). ``stream_mode`` 1 (default) stages each
    block's keys and appends survivors once per strip; 0 appends them after every block; 2 lets
    each survivor claim a slot atomically (slower on the H200; see
    :mod:`indexer_topk.kernels.fused`). All give the same bits. ``score_only`` is a measurement
    variant that selects nothing (outputs are not valid): in stream mode 0 every block is
    scored and its largest key reduced; in stream mode 1 every block is scored and staged, and no
    strip is read.
    """
    inputs = as_inputs(inputs, topk=topk, layout=layout, weight_scale=weight_scale)
    topk, layout, weight_scale = inputs.topk, inputs.layout, inputs.weight_scale
    if score_only and stream_mode == 2:
        raise ValueError("score_only: a measurement variant of stream modes 0 and 1 only")
    if stream_mode == 2 and not interpreting() and TRITON_VERSION < CLAIMED_MIN_TRITON:
        raise ValueError(
            f"stream_mode: 2 needs Triton >= {'.'.join(map(str, CLAIMED_MIN_TRITON))}, whose tensor atomics return "
            f"each lane's value to every thread holding that lane; found {triton.__version__}"
        )
    ka = pack_args(inputs)
    rows = ka.q.shape[0]
    device = ka.kc.device
    if out is None:
        out = allocate_result(rows, topk, device)
    if rows == 0:
        return out
    cfg = tile_config(layout)
    plan = plan_fused(rows, topk, device, num_splits, pool, stream_mode, cfg.block_n)
    check_workspace(workspace, plan.nbytes, device)
    if workspace is None:
        workspace = torch.empty(plan.nbytes, dtype=torch.uint8, device=device)
    queue, buf_key, buf_pos, stage, claims, seg_key, seg_pos, seg_cnt = _carve(workspace, plan)
    queue.zero_()
    width = ka.page_table.shape[1] * PAGE_SIZE
    span = triton.cdiv(triton.cdiv(max(width, 1), plan.splits), cfg.block_n) * cfg.block_n
    n_items = triton.cdiv(rows, 2) * plan.splits
    out_bits = out.values.view(torch.int32)
    fused_topk_kernel[(plan.programs,)](
        ka.q, ka.qs, ka.w, ka.kc, ka.kf, ka.ks, ka.page_table, ka.page_table.stride(0), ka.seq_lens, rows,
        float(weight_scale), buf_key, buf_pos, stage, claims, queue, n_items, span,
        out_bits, out.raw_indices, out.physical_indices, out.counts, seg_key, seg_pos, seg_cnt,
        **plan.constexprs(ka.layout, cfg.block_n, score_only, ka.interpret),
        num_warps=cfg.num_warps, num_stages=cfg.fused_stages,
    )
    if plan.splits > 1 and not score_only:
        select_rows_kernel[(rows,)](
            seg_key, seg_pos, seg_cnt, plan.splits * topk, ka.seq_lens, ka.page_table, ka.page_table.stride(0),
            out_bits, out.raw_indices, out.physical_indices, out.counts, 0, seg_cnt, seg_cnt,
            MODE=MODE_SEGMENTS, TOPK=topk, SPLITS=plan.splits, CHUNK=SELECT_CHUNK, KNOWN_T=False,
            num_warps=SELECT_WARPS,
        )
    return out
