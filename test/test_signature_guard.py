"""The remembered signature's guard (:class:`indexer_topk.calls.SignatureGuard`): a later call it
accepts must have the key :func:`indexer_topk.calls.signature` would build, and the calls it
serves must give the full path's bits, refuse what the full path refuses, and fall back to the
key wherever torch gives no guards."""

import pytest
import torch

import indexer_topk as it
from indexer_topk import api, calls
from indexer_topk.calls import KnownCall, KnownCalls, make_guard, signature
from indexer_topk.envs import envs
from indexer_topk.guards import poisoned_result

from kernel_cases import assert_bitwise
from test_replay_edges import batch, fresh_signatures  # noqa: F401 - the autouse fixture clears signatures here too

needs_guards = pytest.mark.skipif(calls._TensorGuards is None, reason="this torch has no TensorGuards")


def call_tensors(w, out=None, workspace=None):
    outs = tuple(out) if out is not None else (None,) * 4
    return (*w.args(), *outs, workspace)


def scalars_of(w, backend="legacy", **over):
    s = dict(topk=w.topk, layout=w.layout.value, scale=w.weight_scale, negzero=False, backend=backend, check=False,
             rpr=None, no_out=False, device=-1)
    s.update(over)
    return (type(s["topk"]), s["topk"], type(s["layout"]), s["layout"], type(s["scale"]), s["scale"], s["negzero"],
            type(s["backend"]), s["backend"], type(s["check"]), s["check"], s["rpr"], s["no_out"], s["device"])


def key_of(tensors, scalars):
    return signature(tensors, scalars, api._OFFSET_KEYED)


def shifted(t: torch.Tensor, elements: int) -> torch.Tensor:
    """``t``'s values in a fresh storage, viewed ``elements`` elements past its start."""
    flat = torch.zeros(t.numel() + elements, dtype=t.dtype)
    view = flat[elements:].view(t.shape)
    view.copy_(t)
    return view


def variants(w, base):
    """``(name, tensors)`` of calls that differ from ``base`` in one way each, plus fresh copies."""
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, v, r, p, c, ws = base
    yield "fresh copies", tuple(None if t is None else t.clone() for t in base)
    yield "query rows dropped", (q[:-1], *base[1:])
    yield "weights transposed twice (strides)", (q, q_scale, k_cache, k_scale, weights.t().contiguous().t(),
                                                 *base[5:])
    yield "weights as float64", (*base[:4], weights.double(), *base[5:])
    yield "weights negated view", (*base[:4], torch._neg_view(weights), *base[5:])
    yield "values negated view", (*base[:7], torch._neg_view(v), r, p, c, ws)
    yield "weights a Parameter", (*base[:4], torch.nn.Parameter(weights.clone(), requires_grad=False), *base[5:])
    yield "weights requiring grad", (*base[:4], weights.clone().requires_grad_(True), *base[5:])
    yield "weights 4 bytes off 16", (*base[:4], shifted(weights, 1), *base[5:])
    yield "weights 16 bytes on", (*base[:4], shifted(weights, 4), *base[5:])
    yield "cache 1 byte off", (q, q_scale, shifted(k_cache, 1), *base[3:])
    yield "cache 16 bytes on", (q, q_scale, shifted(k_cache, 16), *base[3:])
    yield "workspace 4 bytes on", (*base[:11], shifted(ws, 4))
    yield "workspace left out", (*base[:11], None)
    yield "outputs left out", (*base[:7], None, None, None, None, ws)
    yield "page table on meta", (*base[:5], page_table.to("meta"), *base[6:])
    with torch.inference_mode():
        yield "inference tensors", tuple(None if t is None else t.clone() for t in base)
    yield "an int in place of the lengths", (*base[:6], 3, *base[7:])


@needs_guards
def test_a_call_the_guard_accepts_has_the_remembered_key():
    """Soundness, on calls that differ from the remembered one in each way the key tells apart
    (and in a few it does not): wherever the guard accepts, the key is the remembered one, and
    the addresses it returns are the call's; fresh copies of the tensors are accepted."""
    w = batch()
    ws = torch.zeros(it.workspace_size(w.rows, w.topk, "sglang_fp8"), dtype=torch.uint8)
    base = call_tensors(w, poisoned_result(w.rows, w.topk, "cpu"), ws)
    scalars = scalars_of(w)
    key, ptrs = key_of(base, scalars)
    guard = make_guard(base, scalars, ptrs, api._OFFSET_KEYED)
    assert guard is not None and guard.addresses(base, scalars) == ptrs
    accepted = []
    for name, tensors in variants(w, base):
        got = guard.addresses(tensors, scalars)
        if got is not None:
            accepted.append(name)
            assert key_of(tensors, scalars)[0] == key, name
            assert got == [None if t is None else t.data_ptr() for t in tensors], name
    assert "fresh copies" in accepted and "weights 16 bytes on" in accepted and "cache 16 bytes on" in accepted
    refused = {name for name, _ in variants(w, base)} - set(accepted)
    assert {"query rows dropped", "weights negated view", "values negated view", "weights a Parameter",
            "weights 4 bytes off 16", "cache 1 byte off", "workspace left out", "page table on meta"} <= refused


@needs_guards
@pytest.mark.parametrize("change", [
    dict(topk=1024), dict(topk=512.0), dict(backend="fused"), dict(scale=-0.0, negzero=True), dict(check=1),
    dict(rpr=1), dict(no_out=True), dict(device=0), dict(layout="sglang_mxfp4"),
])
def test_the_guard_refuses_other_scalars(change):
    w = batch()
    base = call_tensors(w, poisoned_result(w.rows, w.topk, "cpu"))
    scalars = scalars_of(w)
    guard = make_guard(base, scalars, key_of(base, scalars)[1], api._OFFSET_KEYED)
    assert guard.addresses(base, scalars_of(w, **change)) is None


@needs_guards
def test_a_later_call_of_the_signature_builds_no_key_and_gives_the_full_paths_bits(monkeypatch):
    w = batch(seed=1)
    it.indexer_topk(*w.args(), **w.kwargs(), backend="legacy", out=poisoned_result(w.rows, w.topk, "cpu"),
                    check_values=False)
    (known,) = api._KNOWN._calls.values()
    assert known.guard is not None and api._KNOWN.last is known

    def no_key(*a, **k):
        raise AssertionError("the guard's signature should not build its key")

    later = [batch(seed=seed) for seed in (2, 3)]
    with envs.INDEXER_TOPK_REPLAY.override(False):
        wants = [it.indexer_topk(*w2.args(), **w2.kwargs(), backend="legacy", check_values=False) for w2 in later]
    monkeypatch.setattr(api, "signature", no_key)
    for w2, want in zip(later, wants):
        out = poisoned_result(w2.rows, w2.topk, "cpu")
        got = it.indexer_topk(*w2.args(), **w2.kwargs(), backend="legacy", out=out, check_values=False)
        assert_bitwise(got, want)
        assert api._KNOWN.last is known


@needs_guards
def test_a_negated_view_after_a_guarded_call_is_refused_as_on_a_first_call():
    w = batch(seed=1)
    for seed in (1, 2):
        w2 = batch(seed=seed)
        it.indexer_topk(*w2.args(), **w2.kwargs(), backend="legacy", out=poisoned_result(w.rows, w.topk, "cpu"))
    assert api._KNOWN.last is not None
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens = batch(seed=3).args()
    with pytest.raises(ValueError, match="weights"):
        it.indexer_topk(q, q_scale, k_cache, k_scale, torch._neg_view(weights), page_table, seq_lens, **w.kwargs(),
                        backend="legacy", out=poisoned_result(w.rows, w.topk, "cpu"))


def test_without_torchs_guards_calls_replay_by_their_keys(monkeypatch):
    monkeypatch.setattr(calls, "_TensorGuards", None)
    w = batch(seed=1)
    it.indexer_topk(*w.args(), **w.kwargs(), backend="legacy", out=poisoned_result(w.rows, w.topk, "cpu"))
    (known,) = api._KNOWN._calls.values()
    assert known.guard is None
    w2 = batch(seed=2)
    with envs.INDEXER_TOPK_REPLAY.override(False):
        want = it.indexer_topk(*w2.args(), **w2.kwargs(), backend="legacy")
    got = it.indexer_topk(*w2.args(), **w2.kwargs(), backend="legacy", out=poisoned_result(w.rows, w.topk, "cpu"))
    assert_bitwise(got, want)
    assert api._KNOWN.last is None and known.replays["legacy"] is not None


def test_guards_that_refuse_to_be_built_leave_the_key(monkeypatch):
    class Refusing:
        def __init__(self, *a, **k):
            raise TypeError("other arguments in this torch")

    monkeypatch.setattr(calls, "_TensorGuards", Refusing)
    w = batch()
    base = call_tensors(w)
    assert make_guard(base, scalars_of(w), key_of(base, scalars_of(w))[1]) is None


@needs_guards
def test_clearing_or_forgetting_the_last_call_forgets_its_guard():
    w = batch()
    base = call_tensors(w, poisoned_result(w.rows, w.topk, "cpu"))
    s = scalars_of(w)
    key, ptrs = key_of(base, s)
    known = KnownCalls(limit=1)
    call = KnownCall(None, 1.0, w.rows, 0, torch.device("cpu"), [0] * len(base))
    call.guard = make_guard(base, s, ptrs)
    known.add(key, call)
    assert known.get(key) is call and known.guarded(base, s) == (call, ptrs)
    known.clear()
    assert known.guarded(base, s) == (None, None)
    known.add(key, call)
    assert known.last is call
    known.add(("another",), KnownCall(None, 1.0, 1, 0, torch.device("cpu"), [0]))  # evicts the first
    assert known.last is None and known.guarded(base, s) == (None, None)


@needs_guards
def test_a_negated_view_is_refused_while_the_thread_excludes_the_negated_views_key():
    """Torch's dispatch-key guards (private) can make a negated view look plain to the tensor
    guards: then the key decides, and validation refuses the view as on a first call."""
    w = batch(seed=1)
    it.indexer_topk(*w.args(), **w.kwargs(), backend="legacy", out=poisoned_result(w.rows, w.topk, "cpu"))
    q, q_scale, k_cache, k_scale, weights, page_table, seq_lens = batch(seed=2).args()
    negated = torch._neg_view(weights.neg())  # reads as weights, stored negated
    for key in (torch._C.DispatchKey.Negative, torch._C.DispatchKey.Conjugate):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            assert api._KNOWN.guarded(call_tensors(w), scalars_of(w)) == (None, None)
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Negative)):
        with pytest.raises(ValueError, match="negated or conjugated view"):
            it.indexer_topk(q, q_scale, k_cache, k_scale, negated, page_table, seq_lens, **w.kwargs(),
                            backend="legacy", out=poisoned_result(w.rows, w.topk, "cpu"))


@pytest.mark.parametrize("which", [5, 6])
def test_negated_views_of_the_int_tensors_are_refused_on_a_replayed_signature(which):
    """The key reads every tensor's negation bit (validation refuses a negated view of any), so
    a call that differs from a replayed one only there is validated, not replayed."""
    w = batch(seed=1)
    for seed in (1, 2):
        w2 = batch(seed=seed)
        it.indexer_topk(*w2.args(), **w2.kwargs(), backend="legacy", check_values=False,
                        out=poisoned_result(w.rows, w.topk, "cpu"))
    args = list(batch(seed=3).args())
    args[which] = torch._neg_view(args[which])
    with pytest.raises(ValueError, match="negated or conjugated view"):
        it.indexer_topk(*args, **w.kwargs(), backend="legacy", check_values=False,
                        out=poisoned_result(w.rows, w.topk, "cpu"))


@needs_guards
def test_a_call_cleared_while_it_is_found_is_not_left_as_the_last():
    """``get`` sets the call it found as the last one only while the map still holds it: a
    clear between its lookup and that store leaves no stale guard serving later calls."""
    w = batch()
    base = call_tensors(w, poisoned_result(w.rows, w.topk, "cpu"))
    s = scalars_of(w)
    key, ptrs = key_of(base, s)
    known = KnownCalls()
    call = KnownCall(None, 1.0, w.rows, 0, torch.device("cpu"), [0] * len(base))
    call.guard = make_guard(base, s, ptrs)
    known.add(key, call)
    known.last = None

    class ClearedMidway(dict):
        cleared = False

        def get(self, k, default=None):
            found = dict.get(self, k, default)
            if not ClearedMidway.cleared:  # once, between the lookup and the store of the last call
                ClearedMidway.cleared = True
                known.clear()
            return found

    known._calls = ClearedMidway(known._calls)
    assert known.get(key) is call
    assert len(known) == 0 and known.last is None and known.guarded(base, s) == (None, None)


@needs_guards
def test_a_backend_of_a_str_subclass_equal_to_anything_is_not_taken_for_the_remembered_one():
    class Agreeable(str):
        __hash__ = str.__hash__

        def __eq__(self, other):
            return True

    w = batch()
    base = call_tensors(w)
    s = scalars_of(w)
    guard = make_guard(base, s, key_of(base, s)[1])
    assert guard.addresses(base, scalars_of(w, backend=Agreeable("fused"))) is None
