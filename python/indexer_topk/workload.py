"""Synthetic DeepSeek-V4-shaped indexer workloads for the demo, the tests and the benchmark.

A workload is one prefill batch as SGLang builds it: several requests, each with a raw
context length and a chunk of query tokens at its end; one query row per token, with the
row's causal C4 length ``floor(tokens_seen / 4)`` and its request's page-table row; index keys
written through a slot mapping into pages drawn from a random permutation. Queries and keys
are Hadamard-rotated Gaussians (as the model rotates them before quantising); per-head weights
take both signs. Everything is seeded and deterministic for a given device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .contract import HEAD_DIM, HEADS, PAGE_SIZE, IndexerInputs, is_count, parse_layout
from .errors import value_words
from .formats import allocate_k_cache, quantize_query, write_k_cache

PATTERNS = ("random", "increasing", "decreasing", "equal", "zero_plateau", "nan_rows")

# DeepSeek-V4: softmax_scale * n_heads ** -0.5
DSV4_WEIGHT_SCALE = HEAD_DIM**-0.5 * HEADS**-0.5


def hadamard(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix of order ``n`` (a power of two)."""
    h = torch.ones((1, 1), dtype=dtype, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


@dataclass(frozen=True)
class Workload(IndexerInputs):
    """Inputs of one :func:`indexer_topk.indexer_topk` call (unchecked, see
    :class:`~indexer_topk.contract.IndexerInputs`) plus how they were made. Derive a variant
    with :func:`dataclasses.replace`."""

    context_tokens: Sequence[int] = field(default_factory=list)
    pattern: str = "random"

    @property
    def c4_len(self) -> int:
        return int(self.seq_lens.max()) if self.rows else 0

    def args(self):
        return self.tensors

    def kwargs(self):
        return {"topk": self.topk, "layout": self.layout.value, "weight_scale": self.weight_scale}

    def inputs(self) -> IndexerInputs:
        """The backends' form of the call's inputs (the workload itself is one)."""
        return self


def _keys_for_pattern(pattern, k0, k1, c4, u, gen, device):
    """fp32 keys for C4 positions ``k0..k1-1`` of a request of C4 length ``c4`` (rotated basis)."""
    n = k1 - k0
    if pattern in ("random", "nan_rows"):
        return torch.randn((n, HEAD_DIM), generator=gen, device=device)
    if pattern in ("increasing", "decreasing"):
        ramp = torch.linspace(0.25, 4.0, max(c4, 1), device=device)
        if pattern == "decreasing":
            ramp = ramp.flip(0)
        return ramp[k0:k1, None] * u
    if pattern == "equal":
        return u.expand(n, HEAD_DIM).clone()
    if pattern == "zero_plateau":
        # Most keys point away from every query head (all dots <= 0, score exactly 0); one in
        # 64 points towards them, so the top-k boundary falls inside the zero plateau.
        k = -u.expand(n, HEAD_DIM).clone()
        hits = torch.randperm(n, generator=gen, device=device)[: max(1, n // 64)]
        k[hits] = u * (1.0 + torch.rand((len(hits), 1), generator=gen, device=device))
        return k
    raise ValueError(f"pattern: unknown workload pattern {pattern!r}; expected one of {PATTERNS}")


def make_workload(
    layout,
    *,
    context_tokens: Sequence[int] = (4096,),
    rows_per_request: Sequence[int] | int = 8,
    topk: int = 512,
    seed: int = 0,
    device="cpu",
    pattern: str = "random",
    weight_scale: float = DSV4_WEIGHT_SCALE,
    spare_pages: int = 3,
    page_table_pad: int = 1,
) -> Workload:
    """Build a DSv4-shaped prefill batch.

    Parameters
    ----------
    layout : str or Layout
        Cache/query layout (see :class:`indexer_topk.contract.Layout`).
    context_tokens : sequence of int
        Raw context length of each request (C4 length is a quarter).
    rows_per_request : int or sequence of int
        Query tokens at the end of each request's context, one row each.
    pattern : str
        ``random`` or an adversarial score pattern: ``increasing`` / ``decreasing`` along the
        context, ``equal`` (every score of a row equal), ``zero_plateau`` (mostly exact zeros),
        ``nan_rows`` (every other row has a NaN weight, so its scores are NaN).
    spare_pages, page_table_pad : int
        Extra unused pages in the cache and extra (garbage) page-table columns.
    """
    layout = parse_layout(layout)
    if pattern not in PATTERNS:
        raise ValueError(f"pattern: unknown workload pattern {pattern!r}; expected one of {PATTERNS}")
    if not is_count(seed) or seed >= 2**64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {value_words(seed)}")
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    ctx = [int(c) for c in context_tokens]
    if not ctx or min(ctx) < 0:
        raise ValueError(f"context_tokens: expected one non-negative token count per request, got {value_words(ctx)}")
    if isinstance(rows_per_request, int):
        rows_per_request = [rows_per_request] * len(ctx)
    if len(rows_per_request) != len(ctx):
        raise ValueError("rows_per_request: one entry per request expected")
    if not all(is_count(r) for r in rows_per_request):
        raise ValueError(f"rows_per_request: expected non-negative ints, got {value_words(list(rows_per_request))}")
    rot = hadamard(HEAD_DIM, device=device)

    c4_lens = [c // 4 for c in ctx]
    pages_per_req = [max(1, -(-c // PAGE_SIZE)) for c in c4_lens]
    num_pages = sum(pages_per_req) + spare_pages
    perm = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    k_cache, k_scale = allocate_k_cache(layout, num_pages, device)
    max_pages = max(pages_per_req) + page_table_pad

    # A shared direction makes the adversarial patterns reachable: q heads and keys aligned.
    u = torch.randn((HEAD_DIM,), generator=gen, device=device)
    u = u / u.norm() * math.sqrt(HEAD_DIM)

    q_rows, w_rows, pt_rows, lens = [], [], [], []
    first = 0
    for c4, n_pages, n_rows, raw in zip(c4_lens, pages_per_req, rows_per_request, ctx):
        pages = perm[first : first + n_pages]
        first += n_pages
        for k0 in range(0, c4, 65536):  # bounded quantisation batches
            k1 = min(c4, k0 + 65536)
            k = _keys_for_pattern(pattern, k0, k1, c4, u, gen, device)
            pos = torch.arange(k0, k1, device=device)
            slots = pages.long()[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
            write_k_cache(layout, k @ rot, slots, k_cache, k_scale)
        row = torch.randint(0, num_pages, (max_pages,), generator=gen, device=device).to(torch.int32)
        row[:n_pages] = pages
        for t in range(n_rows):
            seen = max(0, raw - n_rows + t + 1)
            lens.append(seen // 4)
            pt_rows.append(row)
        if pattern == "random" or pattern == "nan_rows":
            qr = torch.randn((n_rows, HEADS, HEAD_DIM), generator=gen, device=device)
            w = torch.randn((n_rows, HEADS), generator=gen, device=device)
        else:
            qr = u.expand(n_rows, HEADS, HEAD_DIM) * (0.5 + torch.rand((n_rows, HEADS, 1), generator=gen, device=device))
            w = torch.rand((n_rows, HEADS), generator=gen, device=device) + 0.1
        if pattern == "nan_rows":
            w[0::2, 0] = float("nan")
        q_rows.append(qr @ rot)
        w_rows.append(w)

    q = torch.cat(q_rows) if q_rows else torch.empty((0, HEADS, HEAD_DIM), device=device)
    w = torch.cat(w_rows) if w_rows else torch.empty((0, HEADS), device=device)
    pack = quantize_query(q, w, layout)
    page_table = torch.stack(pt_rows) if pt_rows else torch.empty((0, max_pages), dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return Workload(
        pack.q, pack.q_scale, k_cache, k_scale, pack.weights, page_table.contiguous(), seq_lens,
        layout=layout, topk=topk, weight_scale=float(weight_scale), context_tokens=ctx, pattern=pattern,
    )
