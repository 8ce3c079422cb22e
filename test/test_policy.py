"""The path policy: probing, routing (the routes table and the proven rule), capture detection,
the freeze and the log line (the flags it reads: test_envs; the tables themselves: test_routes)."""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import fake_aiter
import indexer_topk
from indexer_topk import api, policy
from indexer_topk.routes import modes
from indexer_topk.policy import PathPolicy, Probe, is_capturing, probe_environment
from indexer_topk.reference import reference_indexer_topk
from indexer_topk.workload import make_workload
from kernel_cases import assert_bitwise

LAYOUTS = ("aiter_mxfp4", "sglang_mxfp4", "sglang_fp8")

H200 = dict(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), triton_version="3.6.0")
B200 = dict(device="cuda", device_name="NVIDIA B200", compute_capability=(10, 0), triton_version="3.6.0")
MI355X = dict(device="hip", device_name="AMD Instinct MI355X", gfx_arch="gfx950", triton_version="3.4.0")
MI300X = dict(device="hip", device_name="AMD Instinct MI300X", gfx_arch="gfx942", triton_version="3.4.0")
CPU = dict(device="cpu", device_name="cpu", triton_version="3.9.0")
H200_FUSED = dict(H200, fused_prefill=True)  # the fused kernel opted in for prefill
# an H200 the shipped routes table applies to: 132 SMs, Triton 3.6, the Hopper stream serving
H200_TABLE = dict(H200, sm_count=132, hopper_stream=True)


def make_policy(**fields) -> PathPolicy:
    return PathPolicy(Probe(**fields), logger=logging.getLogger("indexer_topk.test"))




@pytest.fixture(autouse=True)
def no_capture(monkeypatch):
    """Tests see no capture unless they patch it in (the CPU torch build raises here anyway)."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    for group in modes._SGLANG_CAPTURE_PREDICATES:
        for module_name, _ in group:
            monkeypatch.delitem(sys.modules, module_name, raising=False)


# ---------------------------------------------------------------------------------------------
# Routing rules, one probe at a time
# ---------------------------------------------------------------------------------------------

def routes(p: PathPolicy) -> dict:
    """The routes of calls whose shape is not given (prefill: the largest measured)."""
    table = {layout: p.route(layout=layout, capturing=False) for layout in LAYOUTS}
    table["none"] = p.route(capturing=False)
    table["decode"] = p.route(layout="sglang_fp8", is_decode=True, capturing=False)
    table["capture"] = p.route(layout="sglang_fp8", capturing=True)
    return table


def table(*, aiter, sglang, fp8=None, decode="legacy", capture="legacy", none=None):
    return {"aiter_mxfp4": aiter, "sglang_mxfp4": sglang, "sglang_fp8": sglang if fp8 is None else fp8,
            "none": sglang if none is None else none, "decode": decode, "capture": capture}


ROUTING = [
    # NVIDIA without a table for the device: the proven rule (legacy); the fused kernel for every
    # prefill when opted in; with the shipped table: its largest measured prefill shapes (FP8 and
    # sglang_mxfp4 fused, aiter_mxfp4 legacy)
    ("nvidia_sm90_no_table", H200, "fused", table(aiter="legacy", sglang="legacy")),
    ("nvidia_sm90_table", H200_TABLE, "fused", table(aiter="legacy", sglang="fused", none="legacy")),
    ("nvidia_sm100", B200, "fused", table(aiter="legacy", sglang="legacy")),
    ("nvidia_sm90_fused_prefill", dict(H200, fused_prefill=True), "fused", table(aiter="fused", sglang="fused")),
    ("nvidia_sm100_fused_prefill", dict(B200, fused_prefill=True), "fused", table(aiter="fused", sglang="fused")),
    ("nvidia_fused_prefill_kill_switch", dict(H200, fused_prefill=True, fused_enabled=False), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("nvidia_table_kill_switch", dict(H200_TABLE, fused_enabled=False), "legacy", table(aiter="legacy", sglang="legacy")),
    ("nvidia_no_triton", dict(H200, triton_version=None, triton_error="ImportError('no triton')"), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("nvidia_props_raise", dict(H200, compute_capability=None, device_error="RuntimeError('props')"), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("nvidia_kill_switch", dict(H200, fused_enabled=False, kill_switch_raw="off"), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("gfx950_aiter", dict(MI355X, aiter_symbol=True), "aiter", table(aiter="aiter", sglang="legacy")),
    ("gfx950_aiter_triton_opt_in", dict(MI355X, aiter_symbol=True, triton_rocm=True), "aiter",
     table(aiter="aiter", sglang="fused")),
    ("gfx950_aiter_kill_switch", dict(MI355X, aiter_symbol=True, fused_enabled=False), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("gfx950_no_symbol", MI355X, "legacy", table(aiter="legacy", sglang="legacy")),
    ("gfx950_no_symbol_opt_in", dict(MI355X, triton_rocm=True), "fused", table(aiter="fused", sglang="fused")),
    ("gfx950_aiter_import_raises", dict(MI355X, aiter_error="RuntimeError('hip init')"), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("gfx950_opt_in_no_triton", dict(MI355X, triton_rocm=True, triton_version=None), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("gfx942_with_symbol", dict(MI300X, aiter_symbol=True), "legacy", table(aiter="legacy", sglang="legacy")),
    ("gfx942_opt_in", dict(MI300X, triton_rocm=True), "fused", table(aiter="fused", sglang="fused")),
    ("amd_arch_unknown", dict(MI355X, gfx_arch=None, device_error="RuntimeError('props')"), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("cpu_no_interpreter", CPU, "reference",
     table(aiter="reference", sglang="reference", decode="reference", capture="reference")),
    ("cpu_no_interpreter_kill_switch", dict(CPU, fused_enabled=False), "reference",
     table(aiter="reference", sglang="reference", decode="reference", capture="reference")),
    ("cpu_interpreter", dict(CPU, triton_interpret=True), "fused", table(aiter="fused", sglang="fused")),
    ("cpu_interpreter_kill_switch", dict(CPU, triton_interpret=True, fused_enabled=False), "legacy",
     table(aiter="legacy", sglang="legacy")),
    ("cpu_interpreter_no_triton", dict(CPU, triton_interpret=True, triton_version=None), "reference",
     table(aiter="reference", sglang="reference", decode="reference", capture="reference")),
    ("cpu_torch_raised", dict(CPU, torch_error="RuntimeError('driver')"), "reference",
     table(aiter="reference", sglang="reference", decode="reference", capture="reference")),
]


@pytest.mark.parametrize("fields,fused,expected", [r[1:] for r in ROUTING], ids=[r[0] for r in ROUTING])
def test_routing_table(fields, fused, expected):
    p = make_policy(**fields)
    assert p.fused_backend == fused
    assert routes(p) == expected
    assert_describe_matches_routes(p)


def _outside(words: str):
    """The backend a describe() row names for shapes outside the table ("SGLang's path": None)."""
    name = words.split("else ")[-1] if "else " in words else words.split(" (")[0]
    return None if name == "SGLang's path" else name


def assert_describe_matches_routes(p: PathPolicy) -> None:
    """Every describe() row covers its modes and layouts once, and names what a call of them
    outside the table's shapes takes, outside SGLang and (where SGLang can hand it over) inside."""
    seen = []
    for row in p.describe()["routes"]:
        modes = policy.routes.MODES if row["mode"] in ("every call", "every mode") else row["mode"].split(", ")
        layouts = LAYOUTS if row["layout"] == "every layout" else row["layout"].split(", ")
        for mode in modes:
            for layout in layouts:
                seen.append((mode, layout))
                kw = dict(layout=layout, topk=1024, rows=1, c4_len=1, is_decode=mode == "decode",
                          capturing=mode == "capture")
                assert p.route(**kw) == _outside(row["auto"]), (row, mode, layout)
                inside = policy.sglang_has_path(layout, p.probe) and layout in policy.engine_layouts(p.probe)
                assert (row["sglang"] is not None) == inside, row
                if inside:
                    assert p.engine_route(engine_path=True, **kw) == _outside(row["sglang"]), (row, mode, layout)
    assert sorted(seen) == sorted((m, x) for m in policy.routes.MODES for x in LAYOUTS)


@pytest.mark.parametrize(
    "fields,words",
    [
        (dict(H200, triton_version=None, triton_error="ImportError('no triton')"), "ImportError('no triton')"),
        (dict(H200, fused_enabled=False), "kill switch SGLANG_DSV4_FP4_FUSED_TOPK is off"),
        (MI355X, "lacks flydsl_pa_mqa_topk_fp4_prefill"),
        (dict(MI355X, aiter_error="RuntimeError('hip init')"), "RuntimeError('hip init')"),
        (MI300X, "needs gfx950, this GPU is gfx942"),
        (dict(MI300X, triton_rocm=True), "INDEXER_TOPK_TRITON_ROCM=1"),
        (CPU, "no GPU and the Triton interpreter is off (TRITON_INTERPRET is not 1)"),
        (dict(CPU, triton_interpret=True), "interpreter"),
    ],
)
def test_reason_says_why(fields, words):
    assert words in make_policy(**fields).reason


def test_aiter_host_keeps_unsupported_topk_off_aiter():
    p = make_policy(**MI355X, aiter_symbol=True)
    assert p.route(layout="aiter_mxfp4", topk=512, capturing=False) == "aiter"
    assert p.route(layout="aiter_mxfp4", topk=1024, capturing=False) == "aiter"
    assert p.route(layout="aiter_mxfp4", topk=2048, capturing=False) == "legacy"
    opted = make_policy(**MI355X, aiter_symbol=True, triton_rocm=True)
    assert opted.route(layout=indexer_topk.Layout.AITER_MXFP4, topk=2048, capturing=False) == "fused"


def test_route_rejects_unknown_layout():
    with pytest.raises(ValueError, match="layout"):
        make_policy(**MI355X, aiter_symbol=True).route(layout="bf16", capturing=False)


def test_probe_rejects_unknown_device():
    with pytest.raises(ValueError, match="device"):
        Probe(device="xpu")


# ---------------------------------------------------------------------------------------------
# Forward modes
# ---------------------------------------------------------------------------------------------

class FakeForwardMode:
    """The parts of SGLang's ForwardMode the policy may use."""

    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "DECODE"

    def is_idle(self):
        return self.name == "IDLE"


class DecodeOnlyMode:
    def __init__(self, decode):
        self._decode = decode

    def is_decode(self):
        return self._decode


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("extend", "aiter"), ("mixed", "aiter"), ("target_verify", "aiter"), ("draft_extend", "aiter"),
        ("EXTEND", "aiter"), ("decode", "legacy"), ("idle", "legacy"), ("Decode", "legacy"),
        ("no_such_mode", "legacy"),
        (FakeForwardMode("EXTEND"), "aiter"), (FakeForwardMode("MIXED"), "aiter"),
        (FakeForwardMode("TARGET_VERIFY"), "aiter"), (FakeForwardMode("DECODE"), "legacy"),
        (FakeForwardMode("IDLE"), "legacy"), (DecodeOnlyMode(True), "legacy"), (DecodeOnlyMode(False), "aiter"),
        (types.SimpleNamespace(name="DECODE"), "legacy"), (types.SimpleNamespace(name="EXTEND"), "aiter"),
        (types.SimpleNamespace(is_decode_or_idle=lambda: True, is_decode=lambda: False), "legacy"),
        (types.SimpleNamespace(is_decode_or_idle=lambda: False), "aiter"),
    ],
)
def test_forward_modes(mode, expected):
    p = make_policy(**MI355X, aiter_symbol=True)
    assert p.route(layout="aiter_mxfp4", forward_mode=mode, capturing=False) == expected


def test_forward_mode_of_unknown_type_raises():
    with pytest.raises(TypeError, match="forward_mode"):
        make_policy(**H200).route(forward_mode=3, capturing=False)


def test_target_verify_is_prefill_only_when_not_captured():
    p = make_policy(**H200_FUSED)
    assert p.route(forward_mode="target_verify", capturing=False) == "fused"
    assert p.route(forward_mode="target_verify", capturing=True) == "legacy"


# ---------------------------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------------------------

def _install_predicate(monkeypatch, module_name, fn_name, fn):
    # as an import would, the package is loaded with its module (the capture check looks for it first)
    monkeypatch.setitem(sys.modules, "sglang", sys.modules.get("sglang") or types.ModuleType("sglang"))
    module = types.ModuleType(module_name)
    setattr(module, fn_name, fn)
    monkeypatch.setitem(sys.modules, module_name, module)


def test_torch_capture_routes_to_legacy(monkeypatch):
    p = make_policy(**H200_FUSED)
    assert not is_capturing() and p.route() == "fused"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert is_capturing()
    assert p.route() == "legacy"
    assert p.route(layout="sglang_fp8") == "legacy"
    assert p.route(capturing=False) == "fused"  # an explicit answer wins over detection


def test_torch_capture_probe_that_raises_counts_as_not_capturing(monkeypatch):
    def boom():
        raise RuntimeError("no CUDA runtime")

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", boom)
    assert is_capturing() is False
    assert make_policy(**H200_FUSED).route() == "fused"


SGLANG_PREDICATES = [
    ("sglang.srt.model_executor.runner_utils.capture_mode", "get_is_capture_mode"),
    ("sglang.srt.model_executor.cuda_graph_runner_utils.capture_mode", "get_is_capture_mode"),
    ("sglang.srt.model_executor.cuda_graph_runner", "get_is_capture_mode"),
    ("sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph", "is_in_tc_piecewise_cuda_graph"),
    ("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context", "is_in_breakable_cuda_graph"),
    ("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph", "is_in_breakable_cuda_graph"),
]


@pytest.mark.parametrize("module_name,fn_name", SGLANG_PREDICATES, ids=[".".join(m.rsplit(".", 2)[-2:]) for m, _ in SGLANG_PREDICATES])
def test_sglang_capture_predicates(monkeypatch, module_name, fn_name):
    p = make_policy(**MI355X, aiter_symbol=True)
    state = {"on": False}
    _install_predicate(monkeypatch, module_name, fn_name, lambda: state["on"])
    assert not is_capturing() and p.route(layout="aiter_mxfp4") == "aiter"
    state["on"] = True
    assert is_capturing()
    assert p.route(layout="aiter_mxfp4") == "legacy"


def test_sglang_capture_mode_prefers_new_module(monkeypatch):
    # Both spellings loaded: the newer module decides, the older re-export is not consulted.
    _install_predicate(monkeypatch, SGLANG_PREDICATES[0][0], "get_is_capture_mode", lambda: False)
    _install_predicate(monkeypatch, SGLANG_PREDICATES[1][0], "get_is_capture_mode", lambda: True)
    assert is_capturing() is False


def test_sglang_predicate_that_raises_counts_as_capturing(monkeypatch):
    def broken():
        raise RuntimeError("graph runner state unavailable")

    _install_predicate(monkeypatch, SGLANG_PREDICATES[2][0], SGLANG_PREDICATES[2][1], broken)
    assert is_capturing() is True
    assert make_policy(**H200).route() == "legacy"


def test_sglang_module_without_predicate_is_ignored(monkeypatch):
    monkeypatch.setitem(sys.modules, SGLANG_PREDICATES[0][0], types.ModuleType(SGLANG_PREDICATES[0][0]))
    assert is_capturing() is False


# ---------------------------------------------------------------------------------------------
# probe_environment
# ---------------------------------------------------------------------------------------------

def _fake_gpu(monkeypatch, *, hip=None, props=None, available=True, props_error=None):
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def get_device_properties(index):
        assert index == 0
        if props_error is not None:
            raise props_error
        return props

    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)


def test_probe_nvidia(monkeypatch):
    _fake_gpu(monkeypatch, props=types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132))
    with fake_aiter.installed(monkeypatch, "reference"):
        for name in [n for n in sys.modules if n == "aiter" or n.startswith("aiter.")]:
            del sys.modules[name]  # importable, but not yet imported
        p = probe_environment({})
        assert "aiter" not in sys.modules  # AITER is not imported on NVIDIA
    assert (p.device, p.device_name, p.compute_capability, p.gfx_arch, p.sm_count) == (
        "cuda", "NVIDIA H200", (9, 0), None, 132)
    assert p.triton_version is not None and p.fused_enabled and not p.triton_interpret
    assert (p.aiter_symbol, p.aiter_error, p.device_error, p.torch_error) == (False, None, None, None)
    assert PathPolicy(p).fused_backend == "fused"
    assert p.hopper_stream  # an H200 with a Triton that has Gluon: the Hopper stream serves
    # the shipped table was measured with Triton 3.6: with another, the proven rule, and the
    # line says why
    pol = PathPolicy(p)
    if not p.triton_version.startswith("3.6."):
        assert pol.table is None and "Triton" in pol.table_note
        assert pol.route(layout="sglang_fp8", capturing=False) == "legacy"
    assert PathPolicy(dataclasses.replace(p, triton_version="3.6.0")).table is not None


def test_probe_nvidia_stream_switched_off_or_not_hopper(monkeypatch):
    _fake_gpu(monkeypatch, props=types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132))
    for raw in ("0", "false", "unreadable"):  # off, and fail-safe off
        p = dataclasses.replace(probe_environment({"INDEXER_TOPK_HOPPER_STREAM": raw}), triton_version="3.6.0")
        assert not p.hopper_stream
        # the table was measured with the stream serving: without it, the proven rule
        assert PathPolicy(p).table is None
        assert PathPolicy(p).route(layout="sglang_fp8", capturing=False) == "legacy"
    _fake_gpu(monkeypatch, props=types.SimpleNamespace(name="NVIDIA B200", major=10, minor=0))
    p = probe_environment({})
    assert not p.hopper_stream and PathPolicy(p).route(layout="sglang_fp8", capturing=False) == "legacy"


STREAM = Probe(**H200_TABLE)


@pytest.mark.parametrize("rows, c4_len, want", [
    # (topk 1024, topk 512), from the committed serving mix
    (None, None, ("fused", "fused")),  # shape unknown: the largest measured
    (1024, 196608, ("fused", "fused")),
    (128, 16384, ("legacy", "legacy")),  # legacy measured as fast as the stream at 128 rows x 64K tokens
    (64, 16384, ("legacy", "legacy")),  # fewer rows than measured: the proven rule
    (8, 196608, ("legacy", "legacy")),
    (8, None, ("legacy", "legacy")),
    (1024, 16383, ("legacy", "legacy")),  # nearest measured: 1024 x 16384, legacy with the row select
    (None, 4096, ("legacy", "legacy")),
    (16384, 262144, ("fused", "fused")),  # beyond the largest measured prefill: the largest bucket
])
def test_shipped_table_routes_fp8_prefill_by_shape(rows, c4_len, want):
    policy_ = PathPolicy(STREAM)
    assert policy_.route(layout="sglang_fp8", capturing=False, topk=1024, rows=rows, c4_len=c4_len) == want[0]
    assert policy_.route(layout="sglang_fp8", capturing=False, topk=512, rows=rows, c4_len=c4_len) == want[1]
    # inside SGLang its own path: measured faster at every shape, and the proven rule elsewhere
    assert policy_.engine_route(engine_path=True, layout="sglang_fp8", topk=1024, rows=rows, c4_len=c4_len,
                                capturing=False) is None


@pytest.mark.parametrize("layout, rows, c4_len, want", [
    ("sglang_fp8", 8, 196608, "legacy"),  # legacy's split select, measured faster than the stream
    ("sglang_fp8", 32, 196608, "legacy"),  # the trimmed split select, measured faster than the stream (fbfd3ff mix)
    ("sglang_fp8", 256, 32768, "fused"),  # the widest measured
    ("sglang_fp8", 256, 32767, "fused"),  # the nearest measured context
    ("sglang_fp8", 257, 196608, "legacy"),  # nor more requests
    ("sglang_fp8", 8, None, "legacy"),  # an unknown length stays on the proven path
    (None, 8, 196608, "legacy"),  # so does an unknown layout
    ("sglang_mxfp4", 64, 196608, "fused"),
    ("aiter_mxfp4", 64, 196608, "legacy"),  # its decode is not in the mix: the proven rule
])
def test_shipped_table_routes_decode_and_capture(layout, rows, c4_len, want):
    """Decode steps and graph replays of the measured shapes take the backend measured faster there
    (the fused stream or legacy's split select); inside SGLang the FP8 cache's decode stays on
    SGLang's own, faster still."""
    policy_ = PathPolicy(STREAM)
    assert policy_.decode_backend == "legacy"
    assert policy_.route(layout=layout, is_decode=True, rows=rows, c4_len=c4_len) == want
    assert policy_.route(layout=layout, forward_mode="decode", capturing=True, rows=rows, c4_len=c4_len) == want
    assert policy_.route(layout=layout, capturing=True, rows=rows, c4_len=c4_len) == want
    if layout == "sglang_fp8":
        assert policy_.engine_route(engine_path=True, layout=layout, is_decode=True, rows=rows, c4_len=c4_len) is None
    for probe in (dataclasses.replace(STREAM, hopper_stream=False),  # the table does not apply
                  dataclasses.replace(STREAM, triton_version="3.9.0"),
                  dataclasses.replace(STREAM, fused_enabled=False, kill_switch_raw="false")):
        assert PathPolicy(probe).route(layout=layout, is_decode=True, rows=rows, c4_len=c4_len) == "legacy"
    opted = PathPolicy(dataclasses.replace(STREAM, fused_decode=True))
    assert opted.engine_route(engine_path=True, layout=layout, is_decode=True, rows=rows, c4_len=c4_len) == "fused"


def test_table_yields_to_the_memory_opt_in_and_the_kill_switch():
    opted = PathPolicy(dataclasses.replace(STREAM, fused_prefill=True))
    assert opted.route(layout="sglang_fp8", capturing=False, rows=8, c4_len=64) == "fused"
    assert opted.engine_route(engine_path=True, layout="sglang_fp8", capturing=False, rows=1024, c4_len=196608) == "fused"
    killed = PathPolicy(dataclasses.replace(STREAM, fused_enabled=False))
    assert killed.table is None
    assert killed.route(layout="sglang_fp8", capturing=False, rows=1024, c4_len=196608) == "legacy"
    assert killed.engine_route(engine_path=False, layout="sglang_mxfp4", capturing=False) is None


def test_table_in_force_is_named_in_the_line_describe_and_lines():
    policy_ = PathPolicy(STREAM)
    d = policy_.describe()
    assert d["table"].startswith("nvidia-h200.json (NVIDIA H200 sm_90, 132 SMs, Triton 3.6, Hopper stream")
    assert d["lines"][0] == f"routes table: {d['table']}"
    assert policy_.log_line() == "indexer-topk: " + "; ".join(d["lines"])
    assert "prefill sglang_fp8: fused at" in policy_.log_line() and "in SGLang: SGLang's path" in policy_.log_line()
    assert_describe_matches_routes(policy_)
    # the layouts SGLang cannot hand over on an H200 (it refuses its FP4 indexer below SM100)
    # have no "in SGLang" part
    for row in d["routes"]:
        assert (row["sglang"] is not None) == (row["layout"] == "sglang_fp8"), row


@pytest.mark.parametrize(
    "variant,symbol,error",
    [
        ("reference", True, None),
        ("missing", False, None),
        ("broken", False, "RuntimeError('fake aiter: HIP runtime failed to initialise')"),
        ("lazy_broken", False, "ImportError(\"fake aiter: No module named 'flydsl'\")"),
        ("absent", False, "ModuleNotFoundError"),
    ],
)
def test_probe_amd_aiter_outcomes(monkeypatch, variant, symbol, error):
    _fake_gpu(monkeypatch, hip="6.4", props=types.SimpleNamespace(name="AMD Instinct MI355X",
                                                                  gcnArchName="gfx950:sramecc+:xnack-"))
    with fake_aiter.installed(monkeypatch, variant):
        p = probe_environment({})
    assert (p.device, p.gfx_arch, p.compute_capability) == ("hip", "gfx950", None)
    assert p.aiter_symbol is symbol
    if error is None:
        assert p.aiter_error is None
    else:
        assert p.aiter_error is not None and p.aiter_error.startswith(error)
    assert PathPolicy(p).fused_backend == ("aiter" if symbol else "legacy")


def test_probe_amd_gfx942_with_triton_opt_in(monkeypatch):
    _fake_gpu(monkeypatch, hip="6.2", props=types.SimpleNamespace(name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+"))
    with fake_aiter.installed(monkeypatch, "reference"):
        p = probe_environment({"INDEXER_TOPK_TRITON_ROCM": "1"})
    assert (p.gfx_arch, p.aiter_symbol, p.triton_rocm) == ("gfx942", True, True)
    assert PathPolicy(p).fused_backend == "fused"


def test_probe_device_properties_raise(monkeypatch):
    _fake_gpu(monkeypatch, props_error=RuntimeError("device lost"))
    p = probe_environment({})
    assert p.device == "cuda" and p.device_error == "RuntimeError('device lost')"
    pol = PathPolicy(p)
    assert pol.fused_backend == "legacy" and "device lost" in pol.reason


def test_probe_torch_raises(monkeypatch):
    def boom():
        raise RuntimeError("driver too old")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    p = probe_environment({})
    assert (p.device, p.torch_error) == ("cpu", "RuntimeError('driver too old')")
    assert PathPolicy(p).route(capturing=False) == "reference"


def test_probe_triton_import_raises(monkeypatch):
    _fake_gpu(monkeypatch, props=types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0))
    monkeypatch.setitem(sys.modules, "triton", None)
    p = probe_environment({})
    assert p.triton_version is None and p.triton_error.startswith("ModuleNotFoundError")
    assert PathPolicy(p).fused_backend == "legacy"


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("0", False), ("", False), (None, False)])
def test_probe_cpu_triton_interpret(monkeypatch, value, on):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env = {} if value is None else {"TRITON_INTERPRET": value}
    p = probe_environment(env)
    assert (p.device, p.triton_interpret) == ("cpu", on)
    assert PathPolicy(p).route(capturing=False) == ("fused" if on else "reference")


def test_probe_reads_flags_from_os_environ_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SGLANG_DSV4_FP4_FUSED_TOPK", "off")
    monkeypatch.setenv("INDEXER_TOPK_TRITON_ROCM", "yes")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    p = probe_environment()
    assert (p.fused_enabled, p.kill_switch_raw, p.triton_rocm, p.triton_interpret) == (False, "off", True, True)


# ---------------------------------------------------------------------------------------------
# Freeze and log line
# ---------------------------------------------------------------------------------------------

def test_decision_is_frozen_against_env_changes(monkeypatch):
    _fake_gpu(monkeypatch, hip="6.4", props=types.SimpleNamespace(name="AMD Instinct MI355X", gcnArchName="gfx950"))
    monkeypatch.delenv("SGLANG_DSV4_FP4_FUSED_TOPK", raising=False)
    monkeypatch.delenv("INDEXER_TOPK_TRITON_ROCM", raising=False)
    with fake_aiter.installed(monkeypatch, "reference"):
        p = PathPolicy()
    before = (p.fused_backend, p.reason, routes(p))
    assert before[0] == "aiter" and before[2]["sglang_fp8"] == "legacy"
    monkeypatch.setenv("SGLANG_DSV4_FP4_FUSED_TOPK", "false")
    monkeypatch.setenv("INDEXER_TOPK_TRITON_ROCM", "1")
    with fake_aiter.installed(monkeypatch, "missing"):
        assert (p.fused_backend, p.reason, routes(p)) == before
        # A policy built now does see the change: the freeze is per policy, not a cache of env.
        assert PathPolicy().fused_backend == "legacy"
    with pytest.raises(AttributeError, match="frozen"):
        p.fused_backend = "fused"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.probe.fused_enabled = False


def test_single_info_line_nvidia(caplog):
    with caplog.at_level(logging.DEBUG, logger="indexer_topk"):
        PathPolicy(Probe(**H200))
    assert [(r.name, r.levelno) for r in caplog.records] == [("indexer_topk", logging.INFO)]
    line = caplog.records[0].getMessage()
    assert line == (
        "indexer-topk: routes table: none (no routes table for this GPU (architecture or SM count unknown)): "
        "the proven rule; device: NVIDIA H200 sm_90, triton 3.6.0; kill switch SGLANG_DSV4_FP4_FUSED_TOPK unset; "
        "every mode aiter_mxfp4, sglang_mxfp4: legacy; every mode sglang_fp8: legacy; in SGLang: SGLang's path"
    )


def test_info_line_kill_switch_and_probe_errors(caplog):
    with caplog.at_level(logging.INFO, logger="indexer_topk"):
        PathPolicy(Probe(**MI355X, fused_enabled=False, kill_switch_raw=" Off ",
                         aiter_error="ImportError('line one\\nline two')"))
    [record] = caplog.records
    line = record.getMessage()
    assert line.startswith("indexer-topk: routes table: none: kill switch SGLANG_DSV4_FP4_FUSED_TOPK is off; "
                           "device: AMD Instinct MI355X gfx950")
    assert "; kill switch SGLANG_DSV4_FP4_FUSED_TOPK=Off; " in line
    assert "aiter_error=ImportError('line one\\nline two')" in line
    assert "\n" not in line


def test_custom_logger_gets_the_line(caplog):
    with caplog.at_level(logging.INFO, logger="custom.policy"):
        p = PathPolicy(Probe(**CPU), logger=logging.getLogger("custom.policy"))
    assert [r.name for r in caplog.records] == ["custom.policy"]
    assert caplog.records[0].getMessage() == p.log_line()


def test_describe_has_probe_decision_and_reason():
    d = make_policy(**MI355X, aiter_symbol=True).describe()
    assert d["device"] == "hip" and d["gfx_arch"] == "gfx950" and d["aiter_symbol"] is True
    assert d["fused_backend"] == "aiter" and "gfx950" in d["reason"]
    assert {"mode": "prefill", "layout": "aiter_mxfp4", "auto": "aiter (topk 512, 1024), legacy for topk 2048",
            "sglang": "aiter (topk 512, 1024), SGLang's path for topk 2048"} in d["routes"]
    assert_describe_matches_routes(make_policy(**MI355X, aiter_symbol=True))


# ---------------------------------------------------------------------------------------------
# default_policy and the public API
# ---------------------------------------------------------------------------------------------

def test_default_policy_is_built_once(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("INDEXER_TOPK_LOG_LEVEL", raising=False)
    policy.default_policy.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="indexer_topk"):
            first = policy.default_policy()
            second = policy.default_policy()
        assert first is second
        assert len([r for r in caplog.records if r.name == "indexer_topk"]) == 1
    finally:
        policy.default_policy.cache_clear()


def test_default_policy_applies_log_level(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("INDEXER_TOPK_LOG_LEVEL", "warning")
    pkg_logger = logging.getLogger("indexer_topk")
    monkeypatch.setattr(pkg_logger, "level", pkg_logger.level)
    policy.default_policy.cache_clear()
    try:
        policy.default_policy()
        assert pkg_logger.level == logging.WARNING
    finally:
        policy.default_policy.cache_clear()


PLAIN_CALL = (
    "import indexer_topk as it; w = it.make_workload('sglang_fp8', context_tokens=[300], rows_per_request=1); "
    "it.indexer_topk(*w.args(), **w.kwargs())"
)


def _plain_process(code: str, **env_extra) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (no pytest logging handlers), this checkout's package."""
    env = {k: v for k, v in os.environ.items() if k not in ("INDEXER_TOPK_LOG_LEVEL", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(indexer_topk.__file__).parents[1])] + [env.get("PYTHONPATH", "")])
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def path_lines(text: str) -> list:
    return [line for line in text.splitlines() if "indexer-topk: routes table: " in line]


def test_log_level_info_shows_the_path_line_in_a_plain_process():
    """INDEXER_TOPK_LOG_LEVEL=INFO in a process that configured no logging: the documented line
    appears once on stderr (a handler is attached, because nothing else would print it)."""
    proc = _plain_process(PLAIN_CALL, INDEXER_TOPK_LOG_LEVEL="INFO")
    assert proc.returncode == 0, proc.stderr
    assert len(path_lines(proc.stderr)) == 1, proc.stderr


def test_log_level_adds_no_second_handler_where_the_application_has_one():
    proc = _plain_process("import logging; logging.basicConfig(level=logging.INFO); " + PLAIN_CALL,
                          INDEXER_TOPK_LOG_LEVEL="INFO")
    assert proc.returncode == 0, proc.stderr
    assert len(path_lines(proc.stderr)) == 1, proc.stderr


def test_no_log_level_prints_nothing_in_a_plain_process():
    """Without the variable a library leaves logging to the application."""
    proc = _plain_process(PLAIN_CALL)
    assert proc.returncode == 0, proc.stderr
    assert path_lines(proc.stderr) == [], proc.stderr


@pytest.mark.parametrize("backend", ["legacy", "fused"])
def test_triton_backend_on_a_cpu_without_the_interpreter_says_how(backend):
    """CPU tensors and kernels compiled for a GPU (TRITON_INTERPRET unset when they were
    imported): one clear error naming both ways out, not Triton's driver traceback."""
    code = (
        "import indexer_topk as it\n"
        "w = it.make_workload('sglang_fp8', context_tokens=[300], rows_per_request=1)\n"
        "try:\n"
        f"    it.indexer_topk(*w.args(), **w.kwargs(), backend={backend!r})\n"
        "except RuntimeError as exc:\n"
        "    print('ERROR', exc)\n"
    )
    proc = _plain_process(code, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ERROR "), proc.stdout + proc.stderr
    assert "TRITON_INTERPRET=1" in proc.stdout and "GPU" in proc.stdout and "driver" not in proc.stdout


def test_api_auto_goes_through_the_policy(monkeypatch):
    calls = []
    cpu_policy = make_policy(**CPU)

    def fake_default_policy():
        calls.append(1)
        return cpu_policy

    monkeypatch.setattr(policy, "default_policy", fake_default_policy)
    wl = make_workload("sglang_mxfp4", context_tokens=(3000, 900), rows_per_request=(3, 2), topk=512, seed=3)
    assert api.resolve_backend("auto", layout=wl.layout) == "reference"
    got = indexer_topk.indexer_topk(*wl.args(), **wl.kwargs(), backend="auto")
    want = reference_indexer_topk(*wl.args(), **wl.kwargs())
    assert len(calls) == 2
    assert_bitwise(got, want, "auto on a CPU policy")
    assert int(got.counts.min()) < 512 < int(wl.seq_lens.max())  # short and long rows both covered


def test_api_auto_routes_decode_to_legacy(monkeypatch):
    monkeypatch.setattr(policy, "default_policy", lambda: make_policy(**H200_FUSED))
    assert api.resolve_backend("auto", layout="sglang_fp8") == "fused"
    assert api.resolve_backend("auto", layout="sglang_fp8", is_decode=True) == "legacy"


# ---------------------------------------------------------------------------------------------
# Inside a serving engine, and warm-up
# ---------------------------------------------------------------------------------------------

ENGINE = [
    # (probe, layout, the engine has its own path, our backend or None for the engine's path)
    (H200_TABLE, "sglang_fp8", True, None),  # the table: SGLang's CUDA path is faster
    (H200_FUSED, "sglang_fp8", True, "fused"),  # opted in for the memory
    (H200_TABLE, "sglang_mxfp4", False, "fused"),  # no path of the engine's: ours, the faster one
    (H200, "sglang_fp8", True, None),  # no table: the engine's own path
    (H200, "sglang_fp8", False, "legacy"),  # an engine without its own path: our proven one
    (dict(H200_FUSED, fused_enabled=False), "sglang_fp8", True, None),  # kill switch
    (dict(H200_TABLE, fused_enabled=False), "sglang_mxfp4", False, None),
    (dict(MI355X, aiter_symbol=True), "aiter_mxfp4", True, "aiter"),
    (MI355X, "aiter_mxfp4", True, None),  # our Triton kernels are opt-in on AMD
    (MI355X, "aiter_mxfp4", False, None),
    (dict(MI355X, triton_rocm=True), "aiter_mxfp4", True, "fused"),
    (CPU, "sglang_fp8", False, None),  # nothing of ours can run
]


@pytest.mark.parametrize("fields,layout,engine_path,want", ENGINE)
def test_engine_route(fields, layout, engine_path, want):
    p = make_policy(**fields)
    assert p.engine_route(engine_path=engine_path, layout=layout, capturing=False, topk=1024, rows=1024,
                          c4_len=196608) == want
    # decode and capture of unknown length: the engine's own path
    assert p.engine_route(engine_path=engine_path, layout=layout, is_decode=True, capturing=False) is None
    assert p.engine_route(engine_path=engine_path, layout=layout, capturing=True) is None


def test_aiter_topk_2048_stays_on_the_engines_path():
    p = make_policy(**MI355X, aiter_symbol=True)
    assert p.engine_route(engine_path=True, layout="aiter_mxfp4", topk=2048, capturing=False) is None
    assert p.route(layout="aiter_mxfp4", topk=2048, capturing=False) == "legacy"


def test_sglang_has_path():
    h200, b200 = Probe(**H200), Probe(**B200)
    assert policy.sglang_has_path("sglang_fp8", h200) and policy.sglang_has_path("sglang_fp8", b200)
    assert not policy.sglang_has_path("sglang_mxfp4", h200)  # SGLang refuses the FP4 indexer below SM100
    assert policy.sglang_has_path("sglang_mxfp4", b200)
    assert policy.sglang_has_path("aiter_mxfp4", Probe(**MI355X))  # its ROCm FP4 indexer
    assert not policy.sglang_has_path("sglang_fp8", Probe(**MI355X))
    assert not policy.sglang_has_path("sglang_fp8", Probe(**CPU))
    assert policy.engine_layouts(h200) == ("sglang_fp8",) and policy.engine_layouts(Probe(**CPU)) == ()


def test_fused_prefill_flag_is_read_by_the_probe():
    assert probe_environment({"INDEXER_TOPK_FUSED_PREFILL": "1"}).fused_prefill is True
    assert probe_environment({}).fused_prefill is False


def test_warm_up_without_a_gpu_compiles_nothing(monkeypatch):
    from indexer_topk.backends import fused, legacy

    for module, name in ((fused, "fused_indexer_topk"), (legacy, "legacy_indexer_topk")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("nothing to compile without a GPU"))
    p = make_policy(**dict(CPU, triton_interpret=True))
    assert p.warm_up("sglang_fp8", 512) >= 0.0


def test_warm_up_runs_each_backend_the_prefill_may_take_directly(monkeypatch):
    """On a GPU the warm-up calls the backends it warms (not the public API): here both, as
    the table sends sglang_fp8 prefill to either by shape."""
    from indexer_topk.backends import fused, legacy
    from indexer_topk.contract import IndexerInputs

    ran = []
    monkeypatch.setattr(fused, "fused_indexer_topk", lambda inputs: ran.append(("fused", type(inputs), inputs.topk)))
    monkeypatch.setattr(legacy, "legacy_indexer_topk", lambda inputs: ran.append(("legacy", type(inputs), inputs.topk)))
    monkeypatch.setattr(fused, "program_slots", lambda device: 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(api, "indexer_topk", lambda *a, **k: pytest.fail("the warm-up calls the backend"))
    make_policy(**H200_TABLE).warm_up("sglang_fp8", 512, device="cpu")
    assert sorted(ran) == [("fused", IndexerInputs, 512), ("legacy", IndexerInputs, 512)]


# ---------------------------------------------------------------------------------------------
# Decode and capture: the proven path unless opted in (INDEXER_TOPK_FUSED_DECODE)
# ---------------------------------------------------------------------------------------------

H200_PROBE = Probe(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), triton_version="3.6.0")


def test_decode_and_capture_take_the_proven_path_by_default():
    policy = PathPolicy(H200_PROBE)
    assert policy.decode_backend == "legacy" and "INDEXER_TOPK_FUSED_DECODE=1" in policy.decode_reason
    assert policy.route(layout="sglang_fp8", is_decode=True, rows=8, c4_len=196608) == "legacy"
    assert policy.route(layout="sglang_mxfp4", capturing=True) == "legacy"
    assert policy.engine_route(engine_path=False, layout="sglang_mxfp4", is_decode=True) is None


def test_decode_opt_in_puts_decode_and_capture_on_the_fused_path():
    policy = PathPolicy(dataclasses.replace(H200_PROBE, fused_decode=True))
    assert policy.decode_backend == "fused"
    for layout in ("sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"):
        assert policy.route(layout=layout, is_decode=True) == "fused"
        assert policy.route(layout=layout, forward_mode="decode", capturing=False) == "fused"
        assert policy.route(layout=layout, capturing=True) == "fused"
        # inside SGLang too, where SGLang has a decode path of its own
        assert policy.engine_route(engine_path=True, layout=layout, is_decode=True) == "fused"
        assert policy.engine_route(engine_path=True, layout=layout, capturing=True) == "fused"
    # eager prefill is unchanged by the decode opt-in
    assert policy.route(layout="sglang_fp8", capturing=False) == PathPolicy(H200_PROBE).route(layout="sglang_fp8", capturing=False)
    assert {"mode": "decode, capture", "layout": "sglang_fp8", "auto": "fused", "sglang": "fused"} in (
        policy.describe()["routes"])
    assert "decode, capture sglang_fp8: fused; in SGLang: fused" in policy.log_line()


@pytest.mark.parametrize("probe, why", [
    (dataclasses.replace(H200_PROBE, fused_decode=True, fused_enabled=False, kill_switch_raw="0"), "kill switch"),
    (Probe(device="hip", device_name="AMD Instinct MI355X", gfx_arch="gfx950", triton_version="3.6.0",
           aiter_symbol=True, fused_decode=True), "cannot run here"),
    (dataclasses.replace(H200_PROBE, fused_decode=True, triton_version=None, triton_error="ImportError('x')"), "cannot run"),
])
def test_decode_opt_in_yields_where_the_fused_path_cannot_serve(probe, why):
    policy = PathPolicy(probe)
    assert policy.decode_backend in ("legacy", "reference") and why in policy.decode_reason
    assert policy.route(layout="aiter_mxfp4", is_decode=True) == policy.decode_backend
    assert policy.engine_route(engine_path=True, layout="sglang_fp8", is_decode=True) is None


@pytest.mark.parametrize("raw, on", [("1", True), ("true", True), ("0", False), ("maybe", False)])
def test_probe_reads_the_decode_opt_in(raw, on):
    assert probe_environment({"INDEXER_TOPK_FUSED_DECODE": raw}).fused_decode is on


# ---------------------------------------------------------------------------------------------
# The policy's shape: measured data in the table, not in prose; one way in
# ---------------------------------------------------------------------------------------------

PACKAGE = Path(indexer_topk.__file__).parent
TIMING_PROSE = re.compile(r"\d+(\.\d+)?\s*ms\b|\d+(\.\d+)?\s*(ms\s*)?vs\.?\s*\d+(\.\d+)?")


def test_no_timings_in_prose_anywhere_in_the_package():
    """Measurements live in the routes table (which cites them), not in sentences that go stale."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if TIMING_PROSE.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert found == []


def test_policy_is_small_and_does_not_import_the_api():
    source = (PACKAGE / "policy.py").read_text()
    assert len(source.splitlines()) <= 400
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
            assert "api" not in names and not (node.module or "").endswith(".api"), ast.dump(node)
        if isinstance(node, ast.Import):
            assert all(not a.name.endswith(".api") for a in node.names)


def test_a_call_reads_no_environment_and_no_file(monkeypatch):
    """The lookup structures are built with the policy: a call neither reads the environment
    nor opens a table, so a later change to either does not move it."""
    p = PathPolicy(Probe(**H200_TABLE))
    before = [p.route(layout="sglang_fp8", topk=1024, rows=r, c4_len=196608, capturing=False) for r in (8, 1024)]

    def boom(*a, **k):
        raise AssertionError("read during a call")

    class Watched(dict):
        reads: list = []

        def get(self, key, default=None):
            self.reads.append(key)
            return super().get(key, default)

        def __getitem__(self, key):
            self.reads.append(key)
            return super().__getitem__(key)

    monkeypatch.setattr(policy.routes, "load_table", boom)
    monkeypatch.setattr(policy.routes, "shipped_tables", boom)
    monkeypatch.setattr(Path, "read_text", boom)
    monkeypatch.setattr(Path, "open", boom)
    environ, os.environ = os.environ, Watched(os.environ)
    try:
        after = [p.route(layout="sglang_fp8", topk=1024, rows=r, c4_len=196608, capturing=False) for r in (8, 1024)]
        engine = p.engine_route(engine_path=True, layout="sglang_fp8", is_decode=True, rows=8, c4_len=196608)
        reads = [k for k in os.environ.reads if k.startswith(("INDEXER_TOPK", "SGLANG", "TRITON"))]
    finally:
        os.environ = environ
    assert before == after == ["legacy", "fused"] and engine is None
    assert reads == []
