"""Property-based tests of the public entry point: valid argument sets match the reference,
invalid ones raise ``ValueError`` naming the argument before any backend runs."""

import os

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import indexer_topk as it  # noqa: E402
from indexer_topk import api  # noqa: E402
from indexer_topk.compare import compare_to_reference  # noqa: E402
from indexer_topk.reference import reference_with_next_values  # noqa: E402
from indexer_topk.reference import reference_indexer_topk  # noqa: E402
from indexer_topk.workload import PATTERNS  # noqa: E402
from kernel_cases import LAYOUTS, assert_bitwise  # noqa: E402
# Kernel calls run under the Triton interpreter on a CPU: keep the examples few and small.
KERNEL_EXAMPLES = int(os.environ.get("INDEXER_TOPK_PROPERTY_EXAMPLES", "6"))


@st.composite
def workloads(draw, max_tokens=3200):
    layout = draw(st.sampled_from(LAYOUTS))
    n_req = draw(st.integers(1, 3))
    ctx = draw(st.lists(st.integers(0, max_tokens), min_size=n_req, max_size=n_req))
    rows = draw(st.lists(st.integers(1, 3), min_size=n_req, max_size=n_req))
    return it.make_workload(
        layout,
        context_tokens=ctx,
        rows_per_request=rows,
        topk=512,
        seed=draw(st.integers(0, 2**16)),
        pattern=draw(st.sampled_from(PATTERNS)),
        spare_pages=draw(st.integers(0, 4)),
        page_table_pad=draw(st.integers(0, 3)),
    )


def _check_against_reference(w, backend):
    got = it.indexer_topk(*w.args(), **w.kwargs(), backend=backend)
    ref, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    cmp = compare_to_reference(got, ref, next_values=next_values, inputs=w)
    assert cmp.ok, cmp.summary()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_reference_backend_matches_reference_function(w):
    """The public entry with backend="reference" is the reference, in place or not."""
    out = it.allocate_result(w.rows, w.topk, "cpu")
    got = it.indexer_topk(*w.args(), **w.kwargs(), backend="reference", out=out)
    assert got is out
    assert_bitwise(got, reference_indexer_topk(*w.args(), **w.kwargs()), "backend='reference'")


@pytest.mark.parametrize("backend", ["legacy", "fused"])
@settings(max_examples=KERNEL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_kernel_backends_match_reference(backend, w):
    """Random valid argument sets (ragged rows, scattered pages, every pattern) match the reference."""
    _check_against_reference(w, backend)


# --- invalid argument sets -----------------------------------------------------------------

def _mutations():
    """(argument named in the error, function making the call's args/kwargs invalid)."""

    def set_arg(i, fn):
        def mutate(args, kw):
            args = list(args)
            args[i] = fn(args[i], kw)
            return args, kw

        return mutate

    def set_kw(key, value):
        def mutate(args, kw):
            return args, {**kw, key: value}

        return mutate

    def bad_seq_lens(fn):
        return set_arg(6, lambda t, kw: fn(t.clone()))

    def bad_page(value):
        def f(pt, kw):
            pt = pt.clone()
            pt[0, 0] = value
            return pt

        return set_arg(5, f)

    return [
        ("q", set_arg(0, lambda t, kw: t.view(torch.uint8).clone() if t.dtype != torch.uint8 else t.to(torch.int32))),
        ("q", set_arg(0, lambda t, kw: t[:, :32].contiguous())),
        ("weights", set_arg(4, lambda t, kw: t.to(torch.float16))),
        ("weights", set_arg(4, lambda t, kw: t.repeat_interleave(2, dim=1)[:, ::2])),
        ("page_table", set_arg(5, lambda t, kw: t.to(torch.int64))),
        ("seq_lens", set_arg(6, lambda t, kw: t[:-1].contiguous() if t.numel() > 1 else t.reshape(1, 1))),
        ("seq_lens", bad_seq_lens(lambda t: t.fill_(-1))),
        ("seq_lens", bad_seq_lens(lambda t: t.fill_(2**30))),
        ("page_table", bad_page(-5)),
        ("page_table", bad_page(10**6)),
        ("topk", set_kw("topk", 100)),
        ("topk", set_kw("topk", 4096)),
        ("layout", set_kw("layout", "mxfp8")),
        ("weight_scale", set_kw("weight_scale", torch.tensor(1.0))),
        ("out", set_kw("out", (1, 2, 3))),
    ]


MUTATIONS = _mutations()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(max_tokens=1200), pick=st.integers(0, len(MUTATIONS) - 1),
       backend=st.sampled_from(["reference", "legacy", "fused", "auto"]))
def test_invalid_arguments_raise_before_any_backend(w, pick, backend):
    """Each invalid argument set raises ValueError naming the argument; no backend is reached."""
    name, mutate = MUTATIONS[pick]
    # A garbage page id in a row that uses no page is valid: not an invalid argument set.
    assume(not (name == "page_table" and int(w.seq_lens[0]) == 0))
    args, kw = mutate(w.args(), w.kwargs())

    def refuse(backend_name):
        raise AssertionError(f"backend {backend_name!r} reached with invalid arguments")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "_backend_fn", refuse)
        with pytest.raises(ValueError) as exc:
            it.indexer_topk(*args, **kw, backend=backend)
    assert str(exc.value).startswith(name), str(exc.value)
