"""Every invalid argument raises ValueError naming it, before any backend is reached."""

import dataclasses
import functools
import re
import struct

import pytest
import torch

import indexer_topk.api as api
from indexer_topk import IndexerTopKResult, Layout, allocate_result, indexer_topk, make_workload
from indexer_topk.contract import IndexerInputs
from kernel_cases import LAYOUTS, assert_bitwise

NAMES = ("q", "q_scale", "k_cache", "k_scale", "weights", "page_table", "seq_lens")
TOPK = 512


@pytest.fixture
def no_kernel(monkeypatch):
    def fail(name):
        pytest.fail(f"backend {name!r} was reached although the arguments are invalid")

    monkeypatch.setattr(api, "_backend_fn", fail)


@pytest.fixture
def calls(monkeypatch):
    """Replace every backend with a stub that records its calls."""
    seen = []

    def backend_fn(name):
        def run(inputs, **kw):
            seen.append((name, inputs, kw))
            return "ran"

        return run

    monkeypatch.setattr(api, "_backend_fn", backend_fn)
    return seen


@functools.lru_cache(maxsize=None)
def _small(layout):
    wl = make_workload(layout, context_tokens=(300,), rows_per_request=2, topk=TOPK, seed=0)
    assert wl.seq_lens.tolist() == [74, 75] and wl.page_table.shape == (2, 3) and wl.k_cache.shape[0] == 5
    return wl.args()


def small(layout):
    """Fresh copies of two rows of lengths 74 and 75 over 2 used pages (3 page-table columns, 5
    cache pages)."""
    return {n: None if t is None else t.clone() for n, t in zip(NAMES, _small(layout))}


def call(args, *, layout, **kw):
    kw.setdefault("topk", TOPK)
    kw.setdefault("backend", "reference")
    return indexer_topk(**args, layout=layout, **kw)


def expect(name, args, *, layout, message="", **kw):
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}: {message}"):
        call(args, layout=layout, **kw)


def present(layout):
    args = small(layout)
    return [n for n in NAMES if args[n] is not None]


def wrong_dtype(t):
    return t.to(torch.float64) if t.dtype != torch.float64 else t.to(torch.float32)


def noncontiguous(t):
    """Same shape, dtype and values, but not contiguous."""
    if t.dim() == 1:
        out = torch.empty(t.shape[0] * 2, dtype=t.dtype)[::2]
    else:
        out = torch.empty(tuple(reversed(t.shape)), dtype=t.dtype).permute(*reversed(range(t.dim())))
    out.copy_(t)
    assert not out.is_contiguous() and out.shape == t.shape
    return out


# ---------------------------------------------------------------------------------------------
# Valid calls reach the backend
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_valid_call_reaches_the_backend(layout, calls):
    args = small(layout)
    for topk in (512, 1024, 2048):
        assert call(dict(args), layout=layout, topk=topk) == "ran"
    assert call(dict(args), layout=Layout(layout), weight_scale=2) == "ran"
    assert [c[0] for c in calls] == ["reference"] * 4
    inputs = calls[0][1]
    assert isinstance(inputs, IndexerInputs) and inputs.layout is Layout(layout) and inputs.topk == 512
    assert all(a is b for a, b in zip(inputs.tensors, args.values()))
    assert calls[-1][1].weight_scale == 2.0 and isinstance(calls[-1][1].weight_scale, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.topk = 1024


@pytest.mark.parametrize("backend", ["reference", "legacy", "fused", "aiter"])
def test_every_named_backend_is_routed(backend, calls):
    args = small("sglang_fp8")
    call(args, layout="sglang_fp8", backend=backend)
    assert calls[0][0] == backend


# ---------------------------------------------------------------------------------------------
# dtype, shape, device, contiguity
# ---------------------------------------------------------------------------------------------

# every tensor argument, changed in one property at a time
TENSOR_MUTATIONS = {
    "dtype": (wrong_dtype, "expected dtype"),
    "contiguity": (noncontiguous, "expected a contiguous tensor"),
}


@pytest.mark.parametrize("mutation", TENSOR_MUTATIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_wrong_tensor_property(layout, mutation, no_kernel):
    mutate, message = TENSOR_MUTATIONS[mutation]
    for name in present(layout):
        args = small(layout)
        args[name] = mutate(args[name])
        expect(name, args, layout=layout, message=message)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_int64_page_table_and_lengths(layout, no_kernel):
    for name in ("page_table", "seq_lens"):
        args = small(layout)
        args[name] = args[name].long()
        expect(name, args, layout=layout, message="expected dtype torch.int32")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_wrong_shape(layout, no_kernel):
    for name in present(layout):
        if name == "page_table":
            continue  # its width is free
        args = small(layout)
        args[name] = args[name][..., :-1].contiguous()
        expect(name, args, layout=layout, message="expected shape")
        args = small(layout)
        args[name] = args[name].unsqueeze(-1)
        expect(name, args, layout=layout, message=r"expected \d+ dimensions, got \d+ \(shape ")
        if name == "k_cache":  # flattened: the message names the dimensions, not sizes taken from the wrong one
            args = small(layout)
            args[name] = args[name].view(-1)
            expect(name, args, layout=layout, message=rf"expected {small(layout)[name].dim()} dimensions, got 1")
    # rows are taken from q: every other per-row tensor must agree
    for name in ("q_scale", "weights", "page_table", "seq_lens"):
        args = small(layout)
        if args[name] is None:
            continue
        args[name] = args[name][:1].contiguous()
        expect(name, args, layout=layout, message="expected shape")
    for bad in (torch.zeros(2, dtype=torch.int32), torch.zeros(2, 3, 1, dtype=torch.int32), [[0, 1, 2]] * 2):
        args = small(layout)
        args["page_table"] = bad
        expect("page_table", args, layout=layout, message="expected an int32 tensor")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_wrong_device(layout, no_kernel):
    for name in present(layout):
        if name == "q":
            continue
        args = small(layout)
        args[name] = torch.empty_like(args[name], device="meta")
        expect(name, args, layout=layout, message="expected device cpu, got meta")
    # q's device is the one every other tensor is held to; a meta q is rejected as such
    args = small(layout)
    args["q"] = torch.empty_like(args["q"], device="meta")
    expect("q", args, layout=layout, message="a meta tensor")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_not_a_tensor(layout, no_kernel):
    for name in ("q", "k_cache", "weights", "seq_lens"):
        args = small(layout)
        args[name] = None if name != "seq_lens" else args[name].tolist()
        expect(name, args, layout=layout, message="expected a torch.Tensor")
    args = small(layout)
    args["q"] = torch.tensor(1.0)  # no rows dimension
    expect("q", args, layout=layout)


# ---------------------------------------------------------------------------------------------
# Scales present or absent per layout
# ---------------------------------------------------------------------------------------------

def test_scales_that_must_be_none(no_kernel):
    args = small("sglang_fp8")
    args["q_scale"] = torch.zeros(2, 64, dtype=torch.int32)
    expect("q_scale", args, layout="sglang_fp8", message="must be None for layout 'sglang_fp8'")
    for layout in ("sglang_fp8", "sglang_mxfp4"):
        args = small(layout)
        args["k_scale"] = torch.zeros(5, 1, 4, 64, dtype=torch.uint8)
        expect("k_scale", args, layout=layout, message=f"must be None for layout '{layout}'")


@pytest.mark.parametrize("layout,name", [("aiter_mxfp4", "q_scale"), ("aiter_mxfp4", "k_scale"), ("sglang_mxfp4", "q_scale")])
def test_scales_that_are_required(layout, name, no_kernel):
    args = small(layout)
    args[name] = None
    expect(name, args, layout=layout, message="expected a torch.Tensor, got NoneType")


def test_inputs_of_another_layout(no_kernel):
    """A valid aiter batch called as sglang_mxfp4 fails on its first mismatching argument."""
    args = small("aiter_mxfp4")
    expect("q_scale", args, layout="sglang_mxfp4", message="expected dtype torch.int32")
    args = small("sglang_mxfp4")
    expect("q", args, layout="sglang_fp8", message="expected dtype torch.float8_e4m3fn")


# ---------------------------------------------------------------------------------------------
# Value checks: seq_lens and page ids
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_seq_lens_values(layout, no_kernel):
    args = small(layout)
    args["seq_lens"] = torch.tensor([74, -1], dtype=torch.int32)
    expect("seq_lens", args, layout=layout, message="negative length -1")
    args = small(layout)
    args["seq_lens"] = torch.tensor([3 * 64 + 1, 5], dtype=torch.int32)
    expect("seq_lens", args, layout=layout, message=re.escape("length 193 exceeds the page table (3 pages x 64)"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seq_len_filling_the_page_table_is_valid(layout, calls):
    args = small(layout)
    args["seq_lens"] = torch.tensor([3 * 64, 0], dtype=torch.int32)
    call(args, layout=layout)
    assert len(calls) == 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bad_id", [-1, -(2**31), 5, 2**31 - 1])
def test_page_id_outside_the_cache_in_a_used_page(layout, bad_id, no_kernel):
    args = small(layout)
    args["page_table"][1, 1] = bad_id  # row 1 (75 positions) uses pages 0 and 1
    expect("page_table", args, layout=layout, message=f"row 1 page 1 holds id {bad_id}, outside the cache of 5 pages")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_garbage_in_unused_page_table_columns_is_allowed(layout, calls):
    args = small(layout)
    args["page_table"][:, 2] = torch.tensor([-7, 10**6], dtype=torch.int32)  # column 2 unused by both rows
    call(dict(args), layout=layout)
    # an empty row uses no page at all
    args["seq_lens"] = torch.tensor([0, 75], dtype=torch.int32)
    args["page_table"][0, :] = -1
    call(dict(args), layout=layout)
    # a row of exactly 128 positions does not use column 2; one more position does
    args["seq_lens"] = torch.tensor([128, 75], dtype=torch.int32)
    args["page_table"][0, :2] = torch.tensor([3, 4], dtype=torch.int32)
    call(dict(args), layout=layout)
    assert len(calls) == 3
    args["seq_lens"] = torch.tensor([129, 75], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^page_table: row 0 page 2 holds id -1,"):
        call(dict(args), layout=layout)
    assert len(calls) == 3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_check_values_false_skips_only_the_value_checks(layout, calls):
    args = small(layout)
    args["seq_lens"] = torch.tensor([-3, 10**6], dtype=torch.int32)
    args["page_table"][1, 0] = -1
    call(dict(args), layout=layout, check_values=False)
    assert len(calls) == 1
    with pytest.raises(ValueError, match=r"^seq_lens: negative"):
        call(dict(args), layout=layout)
    # metadata checks still run
    args = small(layout)
    args["seq_lens"] = args["seq_lens"].long()
    with pytest.raises(ValueError, match=r"^seq_lens: expected dtype"):
        call(args, layout=layout, check_values=False)
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------
# The fp32 range: sum_h |weights| * largest |q . k| * largest key scale at most 2**127
# ---------------------------------------------------------------------------------------------

E4M3_448 = 0x7E  # the e4m3 byte of 448, its largest magnitude
FP8_DOT = 128 * 448 * 448  # the largest |q . k| of the layout, reached by these inputs


def saturated_fp8(key_scale: float, weight: float = 1.0):
    """One row of 64 positions where every query and key element is 448, so each head's dot is
    the layout's largest and the fp32 intermediate S * k_scale is 64 * weight * 128 * 448**2 *
    key_scale: the bound itself."""
    k_cache = torch.zeros((1, 64 * 132), dtype=torch.uint8)
    k_cache[0, : 64 * 128] = E4M3_448
    k_cache[0, 64 * 128 :].view(torch.float32)[:] = key_scale
    return {
        "q": torch.full((1, 64, 128), 448.0).to(torch.float8_e4m3fn), "q_scale": None, "k_cache": k_cache,
        "k_scale": None, "weights": torch.full((1, 64), weight), "page_table": torch.zeros((1, 1), dtype=torch.int32),
        "seq_lens": torch.tensor([64], dtype=torch.int32),
    }


def fp8_key_scales(args):
    return args["k_cache"].view(args["k_cache"].shape[0], -1)[:, 64 * 128 :].view(torch.float32)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's fp32 overflow
def test_the_fp32_range_is_where_the_kernels_overflow():
    """At 1e38 (inside 2**127) the kernels' fp32 S * k_scale is finite and the call runs, equal to
    the reference; at 4.1e38 the legacy kernel gives inf where the fp64 score (weight_scale 1/4)
    is a finite 1.03e38, so the call, and the reference, refuse it before anything runs."""
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.contract import IndexerInputs
    from indexer_topk.reference import reference_indexer_topk, reference_scores

    inside = saturated_fp8(1e38 / (64 * FP8_DOT))
    got = call(inside, layout="sglang_fp8", backend="legacy", weight_scale=0.25)
    want = call(inside, layout="sglang_fp8", backend="reference", weight_scale=0.25)
    assert bool(torch.isfinite(got.values[0, :64]).all())
    assert torch.allclose(got.values[0, :64], want.values[0, :64], rtol=1e-6)

    beyond = saturated_fp8(4.1e38 / (64 * FP8_DOT))
    exact = reference_scores(*beyond.values(), layout="sglang_fp8", weight_scale=0.25)
    assert bool(torch.isfinite(exact).all()) and float(exact.max()) == pytest.approx(1.025e38, rel=1e-3)
    unchecked = legacy_indexer_topk(IndexerInputs(*beyond.values(), layout=Layout.SGLANG_FP8, topk=TOPK,
                                                  weight_scale=0.25))
    assert bool(torch.isinf(unchecked.values[0, :64]).all())
    for backend in ("reference", "legacy", "fused", "auto"):
        with pytest.raises(ValueError, match=r"^weights, k_cache: row 0's scores are beyond the fp32 range"):
            call(dict(beyond), layout="sglang_fp8", backend=backend, weight_scale=0.25)
    with pytest.raises(ValueError, match=r"^weights, k_cache: row 0"):
        reference_indexer_topk(*beyond.values(), topk=TOPK, layout="sglang_fp8", weight_scale=0.25)


@pytest.mark.parametrize("what", ["key_scale", "weights"])
def test_values_beyond_the_fp32_range_are_refused(what, no_kernel):
    """A key scale of 1e36 in the second page (both rows use it), or row 1's weights at 1e30:
    refused, naming the row and the bound, before any backend is reached."""
    args = small("sglang_fp8")
    if what == "key_scale":
        fp8_key_scales(args)[int(args["page_table"][1, 1]), 10] = 1e36
        row = 0
    else:
        args["weights"][1] = 1e30
        row = 1
    expect("weights, k_cache", args, layout="sglang_fp8",
           message=rf"row {row}'s scores are beyond the fp32 range .*2\*\*127")


@pytest.mark.parametrize("layout", ["sglang_mxfp4", "aiter_mxfp4"])
def test_block_exponents_beyond_the_fp32_range_are_refused(layout, no_kernel):
    """MXFP4: a query block exponent of 200 against a key block exponent of 200 (dots up to
    4608 * 2**146)."""
    args = small(layout)
    if layout == "sglang_mxfp4":
        args["q_scale"].view(torch.uint8)[0, :] = 200
        args["k_cache"][int(args["page_table"][0, 0]), 64 * 64 + 5] = 200
    else:
        args["q_scale"][0] = 200
        args["k_scale"][int(args["page_table"][0, 0]), 0, 2, 7] = 200
    expect("weights, q_scale, k_cache", args, layout=layout, message="row 0's scores are beyond the fp32 range")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_deepseek_v4_magnitudes_are_inside_the_fp32_range(layout, calls):
    """Weights of up to 4 per head and FP8 key scales of 1e-2 .. 1e2 (MXFP4: block exponents
    127 +- 20) are far inside the range; so are huge values where no row reads them (an unused
    cache page, an empty row's weights) and non-finite ones (their scores are non-finite in every
    path alike)."""
    args = small(layout)
    args["weights"] = torch.full_like(args["weights"], 4.0)
    if layout == "sglang_fp8":
        scales = fp8_key_scales(args)
        scales.copy_(torch.logspace(-2, 2, scales.numel()).reshape(scales.shape))
    elif layout == "sglang_mxfp4":
        args["q_scale"].view(torch.uint8).fill_(147)
        args["k_cache"][:, 64 * 64 :] = 107
    else:
        args["q_scale"].fill_(147)
        args["k_scale"].fill_(147)
    call(dict(args), layout=layout)
    unused = int(({0, 1, 2, 3, 4} - set(args["page_table"][:, :2].flatten().tolist())).pop())
    if layout == "sglang_fp8":
        fp8_key_scales(args)[unused] = 1e36
        fp8_key_scales(args)[int(args["page_table"][0, 0]), :3] = torch.tensor([float("inf"), float("nan"), -float("inf")])
    elif layout == "sglang_mxfp4":
        args["k_cache"][unused, 64 * 64 :] = 254
        args["k_cache"][int(args["page_table"][0, 0]), 64 * 64 : 64 * 64 + 4] = 255
    else:
        args["k_scale"][unused] = 254
        args["k_scale"][int(args["page_table"][0, 0]), 0, 0, :4] = 255
    args["weights"][1, 3] = float("nan")
    call(dict(args), layout=layout)
    args["seq_lens"] = torch.tensor([0, 75], dtype=torch.int32)
    args["weights"][0] = 3e38
    call(dict(args), layout=layout)
    assert len(calls) == 3


def test_zero_rows_are_valid(calls):
    args = {k: (None if v is None else v[:0]) for k, v in small("sglang_mxfp4").items()}
    args["k_cache"] = small("sglang_mxfp4")["k_cache"]
    call(args, layout="sglang_mxfp4")
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------
# Scalars: topk, layout, backend, weight_scale
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("topk", [0, 100, 4096, 511, -512, True, 512.0, "512", None, torch.tensor(512)])
def test_unsupported_topk(topk, no_kernel):
    expect("topk", small("sglang_fp8"), layout="sglang_fp8", topk=topk, message="unsupported value")


@pytest.mark.parametrize("layout", ["fp4", "SGLANG_FP8", "", None, 3])
def test_unsupported_layout(layout, no_kernel):
    expect("layout", small("sglang_fp8"), layout=layout, message="unsupported layout")


@pytest.mark.parametrize("backend", ["cuda", "", "Reference", "triton"])
def test_unknown_backend(backend, no_kernel):
    expect("backend", small("sglang_fp8"), layout="sglang_fp8", backend=backend, message="unknown backend")


@pytest.mark.parametrize("weight_scale", [torch.tensor(1.0), "1.0", None, [1.0]])
def test_weight_scale_must_be_a_python_number(weight_scale, no_kernel):
    expect("weight_scale", small("sglang_fp8"), layout="sglang_fp8", weight_scale=weight_scale,
           message="expected a Python float")


def test_layout_is_checked_first(no_kernel):
    args = small("sglang_fp8")
    args["q"] = None
    expect("layout", args, layout="nope", topk=3)
    expect("topk", args, layout="sglang_fp8", topk=3)


# ---------------------------------------------------------------------------------------------
# out=
# ---------------------------------------------------------------------------------------------

FIELDS = IndexerTopKResult._fields


def good_out(rows=2):
    return allocate_result(rows, TOPK, "cpu")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_accepted(layout, calls):
    args = small(layout)
    out = good_out()
    call(dict(args), layout=layout, out=out)
    assert calls[-1][2]["out"] is out
    call(dict(args), layout=layout, out=tuple(out))
    assert isinstance(calls[-1][2]["out"], IndexerTopKResult)
    assert all(a is b for a, b in zip(calls[-1][2]["out"], out))


@pytest.mark.parametrize("field", FIELDS)
def test_out_wrong_field(field, no_kernel):
    layout = "sglang_mxfp4"
    i = FIELDS.index(field)
    good = good_out()
    bad_versions = {
        "expected dtype": wrong_dtype(good[i]),
        "expected shape": good[i][..., :-1].contiguous(),
        "expected device": torch.empty_like(good[i], device="meta"),
        "expected a contiguous tensor": noncontiguous(good[i]),
    }
    for message, bad in bad_versions.items():
        out = list(good_out())
        out[i] = bad
        expect(f"out.{field}", small(layout), layout=layout, out=IndexerTopKResult(*out), message=message)
    # topk of the call decides the shape
    out = allocate_result(2, 1024, "cpu")
    expect("out.values", small(layout), layout=layout, out=out, message="expected shape")


@pytest.mark.parametrize("bad", [[], (1, 2, 3), list(allocate_result(2, TOPK, "cpu")), "out"])
def test_out_not_a_result(bad, no_kernel):
    expect("out", small("sglang_fp8"), layout="sglang_fp8", out=bad, message="expected an IndexerTopKResult")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_aliasing_an_input(layout, calls):
    args = small(layout)
    out = good_out()._replace(counts=args["seq_lens"])
    expect("out.counts", args, layout=layout, out=out, message="aliases an input tensor")

    # raw_indices over a buffer that also holds the page table
    args = small(layout)
    buf = torch.zeros(2 * TOPK, dtype=torch.int32)
    pt = buf[-6:].view(2, 3)
    pt.copy_(args["page_table"])
    args["page_table"] = pt
    out = good_out()._replace(raw_indices=buf.view(2, TOPK))
    expect("out.raw_indices", dict(args), layout=layout, out=out, message="aliases an input tensor")
    # a neighbouring slice of the same buffer that does not overlap the page table is fine
    buf2 = torch.zeros(2 * TOPK + 6, dtype=torch.int32)
    pt2 = buf2[:6].view(2, 3)
    pt2.copy_(args["page_table"])
    args["page_table"] = pt2
    out = good_out()._replace(physical_indices=buf2[6:].view(2, TOPK))
    call(dict(args), layout=layout, out=out)
    assert len(calls) == 1

    # values over the bytes of the key cache
    args = small(layout)
    kbuf = args["k_cache"].reshape(-1)
    if kbuf.numel() >= 2 * TOPK * 4:
        out = good_out()._replace(values=kbuf[: 2 * TOPK * 4].view(torch.float32).view(2, TOPK))
        expect("out.values", args, layout=layout, out=out, message="aliases an input tensor")
    assert len(calls) == 1


def test_out_values_aliasing_fp32_weights(no_kernel):
    args = small("sglang_fp8")
    buf = torch.zeros(2 * TOPK, dtype=torch.float32)
    w = buf[100 : 100 + 128].view(2, 64)
    w.copy_(args["weights"])
    args["weights"] = w
    out = good_out()._replace(values=buf.view(2, TOPK))
    expect("out.values", args, layout="sglang_fp8", out=out, message="aliases an input tensor")


def test_out_fields_aliasing_each_other(calls):
    layout = "sglang_fp8"
    same = torch.empty(2, TOPK, dtype=torch.int32)
    out = good_out()._replace(raw_indices=same, physical_indices=same)
    expect("out.raw_indices", small(layout), layout=layout, out=out,
           message="aliases out.physical_indices")

    buf = torch.empty(4 * TOPK + 2, dtype=torch.int32)
    out = good_out()._replace(raw_indices=buf[: 2 * TOPK].view(2, TOPK), physical_indices=buf[1 : 2 * TOPK + 1].view(2, TOPK))
    expect("out.raw_indices", small(layout), layout=layout, out=out, message="aliases out.physical_indices")

    out = good_out()._replace(physical_indices=buf[: 2 * TOPK].view(2, TOPK), counts=buf[2 * TOPK - 1 : 2 * TOPK + 1])
    expect("out.physical_indices", small(layout), layout=layout, out=out, message="aliases out.counts")

    fbuf = torch.empty(2 * TOPK, dtype=torch.float32)
    out = good_out()._replace(values=fbuf.view(2, TOPK), counts=fbuf[-2:].view(torch.int32))
    expect("out.values", small(layout), layout=layout, out=out, message="aliases out.counts")

    # adjacent, non-overlapping slices of one buffer are fine
    out = good_out()._replace(
        raw_indices=buf[: 2 * TOPK].view(2, TOPK),
        physical_indices=buf[2 * TOPK : 4 * TOPK].view(2, TOPK),
        counts=buf[4 * TOPK :],
    )
    call(small(layout), layout=layout, out=out)
    assert len(calls) == 1  # and only this call reached the backend



# ---------------------------------------------------------------------------------------------
# workspace=
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "legacy", "fused"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_workspace_overlapping_an_input_or_output(layout, backend, no_kernel):
    """A workspace over the bytes of any input or output would be scribbled over (or scribble
    over it) during the call: rejected, naming what it overlaps."""
    for name in present(layout):
        args = small(layout)
        t = args[name]
        buf = torch.zeros(t.numel() * t.element_size() + 64, dtype=torch.uint8)
        args[name] = buf[16 : 16 + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        args[name].copy_(t)
        expect("workspace", args, layout=layout, backend=backend, workspace=buf[:32],
               message=f"overlaps {name}")
    out = good_out()
    for i, field in enumerate(FIELDS):
        t = out[i]
        buf = torch.zeros(t.numel() * 4 + 64, dtype=torch.uint8)
        fields = list(good_out())
        fields[i] = buf[16 : 16 + t.numel() * 4].view(t.dtype).view(t.shape)
        expect("workspace", small(layout), layout=layout, backend=backend, out=IndexerTopKResult(*fields),
               workspace=buf[: 16 + t.numel() * 4], message=f"overlaps out.{field}")


@pytest.mark.parametrize("workspace", ["scratch", 7, [0] * 64, torch.zeros(64, dtype=torch.int32)])
def test_workspace_of_the_wrong_kind_is_rejected_by_every_backend(workspace, no_kernel):
    """The reference needs no scratch, but it does not silently accept nonsense either."""
    for backend in ("reference", "legacy", "fused", "auto"):
        expect("workspace", small("sglang_fp8"), layout="sglang_fp8", backend=backend, workspace=workspace)


def test_reference_accepts_and_ignores_a_valid_workspace():
    args = small("sglang_fp8")
    ws = torch.full((4096,), 0xA5, dtype=torch.uint8)
    got = call(dict(args), layout="sglang_fp8", workspace=ws)
    assert_bitwise(got, call(dict(args), layout="sglang_fp8"))
    assert bool((ws == 0xA5).all())


# ---------------------------------------------------------------------------------------------
# Tensors that look valid and are not
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check_values", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_meta_tensors(layout, check_values, no_kernel):
    """Meta tensors have a device and a shape but no data: rejected as such, checks on or off."""
    args = {n: None if t is None else torch.empty_like(t, device="meta") for n, t in small(layout).items()}
    expect("q", args, layout=layout, check_values=check_values, message="a meta tensor")


@pytest.mark.parametrize("backend", ["reference", "legacy", "fused"])
def test_fp8_cache_must_start_on_a_4_byte_boundary(backend, no_kernel):
    """The FP8 cache's per-key scales are read as float32: a cache at an odd byte offset names
    k_cache (it used to fail inside torch, and the reference accepted it)."""
    args = small("sglang_fp8")
    k = args["k_cache"]
    for offset in (1, 2, 3):
        buf = torch.zeros(k.numel() + 4, dtype=torch.uint8)
        args["k_cache"] = buf[offset : offset + k.numel()].view(k.shape)
        args["k_cache"].copy_(k)
        expect("k_cache", dict(args), layout="sglang_fp8", backend=backend, message="must start on a 4-byte boundary")


@pytest.mark.parametrize("layout", ["sglang_mxfp4", "aiter_mxfp4"])
def test_mxfp4_cache_at_any_byte_offset_is_valid(layout, calls):
    """MXFP4 caches are read byte by byte."""
    args = small(layout)
    k = args["k_cache"]
    buf = torch.zeros(k.numel() + 1, dtype=torch.uint8)
    args["k_cache"] = buf[1:].view(k.shape)
    args["k_cache"].copy_(k)
    call(args, layout=layout, backend="legacy")
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------
# Scalars fp32 cannot carry, and flags of the wrong type
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "weight_scale",
    [pytest.param(10**400, id="10**400"), pytest.param(10**5000, id="10**5000"), 1e39, -1e39, float("inf"),
     float("-inf"), float("nan"), 1e-45, -1e-40, 1e-39],
)
def test_weight_scale_outside_fp32(weight_scale, no_kernel):
    """Values fp32 cannot hold (overflow to inf, NaN, or subnormal and imprecise) would be
    rounded silently in the kernels, differently from the reference. A huge int is named by its
    size, not printed (past 4,300 digits Python refuses to print it at all)."""
    expect("weight_scale", small("sglang_fp8"), layout="sglang_fp8", weight_scale=weight_scale,
           message=r"an int of \d+ bits is beyond" if isinstance(weight_scale, int) else "")


def test_weight_scale_is_rounded_to_fp32(calls):
    """What the backends receive is the fp32 value the kernels multiply by, for every backend
    alike (the reference included); zero and fp32's extremes are valid."""
    args = small("sglang_fp8")
    call(dict(args), layout="sglang_fp8", weight_scale=0.1)
    assert calls[-1][1].weight_scale == struct.unpack("f", struct.pack("f", 0.1))[0] != 0.1
    for ok in (0.0, -0.0, 3.4028234663852886e38, -3.4028234663852886e38, 1.1754943508222875e-38, 5, -2):
        call(dict(args), layout="sglang_fp8", weight_scale=ok)
        assert calls[-1][1].weight_scale == float(ok)


@pytest.mark.parametrize("weight_scale", [True, False])
def test_weight_scale_bool(weight_scale, no_kernel):
    """Like topk, a bool is not a number here."""
    expect("weight_scale", small("sglang_fp8"), layout="sglang_fp8", weight_scale=weight_scale,
           message="expected a Python float")


@pytest.mark.parametrize("check_values", ["no", "", 0, 1, None, torch.tensor(True)])
def test_check_values_must_be_a_bool(check_values, no_kernel):
    expect("check_values", small("sglang_fp8"), layout="sglang_fp8", check_values=check_values,
           message="expected True or False")


def test_weights_that_require_grad_are_checked_without_a_warning():
    """The value checks read the weights as numbers: weights that require grad (a caller's
    module parameters) raise no autograd warning from them."""
    import warnings

    w = make_workload("sglang_fp8", context_tokens=[1500], rows_per_request=[2], topk=512, seed=1, device="cpu")
    args = list(w.args())
    args[4] = args[4].clone().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = indexer_topk(*args, **w.kwargs(), backend="reference", check_values=True)
    assert got.counts.tolist() == [374, 375]


@pytest.mark.parametrize("backend", ["reference", "legacy"])
def test_outputs_made_under_inference_mode_are_written_by_every_backend(backend):
    """Outputs allocated under ``torch.inference_mode()`` (as an engine's warm-up may make them)
    and a call outside it: the kernels write them through pointers, and the reference writes
    them too, where torch refused its in-place copy after the scores were computed."""
    w = make_workload("sglang_fp8", context_tokens=[1500], rows_per_request=[2], topk=512, seed=2, device="cpu")
    with torch.inference_mode():
        out = allocate_result(w.rows, w.topk, "cpu")
    got = indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=out)
    assert got is out or all(a is b for a, b in zip(got, out))
    assert_bitwise(out, indexer_topk(*w.args(), **w.kwargs(), backend=backend), f"{backend} into inference outputs")


@pytest.mark.parametrize("call, field", [
    (lambda: allocate_result(-1, 512, "cpu"), "rows"),
    (lambda: allocate_result(2, 2.5, "cpu"), "topk"),
    (lambda: make_workload("sglang_fp8", context_tokens=[], rows_per_request=[]), "context_tokens"),
    (lambda: make_workload("sglang_fp8", context_tokens=[-100], rows_per_request=[1]), "context_tokens"),
    (lambda: make_workload("sglang_fp8", context_tokens=[2048], rows_per_request=[-1]), "rows_per_request"),
    (lambda: make_workload("sglang_fp8", context_tokens=[2048], rows_per_request=[1], seed=2**64), "seed"),
    (lambda: make_workload("sglang_fp8", context_tokens=[2048], rows_per_request=[1], seed=-1), "seed"),
])
def test_public_helpers_name_a_bad_argument(call, field):
    """The helpers a user builds a call with refuse what they cannot build by name, where torch
    raised from inside them (or a negative context became an empty one)."""
    with pytest.raises(ValueError, match=f"^{field}: "):
        call()


def test_workspace_size_names_a_bad_device():
    with pytest.raises(ValueError, match="^device: "):
        api.workspace_size(4, 512, "sglang_fp8", device="bogus")


def test_numpy_ints_size_the_helpers():
    import numpy as np

    out = allocate_result(np.int64(3), np.int64(512), "cpu")
    assert out.values.shape == (3, 512) and out.counts.shape == (3,)
    w = make_workload("sglang_fp8", context_tokens=[300], rows_per_request=[1], topk=512, seed=3, device="cpu")
    from indexer_topk.reference import reference_indexer_topk

    got = reference_indexer_topk(*w.args(), **{**w.kwargs(), "topk": np.int64(512)})
    assert got.values.shape == (1, 512)


@pytest.mark.parametrize("case", ["layout_before_check_values", "topk_before_meta", "alignment_before_seq_lens"])
def test_the_first_bad_argument_is_named_in_argument_order(case):
    """With several arguments wrong, the error names the first in the order validation reads
    them: the scalars, then check_values, then the tensors (q, the cache and its alignment, ...)."""
    w = make_workload("sglang_fp8", context_tokens=[600], rows_per_request=[1], topk=512, seed=3, device="cpu")
    args, kw = list(w.args()), dict(w.kwargs())
    if case == "layout_before_check_values":
        kw.update(layout="nope", check_values="yes")
        want = "layout"
    elif case == "topk_before_meta":
        args[0] = args[0].to("meta")
        kw.update(topk=513)
        want = "topk"
    else:
        raw = torch.zeros(args[2].numel() + 2, dtype=torch.uint8)
        args[2] = raw[2:].view(args[2].shape)  # two bytes past a 4-byte boundary
        args[6] = args[6].long()
        want = "k_cache: must start on a 4-byte boundary"
    with pytest.raises(ValueError, match=f"^{want}"):
        indexer_topk(*args, **kw)
