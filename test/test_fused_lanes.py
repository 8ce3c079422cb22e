"""Stream mode 2 of the fused kernel (lane-private candidate buffers, ``kernels/slots.py``):
bitwise equal to legacy on the cases that exercise its cuts, ties, splits and short rows."""

import pytest

from indexer_topk.backends.fused import fused_indexer_topk, lane_slots

import kernel_cases as kc

CASES = [
    # every score enters: the lane buffers are cut every CHECK blocks
    (kc.Case("increasing", "sglang_fp8", pattern="increasing", context_tokens=(16384,), rows_per_request=(3,), topk=16), 1),
    # equal scores: ties broken by position across lanes, and across a two-way split + merge
    (kc.Case("equal", "aiter_mxfp4", pattern="equal", context_tokens=(4000,), rows_per_request=(2,), topk=16), 2),
    # empty, short, exactly-topk and long rows in one call, NaN scores, an odd row count
    (kc.Case("edges", "sglang_mxfp4", pattern="nan_rows", context_tokens=(4000, 60, 3), rows_per_request=(2, 2, 1), topk=16), 1),
]


@pytest.mark.parametrize("case,splits", CASES, ids=[c.name for c, _ in CASES])
def test_lane_mode_equals_legacy(case, splits, device):
    wl = kc.build(case, device)
    expected = kc.legacy_result(case, device)
    got = fused_indexer_topk(wl.args(), **kc.call_kwargs(wl), stream_mode=2, num_splits=splits)
    kc.assert_bitwise(got, expected, f"stream_mode=2 {case}")


@pytest.mark.parametrize("topk,block_n", [(16, 128), (512, 128), (1024, 128), (2048, 128), (100, 64)])
def test_lane_slots_never_overflow(topk, block_n):
    """After a cut a lane holds ceil(topk/BLOCK_N) entries; CHECK more blocks fit in S."""
    s, check = lane_slots(topk, block_n)
    kept = -(-topk // block_n)
    assert s & (s - 1) == 0 and check >= 8 and kept + check == s
