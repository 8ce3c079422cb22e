"""The fused streaming backend: bit-identical to the legacy backend under every launch geometry.

Both backends score with the same tile, so the fused outputs must equal the legacy outputs bit
for bit, whatever the context split (exact merge kernel) and the candidate pool (in-kernel
compactions). Small topk and short contexts keep these fast under the Triton interpreter; on a
GPU the same tests run compiled. Tests marked ``gpu`` use DeepSeek-V4 shapes.
"""


import dataclasses

import pytest
import torch

from indexer_topk.backends.fused import fused_indexer_topk, fused_workspace_size, plan_fused
from indexer_topk.contract import SUPPORTED_TOPK, allocate_result
from indexer_topk.guards import GuardedResult, GuardedWorkspace
from indexer_topk.reference import reference_scores

from kernel_cases import (
    LAYOUTS,
    Case,
    assert_bitwise,
    assert_contract,
    assert_matches_reference,
    build,
    check_fused_against_legacy,
    check_legacy,
    DETERMINISM_CASE,
    check_fused,
    edge_length_case,
    extreme_case,
    fused_result,
    gpu_128k_case,
    gpu_adversarial_case,
    legacy_result,
    mixed_requests_case,
    nonfinite_case,
    pattern_cases,
    reference_result,
    reversed_pages_case,
    run_fused,
    run_legacy,
    small_pool,
    without_rows,
)

PATTERN_CASES = pattern_cases()
SPLITS = [None, 1, 2, 4]
POOLS = ["small_pool", "default_pool"]


def split_id(s):
    return "auto_splits" if s is None else f"splits{s}"


def pool_for(which: str, topk: int):
    """``small_pool``: a cut every block or two; ``default_pool``: the backend's own (None)."""
    return small_pool(topk) if which == "small_pool" else None


# ---------------------------------------------------------------------------------------------
# Bit-identical to legacy
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", PATTERN_CASES, ids=str)
def test_matches_legacy(case, device):
    """Every layout on random and zero-plateau scores, every adversarial pattern on one layout:
    default launch (automatic splits, full pool) equals legacy bit for bit."""
    check_fused(case, device)


@pytest.mark.parametrize("num_splits", [None, 1], ids=split_id)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_edge_lengths(layout, num_splits, device):
    """Empty rows, rows shorter than, equal to and one longer than topk, an odd row count:
    equal to legacy and to the contract, split or not."""
    case = edge_length_case(layout)
    wl, res = check_fused(case, device, num_splits)
    assert_matches_reference(res, wl, reference_result(case, device))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_of_different_requests_share_a_pair(layout, device):
    """One-row requests: each pair spans two page tables and two lengths."""
    case = mixed_requests_case(layout)
    check_fused(case, device)


@pytest.mark.parametrize(
    "num_splits, pool", [(None, None), (16, None), (64, "small_pool")],
    ids=["auto_splits", "splits16", "splits64-small_pool"],
)
@pytest.mark.parametrize("layout", ["sglang_fp8", "aiter_mxfp4"])
def test_decode_rows_one_per_work_item(layout, num_splits, pool, device):
    """``rows_per_request=1`` (a decode step): one row per work item, each request with its own
    pages and length (one empty, one of topk, one of topk + 1). 16 and 64 splits per row go
    through a level of the merge tree (2 and 8 lists per row left for the final merge), with
    empty splits past the short rows; a one-page pool cuts inside every split. Legacy's bits."""
    case = mixed_requests_case(layout)
    wl = build(case, device)
    plan = plan_fused(wl.rows, wl.topk, device, num_splits, group_rows=1)
    assert plan.group_rows == 1
    assert plan.merge_levels == {None: plan.merge_levels, 16: (2,), 64: (8,)}[num_splits]
    res = run_fused(wl, num_splits=num_splits, pool=pool_for(pool, wl.topk) if pool else None, rows_per_request=1)
    assert_contract(res, wl)
    assert_bitwise(res, legacy_result(case, device), f"decode rows, {split_id(num_splits)}")


def test_merge_tree_levels_and_workspace():
    """Rows split more than eight ways are merged in a tree of eight lists per program, whose
    lists the workspace holds; one row per item never needs more scratch than the tile's two."""
    from indexer_topk.backends.fused import MERGE_FANIN

    assert MERGE_FANIN == 8
    for splits, levels in ((1, ()), (8, ()), (16, (2,)), (32, (4,)), (64, (8,))):
        plan = plan_fused(4, 64, "cpu", splits)
        assert plan.merge_levels == levels
        assert plan.merge_counts == 4 * sum(levels)
    for rows in (1, 3, 8, 64, 300):
        assert fused_workspace_size(rows, 1024, "sglang_fp8", "cpu") >= max(
            plan_fused(r, 1024, "cpu", group_rows=g, one_wave=w).nbytes
            for r in range(1, rows + 1) for g in (1, 2) for w in (False, True))


def test_decode_plan_on_the_stream_is_one_wave(monkeypatch):
    """A decode step on the Hopper stream (one row per item, one program per SM): the most
    splits whose items fit the programs, so no program takes a second item."""
    from indexer_topk.backends import fused

    monkeypatch.setattr(fused, "device_sm_count", lambda device: 132)
    for rows, splits in ((1, 64), (8, 16), (9, 8), (64, 2), (66, 2), (67, 1), (256, 1)):
        plan = plan_fused(rows, 1024, "cpu", group_rows=1, one_wave=True)
        assert (plan.splits, plan.programs) == (splits, min(132, rows * splits)), rows
        assert rows * splits <= 132 or splits == 1


@pytest.mark.parametrize("num_splits", [None, 1], ids=split_id)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reversed_page_order(layout, num_splits, device):
    """Rows reading their pages in reverse physical order, one of them beside a partner with the
    original order (the pair disagrees on every page): equal to legacy, split or not."""
    case = reversed_pages_case(layout)
    check_fused(case, device, num_splits)


# ---------------------------------------------------------------------------------------------
# Launch geometry: context splits and the candidate pool
# ---------------------------------------------------------------------------------------------

GEOMETRY_CASES = [
    Case("sglang_fp8-zero_plateau-7rows", "sglang_fp8", "zero_plateau", context_tokens=(4400, 1000),
         rows_per_request=(4, 3), seed=6),
    edge_length_case("sglang_fp8"),
    Case("aiter_mxfp4-nan_rows-7rows", "aiter_mxfp4", "nan_rows", context_tokens=(2400, 1000),
         rows_per_request=(4, 3), seed=6),
]


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("num_splits", SPLITS, ids=split_id)
@pytest.mark.parametrize("case", GEOMETRY_CASES, ids=str)
def test_splits_and_pool(case, num_splits, pool, device):
    """Context splits (with the exact merge) and a small pool (a cut every block or two) change
    no bit of the outputs: on exact-zero ties at the selection boundary, on edge lengths, and
    on rows whose every score is NaN."""
    check_fused(case, device, num_splits, pool_for(pool, case.topk), f"{split_id(num_splits)}, {pool}")


@pytest.mark.parametrize(
    "num_splits, pool", [(None, "default_pool"), (1, "small_pool"), (4, "small_pool")],
    ids=["auto_splits-default_pool", "splits1-small_pool", "splits4-small_pool"],
)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf * 0
def test_nonfinite_scores(num_splits, pool, device):
    """Scattered +inf, -inf and NaN scores (non-finite key scales), through cuts and merges."""
    case = nonfinite_case()
    check_fused(case, device, num_splits, pool_for(pool, case.topk))


@pytest.mark.parametrize(
    "pattern, num_splits", [("increasing", 1), ("random", 2)], ids=["increasing-splits1", "random-splits2"]
)
def test_long_rows_compact_with_the_full_pool(pattern, num_splits, device):
    """Rows of 5000 positions: more per split than the default candidate buffer holds, so it
    fills and is cut back inside the stream (on increasing scores every new score enters)."""
    case = Case(f"long-{pattern}", "aiter_mxfp4", pattern, context_tokens=(20000,), rows_per_request=(3,), seed=7)
    wl = build(case, device)
    # more positions per split than the candidate buffer holds
    assert int(wl.seq_lens.min()) // num_splits > plan_fused(wl.rows, wl.topk, device, num_splits).cap
    res = run_fused(wl, num_splits=num_splits)
    assert_contract(res, wl)
    assert_bitwise(res, legacy_result(case, device), "fused vs legacy")
    assert_matches_reference(res, wl, reference_result(case, device))


@pytest.mark.parametrize("topk", [16, 64])
def test_other_topk(topk, device):
    """topk 16 and 64 with a small pool and automatic splits."""
    case = Case(f"topk{topk}", "sglang_mxfp4", "random", context_tokens=(3000, 700), rows_per_request=(2, 3),
                topk=topk, seed=8)
    wl = build(case, device)
    res = run_fused(wl, pool=small_pool(topk))
    assert_contract(res, wl)
    assert_bitwise(res, legacy_result(case, device), "fused vs legacy")
    assert_matches_reference(res, wl, reference_result(case, device))


def supported_topk_case(topk: int) -> Case:
    """Two rows a little longer than ``topk`` (one request) and one shorter row (another)."""
    return Case(f"supported-topk{topk}", "sglang_fp8", context_tokens=(4 * topk + 600, 2000),
                rows_per_request=(2, 1), topk=topk, seed=31)


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("topk", SUPPORTED_TOPK)
def test_supported_topk_on_long_rows(topk, num_splits, device):
    """Every topk the API takes, on rows longer than it, in one split and merged from two: the
    same bits as legacy (at 2048 the sorts hold more keys than the interpreter's rank count
    fits in one Triton block)."""
    case = supported_topk_case(topk)
    wl = build(case, device)
    assert int(wl.seq_lens.max()) > topk
    check_fused(case, device, num_splits)


@pytest.mark.parametrize("backend", ["legacy", "fused", "auto"])
def test_topk_2048_through_the_api(backend, device):
    """``indexer_topk`` at topk 2048 on every Triton route agrees with the reference."""
    from indexer_topk import indexer_topk

    wl = build(supported_topk_case(2048), device)
    res = indexer_topk(*wl.args(), **wl.kwargs(), backend=backend)
    assert_contract(res, wl)
    assert_matches_reference(res, wl, reference_result(supported_topk_case(2048), device))


def test_zero_rows(device):
    """A call without rows returns empty outputs."""
    wl = build(mixed_requests_case("sglang_mxfp4"), device)
    res = fused_indexer_topk(without_rows(wl))
    assert res.values.shape == (0, wl.topk) and res.counts.shape == (0,)


def test_invalid_geometry_is_rejected(device):
    """A pool that is not a positive multiple of the 64-key page and a split count that is not a
    power of two raise."""
    wl = build(edge_length_case("sglang_fp8"), device)
    for pool in (0, 100):
        with pytest.raises(ValueError, match="pool"):
            run_fused(wl, pool=pool)
    with pytest.raises(ValueError, match="num_splits"):
        run_fused(wl, num_splits=3)


# ---------------------------------------------------------------------------------------------
# The workspace and preallocated outputs
# ---------------------------------------------------------------------------------------------

def test_workspace_size_is_context_independent(device):
    """The scratch size depends on rows, topk, splits and pool, never on the context length,
    and serves every call of fewer rows."""
    for splits in SPLITS:
        for pool in (small_pool(32), None):
            n = fused_workspace_size(9, 32, "sglang_fp8", device, splits, pool)
            assert n >= plan_fused(9, 32, device, splits, pool).nbytes
            assert all(n >= plan_fused(r, 32, device, splits, pool).nbytes for r in range(1, 9))
            assert n == fused_workspace_size(9, 32, "aiter_mxfp4", device, splits, pool)
    assert fused_workspace_size(9, 32, None, device, 4) > fused_workspace_size(9, 32, None, device, 1)


def test_workspace_too_small_is_rejected(device):
    """A workspace one byte short of the plan raises before any kernel runs."""
    wl = build(edge_length_case("sglang_fp8"), device)
    n = fused_workspace_size(wl.rows, wl.topk, wl.layout, device, 2)
    ws = torch.zeros(n - 1, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="workspace"):
        run_fused(wl, num_splits=2, workspace=ws)


@pytest.mark.parametrize(
    "num_splits, pool", [(1, "default_pool"), (4, "small_pool")], ids=["splits1-default_pool", "splits4-small_pool"]
)
def test_guarded_outputs_and_workspace(num_splits, pool, device):
    """Outputs and workspace are slices of larger garbage-filled buffers: every output element
    is overwritten per the contract, and no byte outside the outputs or the workspace changes."""
    case = edge_length_case("sglang_fp8")
    wl = build(case, device)
    pool = pool_for(pool, wl.topk)
    out = GuardedResult(wl.rows, wl.topk, device)
    ws = GuardedWorkspace(fused_workspace_size(wl.rows, wl.topk, wl.layout, device, num_splits, pool), device)
    res = run_fused(wl, out=out.out, workspace=ws.workspace, num_splits=num_splits, pool=pool)
    assert res.values.data_ptr() == out.out.values.data_ptr()
    out.assert_guards_intact()
    ws.assert_guards_intact()
    assert_contract(out.out, wl)
    assert_bitwise(out.out, legacy_result(case, device), "into guarded outputs")


def test_workspace_reuse(device):
    """One workspace through three calls with different inputs (layouts, patterns): each call's
    outputs equal those of a call with its own fresh workspace."""
    a = PATTERN_CASES[0]  # aiter_mxfp4-random
    b = next(c for c in PATTERN_CASES if c.name == "sglang_fp8-zero_plateau")
    wa, wb = build(a, device), build(b, device)
    assert (wa.rows, wa.topk) == (wb.rows, wb.topk)
    ws = GuardedWorkspace(fused_workspace_size(wa.rows, wa.topk, None, device), device)
    for case, wl in ((a, wa), (b, wb), (a, wa)):
        res = run_fused(wl, workspace=ws.workspace)
        assert_bitwise(res, fused_result(case, device), f"{case.name} through a reused workspace")
    ws.assert_guards_intact()


def test_outputs_reused_across_calls(device):
    """Outputs written by a call with long rows, then reused by a call with short and empty rows:
    no stale element survives."""
    long_case = PATTERN_CASES[0]  # five rows, all longer than topk
    short_case = Case("short-5rows", "sglang_mxfp4", context_tokens=(100, 3, 140), rows_per_request=(2, 1, 2), seed=9)
    wl_long, wl_short = build(long_case, device), build(short_case, device)
    assert wl_long.rows == wl_short.rows
    out = allocate_result(wl_long.rows, wl_long.topk, device)
    run_fused(wl_long, out=out)
    run_fused(wl_short, out=out)
    assert_contract(out, wl_short)
    assert_bitwise(out, run_legacy(wl_short), "outputs reused")


def test_deterministic(device):
    """Five calls with four splits and a small pool (merge and compactions) on a tie-heavy
    workload give bit-identical outputs."""
    wl = build(DETERMINISM_CASE, device)
    pool = small_pool(wl.topk)
    first = run_fused(wl, num_splits=4, pool=pool)
    for i in range(4):
        assert_bitwise(run_fused(wl, num_splits=4, pool=pool), first, f"repeat {i + 1}")


SCRAMBLE_CASES = [
    GEOMETRY_CASES[0],  # exact-zero ties at the boundary
    Case("scramble-increasing", "sglang_mxfp4", "increasing", context_tokens=(9000, 300), rows_per_request=(3, 2),
         seed=9),
    Case("scramble-equal-4rows", "sglang_fp8", "equal", context_tokens=(6000,), rows_per_request=(4,), seed=10),
]


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("num_splits", [1, 4], ids=split_id)
@pytest.mark.parametrize("case", SCRAMBLE_CASES, ids=str)
def test_scrambled_visits_and_composite_cuts(case, num_splits, pool, device):
    """Pages visited out of order, buffers out of position order, cuts and gates by
    (key, position): the same bits as legacy on ties (all-equal and zero plateaus, where only
    positions decide) and on scores that grow along the context, with a cut every page or two
    and with the full pool."""
    check_fused(case, device, num_splits, pool_for(pool, case.topk), f"{split_id(num_splits)}, {pool}")



def test_strip_of_two_pages_with_cuts(device):
    """A two-page strip (pool 128 at topk 32): strips end inside and at the end of a split, and
    a buffer is cut before a strip's entrants are appended."""
    case = Case("strip2-increasing", "sglang_mxfp4", "increasing", context_tokens=(6000, 1100),
                rows_per_request=(3, 2), seed=9)
    plan = plan_fused(build(case, device).rows, case.topk, device, 2, 128)
    assert (plan.cap, plan.strip) == (160, 128)
    check_fused(case, device, 2, 128, "two-page strips")


EXTREME = [("sglang_fp8", "huge_scale"), ("sglang_mxfp4", "huge_scale"), ("aiter_mxfp4", "exponent_1"),
           ("sglang_mxfp4", "exponent_254")]


def assert_extreme_present(case: Case, wl, legacy, device) -> None:
    """The edit took effect: a huge score was selected, or the edited exponents change the
    scores of row 0's first positions (to non-finite values at exponent 254)."""
    if case.extreme == "huge_scale":
        assert float(legacy.values[:, 0].max()) > 1e25, "no huge score was selected"
        return
    if not case.extreme:
        return
    n = min(4096, int(wl.seq_lens[0]))
    row0 = torch.tensor([0], device=wl.seq_lens.device)

    def row0_scores(w):
        return reference_scores(*w.args(), layout=w.layout, weight_scale=w.weight_scale, rows=row0, stop=n)

    edited = row0_scores(wl)
    if case.extreme == "exponent_254":
        assert bool((~torch.isfinite(edited)).any()), "exponent 254 left every score finite"
    else:
        unedited = row0_scores(build(dataclasses.replace(case, name=case.name + "-unedited", extreme=""), device))
        assert bool((edited != unedited).any()), "the edited exponents changed no score"


def check_extreme(case: Case, device, splits=(None, 4)) -> None:
    """Fused equals legacy bit for bit (automatic and four splits) and both keep the contract;
    legacy agrees with the reference except at exponent 254, where keys overflow fp32 and the
    kernels (fp32 products and sums) and the fp64 reference (fp32 dequantised keys) need not
    turn the same scores into NaN or infinity."""
    if case.extreme == "exponent_254":
        wl, legacy = build(case, device), legacy_result(case, device)
        assert_contract(legacy, wl)
    else:
        wl, legacy = check_legacy(case, device)
    assert_extreme_present(case, wl, legacy, device)
    for num_splits in splits:
        check_fused(case, device, num_splits, what=f"fused, {split_id(num_splits)}")


@pytest.mark.parametrize("layout,kind", EXTREME, ids=lambda x: x)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
def test_extreme_key_scales(layout, kind, device):
    """One huge key scale per row, and ue8m0 exponents at 1 and at 254."""
    check_extreme(extreme_case(layout, kind), device)


# ---------------------------------------------------------------------------------------------
# GPU: DeepSeek-V4 shapes
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_small_pool(layout, device):
    """A 128K-token context, topk 1024, a one-page pool: a cut every page or two, equal to legacy."""
    check_fused(gpu_128k_case(layout, 1024), device, pool=64, what="one-page pool")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_mixed_groups(layout, device):
    """Groups of rows from different requests (pages not shared, each row scored from its own
    pages) next to groups within one request: equal to legacy."""
    case = Case(f"gpu-mixed-{layout}", layout, context_tokens=(65536, 30000, 700, 131072), rows_per_request=(3, 2, 1, 6),
                topk=1024, seed=26)
    check_fused_against_legacy(case, device)


@pytest.mark.gpu
def test_gpu_empty_rows_among_1m_token_rows(device):
    """Empty, one-position and full rows of a 1M-token request side by side."""
    case = Case("gpu-1m-empty", "sglang_fp8", context_tokens=(1 << 20,), rows_per_request=(6,), topk=1024, seed=25,
                seq_lens=(0, 262000, 0, 261999, 1, 0))
    check_fused_against_legacy(case, device)


GPU_EXTREME = [("sglang_fp8", "huge_scale"), ("sglang_fp8", "nonfinite"), ("sglang_mxfp4", "huge_scale"),
               ("sglang_mxfp4", "exponent_254"), ("aiter_mxfp4", "exponent_1")]


@pytest.mark.gpu
@pytest.mark.parametrize("layout,kind", GPU_EXTREME, ids=lambda x: x)
def test_gpu_extreme_key_scales(layout, kind, device):
    """256K tokens, 32 rows, topk 1024 (automatic splits): one huge key scale per row, ue8m0
    exponents at 1 and 254, and scattered +inf / -inf / NaN key scales."""
    check_extreme(extreme_case(layout, kind, gpu=True), device, splits=(None,))

@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 1024, 2048])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_128k_matches_legacy(layout, topk, device):
    """A 128K-token context: fused with the real pool, automatic splits and eight splits equals
    legacy bit for bit, and legacy agrees with the reference."""
    case = gpu_128k_case(layout, topk)
    wl = build(case, device)
    legacy = legacy_result(case, device)
    assert_matches_reference(legacy, wl, reference_result(case, device))
    for num_splits in (None, 8):
        res = run_fused(wl, num_splits=num_splits)
        assert_contract(res, wl)
        assert_bitwise(res, legacy, split_id(num_splits))


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["increasing", "equal", "zero_plateau", "nan_rows"])
def test_gpu_adversarial_full_shape(pattern, device):
    """64 rows of a 256K-token request under adversarial patterns: fused equals legacy bit for
    bit, and legacy agrees with the reference."""
    check_fused_against_legacy(gpu_adversarial_case(pattern), device)


@pytest.mark.gpu
def test_gpu_two_streams(device):
    """Two workloads launched concurrently on two streams, each with its own workspace and
    outputs, give the same bits as sequential calls."""
    cases = [
        Case("gpu-stream-a", "sglang_fp8", context_tokens=(131072,), rows_per_request=(16,), topk=2048, seed=20),
        Case("gpu-stream-b", "aiter_mxfp4", "zero_plateau", context_tokens=(65536, 40000), rows_per_request=(5, 4),
             topk=1024, seed=21),
    ]
    wls = [build(c, device) for c in cases]
    sequential = [run_fused(wl) for wl in wls]
    for a, b in zip(sequential, (legacy_result(c, device) for c in cases)):
        assert_bitwise(a, b, "sequential fused vs legacy")
    workspaces = [torch.empty(fused_workspace_size(wl.rows, wl.topk, wl.layout, device), dtype=torch.uint8,
                              device=device) for wl in wls]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for rep in range(5):
        outs = [allocate_result(wl.rows, wl.topk, device) for wl in wls]
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        for s, wl, ws, out in zip(streams, wls, workspaces, outs):
            with torch.cuda.stream(s):
                run_fused(wl, workspace=ws, out=out)
        torch.cuda.synchronize()
        for out, want, c in zip(outs, sequential, cases):
            assert_bitwise(out, want, f"{c.name} on its own stream, round {rep}")


@pytest.mark.gpu
def test_gpu_deterministic(device):
    """100 calls with automatic splits (work items taken in a different order each time) give
    bit-identical outputs."""
    case = Case("gpu-det", "aiter_mxfp4", "zero_plateau", context_tokens=(65536, 32768), rows_per_request=(8, 8),
                topk=2048, seed=13)
    wl = build(case, device)
    ws = torch.empty(fused_workspace_size(wl.rows, wl.topk, wl.layout, device), dtype=torch.uint8, device=device)
    first = run_fused(wl, workspace=ws)
    assert_bitwise(first, legacy_result(case, device), "fused vs legacy")
    for i in range(99):
        assert_bitwise(run_fused(wl, workspace=ws), first, f"repeat {i + 1}")


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 8], ids=split_id)
def test_gpu_empty_rows_among_long_rows(num_splits, device):
    """Empty, short and 128K-token rows side by side in pairs: equal to legacy and the reference."""
    lens = (0, 32766, 0, 511, 512, 513, 29999, 0, 1, 30000, 0)
    case = Case("gpu-empty-long", "sglang_mxfp4", context_tokens=(131072, 120003), rows_per_request=(6, 5),
                topk=512, seed=22, seq_lens=lens)
    check_fused_against_legacy(case, device, num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_single_row(layout, device):
    """One row of a 128K-token context (decode-like: automatic splits spread it over the GPU)."""
    case = Case(f"gpu-1row-{layout}", layout, context_tokens=(131072,), rows_per_request=(1,), topk=2048, seed=23)
    assert plan_fused(1, 2048, device).splits > 1
    check_fused_against_legacy(case, device)


@pytest.mark.gpu
def test_gpu_4097_rows(device):
    """4097 rows (2049 pairs, the last with a phantom partner) of two requests."""
    case = Case("gpu-4097", "sglang_fp8", context_tokens=(20000, 12000), rows_per_request=(2049, 2048),
                topk=512, seed=24)
    assert build(case, device).rows == 4097
    check_fused_against_legacy(case, device)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 8], ids=split_id)
def test_gpu_guarded_outputs_and_workspace(num_splits, device):
    """At a 128K-token context: garbage-filled guarded outputs and workspace, nothing written
    outside them, every output element written."""
    case = gpu_128k_case("sglang_fp8", 2048)
    wl = build(case, device)
    out = GuardedResult(wl.rows, wl.topk, device)
    ws = GuardedWorkspace(fused_workspace_size(wl.rows, wl.topk, wl.layout, device, num_splits), device)
    run_fused(wl, out=out.out, workspace=ws.workspace, num_splits=num_splits)
    out.assert_guards_intact()
    ws.assert_guards_intact()
    assert_contract(out.out, wl)
    assert_bitwise(out.out, legacy_result(case, device), "into guarded outputs")


@pytest.mark.parametrize("programs, sms, wide", [(16, 132, True), (132, 132, True), (133, 132, False), (2048, 132, False)])
def test_merge_levels_of_few_programs_take_more_warps(programs, sms, wide):
    # a decode batch's merge has a program or less per SM: it gets the wider program; a prefill's keeps the select's
    from indexer_topk.backends import fused
    from indexer_topk.kernels.launch import SELECT_WARPS

    assert fused.MERGE_WARPS > SELECT_WARPS
    assert fused._merge_warps(programs, sms) == (fused.MERGE_WARPS if wide else SELECT_WARPS)
