"""The fused backend's Hopper stream (:mod:`indexer_topk.backends.hopper`).

Its kernel is Gluon for sm_90 and runs only there (the ``gpu`` tests below and the GPU tests of
``test_fused.py``, whose FP8 calls it serves on an H200); a CPU checks where it applies, its
configuration's rules and that the fused backend falls back to the plain-Triton kernel.
"""

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from indexer_topk.backends.fused import fused_indexer_topk, plan_fused
from indexer_topk.backends.fused import hopper_indexer_topk
from indexer_topk.backends.hopper import hopper_kernels, why_not_stream
from indexer_topk.backends.legacy import legacy_indexer_topk
from indexer_topk.contract import allocate_result, as_inputs, by_position
from indexer_topk.kernels.launch import pack_args, tile_config
from indexer_topk.workload import make_workload

from kernel_cases import assert_bitwise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark" / "research"))
import hopper_probe  # noqa: E402

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def kernels():
    k = hopper_kernels()
    if k is None:
        pytest.skip("this Triton has no Gluon dialect for Hopper")
    return k


def small_inputs(layout="sglang_fp8", device="cpu", rows=4, tokens=3000, topk=64, **kw):
    w = make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=topk, seed=3, device=device, **kw)
    return w.inputs()


def why(inputs):
    inputs = as_inputs(inputs)
    return why_not_stream(inputs, pack_args(inputs), tile_config(inputs.layout))


# ---------------------------------------------------------------------------------------------
# CPU: configuration and where the stream applies
# ---------------------------------------------------------------------------------------------

def test_default_config_is_the_measured_one():
    cfg = kernels().HopperConfig()
    assert (cfg.select_visits, cfg.select_parts, cfg.score_slots, cfg.key_stages) == (8, 4, 256, 6)
    # three score warpgroups at 104 registers and a 24-register loader leave the selection 144
    assert (cfg.score_regs, cfg.load_regs, cfg.select_regs) == (104, 24, 144)


@pytest.mark.parametrize("pool, step_pages", [(1024, 8), (1024, 16), (64, 1), (128, 2), (192, 1), (4096, 8)])
def test_step_cut_slack_leaves_room_for_a_step(pool, step_pages):
    # after a step's cut the buffer holds at most topk + slack entries, and the step's entrants
    # (step_pages pages of 64 keys) must still fit in topk + pool; the item's last cut is exact
    topk = 1024
    slack = kernels()._cut_slack.fn(topk + pool, topk, step_pages * 64)
    assert 0 <= slack <= pool // 8
    assert topk + slack + step_pages * 64 <= topk + pool
    if pool == step_pages * 64:  # a pool of one step: every cut exact
        assert slack == 0


def test_mxfp4_config_runs_two_score_warpgroups():
    # the widened keys sit in registers beside the accumulator: two warpgroups of 160 registers
    cfg = kernels().HopperConfig.for_layout("sglang_mxfp4")
    assert (cfg.score_groups, cfg.score_regs, cfg.score_slots, cfg.select_regs) == (2, 160, 128, 168)
    assert kernels().HopperConfig.for_layout("sglang_fp8") == kernels().HopperConfig()


def test_decode_config_gives_the_selection_the_registers_one_row_frees():
    # one row's accumulator is half the prefill tile's: the score warpgroups shrink, the selection grows
    decode = kernels().HopperConfig.for_layout("sglang_fp8", rows=1)
    prefill = kernels().HopperConfig.for_layout("sglang_fp8", rows=2)
    assert prefill == kernels().HopperConfig()
    assert decode.score_regs < prefill.score_regs and decode.select_regs == 240 > prefill.select_regs
    mx = kernels().HopperConfig.for_layout("sglang_mxfp4", rows=1)
    assert mx.select_regs > kernels().HopperConfig.for_layout("sglang_mxfp4").select_regs


@pytest.mark.parametrize("groups, expected", [(3, 96), (2, 128)])
def test_launch_registers_fill_the_register_file(groups, expected):
    regs = kernels().HopperConfig(score_groups=groups, score_regs=104).launch_regs()
    threads = 128 * (2 + groups)  # selection, loader (a warpgroup's share), score warpgroups
    assert regs == expected and regs % 8 == 0 and regs * threads <= 65536 < (regs + 8) * threads


@pytest.mark.parametrize("bad, match", [
    (dict(key_stages=4), "key_stages"),  # a stage shared by two warpgroups: parity aliasing
    (dict(key_stages=5), "key_stages"),
    (dict(key_stages=0), "key_stages"),
    (dict(select_visits=6), "select_visits"),
    (dict(select_visits=0), "select_visits"),
    (dict(select_parts=3), "select_parts"),
    (dict(select_visits=2, select_parts=4, score_slots=8), "select_parts"),
    (dict(score_slots=100), "score_slots"),
    (dict(score_slots=4), "score_slots"),
    (dict(score_regs=100), "score_regs"),
    (dict(load_regs=16), "load_regs"),
    (dict(score_regs=160), "leave the selection"),
    (dict(score_groups=4), "score_groups"),
    (dict(score_groups=1), "score_groups"),
    (dict(score_groups=2, key_stages=3), "key_stages"),
    (dict(score_groups=2, score_regs=240), "leave the selection"),
    (dict(finish_warps=3), "finish_warps"),
    (dict(finish_warps=32), "finish_warps"),
])
def test_config_refuses_what_the_kernel_cannot_run(bad, match):
    with pytest.raises(ValueError, match=match):
        kernels().HopperConfig(**bad)


def test_every_probe_build_is_a_valid_config():
    for name, kw in hopper_probe.BUILDS.items():
        kernels().HopperConfig(**kw)  # a misspelt field raises TypeError here, not minutes into a device run


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's answer")
def test_stream_does_not_apply_without_a_gpu():
    assert "GPU" in why(small_inputs())
    assert "GPU" in why(small_inputs("sglang_mxfp4"))
    assert "not aiter_mxfp4" in why(small_inputs("aiter_mxfp4"))
    with pytest.raises(ValueError, match="does not apply"):
        hopper_indexer_topk(small_inputs())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's answer")
def test_fused_backend_falls_back_to_the_plain_kernel():
    # where the stream does not apply, the plain-Triton kernel serves the FP8 layout with legacy's bits
    inputs = small_inputs(pattern="equal")
    assert why(inputs) is not None
    assert_bitwise(fused_indexer_topk(inputs), legacy_indexer_topk(inputs), "plain fused vs legacy")


@pytest.mark.parametrize("raw", ["0", "off", "not-a-bool"])
def test_switch_off_or_unreadable_sends_fp8_to_the_plain_kernel(raw, monkeypatch):
    # a GPU with bulk copies, as far as the checks before the switch can tell
    inputs = as_inputs(small_inputs())
    gpu_like = SimpleNamespace(interpret=False, kc=inputs.k_cache)
    monkeypatch.setattr("indexer_topk.backends.hopper.bulk_copies_available", lambda device: True)
    monkeypatch.setenv("INDEXER_TOPK_HOPPER_STREAM", raw)
    assert why_not_stream(inputs, gpu_like, tile_config(inputs.layout)) == "INDEXER_TOPK_HOPPER_STREAM is off"


def test_profile_table_reports_shares_and_skips_absent_partitions():
    # a third row, as for an SM the grid did not use, must not dilute the means
    prof = torch.zeros(3, 5, 8, dtype=torch.int64)
    prof[:2, 0, :5] = torch.tensor([1000, 400, 200, 100, 3])  # selection: all, waits, cuts, ends, cuts
    prof[:2, 2, :5] = torch.tensor([1000, 50, 500, 100, 100])  # score 0
    prof[0, 2, 2] = 300  # programs are averaged: (300 + 500) / 2 = 400 cycles in the MMA
    # global-timer starts and ends (ns): program 0 spans 1000..9000, program 1 3000..6000
    prof[0, 0, 5:7] = torch.tensor([1000, 8000])
    prof[0, 2, 5:7] = torch.tensor([2000, 9000])
    prof[1, 0, 5:7] = torch.tensor([3000, 6000])
    prof[1, 2, 5:7] = torch.tensor([3000, 5000])
    prof[:2, 0, 7] = 50  # the step cuts' loads: 50 of their 200 cycles
    prof[:2, 1, 7] = 100  # and their threshold search (counter 7 of the loader's row)
    table = hopper_probe.profile_table(prof).splitlines()
    assert len(table) == 4  # the loader and the other score groups recorded nothing
    assert table[0].startswith("select") and "wait tiles  40.0%" in table[0] and "cuts 3.0" in table[0]
    assert table[1].startswith("score 0") and "mma  40.0%" in table[1]
    spans = hopper_probe.profile_spans(prof)
    assert spans == {"kernel us": 8.0, "program us": 5.5, "longest program us": 8.0, "start spread us": 2.0,
                     "end spread us": 3.0}
    assert table[2].startswith("timeline kernel us 8.0")
    assert table[3] == "step cuts  load  25.0%  threshold  50.0%  per cut 0.1 Kcycles"
    fields = hopper_probe.profile_fields(prof)
    assert fields["timeline:end spread us"] == 3.0
    assert (fields["select:step cut loads"], fields["select:step cut threshold"]) == (50.0, 100.0)


# ---------------------------------------------------------------------------------------------
# GPU (sm_90): the stream serves the FP8 cache, with legacy's bits
# ---------------------------------------------------------------------------------------------

hopper_only = pytest.mark.skipif(not ON_HOPPER, reason="the Hopper stream needs an sm_90 GPU")


@pytest.mark.gpu
@hopper_only
def test_gpu_stream_serves_fp8_and_the_switch_turns_it_off(monkeypatch):
    inputs = small_inputs(device="cuda", rows=64, tokens=200000, topk=1024)
    assert why(inputs) is None
    assert why(small_inputs("aiter_mxfp4", device="cuda")) is not None
    monkeypatch.setenv("INDEXER_TOPK_HOPPER_STREAM", "0")
    assert why(inputs) == "INDEXER_TOPK_HOPPER_STREAM is off"
    plain = fused_indexer_topk(inputs)
    monkeypatch.delenv("INDEXER_TOPK_HOPPER_STREAM")
    assert_bitwise(fused_indexer_topk(inputs), plain, "stream vs plain fused kernel")


PATTERNS = ["random", "increasing", "decreasing", "equal", "zero_plateau", "nan_rows"]
PLANS = [(1024, None, None), (512, 64, None), (1024, 128, 4), (2048, None, 2)]
# MXFP4: every pattern with the default plan and the one-page pool; split rows with one pattern
STREAM_CASES = [("sglang_fp8", p, *plan) for plan in PLANS for p in PATTERNS] + [
    ("sglang_mxfp4", p, *plan) for plan in PLANS[:2] for p in PATTERNS] + [
    ("sglang_mxfp4", "random", *plan) for plan in PLANS[2:]]


def run_stream_into_poison(inputs, rows, topk, **kw):
    out = allocate_result(rows, topk, "cuda")
    for t in out:
        t.view(torch.int32).fill_(-12345)
    hopper_indexer_topk(inputs, out=out, **kw)
    return out


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("layout, pattern, topk, pool, splits", STREAM_CASES)
def test_gpu_stream_equals_legacy_into_poisoned_outputs(layout, pattern, topk, pool, splits):
    """Several requests (groups straddle them), adversarial scores, small pools that cut every
    page or two, split rows: every output element written, bit for bit legacy's."""
    w = make_workload(layout, context_tokens=[9000, 70000, 4100], rows_per_request=[5, 7, 3], topk=topk,
                      seed=11, device="cuda", pattern=pattern)
    inputs = w.inputs()
    out = run_stream_into_poison(inputs, w.rows, topk, pool=pool, num_splits=splits)
    assert_bitwise(out, legacy_indexer_topk(inputs), f"stream {layout} {pattern} topk {topk} pool {pool} splits {splits}")


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4"])
@pytest.mark.parametrize("splits", [None, 4])
def test_gpu_stream_position_order_lays_out_legacys_entries(layout, splits):
    """``order="position"``: the finish sorts a one-split row by position instead of by score and
    the merge leaves split rows unsorted; the entries and bits of legacy's best-first rows."""
    w = make_workload(layout, context_tokens=[9000, 70000], rows_per_request=[5, 3], topk=1024, seed=12,
                      device="cuda")
    inputs = dataclasses.replace(w.inputs(), order="position")
    out = run_stream_into_poison(inputs, w.rows, 1024, num_splits=splits)
    assert_bitwise(out, by_position(legacy_indexer_topk(w.inputs())), f"stream {layout} splits {splits}")


@pytest.mark.gpu
@hopper_only
def test_gpu_mxfp4_stream_takes_every_scale_byte_as_legacy_does():
    """Key scale bytes 0 (+0 on the Triton the tile follows), 1, 127, 254 (values overflow to
    inf) and 255 (NaN) scattered over the cache: the stream widens them as legacy's
    ``tl.dot_scaled`` does."""
    w = make_workload("sglang_mxfp4", context_tokens=[60000, 9000], rows_per_request=[6, 3], topk=1024, seed=12,
                      device="cuda")
    inputs = w.inputs()
    kc = inputs.k_cache.view(torch.uint8).view(inputs.k_cache.shape[0], -1)
    scales = kc[:, 4096:4352]  # a page's 64 x 4 key scale bytes follow its packed keys
    gen = torch.Generator(device="cuda").manual_seed(5)
    pick = torch.rand(scales.shape, device="cuda", generator=gen)
    for i, byte in enumerate((0, 1, 127, 254, 255)):
        scales[(pick >= 0.04 * i) & (pick < 0.04 * (i + 1))] = byte
    out = run_stream_into_poison(inputs, w.rows, 1024)
    assert_bitwise(out, legacy_indexer_topk(inputs), "stream vs legacy, extreme scale bytes")


DECODE_CASES = [("sglang_fp8", p) for p in ("random", "increasing", "equal", "nan_rows")] + [
    ("sglang_mxfp4", p) for p in ("random", "zero_plateau")]


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("layout, pattern", DECODE_CASES)
def test_gpu_stream_decode_rows_one_per_item_equal_legacy(layout, pattern):
    """A decode step (one row per request, each with its own pages and length, one empty, one
    shorter than topk) with ``rows_per_request=1``: the one-row tile (an N = 64 MMA), one item
    per program and the merge tree of 16 split lists per row give legacy's bits, into poisoned
    outputs."""
    ctx = [200000, 3, 4000, 150000, 60000, 90000, 4 * 1024 + 1, 120000]
    w = make_workload(layout, context_tokens=ctx, rows_per_request=[1] * len(ctx), topk=1024, seed=13,
                      device="cuda", pattern=pattern)
    inputs = w.inputs()
    out = allocate_result(w.rows, 1024, "cuda")
    for t in out:
        t.view(torch.int32).fill_(-12345)
    fused_indexer_topk(inputs, out=out, rows_per_request=1)
    assert plan_fused(w.rows, 1024, "cuda", group_rows=1, one_wave=True).splits == 16  # one merge level
    assert_bitwise(out, legacy_indexer_topk(inputs), f"decode stream {layout} {pattern}")
