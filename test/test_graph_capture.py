"""CUDA graph capture: the legacy and fused paths capture and replay with new inputs correctly
(the policy keeps captured calls on legacy until the fused path is proven there: this is the
proof), and ``auto`` resolves to legacy under capture."""

import functools

import pytest
import torch

import indexer_topk as it
from kernel_cases import assert_bitwise


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
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up compiles the kernels outside the capture
        it.indexer_topk(*static, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        it.indexer_topk(*static, **kw)
    return graph, static


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["legacy", "fused"])
def test_capture_then_replay_with_new_inputs(backend):
    w1, w2 = _pair("cuda")
    out = it.allocate_result(w1.rows, w1.topk, "cuda")
    ws = None
    if backend == "fused":
        ws = torch.empty(it.workspace_size(w1.rows, w1.topk, w1.layout.value, "cuda"), dtype=torch.uint8, device="cuda")
    graph, static = _capture(backend, w1, out, ws)
    for dst, src in zip(static, w2.args()):
        if dst is not None:
            dst.copy_(src)
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
