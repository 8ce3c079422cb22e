"""The fused backend's Hopper stream: where it applies and how it is launched.

:func:`~indexer_topk.backends.fused.fused_indexer_topk` serves the ``sglang_fp8`` and
``sglang_mxfp4`` layouts on an sm_90 GPU with :func:`indexer_topk.kernels.hopper.hopper_stream_kernel`
(same plan, same workspace, same bits as the plain-Triton kernel) unless ``INDEXER_TOPK_HOPPER_STREAM`` is off; everything
else takes the plain-Triton kernel. :func:`indexer_topk.backends.fused.hopper_indexer_topk` runs the stream alone, with
its tunables and measurement hooks, for the benchmarks. This module imports nothing of the
fused backend's: the fused backend calls it.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Optional

import torch
import triton

from ..contract import ORDER_POSITION, PAGE_SIZE, IndexerTopKResult, Layout
from ..envs import envs
from ..kernels.launch import bulk_copies_available, device_sm_count
from ..replay import launch

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def hopper_kernels() -> Optional[ModuleType]:
    """:mod:`indexer_topk.kernels.hopper`, or ``None`` where this Triton has no Gluon dialect with
    the Hopper operations it uses (imported once, on first use)."""
    try:
        from ..kernels import hopper
    except (ImportError, AttributeError) as exc:  # an older Triton: the plain-Triton kernel serves
        logger.info("the Hopper stream is unavailable with this Triton (%s: %s)", type(exc).__name__, exc)
        return None
    return hopper


# The layouts the stream serves. AITER's MXFP4 layout (keys split by chunk, scales interleaved in
# their own tensor) would need its own page decode: it takes the plain-Triton kernel.
STREAM_LAYOUTS = (Layout.SGLANG_FP8, Layout.SGLANG_MXFP4)


def why_not_stream(inputs, ka, cfg) -> Optional[str]:
    """Why the Hopper stream does not serve these inputs (packed as ``ka``, tile ``cfg``), or
    ``None`` when it does. Host-side checks only: no device sync."""
    if inputs.layout not in STREAM_LAYOUTS:  # before the Gluon import: other layouts never need it
        return f"it serves the {' and '.join(x.value for x in STREAM_LAYOUTS)} layouts, not {inputs.layout.value}"
    if ka.interpret or not bulk_copies_available(ka.kc.device):
        return "it runs only on a GPU with bulk tensor copies"
    if not envs.INDEXER_TOPK_HOPPER_STREAM.get():
        return "INDEXER_TOPK_HOPPER_STREAM is off"
    kernels = hopper_kernels()
    if kernels is None:
        return "this Triton has no Gluon dialect for Hopper"
    return kernels.stream_unfit(inputs, ka, cfg)


def launch_stream(inputs, ka, cfg, plan, out: IndexerTopKResult, buffers, width: int, span: int, n_items: int, *,
                  config=None, no_select: bool = False, profile: Optional[torch.Tensor] = None) -> None:
    """Launch the Hopper stream and its row finish for a call the fused backend planned
    (:func:`~indexer_topk.backends.fused.fused_call`: ``width`` C4 positions per page-table row,
    ``span`` per context split, ``n_items`` work items).

    ``buffers``: ``(buf_key, buf_pos, strip, seg_key, seg_pos, seg_cnt)`` carved from the fused
    workspace (the stream keeps its group passes in the strip area, which it does not otherwise
    use). Split rows are left in their split lists for the fused backend's merge.
    """
    kernels = hopper_kernels()
    config = config or kernels.HopperConfig.for_layout(inputs.layout, plan.group_rows)
    descs = kernels.hopper_descriptors(inputs, cfg)
    buf_key, buf_pos, strip, seg_key, seg_pos, seg_cnt = buffers
    rows = ka.q.shape[0]
    groups = triton.cdiv(rows, plan.group_rows)
    group_pass = strip[:groups]
    out_bits = out.values.view(torch.int32)
    if plan.splits == 1:  # each row's entries go straight to its output slots
        seg_key, seg_pos, seg_cnt = out_bits, out.raw_indices, out.counts
    if plan.group_rows > 1:  # a one-row group is one pass by definition: the stream does not read it
        launch(
            kernels.group_pass_kernel, (groups,), ka.page_table, ka.page_table.stride(0), width, ka.seq_lens, rows, group_pass, R=plan.group_rows,
        )
    g = min(config.select_visits, plan.pool // PAGE_SIZE)
    programs = min(device_sm_count(ka.kc.device), n_items)
    if profile is not None and (profile.shape[0] < programs or tuple(profile.shape[1:]) != (5, 8)):
        raise ValueError(f"profile: expected int64 [at least {programs}, 5, 8], got {tuple(profile.shape)}")
    launch(
        kernels.hopper_stream_kernel, (programs,), descs.queries, descs.keys, descs.scales, ka.w, ka.page_table, ka.page_table.stride(0), ka.pages, width,
        ka.seq_lens, rows, float(inputs.weight_scale), group_pass, buf_key, buf_pos, seg_key, seg_pos, seg_cnt,
        n_items, span, plan.splits, ka.q, ka.qs,
        R=plan.group_rows, TOPK=plan.topk, CAP=plan.cap, TILE=plan.tile, KSTAGES=config.key_stages,
        SLOTS=config.score_slots, KEY_ROWS=descs.key_rows, SCALE_COL=descs.scale_col, G=g,
        PARTS=min(config.select_parts, g), SCORE_REGS=config.score_regs, LOAD_REGS=config.load_regs,
        NSCORE=config.score_groups, MX=inputs.layout is Layout.SGLANG_MXFP4, NO_SELECT=no_select, prof=seg_cnt if profile is None else profile, PROF=profile is not None,
        num_warps=4, maxnreg=config.launch_regs(),
    )
    if no_select:
        return
    launch(
        kernels.finish_rows_kernel, (rows * plan.splits,), ka.seq_lens, ka.page_table, ka.page_table.stride(0), width, out_bits, out.raw_indices,
        out.physical_indices, out.counts, seg_key, seg_pos, seg_cnt, plan.splits, TOPK=plan.topk, TILE=plan.tile,
        POSITION=inputs.order == ORDER_POSITION, num_warps=config.finish_warps,
    )
