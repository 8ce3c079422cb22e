"""Workspaces an engine integration owns (indexer_topk.workspaces): sizes, reuse, growth, the
buffers a captured graph keeps, streams; and calls served from them against calls without."""

import threading

import pytest
import torch

import indexer_topk
from indexer_topk import workspaces as ws_module
from indexer_topk.compare import bitwise_equal
from indexer_topk.contract import allocate_result
from indexer_topk.workload import make_workload
from indexer_topk.workspaces import Workspaces

CPU = torch.device("cpu")


def test_a_key_keeps_one_buffer_while_its_rows_fit():
    pool = Workspaces()
    first = pool.get(8, 1024, "sglang_fp8", CPU)
    assert first.dtype == torch.uint8 and first.is_contiguous() and first.device == CPU
    assert first.numel() >= indexer_topk.workspace_size(8, 1024, "sglang_fp8", CPU)
    for rows in (0, 1, 7, 8):
        assert pool.get(rows, 1024, "sglang_fp8", CPU) is first
    # another topk or layout is another key
    other = pool.get(8, 512, "sglang_fp8", CPU)
    assert other is not first and pool.get(8, 1024, "sglang_mxfp4", CPU) is not first
    assert pool.get(8, 512, "sglang_fp8", CPU) is other
    assert pool.nbytes() == sum(pool.get(8, t, l, CPU).numel()
                                for t, l in ((1024, "sglang_fp8"), (512, "sglang_fp8"), (1024, "sglang_mxfp4")))


def test_bad_arguments_are_refused_with_or_without_a_buffer():
    pool = Workspaces()
    pool.get(8, 1024, "sglang_fp8", "cpu")  # a device by name
    for rows, topk, layout in ((-1, 1024, "sglang_fp8"), (True, 1024, "sglang_fp8"), (2.0, 1024, "sglang_fp8"),
                               (4, 100, "sglang_fp8"), (4, 1024, "nope")):
        with pytest.raises(ValueError, match="rows|topk|layout"):
            pool.get(rows, topk, layout, CPU)


def test_an_outgrown_buffer_is_replaced_for_twice_the_rows():
    pool = Workspaces()
    small = pool.get(8, 1024, "sglang_fp8", CPU)
    grown = pool.get(9, 1024, "sglang_fp8", CPU)
    assert grown is not small
    assert grown.numel() >= indexer_topk.workspace_size(16, 1024, "sglang_fp8", CPU)
    assert pool.get(16, 1024, "sglang_fp8", CPU) is grown
    assert pool.get(100, 1024, "sglang_fp8", CPU).numel() >= indexer_topk.workspace_size(100, 1024, "sglang_fp8", CPU)
    assert pool._kept == []  # none was handed out under capture: nothing to keep


def test_captured_calls_get_buffers_apart_and_keep_them(monkeypatch):
    """A graph replays the address it captured, on whatever stream is current then: calls made
    while capturing get buffers eager calls never get, and a captured buffer is never freed when
    a larger captured call replaces it (an eager one is)."""
    pool = Workspaces()
    capturing = [True]
    monkeypatch.setattr(ws_module, "is_capturing", lambda: capturing[0])
    monkeypatch.setattr(ws_module, "workspace_size", lambda rows, topk, layout, device: 64 * rows)  # never flat
    captured = pool.get(8, 1024, "sglang_fp8", CPU)
    capturing[0] = False
    eager = pool.get(8, 1024, "sglang_fp8", CPU)
    assert eager is not captured
    eager_grown = pool.get(20, 1024, "sglang_fp8", CPU)
    assert eager_grown is not eager and eager_grown.numel() == 64 * 20 and pool._kept == []
    capturing[0] = True
    assert pool.get(8, 1024, "sglang_fp8", CPU) is captured
    bigger = pool.get(9, 1024, "sglang_fp8", CPU)
    assert bigger is not captured and bigger.numel() == 64 * 16  # twice the rows it outgrew
    assert len(pool._kept) == 1 and pool._kept[0] is captured
    assert pool.nbytes() == captured.numel() + bigger.numel() + eager_grown.numel()


def test_a_buffer_that_holds_the_grown_rows_is_not_replaced(monkeypatch):
    """The scratch stops growing with the rows once every program holds a tile: a larger call
    then keeps the buffer (nothing new, nothing kept)."""
    pool = Workspaces()
    monkeypatch.setattr(ws_module, "is_capturing", lambda: True)
    monkeypatch.setattr(ws_module, "workspace_size", lambda rows, topk, layout, device: 64 * min(rows, 10))
    first = pool.get(6, 1024, "sglang_fp8", CPU)
    second = pool.get(7, 1024, "sglang_fp8", CPU)  # outgrown in bytes too: replaced for 12 rows, the first kept
    assert second is not first and second.numel() == 64 * 10 and pool._kept == [first]
    assert pool.get(1000, 1024, "sglang_fp8", CPU) is second and len(pool._kept) == 1


def test_each_stream_has_its_own(monkeypatch):
    pool = Workspaces()
    stream = [7]
    monkeypatch.setattr(ws_module, "_stream_of", lambda device: (0, stream[0], None))
    a = pool.get(8, 1024, "sglang_fp8", CPU)
    stream[0] = 9
    b = pool.get(8, 1024, "sglang_fp8", CPU)
    assert a is not b
    stream[0] = 7
    assert pool.get(8, 1024, "sglang_fp8", CPU) is a


def test_threads_asking_at_once_get_one_buffer():
    pool = Workspaces()
    got, start = [], threading.Barrier(4)

    def ask():
        start.wait()
        got.append(pool.get(32, 1024, "sglang_fp8", CPU))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)


def test_outgrowing_the_rows_without_outgrowing_the_bytes_keeps_the_buffer(monkeypatch):
    """workspace_size stops growing once every program slot holds a group (the fused plan is
    fixed from ``slots * group`` rows on): a buffer that already holds a larger call's bytes is
    kept, not replaced by one of the same size (and, captured, kept twice for life)."""
    small, large = 64, 4096
    assert indexer_topk.workspace_size(small, 512, "sglang_fp8", CPU) == indexer_topk.workspace_size(large, 512, "sglang_fp8", CPU)
    pool = Workspaces()
    monkeypatch.setattr(ws_module, "is_capturing", lambda: True)
    first = pool.get(small, 512, "sglang_fp8", CPU)
    again = pool.get(large, 512, "sglang_fp8", CPU)
    assert again is first, "a buffer already large enough was replaced"
    assert pool._kept == [] and pool.nbytes() == first.numel()


def test_threads_on_the_per_thread_default_stream_get_a_key_each(monkeypatch):
    """``cudaStreamPerThread`` (handle 0x2, reachable as torch.cuda.ExternalStream(2)) is one
    handle for a different stream in each thread: streams that run at once, so each thread is a
    key of its own. (torch's own default stream is the legacy stream, handle 0, one stream for
    every thread: sharing it is sound.)"""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 2, raising=False)
    dev = torch.device("cuda", 0)
    keys = []
    t = threading.Thread(target=lambda: keys.append(ws_module._stream_of(dev)))
    t.start()
    t.join()
    keys.append(ws_module._stream_of(dev))
    assert keys[0] != keys[1], "two threads' per-thread default streams share one workspace key"


@pytest.mark.parametrize("backend", ["legacy", "fused"])
def test_calls_served_from_one_buffer_match_calls_without(backend):
    """Calls of different shapes and scores through one pool's buffer (poisoned between calls)
    give the bits of calls that allocate their own scratch."""
    pool = Workspaces()
    for seed, rows, tokens in ((1, 6, 2048), (2, 3, 4500), (3, 6, 900)):
        w = make_workload("sglang_fp8", context_tokens=[tokens], rows_per_request=[rows], topk=512, seed=seed)
        buf = pool.get(w.rows, w.topk, "sglang_fp8", CPU)
        buf.fill_(0xA5)  # whatever the last call left there
        out = allocate_result(w.rows, w.topk, "cpu")
        for t in out:
            t.view(torch.uint8).fill_(0xFF)
        got = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out, workspace=buf,
                                        check_values=False)
        want = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend=backend, check_values=False)
        assert bitwise_equal(got, want), (seed, rows, tokens)


@pytest.mark.gpu
def test_two_streams_get_two_buffers_gpu():
    pool = Workspaces()
    dev = torch.device("cuda", torch.cuda.current_device())
    a = pool.get(8, 1024, "sglang_fp8", dev)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        b = pool.get(8, 1024, "sglang_fp8", dev)
        assert pool.get(4, 1024, "sglang_fp8", dev) is b
    assert a is not b and pool.get(8, 1024, "sglang_fp8", dev) is a
    assert a.device == dev and b.device == dev
