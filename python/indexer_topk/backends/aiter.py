"""The ``aiter`` backend: AMD AITER's fused FP4 prefill score + top-k (gfx950 only).

AITER ships the kernel as ``aiter.ops.flydsl.flydsl_pa_mqa_topk_fp4_prefill`` (ROCm/aiter
#5282). It is found by an exact attribute lookup, never by a version check: the symbol is what
matters, and AITER's version numbers do not say which experimental kernels a build carries.

The adapter calls it the way SGLang's HIP FP4 indexer calls AITER's prefill kernels: one
block-table row per query row (``row_to_batch = arange(rows)``), every window starting at C4
position 0 (``local_starts = 0``) and ending at the row's causal length (``local_ends =
seq_lens``), and a *guarded* page table (see :func:`guarded_page_table`).

Only the ``aiter_mxfp4`` layout and ``topk`` 512 / 1024 are supported; AITER rejects CUDA/HIP
graph capture itself, which is why the path policy never routes captured calls here.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional, Tuple

import torch

from ..contract import (
    ORDER_POSITION, PAGE_SIZE, IndexerTopKResult, Layout, allocate_result, as_inputs, by_position, canonicalize_scores,
)
from ..errors import BackendUnavailable

AITER_MODULE = "aiter.ops.flydsl"
AITER_SYMBOL = "flydsl_pa_mqa_topk_fp4_prefill"
AITER_ALLOCATOR = "allocate_fp4_prefill_topk_workspace"
AITER_RESULT_TYPE = "FP4PrefillTopKResult"
AITER_TOPK = (512, 1024)
AITER_ARCH = "gfx950"

# AITER scores 256 C4 positions (4 pages of 64) per chunk, so SGLang rounds the page table up
# to whole chunks (at least one) and appends one chunk of columns that the kernel's software
# pipeline may read while prefetching the next chunk's page ids.
GUARD_PAGES_PER_CHUNK = 4
GUARD_LOOKAHEAD_COLUMNS = 4


def _lookup() -> Tuple[Any, Optional[Callable], Optional[str]]:
    """``(module, fn, error)``: :func:`lookup_aiter_symbol` plus the imported module (or ``None``)."""
    try:
        module = importlib.import_module(AITER_MODULE)
        fn = getattr(module, AITER_SYMBOL, None)
    except Exception as exc:  # noqa: BLE001 - any failure means "not available"
        return None, None, repr(exc)
    if fn is None or not callable(fn):
        return module, None, None
    return module, fn, None


def lookup_aiter_symbol() -> Tuple[Optional[Callable], Optional[str]]:
    """``(fn, error)``: AITER's fused top-k entry point, or ``None`` and why not.

    ``error`` is the ``repr`` of the exception if importing ``aiter.ops.flydsl`` or reading the
    attribute raised (AITER resolves many exports lazily, so the attribute read can import a
    kernel module and fail); it is ``None`` when AITER imported and simply lacks the symbol.
    Never raises.
    """
    _, fn, error = _lookup()
    return fn, error


def aiter_symbol() -> Optional[Callable]:
    """AITER's ``flydsl_pa_mqa_topk_fp4_prefill`` if this process can import it, else ``None``."""
    return lookup_aiter_symbol()[0]


def guarded_width(width: int) -> int:
    """Page columns the AITER kernel scans for a page table of ``width`` columns.

    ``max(4, ceil(width / 4) * 4)``: whole 256-position chunks, at least one. Quantising the
    width also bounds how many kernel variants AITER compiles (it specialises on the
    block-table width).
    """
    chunks = -(-int(width) // GUARD_PAGES_PER_CHUNK)
    return max(GUARD_PAGES_PER_CHUNK, chunks * GUARD_PAGES_PER_CHUNK)


def guarded_page_table(page_table: torch.Tensor, seq_lens: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """SGLang's guarded page table for AITER's FP4 prefill kernels, and its ``max_seq_len``.

    Parameters
    ----------
    page_table : torch.Tensor
        int32 ``[rows, width]``.
    seq_lens : torch.Tensor
        int32 ``[rows]``, each row's C4 length.

    Returns
    -------
    (block_tables, max_seq_len)
        ``block_tables`` int32 ``[rows, guarded_width(width) + 4]``, contiguous: a row's used
        columns (those holding positions ``< seq_len``) copied from ``page_table``, every other
        column 0. ``max_seq_len = guarded_width(width) * 64``: the scanned width in C4
        positions, a multiple of 256. The 4 lookahead columns are *not* counted in it; they
        only keep the kernel's page-id prefetch inside the table.

    Why zeros: page 0 exists whenever any row has a position to score, so every page id the
    kernel can load (the rest of a row's last chunk, and the prefetch past it) stays inside
    the cache, even where the caller's unused columns hold garbage such as ``-1`` (which the
    contract allows).
    """
    rows, width = page_table.shape
    scanned = guarded_width(width)
    block_tables = torch.zeros((rows, scanned + GUARD_LOOKAHEAD_COLUMNS), dtype=torch.int32, device=page_table.device)
    if rows and width:
        cols = torch.arange(width, device=page_table.device)
        used = cols[None, :] * PAGE_SIZE < seq_lens[:, None]
        block_tables[:, :width] = torch.where(used, page_table, torch.zeros_like(page_table))
    return block_tables, scanned * PAGE_SIZE


def device_problem(device: torch.device) -> Optional[str]:
    """Why AITER's kernel cannot run on ``device``, or ``None`` on an AMD gfx950.

    AITER exports the symbol on every ROCm GPU, but its FlyDSL kernel is built for gfx950
    only and takes GPU tensors only; anywhere else it would fail inside AITER, which would
    read as a crash rather than as "cannot run here".
    """
    if device.type != "cuda":
        return f"AITER's fused kernel takes tensors on an AMD {AITER_ARCH} GPU; the inputs are on {device.type}"
    if not getattr(torch.version, "hip", None):
        return f"AITER's fused kernel needs an AMD {AITER_ARCH} GPU; this is a CUDA GPU"
    arch = str(getattr(torch.cuda.get_device_properties(device), "gcnArchName", "") or "").split(":")[0]
    if arch != AITER_ARCH:
        return f"AITER's fused kernel needs {AITER_ARCH}; this GPU is {arch or 'of unknown architecture'}"
    return None


def _parallel_units(rows: int, workspace: Any) -> int:
    """CTA slots to schedule: the caller's AITER workspace decides, else AITER's own default.

    AITER sizes the workspace by this number and checks it against the call, so it is passed
    explicitly rather than left to a default that a later AITER might change.
    """
    cta_info = getattr(workspace, "cta_info", None)
    if isinstance(cta_info, torch.Tensor) and cta_info.dim() >= 1:
        return int(cta_info.shape[0])
    return max(512, rows)


def _aiter_workspace(module, workspace: Any, rows: int, parallel_units: int, topk: int, device):
    """The workspace to hand AITER, or ``None`` to let AITER allocate its own.

    A caller's AITER workspace object is passed through. Our own byte scratch (a uint8 tensor
    sized by :func:`indexer_topk.workspace_size`) is for the ``fused`` backend: AITER keeps
    its scratch as a named tuple of typed tensors whose layout is private to AITER, so a
    byte tensor is not carved up for it and AITER's allocator is used instead.
    """
    if workspace is not None and not isinstance(workspace, torch.Tensor):
        return workspace
    allocate = getattr(module, AITER_ALLOCATOR, None)
    if allocate is None:
        return None
    try:
        return allocate(rows, parallel_units, topk, device)
    except TypeError:
        # An AITER build whose allocator has another signature: let the kernel allocate.
        return None


def _conform_values(out: IndexerTopKResult) -> None:
    """Make ``values`` follow the contract in place: ``-inf`` past ``counts``, NaN canonical.

    AITER documents its index padding (``-1``) but not its value padding or NaN bit patterns;
    two passes over ``[rows, topk]`` cost nothing next to the scoring pass.
    """
    topk = out.values.shape[1]
    past = torch.arange(topk, device=out.values.device)[None, :] >= out.counts[:, None]
    out.values.copy_(canonicalize_scores(out.values))
    out.values.masked_fill_(past, float("-inf"))


def aiter_indexer_topk(
    inputs, *, topk=None, layout=None, weight_scale=None, out=None, workspace=None
) -> IndexerTopKResult:
    """Run AITER's ``flydsl_pa_mqa_topk_fp4_prefill`` on validated ``aiter_mxfp4`` inputs.

    Parameters
    ----------
    inputs : IndexerInputs
        The call's inputs in the ``aiter_mxfp4`` layout, with ``topk`` 512 or 1024 (AITER's
        kernel supports no other); ``weight_scale`` is passed to AITER, which multiplies the
        per-head weights by it in the kernel. A tuple of the seven tensors with ``topk``,
        ``layout`` and ``weight_scale`` keywords is also taken
        (:func:`~indexer_topk.contract.as_inputs`).
    out : IndexerTopKResult, optional
        Written in place and returned; allocated when ``None``.
    workspace : optional
        An AITER ``FP4PrefillTopKWorkspace`` to reuse; ``None`` (or our byte scratch, which
        AITER cannot use) allocates one with AITER's allocator when AITER exports it.

    Returns
    -------
    IndexerTopKResult
        As the contract specifies; ``values`` past ``counts`` are ``-inf`` and NaN scores
        are the canonical quiet NaN.

    Raises
    ------
    BackendUnavailable
        Before anything runs: for a layout other than ``aiter_mxfp4`` or ``topk`` not in
        (512, 1024) (the message starts with the argument's name); when this process cannot
        import AITER's symbol (the message carries the import error); when the inputs are not
        on an AMD gfx950 GPU.
    """
    inputs = as_inputs(inputs, topk=topk, layout=layout, weight_scale=weight_scale)
    layout, topk, weight_scale = inputs.layout, inputs.topk, inputs.weight_scale
    if layout is not Layout.AITER_MXFP4:
        raise BackendUnavailable(f"layout: the aiter backend supports only 'aiter_mxfp4', got {layout.value!r}")
    if isinstance(topk, bool) or topk not in AITER_TOPK:
        raise BackendUnavailable(f"topk: the aiter backend supports {AITER_TOPK}, got {topk!r}")
    module, fn, error = _lookup()
    if fn is None:
        why = f"importing {AITER_MODULE} raised {error}" if error else f"{AITER_MODULE} has no {AITER_SYMBOL}"
        raise BackendUnavailable(f"backend 'aiter' is not available: {why}")
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens = inputs.tensors
    problem = device_problem(q.device)
    if problem:
        raise BackendUnavailable(f"backend 'aiter' is not available: {problem}")

    rows = q.shape[0]
    device = q.device
    if out is None:
        out = allocate_result(rows, topk, device)
    if rows == 0:
        # AITER rejects an empty batch; there is nothing to select.
        return out

    block_tables, max_seq_len = guarded_page_table(page_table, seq_lens)
    row_to_batch = torch.arange(rows, dtype=torch.int32, device=device)
    local_starts = torch.zeros(rows, dtype=torch.int32, device=device)
    parallel_units = _parallel_units(rows, workspace)
    aiter_ws = _aiter_workspace(module, workspace, rows, parallel_units, topk, device)
    result_type = getattr(module, AITER_RESULT_TYPE, None)
    aiter_out = result_type(*out) if result_type is not None else out

    res = fn(
        q, q_scale, k_cache, k_scale, block_tables, weights,
        row_to_batch, local_starts, seq_lens, max_seq_len,
        topk=topk,
        weight_scale=float(weight_scale),
        parallel_unit_num=parallel_units,
        workspace=aiter_ws,
        out=aiter_out,
    )
    for dst, src in zip(out, res):
        # AITER writes into ``out`` when given one; an older build may return fresh tensors.
        if src is not dst and src.data_ptr() != dst.data_ptr():
            dst.copy_(src)
    _conform_values(out)
    if inputs.order == ORDER_POSITION:  # AITER writes best first; a few torch ops, as above
        for dst, src in zip(out, by_position(out)):
            dst.copy_(src)
    return out


__all__ = [
    "AITER_ARCH",
    "AITER_MODULE",
    "AITER_SYMBOL",
    "AITER_TOPK",
    "aiter_indexer_topk",
    "aiter_symbol",
    "device_problem",
    "guarded_page_table",
    "guarded_width",
    "lookup_aiter_symbol",
]
