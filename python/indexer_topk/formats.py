"""MXFP4 and FP8 quantisers, and the writers/readers of the three paged cache layouts.

MXFP4 (as SGLang's indexer quantises it): per 32 values ``sf = max(amax / 6, 1e-4)``, the
exponent ``e = ceil(log2(sf))`` stored as ue8m0 ``e + 127`` clamped to ``[1, 254]``, and the
values ``x / 2**e`` rounded to the nearest e2m1 code (ties to even). Two codes per byte, the
even element in the low nibble.

FP8 (per 128-value vector): scale ``2**ceil(log2(max(amax, 1e-4) / 448))``, values
``x / scale`` cast to e4m3 (round to nearest even).

All functions here are plain PyTorch and run on any device; they are the ground truth the
kernels read.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .contract import (
    HEAD_DIM,
    HEADS,
    MX_GROUP,
    PAGE_SIZE,
    SGLANG_FP8_SLOT_BYTES,
    SGLANG_MXFP4_SLOT_BYTES,
    Layout,
    parse_layout,
)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
MIN_AMAX = 1e-4
UE8M0_BIAS = 127


# ---------------------------------------------------------------------------------------------
# Element formats
# ---------------------------------------------------------------------------------------------

def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2(x))`` for positive finite fp32 ``x`` (no transcendental rounding)."""
    mant, exp = torch.frexp(x)  # x = mant * 2**exp, mant in [0.5, 1)
    return torch.where(mant == 0.5, exp - 1, exp).to(torch.int32)


def _round_to_e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """Magnitude codes 0..7 of ``|y| <= 6`` rounded to the nearest e2m1 value, ties to even."""
    a = y.abs()
    grid = torch.tensor(E2M1_VALUES, dtype=a.dtype, device=a.device)
    mids = (grid[1:] + grid[:-1]) / 2
    # searchsorted gives the first midpoint >= a (right=False): a value exactly on a midpoint
    # lands on the lower code; bump it to the upper code when that one is even.
    code = torch.searchsorted(mids, a.contiguous(), right=False)
    on_mid = (code < len(mids)) & (mids[code.clamp(max=len(mids) - 1)] == a)
    upper_even = ((code + 1) % 2) == 0
    code = torch.where(on_mid & upper_even, code + 1, code)
    return code.to(torch.uint8)


def quantize_mxfp4(x: torch.Tensor):
    """Quantise ``x [..., 128]`` to MXFP4.

    Returns ``(packed uint8 [..., 64], exponents uint8 [..., 4])`` with exponents biased by 127.
    """
    if x.shape[-1] % MX_GROUP != 0:
        raise ValueError(f"x: last dimension must be a multiple of {MX_GROUP}")
    xf = x.to(torch.float32)
    groups = xf.reshape(*xf.shape[:-1], xf.shape[-1] // MX_GROUP, MX_GROUP)
    amax = groups.abs().amax(dim=-1)
    sf = torch.clamp(amax / E2M1_MAX, min=MIN_AMAX)
    e = _ceil_log2(sf)
    # log2(inf) = inf: a group holding an infinity takes the top exponent (frexp gives 0 there).
    e = torch.where(torch.isinf(sf), torch.full_like(e, 254 - UE8M0_BIAS), e)
    e = e.clamp(1 - UE8M0_BIAS, 254 - UE8M0_BIAS)
    y = groups * torch.exp2(-e.to(torch.float32)).unsqueeze(-1)
    mag = _round_to_e2m1_codes(y.clamp(-E2M1_MAX, E2M1_MAX))
    sign = ((y < 0) & (mag != 0)).to(torch.uint8) << 3
    codes = (mag | sign).reshape(xf.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), (e + UE8M0_BIAS).to(torch.uint8)


def e2m1_lut(device) -> torch.Tensor:
    signs = torch.tensor([1.0] * 8 + [-1.0] * 8)
    return (torch.tensor(E2M1_VALUES * 2) * signs).to(device=device, dtype=torch.float32)


def dequantize_mxfp4(packed: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_mxfp4` onto fp32 (exact except where ``6 * 2**127`` overflows)."""
    lut = e2m1_lut(packed.device)
    lo = lut[(packed & 0xF).long()]
    hi = lut[(packed >> 4).long()]
    vals = torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    scale = torch.exp2(exponents.to(torch.float32) - UE8M0_BIAS)
    groups = vals.reshape(*vals.shape[:-1], -1, MX_GROUP) * scale.unsqueeze(-1)
    return groups.reshape(vals.shape)


def quantize_fp8(x: torch.Tensor):
    """Quantise ``x [..., D]`` per vector to e4m3 with a power-of-two fp32 scale.

    Returns ``(values float8_e4m3fn [..., D], scale float32 [...])``.
    """
    xf = x.to(torch.float32)
    amax = torch.clamp(xf.abs().amax(dim=-1), min=MIN_AMAX)
    scale = torch.exp2(_ceil_log2(amax / E4M3_MAX).to(torch.float32))
    q = (xf / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def pack_ue8m0_int32(exponents: torch.Tensor) -> torch.Tensor:
    """``[..., 4]`` uint8 exponents -> int32, chunk 0 in the low byte."""
    e = exponents.to(torch.int64)
    packed = e[..., 0] | (e[..., 1] << 8) | (e[..., 2] << 16) | (e[..., 3] << 24)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_ue8m0_int32(packed: torch.Tensor) -> torch.Tensor:
    p = packed.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(p >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)


# ---------------------------------------------------------------------------------------------
# Query
# ---------------------------------------------------------------------------------------------

class QueryPack(NamedTuple):
    """A quantised query in one layout: the ``q``, ``q_scale`` and ``weights`` arguments."""

    q: torch.Tensor
    q_scale: Optional[torch.Tensor]
    weights: torch.Tensor


def quantize_query(q: torch.Tensor, weights: torch.Tensor, layout) -> QueryPack:
    """Quantise ``q [rows, 64, 128]`` and cast ``weights [rows, 64]`` for ``layout``.

    For ``sglang_fp8`` the per-(row, head) query scale is folded into the fp32 weights, as
    SGLang's fused query kernel does.
    """
    layout = parse_layout(layout)
    rows = q.shape[0]
    if tuple(q.shape) != (rows, HEADS, HEAD_DIM) or tuple(weights.shape) != (rows, HEADS):
        raise ValueError("q/weights: expected [rows, 64, 128] and [rows, 64]")
    if layout is Layout.SGLANG_FP8:
        q8, qs = quantize_fp8(q)
        return QueryPack(q8.contiguous(), None, (weights.to(torch.float32) * qs).contiguous())
    packed, exps = quantize_mxfp4(q)  # [rows, 64, 64], [rows, 64, 4]
    if layout is Layout.SGLANG_MXFP4:
        return QueryPack(packed, pack_ue8m0_int32(exps), weights.to(torch.float32).contiguous())
    shuffled = torch.empty((rows, 1, 4, 16, 4), dtype=torch.uint8, device=q.device)
    # head h, chunk c -> [r, 0, c, h % 16, h // 16]
    shuffled[:, 0] = exps.reshape(rows, 4, 16, 4).permute(0, 3, 2, 1)
    return QueryPack(packed, shuffled, weights.to(torch.bfloat16).contiguous())


def query_exponents(layout: Layout, q_scale: torch.Tensor) -> torch.Tensor:
    """ue8m0 exponents of an MXFP4 query as uint8 ``[rows, 64, 4]``."""
    if layout is Layout.SGLANG_MXFP4:
        return unpack_ue8m0_int32(q_scale)
    return q_scale[:, 0].permute(0, 3, 2, 1).reshape(q_scale.shape[0], HEADS, 4)


def dequantize_query(layout, q: torch.Tensor, q_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """fp32 ``[rows, 64, 128]`` query values (for FP8, before the scale folded into weights)."""
    layout = parse_layout(layout)
    if layout is Layout.SGLANG_FP8:
        return q.to(torch.float32)
    return dequantize_mxfp4(q, query_exponents(layout, q_scale))


# ---------------------------------------------------------------------------------------------
# Paged K cache
# ---------------------------------------------------------------------------------------------

def allocate_k_cache(layout, num_pages: int, device="cpu"):
    """Zeroed ``(k_cache, k_scale)`` for ``num_pages`` pages of 64 C4 slots."""
    layout = parse_layout(layout)
    if layout is Layout.AITER_MXFP4:
        return (
            torch.zeros((num_pages, 1, 4, PAGE_SIZE, 16), dtype=torch.uint8, device=device),
            torch.zeros((num_pages, 1, 4, PAGE_SIZE), dtype=torch.uint8, device=device),
        )
    width = SGLANG_MXFP4_SLOT_BYTES if layout is Layout.SGLANG_MXFP4 else SGLANG_FP8_SLOT_BYTES
    return torch.zeros((num_pages, PAGE_SIZE * width), dtype=torch.uint8, device=device), None


def _aiter_scale_column(slot_in_page: torch.Tensor) -> torch.Tensor:
    return (slot_in_page % 16) * 4 + slot_in_page // 16


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(*t.shape, t.element_size())


def write_k_cache(layout, k: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, k_scale=None) -> None:
    """Quantise keys ``k [n, 128]`` and store them at physical ``slots [n]`` (page * 64 + offset)."""
    layout = parse_layout(layout)
    slots = slots.to(device=k_cache.device, dtype=torch.int64)
    page, off = slots // PAGE_SIZE, slots % PAGE_SIZE
    if layout is Layout.SGLANG_FP8:
        k8, ks = quantize_fp8(k)
        flat = k_cache.view(k_cache.shape[0], -1)
        cols = off[:, None] * HEAD_DIM + torch.arange(HEAD_DIM, device=k_cache.device)
        flat[page[:, None], cols] = _bytes_of(k8).reshape(-1, HEAD_DIM)
        scols = PAGE_SIZE * HEAD_DIM + off[:, None] * 4 + torch.arange(4, device=k_cache.device)
        flat[page[:, None], scols] = _bytes_of(ks.to(torch.float32))
        return
    packed, exps = quantize_mxfp4(k)  # [n, 64], [n, 4]
    if layout is Layout.SGLANG_MXFP4:
        cols = off[:, None] * 64 + torch.arange(64, device=k_cache.device)
        k_cache[page[:, None], cols] = packed
        scols = PAGE_SIZE * 64 + off[:, None] * 4 + torch.arange(4, device=k_cache.device)
        k_cache[page[:, None], scols] = exps
        return
    if k_scale is None:
        raise ValueError("k_scale: the aiter_mxfp4 layout stores scales in a separate tensor")
    chunks = torch.arange(4, device=k_cache.device)
    k_cache[page[:, None], 0, chunks[None, :], off[:, None]] = packed.reshape(-1, 4, 16)
    k_scale[page[:, None], 0, chunks[None, :], _aiter_scale_column(off)[:, None]] = exps


def read_k_cache(layout, k_cache: torch.Tensor, k_scale, slots: torch.Tensor):
    """Dequantised keys at ``slots [...]``: ``(k float32 [..., 128], scale float32 [...])``.

    For the MXFP4 layouts the block scales are applied to ``k`` and the returned scale is 1.
    """
    layout = parse_layout(layout)
    shape = slots.shape
    slots = slots.reshape(-1).to(device=k_cache.device, dtype=torch.int64)
    page, off = slots // PAGE_SIZE, slots % PAGE_SIZE
    dev = k_cache.device
    if layout is Layout.SGLANG_FP8:
        flat = k_cache.view(k_cache.shape[0], -1)
        cols = off[:, None] * HEAD_DIM + torch.arange(HEAD_DIM, device=dev)
        k8 = flat[page[:, None], cols].contiguous().view(torch.float8_e4m3fn)
        scols = PAGE_SIZE * HEAD_DIM + off[:, None] * 4 + torch.arange(4, device=dev)
        ks = flat[page[:, None], scols].contiguous().view(torch.float32).reshape(-1)
        return k8.to(torch.float32).reshape(*shape, HEAD_DIM), ks.reshape(shape)
    if layout is Layout.SGLANG_MXFP4:
        cols = off[:, None] * 64 + torch.arange(64, device=dev)
        packed = k_cache[page[:, None], cols]
        exps = k_cache[page[:, None], PAGE_SIZE * 64 + off[:, None] * 4 + torch.arange(4, device=dev)]
    else:
        chunks = torch.arange(4, device=dev)
        packed = k_cache[page[:, None], 0, chunks[None, :], off[:, None]].reshape(-1, 64)
        exps = k_scale[page[:, None], 0, chunks[None, :], _aiter_scale_column(off)[:, None]]
    k = dequantize_mxfp4(packed, exps)
    return k.reshape(*shape, HEAD_DIM), torch.ones(shape, dtype=torch.float32, device=dev)


def physical_slots(page_table_row: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``page_table_row[pos >> 6] * 64 + (pos & 63)`` as int64."""
    pos = positions.to(torch.int64)
    return page_table_row.to(torch.int64)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
