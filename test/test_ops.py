"""The operator as ``torch.ops.indexer_topk.*`` (:mod:`indexer_topk.ops`): schema, fake
implementations, ``torch.compile`` without graph breaks, and the same bits as the Python API."""

import pytest
import torch

import indexer_topk
from indexer_topk.contract import allocate_result
from indexer_topk.workload import make_workload

from kernel_cases import assert_bitwise

OPS = torch.ops.indexer_topk


def small(layout="sglang_fp8", rows=3, tokens=2500, topk=512, pattern="random", seed=7):
    return make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=topk, seed=seed,
                         device="cpu", pattern=pattern)


def op_args(w):
    return (*w.args(), w.topk, w.layout.value)


def test_importing_the_package_registers_both_operators():
    assert hasattr(OPS, "indexer_topk") and hasattr(OPS, "indexer_topk_out")
    # the out form declares every output and the workspace as written in place, and nothing else
    written = {a.name for a in OPS.indexer_topk_out.default._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"values", "raw_indices", "physical_indices", "counts", "workspace"}
    assert not any(a.alias_info is not None for a in OPS.indexer_topk.default._schema.arguments)


@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
def test_functional_operator_equals_the_api(layout):
    w = small(layout)
    want = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="reference")
    got = OPS.indexer_topk(*op_args(w), weight_scale=w.weight_scale, backend="reference")
    assert_bitwise(indexer_topk.IndexerTopKResult(*got), want, f"op vs api, {layout}")


@pytest.mark.parametrize("rows_per_request", [None, 1], ids=["no_hint", "one_row_per_request"])
@pytest.mark.parametrize("backend", ["legacy", "fused"])
def test_out_operator_writes_every_output_with_the_backends_bits(backend, rows_per_request):
    """Into poisoned outputs; the decode hint (one row per work item in the fused backend, even
    where rows in fact share pages) changes no bit."""
    w = small(pattern="equal")  # ties everywhere: the order rule decides every slot
    want = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend=backend)
    out = allocate_result(w.rows, w.topk, "cpu")
    for t in out:
        t.view(torch.int32).fill_(-12345)
    workspace = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, w.layout.value), dtype=torch.uint8)
    ret = OPS.indexer_topk_out(*op_args(w), *out, workspace, weight_scale=w.weight_scale, backend=backend,
                               rows_per_request=rows_per_request)
    assert ret is None
    assert_bitwise(out, want, f"out op vs api, {backend}, rows_per_request {rows_per_request}")


def test_out_operator_validates_like_the_api():
    w = small()
    out = allocate_result(w.rows, w.topk, "cpu")
    bad = out._replace(values=out.values[:, :-1])  # one column short
    with pytest.raises(ValueError, match="values"):
        OPS.indexer_topk_out(*op_args(w), *bad, None, backend="reference")
    with pytest.raises(ValueError, match="topk"):
        OPS.indexer_topk(*w.args(), 100, w.layout.value, backend="reference")
    for bad_hint in (0, -2):
        with pytest.raises(ValueError, match="rows_per_request"):
            OPS.indexer_topk(*w.args(), w.topk, w.layout.value, backend="reference", rows_per_request=bad_hint)
    for bad_hint in (True, 1.0, "1"):
        with pytest.raises(ValueError, match="rows_per_request"):
            indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="reference", rows_per_request=bad_hint)


@pytest.mark.parametrize("layout", ["sglang_mxfp4", "aiter_mxfp4"])
def test_opcheck(layout):
    """Schema, fake tensors, autograd registration and AOT dispatch with dynamic shapes, as
    ``torch.library.opcheck`` runs them (on the reference backend: the op's glue is under test).
    The MXFP4 layouts only: opcheck's schema check compares tensors with arithmetic that
    float8 lacks on the CPU, so the FP8 layout's e4m3 queries trip the checker, not the op."""
    w = small(layout, rows=2, tokens=2300)
    torch.library.opcheck(OPS.indexer_topk.default, op_args(w),
                          dict(weight_scale=w.weight_scale, backend="reference", rows_per_request=2))
    out = allocate_result(w.rows, w.topk, "cpu")
    torch.library.opcheck(OPS.indexer_topk_out.default, op_args(w) + tuple(out),
                          dict(workspace=None, weight_scale=w.weight_scale, backend="reference"))


def test_meta_tensors_get_the_output_shapes_without_running():
    w = small(rows=5)
    meta = [None if t is None else t.to("meta") for t in w.args()]
    values, raw, phys, counts = OPS.indexer_topk(*meta, w.topk, w.layout.value)
    assert values.device.type == "meta"
    assert (values.shape, values.dtype, raw.shape, raw.dtype, phys.dtype) == (
        (5, 512), torch.float32, (5, 512), torch.int32, torch.int32)
    assert (counts.shape, counts.dtype) == ((5,), torch.int32)


@pytest.mark.parametrize("bad", ["topk", "layout", "backend", "weights_shape", "q_dtype", "rows_per_request",
                                 "weight_scale", "out_shape"])
def test_fake_implementations_refuse_what_the_call_refuses(bad):
    """On meta tensors (the fake implementations) a call the operator would refuse when it runs
    is refused at once, naming the argument: a traced graph must not hold a call that can only fail."""
    w = small(rows=4)
    meta = [None if t is None else t.to("meta") for t in w.args()]
    topk, layout, kw = w.topk, w.layout.value, {}
    if bad == "topk":
        topk = 513
    elif bad == "layout":
        layout = "sglang_fp4"
    elif bad == "backend":
        kw["backend"] = "fast"
    elif bad == "weights_shape":
        meta[4] = meta[4][:, :-1]
    elif bad == "q_dtype":
        meta[0] = meta[0].to(torch.float16)
    elif bad == "rows_per_request":
        kw["rows_per_request"] = 0
    elif bad == "weight_scale":
        kw["weight_scale"] = 1e300  # past fp32's range
    out = allocate_result(w.rows, w.topk, "meta")
    if bad == "out_shape":
        out = out._replace(raw_indices=out.raw_indices[:, :-1])
    name = {"weights_shape": "weights", "q_dtype": "q", "out_shape": "raw_indices"}.get(bad, bad)
    if bad != "out_shape":
        with pytest.raises(ValueError, match=name):
            OPS.indexer_topk(*meta, topk, layout, **kw)
    with pytest.raises(ValueError, match=name):
        OPS.indexer_topk_out(*meta, topk, layout, *out, **kw)
    good = [None if t is None else t.to("meta") for t in w.args()]
    OPS.indexer_topk_out(*good, w.topk, w.layout.value, *allocate_result(w.rows, w.topk, "meta"))  # the valid call


def test_torch_compile_refuses_an_unsupported_topk_while_tracing(monkeypatch):
    """``torch.compile`` runs the fake implementation: topk 513 fails there, before the
    operator's implementation is ever called."""
    from indexer_topk import ops

    w = small(rows=2)
    ran = []
    monkeypatch.setattr(ops.api, "indexer_topk", lambda *a, **k: ran.append(1))

    def step(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens):
        return OPS.indexer_topk(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, 513, w.layout.value,
                                w.weight_scale, "reference")

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="topk") as info:
        compiled(*w.args())
    assert "Did you forget" not in str(info.value) and ran == []


def test_torch_compile_traces_both_operators_in_one_graph():
    """``fullgraph=True`` raises on any graph break: both operators, with work around them, must
    sit in one graph and give the eager bits."""
    w = small(rows=4)

    def step(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, values, raw, phys, counts):
        weights = weights * 1.0  # work before and after the operators, in the same graph
        OPS.indexer_topk_out(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, w.topk, w.layout.value,
                             values, raw, phys, counts, None, w.weight_scale, "reference")
        again = OPS.indexer_topk(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, w.topk,
                                 w.layout.value, w.weight_scale, "reference")
        return again[0] - values, counts + 0

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = allocate_result(w.rows, w.topk, "cpu")
    diff, counts = compiled(*w.args(), *out)
    want = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="reference")
    assert_bitwise(out, want, "compiled out op vs api")
    assert torch.equal(counts, want.counts)
    finite = torch.isfinite(want.values)
    assert torch.equal(diff[finite], torch.zeros_like(diff[finite]))


@pytest.mark.parametrize("meta_arg", [0, 4, 6], ids=["q", "weights", "seq_lens"])
def test_operators_refuse_meta_tensors_mixed_with_real_ones(meta_arg):
    """The dispatcher sends a call with any meta tensor to the fake implementation; among real
    tensors it must refuse, not return uninitialised outputs or skip writing them."""
    w = small()
    args = list(w.args())
    args[meta_arg] = args[meta_arg].to("meta")
    with pytest.raises(ValueError, match="meta"):
        OPS.indexer_topk(*args, w.topk, w.layout.value)
    out = allocate_result(w.rows, w.topk, "cpu")
    with pytest.raises(ValueError, match="meta"):
        OPS.indexer_topk_out(*args, w.topk, w.layout.value, *out)
    meta_out = allocate_result(w.rows, w.topk, "meta")  # real inputs, meta outputs
    with pytest.raises(ValueError, match="meta"):
        OPS.indexer_topk_out(*w.args(), w.topk, w.layout.value, *meta_out)


def test_torch_compile_with_a_symbolic_topk_and_weight_scale():
    """Where ``torch.compile`` keeps a Python int or float argument symbolic (on its own after a
    recompile, or with int specialisation off), the fake implementation checks ``topk`` and
    ``weight_scale`` at their traced values: each compiled call gives the eager bits."""
    import torch._dynamo

    def step(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, weight_scale):
        return OPS.indexer_topk(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk, "sglang_fp8",
                                weight_scale, "reference")

    torch._dynamo.reset()
    with torch._dynamo.config.patch(specialize_int=False, specialize_float=False):
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=True)
        for topk, scale in ((512, 1.0), (1024, 0.5)):
            w = small(rows=2, tokens=1500 + topk, topk=topk)
            got = compiled(*w.args(), topk, scale)
            want = indexer_topk.indexer_topk(*w.args(), topk=topk, layout="sglang_fp8", weight_scale=scale,
                                             backend="reference")
            assert_bitwise(indexer_topk.IndexerTopKResult(*got), want, f"compiled, topk {topk}")
    torch._dynamo.reset()
