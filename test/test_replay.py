"""The host path after a signature's first call (:mod:`indexer_topk.calls`, :mod:`indexer_topk.replay`):
replayed launches give the full path's bits on new tensors, and everything that depends on
addresses, values or the environment is still checked on every call."""

import pytest
import torch

import indexer_topk
from indexer_topk import api
from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.bench.mix import capture_graph
from indexer_topk.calls import disjoint, signature
from indexer_topk.contract import allocate_result
from indexer_topk.envs import envs
from indexer_topk.replay import Recorder, launch
from indexer_topk.workload import make_workload

from kernel_cases import assert_bitwise

POISON = -12345


@pytest.fixture(autouse=True)
def fresh_signatures():
    api._KNOWN.clear()
    yield
    api._KNOWN.clear()


def batch(layout="sglang_fp8", seed=1, rows=3, tokens=3000, topk=512, pattern="random"):
    return make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=topk, seed=seed, device="cpu",
                         pattern=pattern)


def poisoned(w):
    out = allocate_result(w.rows, w.topk, "cpu")
    for t in out:
        t.view(torch.int32).fill_(POISON)
    return out


def full_path(w, backend):
    with envs.INDEXER_TOPK_REPLAY.override(False):
        return indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend=backend)


def replays_of(backend):
    return [c.replays.get(backend) for c in api._KNOWN._calls.values() if backend in c.replays]


@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
@pytest.mark.parametrize("backend,kth", [("fused", "torch"), ("legacy", "radix"), ("legacy", "rows")])
def test_replayed_calls_give_the_full_paths_bits_on_new_tensors(layout, backend, kth, monkeypatch):
    """Three calls of one signature on fresh tensors (new addresses, new values), into poisoned
    outputs with a caller's workspace: the second and third are replays, bit for bit the full path."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", kth)
    for seed, pattern in ((1, "random"), (2, "equal"), (3, "increasing")):
        w = batch(layout, seed=seed, pattern=pattern)
        out = poisoned(w)
        workspace = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, layout), dtype=torch.uint8)
        indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out, workspace=workspace,
                                  check_values=False)
        assert_bitwise(out, full_path(w, backend), f"{backend} call {seed}, {layout}")
    replays = replays_of(backend)
    assert len(replays) == 1 and replays[0] is not None, "one signature, replayed"


def test_a_call_without_out_or_workspace_replays_into_fresh_tensors(monkeypatch):
    """The functional form: each call returns its own outputs (the replay allocates them, and the
    fused backend's scratch, anew)."""
    first = indexer_topk.indexer_topk(*batch(seed=1).args(), **batch(seed=1).kwargs(), backend="fused")
    w = batch(seed=2)
    second = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused")
    assert replays_of("fused")[0] is not None
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, second))
    assert_bitwise(second, full_path(w, "fused"), "functional replay")
    assert_bitwise(first, full_path(batch(seed=1), "fused"), "the first call's outputs are not overwritten")


def test_host_work_beyond_launches_is_not_replayed(monkeypatch):
    """legacy with torch.topk on the host: recorded as not replayable, and every call still right."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "torch")
    for seed in (1, 2):
        w = batch(seed=seed)
        out = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="legacy", out=poisoned(w))
        assert_bitwise(out, full_path(w, "legacy"), f"call {seed}")
    assert replays_of("legacy") == [None]


def test_aliasing_is_checked_on_every_call():
    """A signature replayed before: an output that shares bytes with an input is still refused,
    with validation's message."""
    w = batch(seed=1)
    indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned(w))
    indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned(w))
    out = poisoned(w)
    args = list(w.args())
    args[6] = out.counts  # seq_lens is the counts output: same dtype, shape and alignment
    out.counts.copy_(w.args()[6])
    with pytest.raises(ValueError, match="aliases an input"):
        indexer_topk.indexer_topk(*args, **w.kwargs(), backend="fused", out=out)


def test_an_overlapping_call_leaves_the_signatures_record(monkeypatch):
    """A call whose tensors overlap (as far as the byte spans tell) takes the full path and
    neither replaces the signature's record nor records its own launches; the next disjoint
    call replays the first record."""
    w = batch(seed=1)
    indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned(w))
    (first,) = replays_of("fused")
    assert first is not None
    monkeypatch.setattr(api, "disjoint", lambda ptrs, lengths, sized=None: False)
    w2 = batch(seed=2)
    out = indexer_topk.indexer_topk(*w2.args(), **w2.kwargs(), backend="fused", out=poisoned(w2))
    assert_bitwise(out, full_path(w2, "fused"), "overlapping call")
    assert replays_of("fused") == [first]
    monkeypatch.undo()
    w3 = batch(seed=3)
    out = indexer_topk.indexer_topk(*w3.args(), **w3.kwargs(), backend="fused", out=poisoned(w3))
    assert_bitwise(out, full_path(w3, "fused"), "the call after")
    assert replays_of("fused") == [first]


def test_values_are_checked_on_a_replayed_signature():
    w = batch(seed=1)
    indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned(w))
    args = list(w.args())
    args[5] = args[5].clone()
    args[5][0, 0] = 10**6  # a page id past the cache
    with pytest.raises(ValueError, match="page_table"):
        indexer_topk.indexer_topk(*args, **w.kwargs(), backend="fused", out=poisoned(w))


def test_argument_types_are_told_apart_from_equal_values():
    """``check_values=1`` equals ``True`` as a key, but validation refuses it: so must a call of
    a signature first seen with ``True``."""
    w = batch(seed=1)
    indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned(w), check_values=True)
    with pytest.raises(ValueError, match="check_values"):
        indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned(w), check_values=1)
    kwargs = w.kwargs()
    kwargs["topk"] = float(w.topk)
    with pytest.raises(ValueError, match="topk"):
        indexer_topk.indexer_topk(*w.args(), **kwargs, backend="fused", out=poisoned(w))



@pytest.mark.parametrize("backend", ["reference", "legacy"])
def test_a_negative_zero_weight_scale_is_told_apart_from_zero(backend):
    """``-0.0 == 0.0`` (and they hash alike), but a zero scale's sign decides the ranking (``+0``
    above ``-0``): a call with one after a call with the other, same shapes, gets its own bits."""
    w = batch(seed=4)

    def call(scale):
        kwargs = {**w.kwargs(), "weight_scale": scale}
        return indexer_topk.indexer_topk(*w.args(), **kwargs, backend=backend, check_values=False)

    with envs.INDEXER_TOPK_REPLAY.override(False):
        positive, negative = call(0.0), call(-0.0)  # (a dict keyed by the scales would hold one)
    assert not torch.equal(positive.raw_indices, negative.raw_indices), "the sign must matter here"
    for first, second, truth in ((0.0, -0.0, negative), (-0.0, 0.0, positive)):
        api._KNOWN.clear()
        call(first)
        assert_bitwise(call(second), truth, f"{second} after {first}")

def test_an_environment_flag_the_recorded_call_read_invalidates_its_replay(monkeypatch):
    """A flag the backend read while recorded, changed since: the call is recorded again."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "radix")
    w = batch(seed=1)
    want = full_path(w, "legacy")
    calls = []
    real = legacy_backend.legacy_score

    def score(*a, **k):  # a backend that reads a flag on its host path
        calls.append(envs.INDEXER_TOPK_HOPPER_STREAM.get())
        return real(*a, **k)

    monkeypatch.setattr(legacy_backend, "legacy_score", score)
    for flag in ("1", "1", "0", "0"):
        with envs.INDEXER_TOPK_HOPPER_STREAM.override(flag):
            out = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="legacy", out=poisoned(w))
        assert_bitwise(out, want, f"flag {flag}")
    assert calls == [True, False], "recorded, replayed, recorded again under the new value, replayed"


def test_replay_can_be_switched_off():
    w = batch(seed=1)
    with envs.INDEXER_TOPK_REPLAY.override("0"):
        for _ in range(2):
            indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned(w))
    assert len(api._KNOWN) == 0


def test_unusual_arguments_take_the_full_path():
    w = batch(seed=1)

    class Sub(torch.Tensor):
        pass

    args = list(w.args())
    args[4] = args[4].as_subclass(Sub)
    key, _ = signature(args, ())
    assert key is None
    out = indexer_topk.indexer_topk(*args, **w.kwargs(), backend="fused", out=poisoned(w))
    assert_bitwise(out, full_path(w, "fused"), "tensor subclass")
    with pytest.raises(ValueError, match="layout"):
        indexer_topk.indexer_topk(*w.args(), topk=w.topk, layout=["sglang_fp8"], backend="fused")


def test_disjoint():
    assert disjoint([0, 10, None], [10, 5, 0])
    assert not disjoint([0, 9], [10, 5])
    assert disjoint([0, 0], [10, 0])  # an empty tensor shares no byte
    # spans out of address order: one inside another, two that touch, two that share a byte
    assert not disjoint([100, 0, 120], [10, 200, 5])
    assert not disjoint([100, 0, 120], [10, 200, 5], sized=(0, 1, 2))
    assert disjoint([20, 0, 10], [5, 10, 10], sized=(0, 1, 2))
    assert not disjoint([20, 0, 10], [5, 11, 10], sized=(0, 1, 2))


def test_recorder_marks_host_work_and_stray_arguments():
    """Views are free and allocations are steps; any other torch operation, or a kernel argument
    outside the call's tensors, makes the call not replayable."""
    root = torch.zeros(64, dtype=torch.uint8)
    with Recorder([root]) as rec:
        root.view(torch.int32)[:4]
        torch.empty(8, dtype=torch.int32)
    assert rec.why_not is None and len(rec.steps) == 1
    with Recorder([root]) as rec:
        root.zero_()
    assert "zero_" in rec.why_not and rec.replay() is None

    class Kernel:  # what the recorder reads of a kernel, and a launch that does nothing
        arg_names = ["x"]

        def __getitem__(self, grid):
            return lambda *a, **k: None

    with Recorder([root]) as rec:
        launch(Kernel(), (1,), root[8:])
    assert rec.why_not is None and rec.steps[0].tensors[0][1:3] == (0, 8)
    stray = torch.zeros(4)
    with Recorder([root]) as rec:
        launch(Kernel(), (1,), stray)
    assert "lies in 0" in rec.why_not



def test_a_replay_makes_its_scratch_in_one_allocation():
    """The recorded call's scratch tensors (any dtypes, shapes, strides, empty ones too) are made
    as one allocation at replay, each at its own aligned offset, none overlapping another, with the
    recorded shape and strides, on the current call's roots."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from indexer_topk.replay import SCRATCH_ALIGN

    seen = []

    class Kernel:  # records what each launch is given
        arg_names = ["a", "b", "c"]

        def __getitem__(self, grid):
            return lambda *a, **k: seen.append(a)

    def call(root):
        a = torch.empty(5, dtype=torch.int32)
        b = torch.empty_strided((3, 4), (8, 1), dtype=torch.float64)
        torch.empty(0, dtype=torch.uint8)  # allocated, never launched with (no address to follow)
        d = torch.empty(7, dtype=torch.int64)
        launch(Kernel(), (1,), a, b, d)
        launch(Kernel(), (1,), root[4:], b, a)

    root = torch.zeros(64, dtype=torch.uint8)
    with Recorder([root]) as rec:
        call(root)
    replay = rec.replay()
    assert replay is not None and len(seen) == 2
    recorded = seen[:]
    seen.clear()

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default) and out.numel():
                Count.n += 1  # (the interpreter's views of it start as empty tensors: not counted)
            return out

    other = torch.zeros(64, dtype=torch.uint8)
    with Count():
        replay.run([other], [other.data_ptr()], 0)
    assert Count.n == 1, "one allocation of memory for the call's four scratch tensors"
    assert replay.scratch_bytes == 3 * SCRATCH_ALIGN, "20, 160 and 56 bytes, each at an aligned offset"
    first, second = seen
    for new, old in zip(first, recorded[0]):
        assert (new.dtype, new.shape, new.stride()) == (old.dtype, old.shape, old.stride())
    base = min(t.data_ptr() for t in first if t.numel())
    spans = sorted((t.data_ptr(), t.data_ptr() + storage_bytes(t)) for t in first)
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert e0 <= s1, "scratch tensors overlap"
    assert all((t.data_ptr() - base) % SCRATCH_ALIGN == 0 for t in first)
    assert second[0].data_ptr() == other.data_ptr() + 4, "the root's view follows the new root"
    assert second[1].data_ptr() == first[1].data_ptr() and second[2].data_ptr() == first[0].data_ptr()


def test_a_compiled_replay_gives_each_scratch_tensor_its_own_bytes():
    """Compiled launches get addresses, not tensors: each scratch tensor's at its offset in the one
    allocation, past the whole of the tensor before it (strided ones too: a key matrix of padded
    rows, a stride-0 broadcast), and every argument keeps its byte offset into its tensor."""
    from indexer_topk.replay import SCRATCH_ALIGN

    got = []

    class Compiled:  # what the recorder reads of a compiled launch, and a launcher that records
        function, packed_metadata = 0, None

        def run(self, gx, gy, gz, stream, function, metadata, h1, h2, h3, *params):
            got.append(params)

    class Kernel:
        arg_names = ["a", "b", "c"]

        def __getitem__(self, grid):
            def go(*args, **kwargs):
                got.append(tuple(t.data_ptr() for t in args))
                return Compiled()
            return go

    root = torch.zeros(64, dtype=torch.uint8)
    with Recorder([root]) as rec:
        keys = torch.empty_strided((3, 100), (256, 1), dtype=torch.float32)  # 2,448 bytes
        flat = torch.empty(5000, dtype=torch.int32)  # 20,000 bytes
        wide = torch.empty(4, dtype=torch.int64).expand(6, 4)  # stride 0: 32 bytes
        launch(Kernel(), (1,), keys[1:], flat[100:], wide)
        launch(Kernel(), (1,), root[16:], keys, flat)
    replay = rec.replay()
    assert replay is not None and replay.compiled
    sizes = [keys.untyped_storage().nbytes(), flat.untyped_storage().nbytes(), wide.untyped_storage().nbytes()]
    allocs = [s for s in replay.steps if not hasattr(s, "run")]
    assert [a.nbytes for a in allocs] == sizes == [2448, 20000, 32]
    assert replay.scratch_bytes == sum(-(-n // SCRATCH_ALIGN) * SCRATCH_ALIGN for n in sizes)
    got.clear()
    other = torch.zeros(64, dtype=torch.uint8)
    replay.run([other], [other.data_ptr()], 0)
    (k1, f1, w1), (r2, k2, f2) = got
    assert r2 == other.data_ptr() + 16
    assert (k1 - k2, f1 - f2) == (1024, 400), "each argument keeps its offset into its tensor"
    starts = sorted([(k2, sizes[0]), (f2, sizes[1]), (w1, sizes[2])])
    for (a, n), (b, _) in zip(starts, starts[1:]):
        assert a + n <= b, "scratch tensors overlap"
    assert all((a - starts[0][0]) % SCRATCH_ALIGN == 0 for a, _ in starts)


def storage_bytes(t):
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()

def gpu_batch(layout, seed, decode):
    if decode:
        return make_workload(layout, context_tokens=[131072] * 8, rows_per_request=[1] * 8, topk=1024, seed=seed,
                             device="cuda")
    return make_workload(layout, context_tokens=[65536], rows_per_request=[128], topk=1024, seed=seed, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [False, True], ids=["prefill_128x64K", "decode_8x128K"])
@pytest.mark.parametrize("backend", ["fused", "legacy"])
@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
def test_compiled_replays_give_the_full_paths_bits(layout, backend, decode):
    """On the GPU a replay launches through the CUDA driver (tensor descriptors encoded over the
    new addresses): three calls on fresh tensors through the out operator, into poisoned
    outputs, bit for bit the full path; then the step captured in a CUDA graph and replayed with
    a new batch copied into its inputs."""
    hint = 1 if decode else None
    ws = None
    for seed in (1, 2, 3):
        w = gpu_batch(layout, seed, decode)
        if ws is None:
            ws = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, layout), dtype=torch.uint8, device="cuda")
        out = allocate_result(w.rows, w.topk, "cuda")
        for t in out:
            t.view(torch.int32).fill_(POISON)
        torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, layout, *out, ws, w.weight_scale, backend, False,
                                                hint)
        with envs.INDEXER_TOPK_REPLAY.override(False):
            want = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend=backend, rows_per_request=hint)
        assert_bitwise(out, want, f"{layout} {backend} call {seed}")
    # both ways of legacy's select ("rows" and, below ROWS_MIN_ROWS rows, "split") only launch
    assert replays_of(backend)[0] is not None
    # and, with driver launches on, every launch is replayed through the CUDA driver
    launches = [s for s in replays_of(backend)[0].steps if hasattr(s, "driver")]
    if envs.INDEXER_TOPK_DRIVER_LAUNCH.get():
        assert launches and all(s.driver is not None for s in launches), [s.driver for s in launches]
    step = lambda: torch.ops.indexer_topk.indexer_topk_out(  # noqa: E731
        *w.args(), w.topk, layout, *out, ws, w.weight_scale, backend, False, hint)
    graph = capture_graph(step)
    fresh = gpu_batch(layout, 9, decode)
    for dst, src in zip(w.args(), fresh.args()):
        if dst is not None:
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    with envs.INDEXER_TOPK_REPLAY.override(False):
        want = indexer_topk.indexer_topk(*fresh.args(), **fresh.kwargs(), backend=backend, rows_per_request=hint)
    assert_bitwise(out, want, f"{layout} {backend}, graph replayed with a new batch")


def test_auto_is_routed_once_per_signature_capture_and_policy(monkeypatch):
    """A replayed ``auto`` call asks the policy once per signature, and again when a capture
    starts or the process's policy is rebuilt (tests only), never reusing a stale answer."""
    from indexer_topk import policy as policy_module

    asked = []
    real_route = policy_module.PathPolicy.route

    def counting_route(self, **kw):
        asked.append(kw.get("capturing"))
        return real_route(self, **kw)

    monkeypatch.setattr(policy_module.PathPolicy, "route", counting_route)
    w = batch()
    for _ in range(3):
        indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="auto", check_values=False)
    first = len(asked)
    assert first >= 1 and asked[-1] is False  # the first call's route, then the signature's kept one
    indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="auto", check_values=False)
    assert len(asked) == first
    monkeypatch.setattr(api, "is_capturing", lambda: True)
    indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="auto", check_values=False)
    assert len(asked) == first + 1 and asked[-1] is True
    policy_module._clear_default_policy()
    try:
        indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="auto", check_values=False)
        assert len(asked) == first + 2
    finally:
        policy_module._clear_default_policy()


@pytest.mark.gpu
def test_driver_launches_restart_their_map_cache_between_launches(monkeypatch):
    """The fused FP8 path's stream takes three tensor maps; replays whose queries land at new
    addresses keep encoding maps. With the cache bound cut to 4, it starts over every few calls:
    every replay is still bit for bit the full path (a map freed while a launch still pointed at
    it would read another buffer)."""
    from indexer_topk.kernels import driver_launch

    monkeypatch.setattr(driver_launch, "_TMAPS_KEPT", 4)
    w = gpu_batch("sglang_fp8", 1, False)
    ws = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, "sglang_fp8"), dtype=torch.uint8, device="cuda")
    keep = []  # the moved queries stay allocated: each call's addresses are new
    for i in range(12):
        args = list(w.args())
        args[0] = args[0].clone()
        keep.append(args[0])
        out = allocate_result(w.rows, w.topk, "cuda")
        torch.ops.indexer_topk.indexer_topk_out(*args, w.topk, "sglang_fp8", *out, ws, w.weight_scale, "fused", False,
                                                None)
        with envs.INDEXER_TOPK_REPLAY.override(False):
            want = indexer_topk.indexer_topk(*args, **w.kwargs(), backend="fused")
        assert_bitwise(out, want, f"replay {i}")
    launches = [s for s in replays_of("fused")[0].steps if getattr(s, "driver", None) is not None]
    assert any(s.driver.desc_slots for s in launches)
