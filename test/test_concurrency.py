"""No shared mutable state: module-level tensors, concurrent callers, the frozen policy.

The Triton interpreter is not built for threads (it patches ``triton.language`` during a
launch), so the package serialises interpreted launches; CPU threads here call the kernels
through it as well as the reference path, validation and the policy. Kernel launches from
threads on their own CUDA streams are the GPU test here (marker ``gpu``) and the two-stream
test of the fused backend.
"""

import importlib
import pkgutil
import threading

import pytest
import torch

import indexer_topk as it
from indexer_topk import policy
from kernel_cases import assert_bitwise


THREAD_LAYOUTS = ["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4", "sglang_fp8"] * 2


def run_in_threads(n, work):
    """Run ``work(i)`` for ``i < n`` on ``n`` threads released together; the ``(i, exception)``
    of every thread that raised."""
    errors = []
    start = threading.Barrier(n)

    def run(i):
        try:
            start.wait()
            work(i)
        except Exception as exc:  # surfaced by the caller with the thread's index
            errors.append((i, exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _all_modules():
    pkg = importlib.import_module("indexer_topk")
    names = ["indexer_topk"]
    for info in pkgutil.walk_packages(pkg.__path__, "indexer_topk."):
        if info.name.endswith("__main__"):
            continue  # importing it runs the command line
        names.append(info.name)
    return [importlib.import_module(n) for n in names]


def _tensors_in(value, depth=0):
    if isinstance(value, torch.Tensor):
        return True
    if depth < 2 and isinstance(value, dict):
        return any(_tensors_in(v, depth + 1) for v in value.values())
    if depth < 2 and isinstance(value, (list, tuple, set)):
        return any(_tensors_in(v, depth + 1) for v in value)
    return False


def test_no_module_level_tensors():
    """No module keeps a tensor (a buffer two callers could share) at module level."""
    offenders = [
        f"{m.__name__}.{name}"
        for m in _all_modules()
        for name, value in vars(m).items()
        if not name.startswith("__") and _tensors_in(value)
    ]
    assert offenders == []


def test_threads_get_the_sequential_results():
    """Eight threads calling the operator on their own inputs get what one thread gets."""
    wls = [
        it.make_workload(layout, context_tokens=[2000 + 500 * i, 700], rows_per_request=[2, 1], topk=512, seed=i)
        for i, layout in enumerate(THREAD_LAYOUTS)
    ]
    expected = [it.indexer_topk(*w.args(), **w.kwargs(), backend="reference") for w in wls]
    results = [None] * len(wls)

    def work(i):
        for _ in range(3):
            results[i] = it.indexer_topk(*wls[i].args(), **wls[i].kwargs(), backend="reference")

    assert run_in_threads(len(wls), work) == []
    for i, (got, exp) in enumerate(zip(results, expected)):
        assert_bitwise(got, exp, f"thread {i}")


def test_threads_launching_interpreted_kernels():
    """Four threads calling the fused and legacy backends at once under the interpreter (which
    fails when two interpreted launches overlap): every call succeeds with the sequential bits."""
    wls = [
        it.make_workload(layout, context_tokens=[1500 + 400 * i], rows_per_request=[2], topk=512, seed=40 + i)
        for i, layout in enumerate(["sglang_fp8", "sglang_mxfp4"])
    ]
    jobs = [(w, b) for w in wls for b in ("fused", "legacy")]
    expected = [it.indexer_topk(*w.args(), **w.kwargs(), backend=b) for w, b in jobs]
    results = [None] * len(jobs)

    def work(i):
        w, b = jobs[i]
        results[i] = it.indexer_topk(*w.args(), **w.kwargs(), backend=b)

    assert run_in_threads(len(jobs), work) == []
    for (w, b), got, exp in zip(jobs, results, expected):
        assert_bitwise(got, exp, f"{w.layout.value} {b}")


def test_default_policy_is_built_once_across_threads():
    """Threads racing for the process policy all get the same frozen object."""
    policy.default_policy.cache_clear()
    try:
        got = []
        assert run_in_threads(8, lambda i: got.append(policy.default_policy())) == []
        assert len(got) == 8 and all(p is got[0] for p in got)
    finally:
        policy.default_policy.cache_clear()


@pytest.mark.gpu
def test_gpu_threads_with_their_own_streams():
    """Eight threads, each with its own CUDA stream, workspace and outputs, calling ``auto``
    (the fused path), ``legacy`` and ``fused`` three times each while the others run: every
    result equals what one thread gets on the default stream."""
    wls = [
        it.make_workload(layout, context_tokens=[65536 + 4096 * i, 9000], rows_per_request=[6, 3], topk=1024,
                         seed=30 + i, device="cuda")
        for i, layout in enumerate(THREAD_LAYOUTS)
    ]
    expected = [it.indexer_topk(*w.args(), **w.kwargs(), backend="legacy") for w in wls]
    torch.cuda.synchronize()
    results = [[] for _ in wls]

    def work(i):
        w = wls[i]
        stream = torch.cuda.Stream()
        ws = torch.empty(it.workspace_size(w.rows, w.topk, w.layout.value, "cuda"), dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(stream):
            for backend in ("auto", "legacy", "fused") * 3:
                out = it.allocate_result(w.rows, w.topk, "cuda")
                kw = {"workspace": ws} if backend != "legacy" else {}
                results[i].append((backend, it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out,
                                                            check_values=False, **kw)))
        stream.synchronize()

    assert run_in_threads(len(wls), work) == []
    for i, (runs, exp) in enumerate(zip(results, expected)):
        assert len(runs) == 9
        for backend, got in runs:
            assert_bitwise(got, exp, f"thread {i}, {backend}")
