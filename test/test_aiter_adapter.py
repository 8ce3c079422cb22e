"""The AITER adapter, against fake AITER installations (test/fake_aiter)."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

import fake_aiter
import indexer_topk
from indexer_topk import policy
from indexer_topk.backends import aiter as adapter
from indexer_topk.contract import IndexerTopKResult, Layout, allocate_result
from indexer_topk.errors import BackendUnavailable
from indexer_topk.policy import PathPolicy, Probe
from indexer_topk.reference import reference_indexer_topk
from indexer_topk.workload import make_workload
from kernel_cases import assert_bitwise




@pytest.fixture
def fake(monkeypatch):
    """The reference fake, installed for one test; it computes on the CPU, so the adapter's
    gfx950 check is lifted (:func:`test_device_problem` covers that check)."""
    monkeypatch.setattr(adapter, "device_problem", lambda device: None)
    with fake_aiter.installed(monkeypatch, "reference") as module:
        yield module


@functools.lru_cache(maxsize=None)
def workload(topk=512, context_tokens=(4096, 900, 3000), rows_per_request=(3, 2, 3), pattern="random"):
    """A small aiter_mxfp4 batch with long (> topk) and short rows; built once, never mutated."""
    return make_workload("aiter_mxfp4", topk=topk, seed=11, context_tokens=context_tokens,
                         rows_per_request=rows_per_request, pattern=pattern, page_table_pad=2)


@functools.lru_cache(maxsize=None)
def expected(topk=512, **kw):
    wl = workload(topk, **kw)
    return reference_indexer_topk(*wl.args(), **wl.kwargs())


# ---------------------------------------------------------------------------------------------
# Symbol lookup
# ---------------------------------------------------------------------------------------------

def test_symbol_found(fake):
    assert adapter.aiter_symbol() is fake.flydsl_pa_mqa_topk_fp4_prefill
    assert adapter.lookup_aiter_symbol() == (fake.flydsl_pa_mqa_topk_fp4_prefill, None)


@pytest.mark.parametrize(
    "variant,error",
    [
        ("missing", None),
        ("broken", "RuntimeError('fake aiter: HIP runtime failed to initialise')"),
        ("lazy_broken", "ImportError(\"fake aiter: No module named 'flydsl'\")"),
        ("absent", "ModuleNotFoundError"),
    ],
)
def test_symbol_unavailable(monkeypatch, variant, error):
    with fake_aiter.installed(monkeypatch, variant):
        fn, why = adapter.lookup_aiter_symbol()
        assert adapter.aiter_symbol() is None
    assert fn is None
    if error is None:
        assert why is None
    else:
        assert why.startswith(error)


def test_symbol_lookup_is_exact(monkeypatch, fake):
    # A near-miss name (the prototype's alias, or a non-callable) is not the kernel.
    monkeypatch.delattr(fake, "flydsl_pa_mqa_topk_fp4_prefill")
    monkeypatch.setattr(fake, "flydsl_pa_mqa_logits_fp4_prefill_topk", lambda *a, **k: None, raising=False)
    assert adapter.aiter_symbol() is None
    monkeypatch.setattr(fake, "flydsl_pa_mqa_topk_fp4_prefill", "not callable", raising=False)
    assert adapter.aiter_symbol() is None


# ---------------------------------------------------------------------------------------------
# The guarded page table
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width,guarded", [(0, 4), (1, 4), (3, 4), (4, 4), (5, 8), (8, 8), (9, 12), (3072, 3072)])
def test_guarded_width(width, guarded):
    assert adapter.guarded_width(width) == guarded


def test_guarded_page_table_layout():
    page_table = torch.tensor([[7, 3, -1, 99, 5], [2, 8, 9, 4, 6], [1, -5, -5, -5, -5]], dtype=torch.int32)
    seq_lens = torch.tensor([65, 257, 0], dtype=torch.int32)  # 2 pages, 5 pages, none
    table, max_seq_len = adapter.guarded_page_table(page_table, seq_lens)
    assert table.dtype == torch.int32 and table.is_contiguous()
    assert tuple(table.shape) == (3, 8 + 4) and max_seq_len == 8 * 64
    assert table.tolist() == [
        [7, 3] + [0] * 10,
        [2, 8, 9, 4, 6] + [0] * 7,
        [0] * 12,
    ]


# ---------------------------------------------------------------------------------------------
# Calls through the adapter
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("topk,context", [(512, (4096, 900, 3000)), (1024, (8192, 900, 4100))])
def test_matches_reference_through_api(fake, topk, context):
    wl = workload(topk, context_tokens=context)
    got = indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter")
    assert_bitwise(got, expected(topk, context_tokens=context))
    assert isinstance(got, IndexerTopKResult)
    assert int(got.counts.min()) < topk < int(wl.seq_lens.max())  # short and long rows both covered
    [call] = fake.CALLS
    rows = wl.rows
    fp32_scale = float(torch.tensor(wl.weight_scale, dtype=torch.float32))  # as every backend takes it
    assert call["rows"] == rows and call["topk"] == topk and call["weight_scale"] == fp32_scale
    assert call["parallel_unit_num"] == max(512, rows)
    assert isinstance(call["workspace"], fake.FP4PrefillTopKWorkspace)
    assert isinstance(call["out"], fake.FP4PrefillTopKResult)
    # AITER wrote straight into the result it returned: no copy, no second buffer.
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(call["out"], got))
    width = wl.page_table.shape[1]
    assert call["max_seq_len"] == adapter.guarded_width(width) * 64
    assert call["block_tables"].shape[1] == adapter.guarded_width(width) + 4


def test_writes_into_callers_out(fake):
    wl = workload()
    out = allocate_result(wl.rows, wl.topk, "cpu")
    got = indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter", out=out)
    assert got is out or all(a is b for a, b in zip(got, out))
    assert_bitwise(out, expected())


def test_copies_when_aiter_returns_its_own_tensors(monkeypatch, fake):
    monkeypatch.setattr(fake, "RETURN_FRESH", True)
    wl = workload()
    out = allocate_result(wl.rows, wl.topk, "cpu")
    for t in out:
        t.fill_(7)
    indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter", out=out)
    assert_bitwise(out, expected())


def test_values_conform_to_the_contract(monkeypatch, fake):
    monkeypatch.setattr(fake, "CORRUPT_PADDING", True)
    wl = workload(pattern="nan_rows")
    got = indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter")
    want = expected(pattern="nan_rows")
    assert bool(torch.isnan(want.values).any())  # the case exercises NaN scores
    assert_bitwise(got, want)


def test_garbage_in_unused_page_table_columns_is_zeroed(fake):
    wl = workload()
    used = torch.arange(wl.page_table.shape[1])[None, :] * 64 < wl.seq_lens[:, None]
    page_table = torch.where(used, wl.page_table, torch.full_like(wl.page_table, -1))
    args = list(wl.args())
    args[5] = page_table
    got = indexer_topk.indexer_topk(*args, **wl.kwargs(), backend="aiter")
    assert_bitwise(got, expected())
    [call] = fake.CALLS
    assert int(call["block_tables"].min()) == 0


def test_without_allocator_or_result_type(monkeypatch, fake):
    monkeypatch.delattr(fake, "allocate_fp4_prefill_topk_workspace")
    monkeypatch.delattr(fake, "FP4PrefillTopKResult")
    wl = workload()
    got = indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter")
    assert_bitwise(got, expected())
    [call] = fake.CALLS
    assert call["workspace"] is None
    assert isinstance(call["out"], IndexerTopKResult)


def test_callers_aiter_workspace_is_passed_through(fake):
    wl = workload()
    ws = fake.allocate_fp4_prefill_topk_workspace(wl.rows, 600, wl.topk, "cpu")
    indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter", workspace=ws)
    [call] = fake.CALLS
    assert call["workspace"] is ws and call["parallel_unit_num"] == 600


def test_byte_workspace_is_not_handed_to_aiter(fake):
    wl = workload()
    scratch = torch.empty(1 << 16, dtype=torch.uint8)
    got = indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter", workspace=scratch)
    assert_bitwise(got, expected())
    [call] = fake.CALLS
    assert isinstance(call["workspace"], fake.FP4PrefillTopKWorkspace)


def test_allocator_with_another_signature_lets_aiter_allocate(monkeypatch, fake):
    monkeypatch.setattr(fake, "allocate_fp4_prefill_topk_workspace", lambda rows, k, device: None)
    wl = workload()
    indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter")
    [call] = fake.CALLS
    assert call["workspace"] is None


def test_empty_batch_does_not_call_aiter(fake):
    wl = workload()
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens = wl.args()
    args = (q[:0], q_scale[:0], k_cache, k_scale, weights[:0], page_table[:0], seq_lens[:0])
    got = indexer_topk.indexer_topk(*args, **wl.kwargs(), backend="aiter")
    assert got.values.shape == (0, 512) and got.counts.shape == (0,)
    assert fake.CALLS == []


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------

# A layout or topk AITER's kernel lacks is valid input it cannot serve: "unavailable", not a
# ValueError, so the benchmark and `check` do not count it as a failure.

@pytest.mark.parametrize("layout", ["sglang_mxfp4", "sglang_fp8"])
def test_rejects_other_layouts(fake, layout):
    wl = make_workload(layout, context_tokens=(1024,), rows_per_request=2)
    with pytest.raises(BackendUnavailable, match="aiter_mxfp4"):
        indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter")
    with pytest.raises(BackendUnavailable, match="^layout"):
        adapter.aiter_indexer_topk(wl.args(), topk=512, layout=Layout(layout), weight_scale=1.0)
    assert fake.CALLS == []


def test_rejects_topk_2048(fake):
    wl = workload()
    with pytest.raises(BackendUnavailable, match="^topk"):
        indexer_topk.indexer_topk(*wl.args(), **dict(wl.kwargs(), topk=2048), backend="aiter")
    assert fake.CALLS == []


@pytest.mark.parametrize(
    "variant,words",
    [
        ("missing", "aiter.ops.flydsl has no flydsl_pa_mqa_topk_fp4_prefill"),
        ("broken", "HIP runtime failed to initialise"),
        ("lazy_broken", "No module named 'flydsl'"),
        ("absent", "ModuleNotFoundError"),
    ],
)
def test_symbol_missing_is_unavailable(monkeypatch, variant, words):
    wl = workload()
    with fake_aiter.installed(monkeypatch, variant):
        with pytest.raises(BackendUnavailable, match="backend 'aiter' is not available") as info:
            indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter")
    assert words in str(info.value)


class _Props:
    def __init__(self, arch):
        self.gcnArchName = arch


@pytest.mark.parametrize(
    "device, hip, arch, words",
    [
        ("cpu", None, None, "the inputs are on cpu"),
        ("cuda", None, None, "this is a CUDA GPU"),
        ("cuda", "7.2", "gfx942:sramecc+:xnack-", "this GPU is gfx942"),
        ("cuda", "7.2", "", "unknown architecture"),
        ("cuda", "7.2", "gfx950:sramecc+:xnack-", None),
    ],
)
def test_device_problem(monkeypatch, device, hip, arch, words):
    """AITER ships its symbol on every ROCm GPU; only gfx950 runs the kernel."""
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _Props(arch))
    problem = adapter.device_problem(torch.device(device))
    assert problem is None if words is None else words in problem


def test_symbol_present_on_another_device_is_unavailable(monkeypatch):
    """With AITER's symbol importable, inputs it cannot take are refused before AITER runs."""
    wl = workload()
    with fake_aiter.installed(monkeypatch, "reference") as module:
        with pytest.raises(BackendUnavailable, match="inputs are on cpu"):
            indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="aiter")
        assert module.CALLS == []


# ---------------------------------------------------------------------------------------------
# Through the policy
# ---------------------------------------------------------------------------------------------

def test_auto_on_an_aiter_host_uses_aiter(monkeypatch, fake):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    gfx950 = PathPolicy(
        Probe(device="hip", device_name="AMD Instinct MI355X", gfx_arch="gfx950", triton_version="3.4.0",
              aiter_symbol=True),
        logger=logging.getLogger("indexer_topk.test"),
    )
    monkeypatch.setattr(policy, "default_policy", lambda: gfx950)
    wl = workload()
    got = indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="auto")
    assert_bitwise(got, expected())
    assert len(fake.CALLS) == 1
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert indexer_topk.resolve_backend("auto", layout="aiter_mxfp4") == "legacy"
