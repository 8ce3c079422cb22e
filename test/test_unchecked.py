"""What ``check_values=False`` leaves undefined, and what it never allows.

Decode and graph-captured callers skip the value checks (they synchronise with the device), so
lengths past the page table, negative lengths and page ids outside the cache reach the
kernels. Their outputs are then unspecified, but every write stays inside ``out`` and the
workspace, ``counts`` stay within ``[0, topk]``, and each listed position is one the call
scored (no stale scratch is reported as a result).
"""

import dataclasses

import pytest
import torch

import indexer_topk as it
from indexer_topk.backends.fused import fused_indexer_topk
from indexer_topk.contract import allocate_result
from indexer_topk.guards import GuardedResult, GuardedWorkspace

from kernel_cases import assert_bitwise

KERNELS = ["legacy", "fused"]


def workload(page_columns: int, topk: int, layout: str = "sglang_fp8"):
    """Two rows over ``page_columns`` pages, each page used, and the page table exactly that wide."""
    return it.make_workload(layout, context_tokens=(4 * 64 * page_columns,), rows_per_request=2, topk=topk,
                            page_table_pad=0, seed=7)


def key_matrix_workspace(wl) -> GuardedWorkspace:
    """Room for exactly two rows of legacy's key matrix, followed by bytes that read as keys
    above every score's: a read past the matrix would select them."""
    return GuardedWorkspace(2 * wl.page_table.shape[1] * 64 * 4, wl.q.device, fill=0x7F)


def assert_scored_positions_only(res, width: int) -> None:
    """counts in [0, topk]; the first counts positions of a row distinct and inside the width."""
    topk = res.values.shape[1]
    for r, n in enumerate(res.counts.tolist()):
        assert 0 <= n <= topk, f"row {r}: count {n}"
        pos = res.raw_indices[r, :n]
        assert bool((pos >= 0).all()) and bool((pos < width).all()), f"row {r}: positions {pos.tolist()[:8]}..."
        assert len(set(pos.tolist())) == n, f"row {r}: a position listed twice"


@pytest.mark.parametrize("backend", KERNELS)
def test_lengths_past_the_page_table_write_only_the_outputs(backend, device):
    """A 16-column page table (1024 positions) and lengths 1000 and 1624: the score stage stops
    at the page table, so nothing past it may be selected, read or written."""
    wl = workload(16, 512)
    wl = dataclasses.replace(wl, seq_lens=torch.tensor([1000, 16 * 64 + 600], dtype=torch.int32, device=device))
    g = GuardedResult(wl.rows, wl.topk, device)
    ws = key_matrix_workspace(wl) if backend == "legacy" else GuardedWorkspace(
        it.workspace_size(wl.rows, wl.topk, wl.layout.value, device), device, fill=0x7F)
    it.indexer_topk(*wl.args(), **wl.kwargs(), backend=backend, out=g.out, workspace=ws.workspace, check_values=False)
    g.assert_guards_intact()
    ws.assert_guards_intact()
    assert_scored_positions_only(g.out, 16 * 64)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_fused_reports_no_stale_scratch_past_the_page_table(num_splits, device):
    """topk 1024 over an 8-column page table (512 positions) and a length of 900: the fused
    kernel finds 512 candidates, and must not report 388 more from its scratch (zeroed here;
    garbage there would be dereferenced through the page table)."""
    wl = workload(8, 1024)
    wl = dataclasses.replace(wl, seq_lens=torch.tensor([900, 300], dtype=torch.int32, device=device))
    ws = torch.zeros(it.workspace_size(wl.rows, wl.topk, wl.layout.value, device) * 2, dtype=torch.uint8, device=device)
    out = allocate_result(wl.rows, wl.topk, device)
    for t in out:
        t.zero_()
    fused_indexer_topk(wl.inputs(), out=out, workspace=ws, num_splits=num_splits)
    assert_scored_positions_only(out, 8 * 64)


def test_legacy_reads_a_row_no_further_than_the_page_table(device):
    """Legacy treats a length past the page table as the page table's width."""
    wl = workload(8, 1024)
    wl = dataclasses.replace(wl, seq_lens=torch.tensor([900, 300], dtype=torch.int32, device=device))
    got = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", check_values=False)
    wl = dataclasses.replace(wl, seq_lens=torch.tensor([512, 300], dtype=torch.int32, device=device))
    assert_bitwise(got, it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy"), "900 read as 512")


@pytest.mark.parametrize("backend", ["reference"] + KERNELS)
def test_negative_lengths_are_empty_rows(backend, device):
    """A negative length counts 0 (it used to come back as a negative count); the other row of
    the pair is unaffected."""
    wl = workload(2, 512, "sglang_mxfp4")
    wl = dataclasses.replace(wl, seq_lens=torch.tensor([-5, 100], dtype=torch.int32, device=device))
    got = it.indexer_topk(*wl.args(), **wl.kwargs(), backend=backend, check_values=False)
    wl = dataclasses.replace(wl, seq_lens=torch.tensor([0, 100], dtype=torch.int32, device=device))
    assert_bitwise(got, it.indexer_topk(*wl.args(), **wl.kwargs(), backend=backend), "-5 read as 0")
