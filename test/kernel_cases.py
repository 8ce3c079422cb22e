"""Workloads, runners and checks shared by the legacy and fused backend tests.

Cases are small named workloads (hashable, so results are built once per test run and shared
between tests and files). Checks are exact: the contract's structure element by element,
kernel against kernel bit for bit, kernel against the fp64 reference under
:func:`indexer_topk.compare.compare_to_reference` with the boundary next-values.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from indexer_topk.backends.fused import fused_indexer_topk
from indexer_topk.backends.legacy import legacy_indexer_topk
from indexer_topk.compare import bitwise_equal, compare_to_reference, first_difference, mma_tolerance
from indexer_topk.formats import _aiter_scale_column
from indexer_topk.contract import (
    CANONICAL_NAN_BITS, HEAD_DIM, NEG_INF_BITS, PAGE_SIZE, IndexerInputs, IndexerTopKResult, Layout, order_keys,
)
from indexer_topk.reference import reference_with_next_values
from indexer_topk.guards import INDEX_SENTINEL, NAN_SENTINEL_BITS
from indexer_topk.workload import PATTERNS, Workload, make_workload

LAYOUTS = [x.value for x in Layout]
ALL_PATTERNS = list(PATTERNS)



# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A workload recipe: :func:`make_workload` arguments plus edits applied afterwards.

    ``seq_lens``: replace the row lengths (each no longer than the row's original length, so the
    page table stays valid). ``reverse_rows``: give each listed row its own copy of its pages in
    reverse page order (keys byte-identical at the new slots, so the scores do not change).
    ``nonfinite_scales`` (sglang_fp8 only): this fraction of the cache's slots each gets a key
    scale of +inf, of -inf and of NaN, so rows hold scattered +-inf and NaN scores.
    ``extreme``: key scales at the ends of their range, see :func:`with_extreme_keys`.
    """

    name: str
    layout: str
    pattern: str = "random"
    context_tokens: Tuple[int, ...] = (4000, 1000)
    rows_per_request: Tuple[int, ...] = (3, 2)
    topk: int = 32
    seed: int = 0
    seq_lens: Optional[Tuple[int, ...]] = None
    reverse_rows: Tuple[int, ...] = ()
    nonfinite_scales: float = 0.0
    extreme: str = ""

    def __str__(self) -> str:
        return self.name


def reverse_row_pages(wl: Workload, row: int) -> Workload:
    """A copy of ``wl`` whose row ``row`` reads its keys from new pages in reverse page order.

    The row's ``n`` used pages are copied byte for byte to ``n`` new pages appended to the cache,
    the last logical page first, and the row's page table points at them: logical page ``p``
    lives in physical page ``N + n - 1 - p``. Other rows (of the same request too) still read the
    original pages, so a row pair may disagree on every page it needs.
    """
    n = -(-int(wl.seq_lens[row]) // PAGE_SIZE)
    pages = wl.page_table[row, :n].long()
    first_new = wl.k_cache.shape[0]
    k_cache = torch.cat([wl.k_cache, wl.k_cache[pages.flip(0)]]).contiguous()
    k_scale = None if wl.k_scale is None else torch.cat([wl.k_scale, wl.k_scale[pages.flip(0)]]).contiguous()
    page_table = wl.page_table.clone()
    page_table[row, :n] = torch.arange(
        first_new + n - 1, first_new - 1, -1, dtype=torch.int32, device=page_table.device
    )
    return dataclasses.replace(wl, k_cache=k_cache, k_scale=k_scale, page_table=page_table.contiguous())


@functools.lru_cache(maxsize=None)
def build(case: Case, device: str) -> Workload:
    """The workload of ``case`` on ``device`` (cached: tests must not modify it)."""
    wl = make_workload(
        case.layout, context_tokens=case.context_tokens, rows_per_request=list(case.rows_per_request),
        topk=case.topk, seed=case.seed, device=device, pattern=case.pattern,
    )
    if case.seq_lens is not None:
        lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
        assert lens.shape == wl.seq_lens.shape, "one length per row"
        assert bool((lens <= wl.seq_lens).all()), "edited lengths must not exceed the originals"
        wl = dataclasses.replace(wl, seq_lens=lens)
    for row in case.reverse_rows:
        wl = reverse_row_pages(wl, row)
    if case.nonfinite_scales:
        wl = with_nonfinite_key_scales(wl, case.nonfinite_scales, case.seed)
    if case.extreme:
        wl = with_extreme_keys(wl, case.extreme, case.seed)
    return wl


def with_extreme_keys(wl: Workload, kind: str, seed: int) -> Workload:
    """A copy of ``wl`` with key scales at the ends of their range.

    ``huge_scale``: in every row, the key at the middle position gets a scale 2**100 times its
    own (sglang_fp8: the fp32 scale; MXFP4: all four ue8m0 exponents raised by 100, capped at
    254), so one score dwarfs the rest. ``exponent_1`` / ``exponent_254`` (MXFP4 only): 5% of
    the 32-value groups of the cache get the smallest / largest ue8m0 exponent (2**-126 /
    2**127); at 2**127 the products overflow fp32.
    """
    pages = wl.k_cache.shape[0]
    k_cache = wl.k_cache.clone()
    k_scale = None if wl.k_scale is None else wl.k_scale.clone()
    dev = k_cache.device
    if kind == "huge_scale":
        pos = wl.seq_lens.long() // 2
        live = wl.seq_lens > 0
        slots = (wl.page_table.long().gather(1, (pos // PAGE_SIZE)[:, None])[:, 0] * PAGE_SIZE + pos % PAGE_SIZE)[live]
        slots = slots.unique()
        page, off = slots // PAGE_SIZE, slots % PAGE_SIZE
        if wl.layout is Layout.SGLANG_FP8:
            fp8_key_scales(k_cache)[page, off] *= 2.0**100
        else:
            for chunk in range(4):
                _set_exponents(wl.layout, k_cache, k_scale, page, off, torch.full_like(page, chunk), None, 100)
    elif kind in ("exponent_1", "exponent_254"):
        assert wl.layout is not Layout.SGLANG_FP8, "ue8m0 exponents exist in the MXFP4 layouts only"
        gen = torch.Generator().manual_seed(seed)
        groups = torch.randperm(pages * PAGE_SIZE * 4, generator=gen)[: pages * PAGE_SIZE * 4 // 20].to(dev)
        slot, chunk = groups // 4, groups % 4
        value = 1 if kind == "exponent_1" else 254
        _set_exponents(wl.layout, k_cache, k_scale, slot // PAGE_SIZE, slot % PAGE_SIZE, chunk, value, 0)
    else:
        raise ValueError(f"unknown extreme kind {kind!r}")
    return dataclasses.replace(wl, k_cache=k_cache, k_scale=k_scale)


def fp8_key_scales(k_cache: torch.Tensor) -> torch.Tensor:
    """A view ``[pages, 64]`` of the fp32 per-key scales of an sglang_fp8 cache."""
    return k_cache.view(k_cache.shape[0], -1).view(torch.float32)[:, PAGE_SIZE * HEAD_DIM // 4 :]


def _set_exponents(layout, k_cache, k_scale, page, off, chunk, value, add) -> None:
    """Set (``value``) or raise by ``add`` (capped at 254) the ue8m0 exponent byte of group
    ``chunk`` of slot ``off`` in page ``page``, in the layout's own byte position."""
    if layout is Layout.SGLANG_MXFP4:
        index = (page, PAGE_SIZE * 64 + off * 4 + chunk)
        target = k_cache
    else:  # aiter_mxfp4: scales [pages, 1, 4, 64]
        index = (page, torch.zeros_like(page), chunk, _aiter_scale_column(off))
        target = k_scale
    if value is None:
        target[index] = (target[index].long() + add).clamp(max=254).to(torch.uint8)
    else:
        target[index] = value


def with_nonfinite_key_scales(wl: Workload, fraction: float, seed: int) -> Workload:
    """A copy of an sglang_fp8 ``wl`` whose per-key fp32 scales are +inf, -inf or NaN at random
    slots (``fraction`` of all slots each). A score is ``s * scale``: +-inf where ``s != 0`` and
    NaN where ``s == 0``, in the kernels as in the reference."""
    assert wl.layout is Layout.SGLANG_FP8
    pages = wl.k_cache.shape[0]
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(pages * PAGE_SIZE, generator=gen)
    n = int(fraction * pages * PAGE_SIZE)
    k_cache = wl.k_cache.clone()
    scales = fp8_key_scales(k_cache)
    for i, value in enumerate((float("inf"), float("-inf"), float("nan"))):
        chosen = slots[i * n : (i + 1) * n].to(k_cache.device)
        scales[chosen // PAGE_SIZE, chosen % PAGE_SIZE] = value
    return dataclasses.replace(wl, k_cache=k_cache)


def without_rows(wl: Workload) -> IndexerInputs:
    """The inputs of ``wl`` with every per-row tensor cut to zero rows (the cache kept)."""
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens = wl.args()
    cut = lambda t: None if t is None else t[:0]  # noqa: E731
    tensors = (cut(q), cut(q_scale), k_cache, k_scale, cut(weights), cut(page_table), cut(seq_lens))
    return IndexerInputs.of(tensors, **wl.kwargs())


def run_legacy(wl: Workload, **kw) -> IndexerTopKResult:
    return legacy_indexer_topk(wl.inputs(), **kw)


def run_fused(wl: Workload, **kw) -> IndexerTopKResult:
    """A fused call; ``pool=None`` (or no ``pool``) leaves the backend's default pool."""
    if kw.get("pool", 0) is None:
        del kw["pool"]
    return fused_indexer_topk(wl.inputs(), **kw)


def small_pool(topk: int) -> int:
    """The smallest candidate pool the fused backend takes: one 64-key page. The buffer is then
    cut back after every page or two."""
    return 64


@functools.lru_cache(maxsize=None)
def legacy_result(case: Case, device: str) -> IndexerTopKResult:
    """Legacy outputs of ``case`` with default settings (cached: do not modify)."""
    return run_legacy(build(case, device))


@functools.lru_cache(maxsize=None)
def fused_result(case: Case, device: str, num_splits=None, pool=None) -> IndexerTopKResult:
    """Fused outputs of ``case`` with a fresh workspace (cached: do not modify); ``None``
    leaves the backend's default."""
    return run_fused(build(case, device), num_splits=num_splits, pool=pool)


@functools.lru_cache(maxsize=None)
def reference_result(case: Case, device: str):
    """``(expected, next_values)`` of ``case`` from the fp64 reference (cached)."""
    return reference_for(build(case, device))


def reference_for(wl: Workload):
    return reference_with_next_values(*wl.args(), **wl.kwargs())


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------

def _bits(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().view(torch.int32)


def assert_bitwise(actual: IndexerTopKResult, expected: IndexerTopKResult, what: str = "") -> None:
    """All four outputs identical bit for bit (NaN payloads and the sign of zero included)."""
    assert bitwise_equal(actual, expected), f"{what}: {first_difference(actual, expected)}"


def exact_tie_free_boundaries(expected: IndexerTopKResult, next_values: torch.Tensor) -> torch.Tensor:
    """``next_values`` with the near-tie exception withdrawn where the boundary tie is exact.

    Where the reference's (k-1)-th, k-th and (k+1)-th scores are one and the same fp32 number
    (NaN included), the boundary falls inside a group of identical scores (equal keys, an
    exact-zero plateau, NaN rows), which a kernel computes identically, so the contract's tie
    rule (lower position first) decides the set: such rows must match exactly. (A three-way
    tie of distinct keys by rounding alone is too unlikely to matter.) Setting their next value
    to -inf makes :func:`compare_to_reference` demand the reference's set there.
    """
    vals, counts = expected.values, expected.counts
    topk = vals.shape[1]
    if topk < 2:
        return next_values

    def same(a, b):
        a, b = a.contiguous(), b.contiguous()
        return (a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))

    kth, before = vals[:, topk - 1], vals[:, topk - 2]
    exact = same(kth, next_values) & same(before, kth) & (counts.long() == topk)
    return torch.where(exact, torch.full_like(next_values, float("-inf")), next_values)


def assert_matches_reference(result: IndexerTopKResult, wl: Workload, expected=None, rtol=None) -> None:
    """``result`` agrees with the fp64 reference under the kernel-vs-reference rule, with exact
    ties at the selection boundary broken by the lower position and zeros signed as there."""
    if expected is None:
        expected = reference_for(wl)
    exp, next_values = expected
    tol = mma_tolerance(wl.layout, wl.q.device, exp, inputs=wl) if rtol is None else {"rtol": rtol}
    cmp = compare_to_reference(
        result, exp, next_values=exact_tie_free_boundaries(exp, next_values), inputs=wl, seq_lens=wl.seq_lens,
        page_table=wl.page_table, **tol,
    )
    assert cmp.ok, f"{cmp.summary()}; " + "; ".join(cmp.messages)
    # +0 ranks above -0: a zero score must carry the reference's sign
    a, e = result.values.cpu(), exp.values.cpu()
    both_zero = (a == 0) & (e == 0)
    assert torch.equal(torch.signbit(a[both_zero]), torch.signbit(e[both_zero])), "sign of a zero score differs"


def check_fused(case: Case, device: str, num_splits=None, pool=None, what: str = "fused vs legacy"):
    """Fused (cached, with ``num_splits`` and ``pool``) keeps the contract and equals legacy bit
    for bit; returns ``(workload, result)``."""
    wl = build(case, device)
    res = fused_result(case, device, num_splits, pool)
    assert_contract(res, wl)
    assert_bitwise(res, legacy_result(case, device), what)
    return wl, res


def check_legacy(case: Case, device: str):
    """Legacy keeps the contract and agrees with the reference; returns ``(workload, result)``."""
    wl = build(case, device)
    res = legacy_result(case, device)
    assert_contract(res, wl)
    assert_matches_reference(res, wl, reference_result(case, device))
    return wl, res


def check_fused_against_legacy(case: Case, device: str, **fused_kw) -> None:
    """Legacy keeps the contract and agrees with the reference; fused (called with
    ``fused_kw``) keeps the contract and equals legacy bit for bit."""
    wl, legacy = check_legacy(case, device)
    res = run_fused(wl, **fused_kw)
    assert_contract(res, wl)
    assert_bitwise(res, legacy, "fused vs legacy")


def assert_contract(result: IndexerTopKResult, wl: Workload) -> None:
    """The contract's structure, element by element, without the reference.

    counts = min(seq_len, topk); selected positions distinct, inside [0, seq_len) and mapped to
    physical slots through the row's page table; rows with seq_len <= topk hold positions
    0..seq_len-1 ascending; longer rows are strictly descending in the contract's order; NaN
    scores are the canonical quiet NaN; past counts every slot is -1 / -1 / -inf; and no
    sentinel from a preallocated output survives.
    """
    values, raw, phys, counts = (t.cpu() for t in result)
    lens = wl.seq_lens.cpu().long()
    pt = wl.page_table.cpu().long()
    topk = values.shape[1]
    assert torch.equal(counts.long(), lens.clamp(max=topk)), f"counts {counts.tolist()} for lengths {lens.tolist()}"
    bits = _bits(values)
    assert not bool((bits == NAN_SENTINEL_BITS).any()), "a value slot was never written"
    assert not bool((raw == INDEX_SENTINEL).any()), "a raw index slot was never written"
    assert not bool((phys == INDEX_SENTINEL).any()), "a physical index slot was never written"
    slot = torch.arange(topk)[None, :]
    valid = slot < counts.long()[:, None]
    pad = ~valid
    assert bool((raw[pad] == -1).all()), "raw_indices padding must be -1"
    assert bool((phys[pad] == -1).all()), "physical_indices padding must be -1"
    assert bool((bits[pad] == NEG_INF_BITS).all()), "values padding must be -inf"
    nan = torch.isnan(values)
    assert bool((bits[nan] == CANONICAL_NAN_BITS).all()), "NaN scores must be the canonical quiet NaN"
    for r in range(values.shape[0]):
        n = int(counts[r])
        pos = raw[r, :n].long()
        if n == 0:
            continue
        assert bool((pos >= 0).all()) and bool((pos < lens[r]).all()), f"row {r}: position out of range"
        want_phys = pt[r, pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
        assert torch.equal(phys[r, :n].long(), want_phys), f"row {r}: physical indices off the page table"
        if lens[r] <= topk:
            assert torch.equal(pos, torch.arange(n)), f"row {r}: a short row must list positions 0..{n - 1}"
        else:
            keys = order_keys(values[r, :n], pos)
            assert bool((keys[1:] < keys[:-1]).all()), f"row {r}: not strictly descending in the contract order"


# ---------------------------------------------------------------------------------------------
# The shared case matrix (small topk and short contexts: the interpreter is slow)
# ---------------------------------------------------------------------------------------------

def pattern_cases():
    """Every layout on two patterns, and every pattern on one layout (sglang_mxfp4)."""
    cases = []
    for layout in LAYOUTS:
        for pattern in ("random", "zero_plateau"):
            cases.append(Case(f"{layout}-{pattern}", layout, pattern))
    for pattern in ALL_PATTERNS:
        if pattern not in ("random", "zero_plateau"):
            cases.append(Case(f"sglang_mxfp4-{pattern}", "sglang_mxfp4", pattern, seed=1))
    return cases


def edge_length_case(layout: str, topk: int = 32) -> Case:
    """Nine rows (odd: the last row's partner is a phantom) of two requests; lengths edited to
    0, topk - 1, topk, topk + 1, 1 and long, so every pair mixes two kinds."""
    # request 0: 5 rows of C4 length 599..600; request 1: 4 rows of C4 length 324..325
    lens = (0, topk - 1, topk, topk + 1, 600, 1, 0, 324, topk + 1)
    return Case(
        f"{layout}-edge_lengths", layout, "random", context_tokens=(2400, 1300), rows_per_request=(5, 4),
        topk=topk, seed=2, seq_lens=lens,
    )


def mixed_requests_case(layout: str, topk: int = 32) -> Case:
    """Seven one-row requests: every pair holds rows of two requests with different page tables;
    C4 lengths 600, 0, topk, topk + 1, 325, 175 and 12 (the last row has a phantom partner)."""
    ctx = (2400, 3, 4 * topk, 4 * (topk + 1) + 3, 1300, 700, 50)
    return Case(
        f"{layout}-mixed_requests", layout, "random", context_tokens=ctx, rows_per_request=(1,) * len(ctx),
        topk=topk, seed=3,
    )


def reversed_pages_case(layout: str, topk: int = 32) -> Case:
    """Rows 1 and 4 read their pages in reverse order (row 1's partner, row 0, keeps the
    original order, so the pair disagrees on every page); row 4 has a phantom partner."""
    return Case(
        f"{layout}-reversed_pages", layout, "random", context_tokens=(3000, 1200), rows_per_request=(3, 2),
        topk=topk, seed=4, reverse_rows=(1, 4),
    )


def unreversed(case: Case) -> Case:
    """The same workload without the page reversal."""
    return dataclasses.replace(case, name=case.name + "-plain", reverse_rows=())


def nonfinite_case(topk: int = 32) -> Case:
    """sglang_fp8 rows with 6% of the key scales each +inf, -inf and NaN: more +inf scores than
    topk (the boundary falls inside them), -inf and NaN scores among the rest, and a short row
    (row 3) that lists some of each. The scores before scaling are all positive (decreasing
    pattern), so no rounding can flip the sign of an infinity."""
    return Case(
        "sglang_fp8-nonfinite", "sglang_fp8", "decreasing", context_tokens=(2400, 1300), rows_per_request=(3, 2),
        topk=topk, seed=14, seq_lens=(599, 599, 600, topk - 1, 325), nonfinite_scales=0.06,
    )


# ---------------------------------------------------------------------------------------------
# DeepSeek-V4 shapes, for the GPU tests (shared by both files, so results are built once)
# ---------------------------------------------------------------------------------------------

def gpu_128k_case(layout: str, topk: int) -> Case:
    """Two requests of 128K and 96K tokens, nine query rows (four pairs and a phantom partner)."""
    return Case(
        f"gpu128k-{layout}-{topk}", layout, context_tokens=(131072, 98307), rows_per_request=(5, 4),
        topk=topk, seed=10,
    )


def extreme_case(layout: str, kind: str, gpu: bool = False) -> Case:
    """Extreme key scales (``kind`` of :func:`with_extreme_keys`, or ``nonfinite``: 1% of the fp8
    key scales each +inf, -inf and NaN); small for the interpreter, 256K tokens on a GPU."""
    nonfinite = kind == "nonfinite"
    shape = dict(context_tokens=(262144,), rows_per_request=(32,), topk=1024) if gpu else dict(
        context_tokens=(4000, 1300), rows_per_request=(3, 2), topk=32)
    return Case(
        f"{'gpu256k-' if gpu else ''}{layout}-{kind}", layout, "decreasing" if nonfinite else "random", seed=15,
        nonfinite_scales=0.01 if nonfinite else 0.0, extreme="" if nonfinite else kind, **shape,
    )


# A tie-heavy workload for repeated-call determinism (shared, so it is built once).
DETERMINISM_CASE = Case("det-zero_plateau", "sglang_mxfp4", "zero_plateau", context_tokens=(2400,),
                        rows_per_request=(3,), seed=5)


def gpu_adversarial_case(pattern: str) -> Case:
    """64 query rows at the end of one 256K-token request."""
    return Case(
        f"gpu256k-{pattern}", "sglang_mxfp4", pattern, context_tokens=(262144,), rows_per_request=(64,),
        topk=2048, seed=11,
    )


# ---------------------------------------------------------------------------------------------
# Decode batches for the CUDA-graph tests
# ---------------------------------------------------------------------------------------------

# A decode batch's contexts: long rows, one short row, and room for shorter lengths at replay.
DECODE_CONTEXTS = (131072, 98304, 131072, 4096, 131072, 65536, 120000, 131072)


def decode_batch(layout: str, seed: int, device: str, topk: int = 1024) -> Workload:
    """One decode step (one row per request, :data:`DECODE_CONTEXTS`), with queries, keys and
    scattered page tables of its own for each seed."""
    return make_workload(layout, context_tokens=list(DECODE_CONTEXTS), rows_per_request=[1] * len(DECODE_CONTEXTS),
                         topk=topk, seed=seed, device=device)


def load_batch(static, new, max_lengths=None) -> list:
    """Copy another batch's tensors (``Workload.args()`` order) into a captured call's
    ``static`` ones; ``max_lengths``: caps on its ``seq_lens`` (shorter and empty rows).
    Returns the new batch's arguments as copied."""
    new = list(new)
    if max_lengths is not None:
        new[6] = torch.minimum(new[6], torch.tensor(max_lengths, device=new[6].device, dtype=new[6].dtype))
    for dst, src in zip(static, new):
        if dst is not None:
            dst.copy_(src)
    return new
