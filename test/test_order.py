"""``order="position"``: every row's selection in ascending positions, the entries of ``"score"``.

Each way of finishing a row is run twice on one workload, once per order, with poisoned outputs:
the position-ordered outputs must be, bit for bit, the score-ordered ones laid out by position
(:func:`indexer_topk.contract.by_position`), every slot written. The ways: the row select and the
key-matrix select (which skip their sort), the split select (decode batches; it sorts, then a
kernel lays the rows out), the fused kernel with one split and with several (merged), the
reference, the public API (a signature replayed, each order keyed apart) and the operators.
``order`` values no layout has are refused by name before anything runs, fake tensors included.
"""

import dataclasses

import pytest
import torch

import indexer_topk
from indexer_topk import api
from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.backends.fused import fused_indexer_topk
from indexer_topk.backends.legacy import legacy_indexer_topk
from indexer_topk.contract import as_inputs, by_position
from indexer_topk.guards import poisoned_result, unwritten_slots
from indexer_topk.reference import reference_indexer_topk

from kernel_cases import Case, assert_bitwise, build
from test_row_topk import force_way

TOPK = 32
# rows longer than topk (sorted by score) and shorter, a plateau of equal scores
CASES = [
    Case("order-random", "sglang_fp8", context_tokens=(4000, 1000), rows_per_request=(3, 2), topk=TOPK),
    Case("order-plateau", "sglang_mxfp4", pattern="zero_plateau", context_tokens=(3000,), rows_per_request=(3,),
         topk=TOPK),
]

# the public API takes the supported topk alone: rows of 1,000 and 600 positions at 512
API_CASE = Case("order-api", "sglang_fp8", context_tokens=(4000, 2400), rows_per_request=(2, 1), topk=512)


def positioned(inputs):
    return dataclasses.replace(inputs, order="position")


def assert_in_positions(got, want_score_order):
    """``got`` holds every slot, its rows ascend by position and equal ``want_score_order`` laid out
    by position; the long rows did need laying out (the test compares two different layouts)."""
    assert unwritten_slots(got) == []
    raw = got.raw_indices
    live = raw[:, 1:] >= 0
    assert bool((raw[:, 1:] > raw[:, :-1])[live].all()), "positions ascend"
    assert_bitwise(got, by_position(want_score_order), "position order")
    assert not torch.equal(got.raw_indices, want_score_order.raw_indices)


def run_both(fn, inputs, **kw):
    """``fn`` on ``inputs`` in score order, then in position order, each into poisoned outputs."""
    rows, topk, device = inputs.rows, inputs.topk, inputs.device
    score = fn(inputs, out=poisoned_result(rows, topk, device), **kw)
    position = fn(positioned(inputs), out=poisoned_result(rows, topk, device), **kw)
    return score, position


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_position_order(case, device):
    wl = build(case, device)
    score = reference_indexer_topk(*wl.args(), **wl.kwargs())
    position = reference_indexer_topk(*wl.args(), **wl.kwargs(), order="position")
    assert_in_positions(position, score)


@pytest.mark.parametrize("way", ["rows", "torch", "split"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_legacy_position_order(case, way, monkeypatch, device):
    """The row select and the key-matrix select leave rows unsorted; the split select's rows are
    laid out after its finish."""
    force_way(monkeypatch, device, way, ROWS_TILE=1024, ROWS_SAMPLE=512, SPLIT_TILE=1024, SPLIT_SAMPLE=1024,
              SPLIT_BLOCK=256)
    launched = []
    real = legacy_backend.launch
    monkeypatch.setattr(legacy_backend, "launch", lambda k, *a, **kw: (launched.append(kw), real(k, *a, **kw))[1])
    score, position = run_both(legacy_indexer_topk, build(case, device).inputs())
    assert_in_positions(position, score)
    if way != "split":  # no sort, so no second pass
        assert [kw["SORT_BITS"] for kw in launched if "SORT_BITS" in kw][-1] == 0


@pytest.mark.parametrize("num_splits", [1, 4])
def test_fused_position_order(num_splits, device):
    score, position = run_both(fused_indexer_topk, build(CASES[0], device).inputs(), num_splits=num_splits)
    assert_in_positions(position, score)


def test_position_order_through_the_api_and_its_replays(device):
    """A signature's calls in either order, interleaved: each call's outputs are its order's, the
    replayed ones included (the order is part of the signature)."""
    wl = build(API_CASE, device)
    args, kw = wl.args(), dict(wl.kwargs(), backend="legacy", check_values=False)
    score = indexer_topk.indexer_topk(*args, **kw)
    for order in ("position", "score", "position", "score"):
        out = poisoned_result(wl.rows, wl.topk, device)
        got = indexer_topk.indexer_topk(*args, **kw, out=out, order=order)
        want = by_position(score) if order == "position" else score
        assert_bitwise(got, want, order)


def test_position_order_through_the_operators(device):
    wl = build(API_CASE, device)
    args, kw = wl.args(), wl.kwargs()
    score = indexer_topk.indexer_topk(*args, **kw, backend="legacy")
    got = torch.ops.indexer_topk.indexer_topk(*args, kw["topk"], kw["layout"], kw["weight_scale"], "legacy", True,
                                              None, "position")
    assert_bitwise(indexer_topk.IndexerTopKResult(*got), by_position(score), "indexer_topk")
    out = poisoned_result(wl.rows, wl.topk, device)
    torch.ops.indexer_topk.indexer_topk_out(*args, kw["topk"], kw["layout"], *out, weight_scale=kw["weight_scale"],
                                            backend="legacy", order="position")
    assert_bitwise(out, by_position(score), "indexer_topk_out")


class Position(str):
    """A str subclass that compares equal to a valid order."""


@pytest.mark.parametrize("order", ["Position", "", "score ", None, 1, b"score", Position("position"), ["score"]],
                         ids=repr)
def test_unknown_orders_are_refused_before_any_kernel(order, monkeypatch, device):
    wl = build(API_CASE, device)
    monkeypatch.setattr(api, "_run", lambda *a, **k: pytest.fail("a backend ran"))
    with pytest.raises(ValueError, match="^order: expected one of"):
        indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), order=order)


def test_unknown_orders_are_refused_by_the_fake_operator():
    """Under fake tensors (``torch.compile``) the operator refuses what its call would."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    wl = build(API_CASE, "cpu")
    with FakeTensorMode() as mode:
        args = [None if t is None else mode.from_tensor(t) for t in wl.args()]
        kw = wl.kwargs()
        with pytest.raises(ValueError, match="^order: expected one of"):
            torch.ops.indexer_topk.indexer_topk(*args, kw["topk"], kw["layout"], order="rank")
        values, *_ = torch.ops.indexer_topk.indexer_topk(*args, kw["topk"], kw["layout"], order="position")
        assert values.shape == (wl.rows, kw["topk"])


@pytest.mark.parametrize("layout, backend, rows, width, decode, want", [
    ("sglang_fp8", "fused", 8, 4096, False, "position"),        # the fused finishes lay rows out in place of a sort
    ("sglang_fp8", "legacy", 1024, 4096, False, "position"),    # the row select
    ("sglang_mxfp4", "legacy", 8, 4096, False, "score"),        # few rows: the split select sorts, then lays out
    ("sglang_fp8", "legacy", 128, 196608, False, "score"),      # no more long rows than SMs: the split select too
    ("sglang_fp8", "legacy", 256, 196608, False, "position"),   # more: the row select
    ("sglang_fp8", "fused", 8, 4096, True, "score"),            # a decode step keeps best first
    ("aiter_mxfp4", "fused", 1024, 4096, False, "score"),       # AITER's layout keeps AITER's order
    ("sglang_fp8", "reference", 1024, 4096, False, "score"),
])
def test_serving_order_asks_for_positions_where_they_cost_nothing(layout, backend, rows, width, decode, want,
                                                                   monkeypatch):
    from indexer_topk.kernels import launch
    from indexer_topk.orders import serving_order

    monkeypatch.setattr(launch, "device_sm_count", lambda device: 132)  # an H100's SMs, on any machine

    assert serving_order(layout, backend, rows, width, "cpu", decode=decode) == want


def test_backends_refuse_a_misspelt_order():
    """A backend called directly reads the order as a flag: inputs carrying another value are not made."""
    wl = build(CASES[0], "cpu")
    with pytest.raises(ValueError, match="^order: expected one of"):
        dataclasses.replace(wl.inputs(), order="Position")
    with pytest.raises(ValueError, match="^order: expected one of"):
        as_inputs(wl.args(), topk=TOPK, layout=wl.layout.value, order="positions")
