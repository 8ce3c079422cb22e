"""Fake ``aiter.ops.flydsl`` whose fused top-k kernel is indexer_topk's reference.

It enforces AITER's argument contract (ROCm/aiter #5282, ``flydsl_pa_mqa_topk_fp4_prefill``)
plus the way SGLang lays the arguments out (identity ``row_to_batch``, zero ``local_starts``,
a guarded page table), so a test passes only if the adapter calls it exactly that way. Each
call is recorded in :data:`CALLS`. Tests may flip :data:`RETURN_FRESH` (ignore ``out`` and
return new tensors) or :data:`CORRUPT_PADDING` (write 0 past ``counts`` and sign-flipped NaNs,
which AITER does not promise not to do).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

CTA_INFO_WIDTH = 6
GUARD_LOOKAHEAD_COLUMNS = 4

CALLS: list = []
RETURN_FRESH = False
CORRUPT_PADDING = False


class FP4PrefillTopKWorkspace(NamedTuple):
    cta_info: torch.Tensor
    row_offsets: torch.Tensor
    candidate_values: torch.Tensor
    candidate_indices: torch.Tensor
    candidate_counts: torch.Tensor
    merge_values: torch.Tensor
    merge_indices: torch.Tensor
    merge_physical_indices: torch.Tensor


class FP4PrefillTopKResult(NamedTuple):
    values: torch.Tensor
    raw_indices: torch.Tensor
    physical_indices: torch.Tensor
    counts: torch.Tensor


def allocate_fp4_prefill_topk_workspace(rows, parallel_unit_num, topk, device):
    if rows <= 0:
        raise ValueError("rows must be positive")
    if parallel_unit_num < rows:
        raise ValueError("parallel_unit_num must be at least rows")
    if topk not in (512, 1024):
        raise ValueError("topk must be 512 or 1024")

    def empty(shape, dtype):
        return torch.empty(shape, dtype=dtype, device=device)

    return FP4PrefillTopKWorkspace(
        empty((parallel_unit_num, CTA_INFO_WIDTH), torch.int32),
        empty((rows + 1,), torch.int32),
        empty((parallel_unit_num, topk), torch.float32),
        empty((parallel_unit_num, topk), torch.int32),
        empty((parallel_unit_num,), torch.int32),
        empty((rows, topk), torch.float32),
        empty((rows, topk), torch.int32),
        empty((rows, topk), torch.int32),
    )


# Private aliases: tests delete the public names to mimic AITER builds without them.
_Result = FP4PrefillTopKResult
_Workspace = FP4PrefillTopKWorkspace
_allocate = allocate_fp4_prefill_topk_workspace


def _check(cond, message):
    if not cond:
        raise AssertionError(f"fake aiter: {message}")


def _check_tensor(name, t, dtype, shape, device):
    _check(isinstance(t, torch.Tensor), f"{name} is not a tensor")
    _check(t.dtype == dtype, f"{name} dtype {t.dtype}, expected {dtype}")
    _check(tuple(t.shape) == tuple(shape), f"{name} shape {tuple(t.shape)}, expected {tuple(shape)}")
    _check(t.device == device, f"{name} on {t.device}, expected {device}")
    _check(t.is_contiguous(), f"{name} is not contiguous")


def flydsl_pa_mqa_topk_fp4_prefill(
    q_fp4, q_scale, kv_cache, kv_scale, block_tables, weights,
    row_to_batch, local_starts, local_ends, max_seq_len, *,
    topk=512, weight_scale=1.0, block_k=256, kv_block_size=64, num_warps=4,
    parallel_unit_num=None, score_batch_chunks=16, workspace=None, out=None, stream=None,
):
    from indexer_topk.reference import reference_indexer_topk

    _check(topk in (512, 1024), f"topk {topk}")
    _check((block_k, kv_block_size, num_warps, score_batch_chunks) == (256, 64, 4, 16), "tuning arguments changed")
    _check(isinstance(max_seq_len, int) and not isinstance(max_seq_len, bool), "max_seq_len is not an int")
    _check(isinstance(weight_scale, float), "weight_scale is not a float")
    rows = q_fp4.shape[0]
    _check(rows > 0, "AITER rejects an empty batch")
    device = q_fp4.device
    pages = kv_cache.shape[0]
    _check_tensor("q_fp4", q_fp4, torch.uint8, (rows, 64, 64), device)
    _check_tensor("q_scale", q_scale, torch.uint8, (rows, 1, 4, 16, 4), device)
    _check_tensor("kv_cache", kv_cache, torch.uint8, (pages, 1, 4, 64, 16), device)
    _check_tensor("kv_scale", kv_scale, torch.uint8, (pages, 1, 4, 64), device)
    _check_tensor("weights", weights, torch.bfloat16, (rows, 64), device)
    for name, t in (("row_to_batch", row_to_batch), ("local_starts", local_starts), ("local_ends", local_ends)):
        _check_tensor(name, t, torch.int32, (rows,), device)
    _check(block_tables.dim() == 2, "block_tables is not 2-D")
    _check_tensor("block_tables", block_tables, torch.int32, (block_tables.shape[0], block_tables.shape[1]), device)

    # SGLang's layout: one block-table row per query row, windows [0, c4_len).
    _check(torch.equal(row_to_batch, torch.arange(rows, dtype=torch.int32, device=device)), "row_to_batch is not arange(rows)")
    _check(bool((local_starts == 0).all()), "local_starts are not all 0")
    _check(block_tables.shape[0] == rows, "block_tables has not one row per query row")
    width = block_tables.shape[1]
    scanned = width - GUARD_LOOKAHEAD_COLUMNS
    _check(scanned >= 4 and scanned % 4 == 0, f"block_tables width {width} is not a guarded width + 4")
    _check(max_seq_len == scanned * kv_block_size, f"max_seq_len {max_seq_len} != {scanned} guarded pages x 64")
    _check(max_seq_len % block_k == 0, "max_seq_len is not a multiple of 256")
    _check(max_seq_len <= width * kv_block_size, "max_seq_len exceeds block_tables capacity")
    _check(bool((local_ends >= 0).all()) and bool((local_ends <= max_seq_len).all()), "local_ends outside [0, max_seq_len]")
    used = torch.arange(width, device=device)[None, :] * kv_block_size < local_ends[:, None]
    _check(bool((block_tables[~used] == 0).all()), "unused block-table columns are not zero")
    _check(bool(((block_tables >= 0) & (block_tables < max(pages, 1))).all()), "a block-table entry is outside the cache")

    if parallel_unit_num is None:
        parallel_unit_num = max(512, rows)
    _check(parallel_unit_num >= rows, "parallel_unit_num < rows")
    if workspace is not None:
        _check(isinstance(workspace, _Workspace), f"workspace is a {type(workspace).__name__}")
        expected = _allocate(rows, parallel_unit_num, topk, device)
        for field, got, want in zip(workspace._fields, workspace, expected):
            _check_tensor(f"workspace.{field}", got, want.dtype, want.shape, device)
    if out is not None:
        if "FP4PrefillTopKResult" in globals():
            _check(isinstance(out, _Result), f"out is a {type(out).__name__}")
        else:
            _check(getattr(out, "_fields", None) == _Result._fields, "out is not a result named tuple")
        _check_tensor("out.values", out.values, torch.float32, (rows, topk), device)
        _check_tensor("out.raw_indices", out.raw_indices, torch.int32, (rows, topk), device)
        _check_tensor("out.physical_indices", out.physical_indices, torch.int32, (rows, topk), device)
        _check_tensor("out.counts", out.counts, torch.int32, (rows,), device)

    CALLS.append(
        {
            "rows": rows,
            "topk": topk,
            "weight_scale": weight_scale,
            "max_seq_len": max_seq_len,
            "block_tables": block_tables.clone(),
            "parallel_unit_num": parallel_unit_num,
            "workspace": workspace,
            "out": out,
        }
    )
    page_table = block_tables[row_to_batch.long()].contiguous()
    res = _Result(
        *reference_indexer_topk(
            q_fp4, q_scale, kv_cache, kv_scale, weights, page_table, local_ends,
            topk=topk, layout="aiter_mxfp4", weight_scale=weight_scale,
        )
    )
    if CORRUPT_PADDING:
        past = torch.arange(topk, device=device)[None, :] >= res.counts[:, None]
        res.values[past] = 0.0
        nan = torch.isnan(res.values)
        res.values.view(torch.int32)[nan] = -0x400000  # 0xFFC00000: a quiet NaN with the sign bit set
    if RETURN_FRESH or out is None:
        return res
    for dst, src in zip(out, res):
        dst.copy_(src)
    return out
