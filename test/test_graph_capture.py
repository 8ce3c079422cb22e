"""CUDA graph capture: the legacy and fused paths capture and replay with new inputs correctly
(the policy keeps captured calls on legacy until the fused path is proven there: this is the
proof), and ``auto`` resolves to legacy under capture."""

import functools

import pytest
import torch

import indexer_topk as it
from indexer_topk.bench.mix import capture_graph
from kernel_cases import assert_bitwise, decode_batch, load_batch


@functools.lru_cache(maxsize=None)
def _pair(device):
    """Two workloads of one shape (built once; captures copy them, nothing mutates them)."""
    make = lambda seed: it.make_workload(  # noqa: E731
        "sglang_fp8", context_tokens=[65536, 20000], rows_per_request=[40, 24], topk=512, seed=seed, device=device
    )
    return make(1), make(2)


@functools.lru_cache(maxsize=None)
def _eager_legacy(device):
    w2 = _pair(device)[1]
    return it.indexer_topk(*w2.args(), **w2.kwargs(), backend="legacy")


def _capture(backend, w, out, workspace):
    static = [t.clone() if t is not None else None for t in w.args()]
    kw = dict(w.kwargs(), backend=backend, out=out, workspace=workspace, check_values=False)
    return capture_graph(lambda: it.indexer_topk(*static, **kw)), static


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["legacy", "fused"])
def test_capture_then_replay_with_new_inputs(backend):
    w1, w2 = _pair("cuda")
    out = it.allocate_result(w1.rows, w1.topk, "cuda")
    ws = None
    if backend == "fused":
        ws = torch.empty(it.workspace_size(w1.rows, w1.topk, w1.layout.value, "cuda"), dtype=torch.uint8, device="cuda")
    graph, static = _capture(backend, w1, out, ws)
    load_batch(static, w2.args())
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(out, _eager_legacy("cuda"), f"{backend} replayed with new inputs")


@pytest.mark.gpu
def test_policy_routes_capture_to_legacy():
    """Inside a capture, ``auto`` resolves to the legacy path whatever the frozen fused path is."""
    from indexer_topk.api import resolve_backend

    seen = []
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(1, device="cuda")
    with torch.cuda.graph(graph):
        seen.append(resolve_backend("auto", layout="sglang_fp8", topk=512))
        x += 1
    assert seen == ["legacy"]


# ---------------------------------------------------------------------------------------------
# The operator form (torch.ops.indexer_topk.indexer_topk_out) at decode shapes
# ---------------------------------------------------------------------------------------------

def _decode_pair(device, layout):
    """Two decode batches of one shape, each with its own queries, keys and page tables."""
    return decode_batch(layout, 3, device), decode_batch(layout, 4, device)


@pytest.mark.gpu
@pytest.mark.parametrize("rows_per_request", [1, None], ids=["one_row_per_item", "no_hint"])
@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4"])
def test_capture_decode_operator_then_replay_with_new_queries_lengths_and_pages(layout, rows_per_request):
    """A decode step through the out operator (fused backend, caller-owned workspace, no value
    checks; one row per work item with the decode hint, else pairs scored a row per pass)
    captured once, replayed with another batch's queries, keys and page tables and with shorter
    lengths written into the captured buffers: legacy's eager bits."""
    w1, w2 = _decode_pair("cuda", layout)
    static = [t.clone() if t is not None else None for t in w1.args()]
    out = it.allocate_result(w1.rows, w1.topk, "cuda")
    ws = torch.empty(it.workspace_size(w1.rows, w1.topk, layout, "cuda"), dtype=torch.uint8, device="cuda")

    def step():
        torch.ops.indexer_topk.indexer_topk_out(*static, w1.topk, layout, *out, ws, w1.weight_scale, "fused", False,
                                                rows_per_request)

    graph = capture_graph(step)
    new = load_batch(static, w2.args(), [5000, 24576, 1, 1024, 32768, 0, 30000, 16384])
    for t in out:
        t.view(torch.int32).fill_(-12345)
    graph.replay()
    torch.cuda.synchronize()
    want = it.indexer_topk(*new, **w2.kwargs(), backend="legacy")
    assert_bitwise(out, want, f"{layout} decode operator replayed with new inputs")


@pytest.mark.gpu
def test_decode_operator_under_torch_compile_without_a_graph_break():
    w = _decode_pair("cuda", "sglang_fp8")[0]
    out = it.allocate_result(w.rows, w.topk, "cuda")
    ws = torch.empty(it.workspace_size(w.rows, w.topk, "sglang_fp8", "cuda"), dtype=torch.uint8, device="cuda")

    @torch.compile(fullgraph=True)
    def step(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens):
        torch.ops.indexer_topk.indexer_topk_out(q, q_scale, k_cache, k_scale, weights * 1.0, page_table, seq_lens,
                                                w.topk, "sglang_fp8", *out, ws, w.weight_scale, "fused", False, 1)
        return out.counts + 0

    counts = step(*w.args())
    torch.cuda.synchronize()
    want = it.indexer_topk(*w.args(), **w.kwargs(), backend="legacy")
    assert_bitwise(out, want, "compiled decode operator")
    assert torch.equal(counts, want.counts)
