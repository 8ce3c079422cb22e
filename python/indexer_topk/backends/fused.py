"""The fused backend: streaming score + top-k with context-independent scratch.

See :mod:`indexer_topk.kernels.fused` for the algorithm. This module plans the launch
(programs, context splits, candidate room), lays out the caller-owned workspace and launches the
fused kernel and, for split rows, the exact merge. On an sm_90 GPU the FP8 cache takes the
warp-specialised Hopper stream instead (:mod:`indexer_topk.backends.hopper`): same plan, same
workspace, same bits.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton

from ..contract import ORDER_POSITION, PAGE_SIZE, IndexerTopKResult, Layout, allocate_result, as_inputs, check_workspace
from ..kernels.fused import clear_queue_kernel, fused_topk_kernel
from ..kernels.launch import (
    SELECT_CHUNK, SELECT_WARPS, device_sm_count, launch_options, launches_kernels, pack_args, tile_config,
)
from ..kernels.select import MODE_SEGMENTS, merge_lists_kernel, select_rows_kernel
from ..replay import launch
from .hopper import launch_stream, why_not_stream

PROGRAMS_PER_SM = 2  # two programs per SM: one scores while the other waits or cuts
MAX_SPLITS = 64
# Split rows only while the per-split candidate lists stay small next to the buffers (at topk
# 1024: at most 4 MiB of lists beside 10.3 MiB of buffers and strips on an H200, so every call
# of up to 1024 rows fits 16 MiB).
MAX_SPLIT_ROWS = 512
QUEUE_BYTES = 256
MAX_STRIP = 1024  # keys per row scored between flushes, at most
ENTRY_BYTES = 8  # an int32 key and an int32 position
# Split lists merged per program at each level of the merge tree: runs of 8, then the final
# merge, measured faster than one program per row over all of a row's 64 lists (8 rows x 768K).
MERGE_FANIN = 8
# Entries a merge program holds at once (the build measured in benchmark/results/decode/; 1024-
# entry chunks timed close to it, in runs that differed in their plans too, so which is faster
# is open).
MERGE_CHUNK = 8192
# Warps of a merge program when the level has no more programs than the GPU has SMs (a decode
# batch's few rows): each program then has an SM to itself, and 8 warps held a chunk of 8192 in
# 255 registers and spilled (sm_90). On an H200 at 8 rows x 768K (16 splits) 16 warps merged
# fastest of 8, 16 and 32 (benchmark/results/decode/sweep_merge_warps_nvidia-h200.log). Levels
# of more programs keep SELECT_WARPS, as measured with the prefill grid.
MERGE_WARPS = 16


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def default_pool(topk: int) -> int:
    """Candidate room beyond ``topk`` in each row's buffer (a multiple of the 64-key page).

    A buffer is cut when a strip's entrants do not fit, so each cut is amortised over about
    ``pool`` entering scores, and the strip scored between flushes is at most ``pool`` keys:
    ``topk`` keeps a full grid's buffers and strips at rows 1024, topk 1024 near 10 MiB on an
    H200.
    """
    return max(PAGE_SIZE, topk // PAGE_SIZE * PAGE_SIZE)


@dataclass(frozen=True)
class FusedPlan:
    """Launch geometry of one fused call; it fixes the workspace layout."""

    rows: int
    topk: int
    group_rows: int  # query rows per work item (the tile's R)
    programs: int
    splits: int
    pool: int

    @property
    def cap(self) -> int:
        return self.topk + self.pool

    @property
    def tile(self) -> int:
        """A cut holds a whole buffer as one register tile of this (power-of-two) size."""
        return _next_pow2(self.cap)

    @property
    def strip(self) -> int:
        """Keys per row a program scores between flushes: whole pages, a power of two that fits
        beside a freshly cut buffer (``strip <= pool``)."""
        return min(MAX_STRIP, 1 << (self.pool.bit_length() - 1))

    @property
    def buffer_entries(self) -> int:
        return self.programs * self.group_rows * self.cap

    @property
    def strip_entries(self) -> int:
        return self.programs * self.group_rows * self.strip

    @property
    def segment_counts(self) -> int:
        return self.rows * self.splits if self.splits > 1 else 0

    @property
    def segment_entries(self) -> int:
        return self.segment_counts * self.topk

    @property
    def merge_levels(self) -> tuple:
        """Lists per row after each level of the merge tree before the final merge (empty when
        the final merge takes the split lists directly)."""
        levels, n = [], self.splits
        while n > MERGE_FANIN:
            n //= MERGE_FANIN
            levels.append(n)
        return tuple(levels)

    @property
    def merge_counts(self) -> int:
        return self.rows * sum(self.merge_levels)

    @property
    def nbytes(self) -> int:
        return QUEUE_BYTES + ENTRY_BYTES * (self.buffer_entries + self.segment_entries + self.merge_counts * self.topk) + 4 * (
            self.strip_entries + self.segment_counts + self.merge_counts
        )

    def constexprs(self, layout_id: int, tma: bool, interpret: bool, stages: int, position: bool = False) -> dict:
        """The fused kernel's compile-time arguments for this plan (``position``: rows laid out in
        ascending positions, ``order="position"``)."""
        return dict(
            LAYOUT=layout_id, R=self.group_rows, TOPK=self.topk, CAP=self.cap, TILE=self.tile,
            STRIP=self.strip, TMA=tma, INTERPRET=interpret, STAGES=stages, POSITION=position,
        )


def program_slots(device=None) -> int:
    """Programs the fused kernel keeps resident on ``device`` (the current GPU when None)."""
    return device_sm_count(_device(device)) * PROGRAMS_PER_SM


def plan_fused(
    rows: int, topk: int, device=None, num_splits: Optional[int] = None, pool: Optional[int] = None,
    group_rows: Optional[int] = None, one_wave: bool = False,
) -> FusedPlan:
    """Programs and context splits for ``rows`` rows: split rows only when groups are too few
    to occupy every program slot. ``group_rows`` defaults to the tile's (every layout's today).

    ``one_wave``: the plan of a decode step on the Hopper stream, one program per SM, each
    taking at most one item: the most splits (a power of two) whose items fit the programs.
    Fewer, longer splits than the plain kernel's rule: each item pays a pipeline fill, a final
    cut and a sort, and each split list a share of the merge (measured at 8 and 64 rows x 768K).
    """
    if group_rows is None:
        group_rows = tile_config(Layout.SGLANG_FP8).rows
    slots = device_sm_count(_device(device)) if one_wave else program_slots(device)
    return _plan(rows, topk, slots, num_splits, pool, group_rows, one_wave)


def _device(device):
    if device is None:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return device


def _plan(rows, topk, slots, num_splits, pool, group_rows, one_wave=False) -> FusedPlan:
    groups = max(1, -(-rows // group_rows))
    if num_splits is None:
        splits = 1
        if one_wave:
            while splits < MAX_SPLITS and groups * splits * 2 <= slots:
                splits *= 2
        elif groups < slots:
            splits = min(MAX_SPLITS, _next_pow2(-(-slots // groups)))
        while splits > 1 and rows * splits > MAX_SPLIT_ROWS:
            splits //= 2
    else:
        splits = num_splits
        if splits < 1 or splits & (splits - 1):
            raise ValueError(f"num_splits: expected a power of two, got {splits}")
    if pool is None:
        pool = default_pool(topk)
    if pool < PAGE_SIZE or pool % PAGE_SIZE:
        raise ValueError(f"pool: expected a positive multiple of the {PAGE_SIZE}-key page, got {pool}")
    programs = max(1, min(slots, groups * splits))
    return FusedPlan(rows, topk, group_rows, programs, splits, pool)


def group_rows_for(rows_per_request: Optional[int], tile_rows: int) -> int:
    """Query rows per work item: the tile's (rows sharing a page-table row share each key tile),
    or one when every row has pages of its own (``rows_per_request == 1``, a decode step
    without draft rows), so no MMA column is spent on a row whose pages differ. A row's score
    bits do not depend on the choice (the tile's head reduction is the same for one and two
    rows; tested bit for bit on the GPU)."""
    return 1 if rows_per_request == 1 else tile_rows


def fused_workspace_size(
    rows: int, topk: int, layout=None, device=None, num_splits: Optional[int] = None, pool: Optional[int] = None,
) -> int:
    """Bytes of scratch that serve every fused call of at most ``rows`` rows (independent of the
    context length): an engine sizes one workspace for its largest batch and reuses it, for
    prefill and decode calls alike.

    ``layout`` picks the tile's rows per group; the three layouts share one today.
    """
    group = (tile_config(Layout(layout)) if layout is not None else tile_config(Layout.SGLANG_FP8)).rows
    slots, sms = program_slots(device), device_sm_count(_device(device))
    return max(
        max(_max_plan_bytes(rows, topk, slots, num_splits, pool, g, False) for g in {1, group}),
        _max_plan_bytes(rows, topk, sms, num_splits, pool, 1, True),
    )


@functools.lru_cache(maxsize=256)
def _max_plan_bytes(rows, topk, slots, num_splits, pool, group, one_wave) -> int:
    # A smaller call may split its rows and need more than a larger one: take the largest. From
    # ``slots * group`` rows on, every slot holds a group and nothing is split, so the plan stops
    # changing; with the splits fixed by the caller every area grows with the rows, so the
    # largest call needs the most.
    rows = max(rows, 1)
    last = min(rows, slots * group)
    sizes = (_plan(r, topk, slots, num_splits, pool, group, one_wave).nbytes for r in (*range(1, last + 1), rows))
    return max(sizes)


def _carve(workspace: torch.Tensor, plan: FusedPlan):
    """The workspace's areas: ``(queue, buf_key, buf_pos, strip, seg_key, seg_pos, seg_cnt,
    merge)``, ``merge`` a list of ``(key, pos, cnt)`` per level of the merge tree."""
    ws = workspace.view(-1)
    queue = ws[:QUEUE_BYTES].view(torch.int32)
    off = QUEUE_BYTES

    def take(n):
        nonlocal off
        t = ws[off : off + 4 * n].view(torch.int32)
        off += 4 * n
        return t

    buf_key, buf_pos = take(plan.buffer_entries), take(plan.buffer_entries)
    strip = take(plan.strip_entries)
    if plan.splits > 1:
        seg_key, seg_pos = take(plan.segment_entries), take(plan.segment_entries)
        seg_cnt = take(plan.segment_counts)
    else:
        seg_key = seg_pos = seg_cnt = buf_key  # unused by the kernel with one split
    merge = []
    for lists in plan.merge_levels:
        n = plan.rows * lists
        merge.append((take(n * plan.topk), take(n * plan.topk), take(n)))
    return queue, buf_key, buf_pos, strip, seg_key, seg_pos, seg_cnt, merge


@launches_kernels
def fused_indexer_topk(
    inputs, *, topk=None, layout=None, weight_scale=None, out: Optional[IndexerTopKResult] = None,
    workspace: Optional[torch.Tensor] = None, num_splits: Optional[int] = None, pool: Optional[int] = None,
    rows_per_request: Optional[int] = None,
) -> IndexerTopKResult:
    """Fused streaming top-k (the contract of :func:`indexer_topk.indexer_topk`) of
    :class:`~indexer_topk.contract.IndexerInputs` (or a tuple, see :func:`~indexer_topk.contract.as_inputs`).

    ``workspace``: uint8, at least :func:`fused_workspace_size` bytes; allocated per call when
    omitted. Two concurrent calls must not share one workspace. ``num_splits`` overrides the
    context split count (a power of two); ``pool`` the candidate room beyond ``topk`` per row, a
    multiple of 64 (small pools force frequent cuts, which tests use); ``rows_per_request`` the
    caller's promise of how rows share page-table rows (:func:`group_rows_for`). All give the
    same bits.
    """
    inputs = as_inputs(inputs, topk=topk, layout=layout, weight_scale=weight_scale)
    return fused_call(inputs, out, workspace, num_splits, pool, rows_per_request=rows_per_request)


def fused_call(inputs, out, workspace, num_splits, pool, stream: Optional[dict] = None,
               rows_per_request: Optional[int] = None) -> IndexerTopKResult:
    """One fused call of :class:`~indexer_topk.contract.IndexerInputs`: the Hopper stream where it
    applies (:func:`~indexer_topk.backends.hopper.why_not_stream`), else the plain-Triton kernel,
    then the merge of split rows. ``stream``: keyword arguments of
    :func:`~indexer_topk.backends.hopper.launch_stream`; with them the stream is required
    (ValueError where it does not apply, before anything is allocated)."""
    ka = pack_args(inputs)
    cfg = tile_config(inputs.layout)
    group = group_rows_for(rows_per_request, cfg.rows)
    if group != cfg.rows:
        cfg = dataclasses.replace(cfg, rows=group)
    why = why_not_stream(inputs, ka, cfg)
    if stream is not None and why is not None:
        raise ValueError(f"the Hopper stream does not apply: {why}")
    rows, topk, device = ka.q.shape[0], inputs.topk, ka.kc.device
    position = inputs.order == ORDER_POSITION  # each finish lays rows out by position instead of sorting them
    if out is None:
        out = allocate_result(rows, topk, device)
    if rows == 0:
        return out
    plan = plan_fused(rows, topk, device, num_splits, pool, cfg.rows, one_wave=why is None and cfg.rows == 1)
    check_workspace(workspace, plan.nbytes, device)
    if workspace is None:
        workspace = torch.empty(plan.nbytes, dtype=torch.uint8, device=device)
    queue, buf_key, buf_pos, strip, seg_key, seg_pos, seg_cnt, merge = _carve(workspace, plan)
    width = ka.page_table.shape[1] * PAGE_SIZE
    span = triton.cdiv(triton.cdiv(max(width, 1), plan.splits), PAGE_SIZE) * PAGE_SIZE
    n_items = triton.cdiv(rows, cfg.rows) * plan.splits
    if why is None:  # the FP8 cache on sm_90: the warp-specialised stream
        stream = stream or {}
        launch_stream(inputs, ka, cfg, plan, out, (buf_key, buf_pos, strip, seg_key, seg_pos, seg_cnt),
                      width, span, n_items, **stream)
        if stream.get("no_select"):  # a timing probe: nothing to merge
            return out
    else:
        launch(clear_queue_kernel, (1,), queue)
        launch(
            fused_topk_kernel, (plan.programs,), ka.q, ka.qs, ka.w, ka.kc, ka.kf, ka.ks, ka.kdesc, ka.pages, ka.page_table, ka.page_table.stride(0),
            width, ka.seq_lens, rows, float(inputs.weight_scale), buf_key, buf_pos, strip, queue, n_items, span,
            out.values.view(torch.int32), out.raw_indices, out.physical_indices, out.counts, seg_key, seg_pos,
            seg_cnt, plan.splits,
            **plan.constexprs(ka.layout, ka.tma, ka.interpret, cfg.fused_stages, position),
            num_warps=cfg.num_warps, num_stages=cfg.fused_stages, **launch_options(cfg.fused_maxnreg, ka.interpret),
        )
    if plan.splits > 1:
        merge_split_lists(ka, plan, out, seg_key, seg_pos, seg_cnt, merge, position)
    return out


def merge_split_lists(ka, plan: FusedPlan, out: IndexerTopKResult, seg_key, seg_pos, seg_cnt, merge=(),
                      position: bool = False) -> None:
    """The exact merge of split rows: each row's ``plan.splits`` lists of at most ``topk``
    entries in position order (``seg_*``, as the streaming kernels leave them) become its outputs
    (best first, or left in position order with ``position``).

    A tree: while a row has more than ``MERGE_FANIN`` lists, each run of ``MERGE_FANIN``
    consecutive lists becomes one list of its best ``topk`` (still in position order) in the
    ``merge`` areas of :func:`_carve`, one program per run; the final merge of the remaining
    lists writes the outputs. The best ``topk`` of the best ``topk`` of each run are the row's
    best ``topk``, so every level keeps the bits."""
    lists = plan.splits
    sms = device_sm_count(ka.kc.device)
    for (m_key, m_pos, m_cnt), after in zip(merge, plan.merge_levels):
        launch(
            merge_lists_kernel, (plan.rows * after,), seg_key, seg_pos, seg_cnt, m_key, m_pos, m_cnt,
            TOPK=plan.topk, FANIN=lists // after, CHUNK=_merge_chunk(lists // after, plan.topk),
            num_warps=_merge_warps(plan.rows * after, sms),
        )
        seg_key, seg_pos, seg_cnt, lists = m_key, m_pos, m_cnt, after
    launch(
        select_rows_kernel, (plan.rows,), seg_key, seg_pos, seg_cnt, lists * plan.topk, ka.seq_lens, ka.page_table, ka.page_table.stride(0),
        out.values.view(torch.int32), out.raw_indices, out.physical_indices, out.counts, 0, seg_cnt, seg_cnt,
        MODE=MODE_SEGMENTS, TOPK=plan.topk, SPLITS=lists, CHUNK=_merge_chunk(lists, plan.topk), KNOWN_T=False,
        SORT_BITS=0 if position else 64, num_warps=_merge_warps(plan.rows, sms),
    )


def _merge_warps(programs: int, sms: int) -> int:
    """Warps per program of a merge level of ``programs`` programs (see ``MERGE_WARPS``)."""
    return MERGE_WARPS if programs <= sms else SELECT_WARPS


def _merge_chunk(lists: int, topk: int) -> int:
    """Entries a merge program holds at once: all of its lists, up to ``MERGE_CHUNK``."""
    return max(SELECT_CHUNK, min(MERGE_CHUNK, lists * topk))


@launches_kernels
def hopper_indexer_topk(
    inputs, *, out: Optional[IndexerTopKResult] = None, workspace: Optional[torch.Tensor] = None,
    num_splits: Optional[int] = None, pool: Optional[int] = None, config=None, no_select: bool = False,
    profile: Optional[torch.Tensor] = None, rows_per_request: Optional[int] = None,
) -> IndexerTopKResult:
    """The fused backend's contract through the Hopper stream alone (ValueError where it does not
    apply), for benchmarks: ``config`` a :class:`indexer_topk.kernels.hopper.HopperConfig`;
    ``rows_per_request`` as in :func:`indexer_topk.indexer_topk`;
    ``no_select`` a timing probe (the loads and MMAs alone; outputs undefined); ``profile`` int64
    ``[P, 5, 8]``, zeroed, ``P`` at least the SM count: each partition's cycle counters (a
    separate ``PROF`` compile)."""
    stream = dict(config=config, no_select=no_select, profile=profile)
    return fused_call(as_inputs(inputs), out, workspace, num_splits, pool, stream=stream,
                      rows_per_request=rows_per_request)
