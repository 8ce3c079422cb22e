"""Edge cases of the replay path (:mod:`indexer_topk.calls`, :mod:`indexer_topk.replay`): a
second or later call of a signature must give the full path's bits (``INDEXER_TOPK_REPLAY=0``),
write nothing outside its outputs and workspace, and refuse what the full path refuses."""

import dataclasses
import threading

import numpy as np
import pytest
import torch

import indexer_topk as it
from indexer_topk import api
from indexer_topk.backends import fused as fused_backend
from indexer_topk.compare import bitwise_equal
from indexer_topk.contract import IndexerTopKResult
from indexer_topk.envs import envs
from indexer_topk.guards import GuardedResult, GuardedWorkspace, poisoned_result, unwritten_slots
from indexer_topk.workload import make_workload

from kernel_cases import assert_bitwise

BACKENDS = ["fused", "legacy"]


@pytest.fixture(autouse=True)
def fresh_signatures():
    api._KNOWN.clear()
    yield
    api._KNOWN.clear()


def batch(seed=1, rows=3, tokens=3000, topk=512):
    return make_workload("sglang_fp8", context_tokens=[tokens], rows_per_request=[rows], topk=topk, seed=seed)


def full_path(w, backend, args=None, **kw):
    with envs.INDEXER_TOPK_REPLAY.override(False):
        return it.indexer_topk(*(args or w.args()), **{**w.kwargs(), **kw}, backend=backend)


def replays(backend):
    return [c.replays.get(backend) for c in api._KNOWN._calls.values() if backend in c.replays]


def record(backend, **kw):
    """A first call of the signature of :func:`batch` (poisoned outputs of its own), replayable."""
    w = batch(seed=1)
    it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=poisoned_result(w.rows, w.topk, "cpu"), **kw)
    (rep,) = replays(backend)
    assert rep is not None, "the signature's first call is recorded as replayable"
    return rep


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the probe compares what each path does
        return type(exc), None


# ---------------------------------------------------------------------------------------------
# Aliasing that appears on a later call only
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_and_workspace_aliasing_on_a_later_call_are_refused_as_on_the_first(backend):
    """After a replayable first call, outputs that alias each other or an input, and a workspace
    over an output, are refused with validation's message (nothing is launched over them)."""
    n = it.workspace_size(3, 512, "sglang_fp8")
    record(backend, workspace=torch.empty(n, dtype=torch.uint8))
    w = batch(seed=2)

    out = poisoned_result(w.rows, w.topk, "cpu")
    with pytest.raises(ValueError, match="out.raw_indices: aliases out.physical_indices"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out._replace(physical_indices=out.raw_indices),
                        workspace=torch.empty(n, dtype=torch.uint8))

    big = torch.full((n + 8192,), 0x5A, dtype=torch.uint8)
    values = big[n - 4096 + 16 : n - 4096 + 16 + w.rows * w.topk * 4].view(torch.float32).view(w.rows, w.topk)
    with pytest.raises(ValueError, match="workspace: overlaps out.values"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out._replace(values=values), workspace=big[:n])
    assert bool((big == 0x5A).all()), "nothing was written into the overlapping buffer"

    args = list(w.args())
    out.counts.copy_(args[6])
    args[6] = out.counts
    with pytest.raises(ValueError, match="out.counts: aliases an input tensor"):
        it.indexer_topk(*args, **w.kwargs(), backend=backend, out=out, workspace=torch.empty(n, dtype=torch.uint8))


def test_inputs_sharing_memory_on_a_later_call_give_the_full_paths_bits():
    """seq_lens a view of the page table's first entries (inputs may overlap), on a later call
    only: the call takes the full path and gets its bits, and the signature's record stays."""
    rep = record("fused", check_values=False)
    w = batch(seed=2)
    args = list(w.args())
    flat = args[5].clone().view(-1)
    args[5], args[6] = flat.view(args[5].shape), flat[: w.rows]
    out = poisoned_result(w.rows, w.topk, "cpu")
    it.indexer_topk(*args, **w.kwargs(), backend="fused", out=out, check_values=False)
    assert_bitwise(out, full_path(w, "fused", args=args, check_values=False), "overlapping inputs")
    assert replays("fused") == [rep]


def test_a_first_call_with_overlapping_inputs_does_not_disable_the_signatures_replay():
    w = batch(seed=1)
    args = list(w.args())
    flat = args[5].clone().view(-1)
    it.indexer_topk(*args[:5], flat.view(args[5].shape), flat[: w.rows], **w.kwargs(), backend="fused",
                    check_values=False)
    w2 = batch(seed=2)
    for _ in range(2):
        it.indexer_topk(*w2.args(), **w2.kwargs(), backend="fused", check_values=False)
    assert all(r is not None for r in replays("fused")), "a disjoint call of the signature is replayed"


# ---------------------------------------------------------------------------------------------
# Tensors changed in place between calls (same Python objects)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_moved_in_place_between_calls_are_written_where_they_are_now(backend):
    """The same output objects, moved between calls with ``set_``, ``as_strided_`` (same shape
    and strides, another offset) and ``resize_`` round trips: each replay writes where the
    tensors are now, in full, and leaves where they were alone."""
    w1 = batch(seed=1)
    out = poisoned_result(w1.rows, w1.topk, "cpu")
    it.indexer_topk(*w1.args(), **w1.kwargs(), backend=backend, out=out)
    old = [t.clone() for t in out]
    old_storage = [t.untyped_storage() for t in out]

    w = batch(seed=2)
    want = full_path(w, backend)
    moved = poisoned_result(w.rows, w.topk, "cpu")
    for t, src in zip(out, moved):  # set_: another storage
        t.set_(src.untyped_storage(), 0, src.shape, src.stride())
    it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out)
    assert_bitwise(out, want, "after set_")
    assert all(torch.equal(o.view(torch.int32), torch.empty(0, dtype=o.dtype).set_(s, 0, o.shape, o.stride())
                           .view(torch.int32)) for o, s in zip(old, old_storage)), "the old storage was written"

    w3 = batch(seed=3)
    want3 = full_path(w3, backend)
    guards = GuardedResult(w3.rows, w3.topk, "cpu")
    for t, g in zip(out, guards.out):  # as_strided_: same shape and strides, another offset
        t.set_(g.untyped_storage(), 0, g.shape, g.stride())
        t.as_strided_(g.shape, g.stride(), g.storage_offset())
    it.indexer_topk(*w3.args(), **w3.kwargs(), backend=backend, out=out)
    assert_bitwise(out, want3, "after moving into guarded buffers")
    guards.assert_guards_intact()
    assert unwritten_slots(out) == []

    for t in out:  # resize_ away and back: a new, larger storage, then the old shape again
        shape = t.shape
        t.resize_(t.numel() * 4)
        t.fill_(0)
        t.resize_(shape)
    poison = poisoned_result(w3.rows, w3.topk, "cpu")
    for t, p in zip(out, poison):
        t.copy_(p)
    it.indexer_topk(*w3.args(), **w3.kwargs(), backend=backend, out=out)
    assert_bitwise(out, want3, "after resize_ round trips")
    assert len(replays(backend)) == 1 and replays(backend)[0] is not None, "one signature, replayed"


def test_a_tensor_made_non_contiguous_in_place_is_refused_on_a_later_call():
    """``as_strided_`` to the same shape with other strides: refused as on a first call."""
    record("fused")
    w = batch(seed=2)
    out = poisoned_result(w.rows, w.topk, "cpu")
    storage = torch.empty(w.rows * w.topk * 2, dtype=torch.int32)
    out.raw_indices.set_(storage.untyped_storage(), 0, (w.rows, w.topk), (1, w.rows))
    with pytest.raises(ValueError, match="out.raw_indices: expected a contiguous tensor"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=out)


# ---------------------------------------------------------------------------------------------
# Unchecked inputs on a replay: only outputs and workspace are written
# ---------------------------------------------------------------------------------------------

def _unchecked(w, how):
    if how == "past_page_table":
        return dataclasses.replace(w, seq_lens=torch.tensor([1000, 16 * 64 + 600], dtype=torch.int32))
    if how == "extreme_lengths":
        return dataclasses.replace(w, seq_lens=torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32))
    pt = torch.where(torch.arange(w.page_table.shape[1])[None] % 3 == 0, torch.tensor(10**6), w.page_table.long())
    pt[1, 1] = -7
    return dataclasses.replace(w, page_table=pt.to(torch.int32).contiguous())


@pytest.mark.parametrize("how", ["past_page_table", "extreme_lengths", "bad_page_ids"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_inputs_on_a_replay_write_only_outputs_and_workspace(backend, how):
    """check_values=False, a valid first call, then a replay over lengths past the page table,
    extreme lengths or page ids outside the cache, into guarded outputs and a guarded
    workspace (legacy: exactly its key matrix, followed by bytes that read as top keys)."""
    def wl(seed):
        return make_workload("sglang_fp8", context_tokens=(4 * 64 * 16,), rows_per_request=2, topk=512,
                             page_table_pad=0, seed=seed)

    def call(w):
        g = GuardedResult(w.rows, w.topk, "cpu")
        nbytes = 2 * w.page_table.shape[1] * 64 * 4 if backend == "legacy" else it.workspace_size(
            w.rows, w.topk, "sglang_fp8")
        ws = GuardedWorkspace(nbytes, "cpu", fill=0x7F)
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=g.out, workspace=ws.workspace,
                        check_values=False)
        g.assert_guards_intact()
        ws.assert_guards_intact()
        assert unwritten_slots(g.out) == []
        return g.out

    call(wl(1))
    (rep,) = replays(backend)
    assert rep is not None
    w = _unchecked(wl(2), how)
    got = call(w)
    api._KNOWN.clear()
    assert_bitwise(got, call(w), f"{how}: replay against the full path")


# ---------------------------------------------------------------------------------------------
# Environment switches
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,replayed", [("maybe", False), ("", False), (" 0 ", False), (" 1 ", True),
                                          ("TRUE", True)])
def test_replay_switch_spellings(raw, replayed):
    """``INDEXER_TOPK_REPLAY``: unreadable or empty values fail safe to the full path (nothing
    remembered); spaced and upper-case spellings read as written. Every call gets the full
    path's bits."""
    w = batch(seed=1)
    want = full_path(w, "fused")
    with envs.INDEXER_TOPK_REPLAY.override(raw):
        for _ in range(2):
            assert_bitwise(it.indexer_topk(*w.args(), **w.kwargs(), backend="fused"), want, f"REPLAY={raw!r}")
    assert (len(api._KNOWN) == 1 and replays("fused")[0] is not None) is replayed


@pytest.mark.parametrize("backend,name", [("fused", "INDEXER_TOPK_DRIVER_LAUNCH"),
                                          ("legacy", "INDEXER_TOPK_LOGITS_BUDGET_MB")])
def test_a_flag_changed_to_garbage_between_calls_records_the_call_again(backend, name):
    """A flag the recorded call read, changed between calls to an unreadable value and then
    to a spaced one: each change makes the next call record again (not replay the old
    record), and every call keeps the full path's bits."""
    field = getattr(envs, name)
    w = batch(seed=1)
    want = full_path(w, backend)
    seen = []
    with field.override(None):
        for raw in (None, "maybe", "maybe", " 1 "):
            with field.override(raw):
                out = poisoned_result(w.rows, w.topk, "cpu")
                it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out)
                assert_bitwise(out, want, f"{name}={raw!r}")
                (rep,) = replays(backend)
                assert rep is not None and (name, raw) in rep.env
                seen.append(rep)
    assert seen[1] is not seen[0] and seen[2] is seen[1] and seen[3] is not seen[2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_interpreter_switched_off_after_recording_is_treated_alike(backend, monkeypatch):
    """TRITON_INTERPRET=0 after a recorded call: the kernels were imported for the interpreter,
    so both the replay and the full path run them, with the same bits."""
    record(backend)
    w = batch(seed=2)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    replayed = outcome(lambda: it.indexer_topk(*w.args(), **w.kwargs(), backend=backend,
                                               out=poisoned_result(w.rows, w.topk, "cpu")))
    api._KNOWN.clear()
    first = outcome(lambda: it.indexer_topk(*w.args(), **w.kwargs(), backend=backend,
                                            out=poisoned_result(w.rows, w.topk, "cpu")))
    assert replayed[0] == first[0] == "ok", f"replay: {replayed[0]}, full path: {first[0]}"
    assert_bitwise(replayed[1], first[1], "interpreter switched off after recording")


# ---------------------------------------------------------------------------------------------
# Scalar spellings
# ---------------------------------------------------------------------------------------------

def test_scalar_spellings_the_first_call_refuses_are_refused_on_a_replayed_signature():
    """topk, check_values, weight_scale and rows_per_request spelled as numpy scalars, bools,
    floats or zero after a replayed signature of the plain spelling: refused as on a first call."""
    record("fused", rows_per_request=1)
    w = batch(seed=2)
    base = {**w.kwargs(), "rows_per_request": 1}
    for name, value in (("topk", np.int64(512)), ("topk", True), ("topk", 512.0), ("check_values", np.bool_(True)),
                        ("check_values", 1), ("weight_scale", True), ("weight_scale", np.float32(0.5)),
                        ("weight_scale", float("nan")), ("weight_scale", 1e-45), ("rows_per_request", True),
                        ("rows_per_request", np.int64(1)), ("rows_per_request", 0), ("rows_per_request", 1.0)):
        with pytest.raises(ValueError, match=name):
            it.indexer_topk(*w.args(), **{**base, name: value}, backend="fused",
                            out=poisoned_result(w.rows, w.topk, "cpu"))


def test_numpy_negative_zero_weight_scale_is_told_apart_from_zero():
    """``np.float64(-0.0) == np.float64(0.0)`` and they hash alike; the sign decides the
    ranking, so the second spelling after the first gets its own bits."""
    w = batch(seed=4)

    def call(scale):
        return it.indexer_topk(*w.args(), **{**w.kwargs(), "weight_scale": scale}, backend="fused",
                               check_values=False)

    with envs.INDEXER_TOPK_REPLAY.override(False):
        positive, negative = call(np.float64(0.0)), call(np.float64(-0.0))
    assert not torch.equal(positive.raw_indices, negative.raw_indices), "the sign must matter here"
    call(np.float64(0.0))
    assert_bitwise(call(np.float64(-0.0)), negative, "-0.0 after 0.0")


def test_equal_weight_scales_of_other_types_get_their_own_bits():
    """1.0, 1 and np.float64(1.0) in turn, then a replay of each: all the full path's bits."""
    w = batch(seed=2)
    want = full_path(w, "fused", weight_scale=1.0)
    for scale in (1.0, 1, np.float64(1.0), 1, 1.0):
        got = it.indexer_topk(*w.args(), **{**w.kwargs(), "weight_scale": scale}, backend="fused")
        assert_bitwise(got, want, f"weight_scale={scale!r}")


def test_a_float_subclass_that_equals_everything_does_not_replay_another_scale():
    class Loose(float):
        def __eq__(self, other):
            return True

        def __hash__(self):
            return 0

    w = batch(seed=2)
    kwargs = {k: v for k, v in w.kwargs().items() if k != "weight_scale"}
    it.indexer_topk(*batch(seed=1).args(), **kwargs, weight_scale=Loose(1.0), backend="fused")
    got = it.indexer_topk(*w.args(), **kwargs, weight_scale=Loose(2.0), backend="fused")
    assert_bitwise(got, full_path(w, "fused", weight_scale=2.0), "weight_scale=Loose(2.0) after Loose(1.0)")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_per_request_toggled_between_calls_never_changes_the_bits(backend):
    """Three requests of 1, 2 and 1 rows; hints None, 1 and 3 (one of them wrong) in turn, each
    recorded and replayed: every call is the full path's bits without a hint."""
    def wl(seed):
        return make_workload("sglang_fp8", context_tokens=[900, 1300, 700], rows_per_request=[1, 2, 1], topk=512,
                             seed=seed)

    w = wl(2)
    want = full_path(w, backend)
    for hint in (None, 1, 3, 1):
        out = poisoned_result(w.rows, w.topk, "cpu")
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out, rows_per_request=hint)
        assert_bitwise(out, want, f"rows_per_request={hint}")
    assert len(replays(backend)) == 3 and all(r is not None for r in replays(backend))


# ---------------------------------------------------------------------------------------------
# Devices, autograd and inference mode
# ---------------------------------------------------------------------------------------------

def test_meta_tensors_on_a_later_call_are_refused():
    record("fused")
    w = batch(seed=2)
    out = poisoned_result(w.rows, w.topk, "cpu")
    with pytest.raises(ValueError, match="out.values: expected device cpu, got meta"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=out._replace(values=out.values.to("meta")))
    args = [a.to("meta") if a is not None else None for a in w.args()]
    with pytest.raises(ValueError, match="q: a meta tensor"):
        it.indexer_topk(*args, **w.kwargs(), backend="fused", out=out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_replays_into_inference_and_grad_outputs_and_from_grad_inputs(backend):
    """After a plain first call: outputs made under inference mode, an output that requires
    grad, weights that require grad, and a call made under inference mode: each replay is
    written in full with the full path's bits, and builds no autograd graph."""
    record(backend)
    w = batch(seed=2)
    want = full_path(w, backend)
    with torch.inference_mode():
        out = poisoned_result(w.rows, w.topk, "cpu")
    it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out)
    assert_bitwise(out, want, "inference-mode outputs")
    out = poisoned_result(w.rows, w.topk, "cpu")
    out.values.requires_grad_(True)
    args = list(w.args())
    args[4] = args[4].clone().requires_grad_(True)
    it.indexer_topk(*args, **w.kwargs(), backend=backend, out=out)
    assert out.values.grad_fn is None
    assert_bitwise(IndexerTopKResult(*(t.detach() for t in out)), want, "outputs and weights that require grad")
    with torch.inference_mode():
        got = it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=poisoned_result(w.rows, w.topk, "cpu"))
    assert_bitwise(got, want, "a replay under inference mode")
    assert len(replays(backend)) == 1


# ---------------------------------------------------------------------------------------------
# Threads, and a call that raises
# ---------------------------------------------------------------------------------------------

def test_two_threads_recording_and_replaying_one_signature_get_their_own_bits():
    ws = [batch(seed=s) for s in (2, 3)]
    want = [full_path(w, "fused") for w in ws]
    got, errors = [None, None], []
    start = threading.Barrier(2)

    def work(i):
        try:
            start.wait()
            out = poisoned_result(3, 512, "cpu")
            for _ in range(2):
                it.indexer_topk(*ws[i].args(), **ws[i].kwargs(), backend="fused", out=out)
            got[i] = out
        except Exception as exc:  # noqa: BLE001 - surfaced below
            errors.append((i, exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(2):
        assert_bitwise(got[i], want[i], f"thread {i}")


def test_a_recording_that_raises_midway_leaves_no_record_and_the_next_calls_are_right(monkeypatch):
    """The first call of a signature raises after its first launch (the main kernel fails):
    nothing is kept for it, the next call records again and the one after replays, both
    with the full path's bits, into outputs written in full."""
    class Failing:
        def __getitem__(self, grid):
            raise RuntimeError("the kernel failed")

    monkeypatch.setattr(fused_backend, "fused_topk_kernel", Failing())
    w = batch(seed=1)
    with pytest.raises(RuntimeError, match="kernel failed"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=poisoned_result(w.rows, w.topk, "cpu"))
    assert replays("fused") == [], "an aborted recording is not kept"
    monkeypatch.undo()
    for seed in (2, 3):
        w = batch(seed=seed)
        out = poisoned_result(w.rows, w.topk, "cpu")
        it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", out=out)
        assert_bitwise(out, full_path(w, "fused"), f"call {seed}")
    assert replays("fused")[0] is not None


# ---------------------------------------------------------------------------------------------
# Storage alignment the signature does not see
# ---------------------------------------------------------------------------------------------

def _workspace_on_a_misaligned_storage(nbytes):
    """A uint8 workspace starting on a 16-byte boundary whose storage starts 1 or 3 bytes
    before a 4-byte boundary (numpy memory): data_ptr % 16 == 0, storage_offset % 4 != 0."""
    arr = np.zeros(nbytes + 64, dtype=np.uint8)
    skip = 1 if (arr.ctypes.data + 1) % 4 else 2
    t = torch.from_numpy(arr[skip:])
    ws = t[(-t.data_ptr()) % 16:][:nbytes]
    assert ws.data_ptr() % 16 == 0 and ws.storage_offset() % 4 != 0
    return ws, arr


def test_a_workspace_on_a_misaligned_storage_is_refused_alike():
    nbytes = it.workspace_size(3, 512, "sglang_fp8")
    w1 = batch(seed=1)
    it.indexer_topk(*w1.args(), **w1.kwargs(), backend="fused", workspace=torch.empty(nbytes, dtype=torch.uint8))
    w = batch(seed=2)
    ws, keep = _workspace_on_a_misaligned_storage(nbytes)
    replayed = outcome(lambda: it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", workspace=ws))
    api._KNOWN.clear()
    first = outcome(lambda: it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", workspace=ws))
    assert replayed[0] == first[0] == ValueError, f"replay: {replayed[0]}, full path: {first[0]}"
    with pytest.raises(ValueError, match="workspace: must start on a 16-byte boundary"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", workspace=ws)
    del keep


@pytest.mark.parametrize("which", ["weights", "values"])
def test_negated_views_are_refused_on_a_first_call_and_on_a_replayed_signature(which):
    """A negated view holds its values un-negated in memory, which is what the kernels read and
    write: refused by validation, and by the signature of a call recorded with plain tensors."""
    def call(w, neg):
        args, out = list(w.args()), poisoned_result(w.rows, w.topk, "cpu")
        if neg and which == "weights":
            args[4] = torch._neg_view(args[4].neg())
        elif neg:
            out = IndexerTopKResult(torch._neg_view(out.values), *out[1:])
        return it.indexer_topk(*args, **w.kwargs(), backend="fused", out=out)

    with pytest.raises(ValueError, match="negated or conjugated view"):
        call(batch(seed=1), neg=True)
    call(batch(seed=1), neg=False)
    call(batch(seed=2), neg=False)
    assert all(r is not None for r in replays("fused"))
    with pytest.raises(ValueError, match="negated or conjugated view"):
        call(batch(seed=3), neg=True)


def test_a_workspace_whose_storage_offset_is_a_multiple_of_4_is_still_accepted():
    """The workspace is carved only into int32 views (fused._carve, legacy's score matrix):
    torch needs storage_offset % 4 == 0 for those, the kernels data_ptr % 16 == 0. Such a
    workspace (numpy memory whose buffer starts 4 bytes past a 16-byte boundary) is accepted and
    gives the bits of a call without one."""
    w = batch(seed=2)
    nbytes = it.workspace_size(w.rows, w.topk, "sglang_fp8")
    arr = np.zeros(nbytes + 64, dtype=np.uint8)
    skip = (4 - arr.ctypes.data) % 16
    ws = torch.from_numpy(arr[skip:])[12:][:nbytes]
    assert ws.data_ptr() % 16 == 0 and ws.storage_offset() % 16 == 12
    ws.view(torch.int32)  # the views the backends take are legal
    want = it.indexer_topk(*w.args(), **w.kwargs(), backend="fused")
    got = it.indexer_topk(*w.args(), **w.kwargs(), backend="fused", workspace=ws)
    assert bitwise_equal(got, want)


def test_negative_zero_of_a_float_subclass_is_keyed_by_the_number_validation_reads():
    """The signature keys a float subclass by ``float(x)`` (_as_read), the sign of zero too: a
    subclass whose ``__eq__`` never holds must not make -0.0 and 0.0 one key."""
    class Strict(float):
        def __eq__(self, other):
            return False

        def __ne__(self, other):
            return True

        __hash__ = float.__hash__

    w = batch(seed=4)
    kw = {k: v for k, v in w.kwargs().items() if k != "weight_scale"}

    def call(scale):
        return it.indexer_topk(*w.args(), **kw, weight_scale=scale, backend="fused", check_values=False)

    with envs.INDEXER_TOPK_REPLAY.override(False):
        positive, negative = call(0.0), call(Strict(-0.0))
    assert not torch.equal(positive.raw_indices, negative.raw_indices), "the sign must matter here"
    call(Strict(0.0))
    assert bitwise_equal(call(Strict(-0.0)), negative), "Strict(-0.0) replayed Strict(0.0)'s launches"
