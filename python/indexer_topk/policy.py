"""Which backend runs a call: probe the process once, decide, freeze, log one line.

The rules
---------
* Eager prefill rows (EXTEND, MIXED, TARGET_VERIFY and other prefill modes, outside graph
  capture) take the frozen *fused path* (:attr:`PathPolicy.fused_backend`).
* Decode (DECODE, IDLE), anything during CUDA/HIP graph capture, and the kill switch
  ``SGLANG_DSV4_FP4_FUSED_TOPK=false`` (or any value it cannot read) take ``"legacy"``
  (AITER's kernel refuses capture outright), except decode calls whose layout and length say
  they are of the shapes the fused path measured faster at on an sm_90 GPU
  (:data:`MEASURED_DECODE`). ``INDEXER_TOPK_FUSED_DECODE=1`` puts every decode and captured
  call on our fused path (its operator form captures), inside SGLang too, except under the kill
  switch (:attr:`PathPolicy.decode_backend`); without it SGLang keeps its own decode, which
  measured faster than ours.
* The fused path: AMD gfx950 with AITER's ``flydsl_pa_mqa_topk_fp4_prefill`` -> ``"aiter"``
  for the ``aiter_mxfp4`` layout (other layouts: ours if opted in, else legacy); other AMD
  GPUs -> our Triton ``"fused"`` only with ``INDEXER_TOPK_TRITON_ROCM=1``, else ``"legacy"``;
  NVIDIA -> the faster exact path as measured: ``"fused"`` for the MXFP4 layouts
  (:data:`MEASURED_MXFP4`); for the FP8 layout ``"fused"`` where the fused backend's Hopper
  stream serves it (an sm_90 GPU) and the call has at least :data:`STREAM_MIN_ROWS` rows and
  :data:`STREAM_MIN_C4` C4 positions (:data:`MEASURED_FP8_STREAM`), else ``"legacy"``; the same
  rule for ``sglang_mxfp4`` where the stream serves it too (:data:`MEASURED_MXFP4_STREAM`)
  (:data:`MEASURED_FP8`); or ``"fused"`` for every call with ``INDEXER_TOPK_FUSED_PREFILL=1``,
  for its memory (``"legacy"`` if Triton cannot be imported).
* Inside a serving engine (:meth:`PathPolicy.engine_route`), a layout the engine serves with
  its own path stays there unless the fused path is opted in: SGLang's CUDA path for the FP8
  cache (DeepGEMM's logits and SGLang's radix top-k) is measured faster than ours.

:meth:`PathPolicy.route` gives each call its layout's backend; :attr:`PathPolicy.fused_backend`
names the fused path (what the MXFP4 layouts take on NVIDIA, AITER's on a gfx950).
* No GPU: the ``legacy`` and ``fused`` backends are Triton kernels, so they run only under
  the Triton interpreter (``TRITON_INTERPRET=1``); without it every route is ``"reference"``.

Everything the decision depends on is read once, into a :class:`Probe`, when the policy is
built; later changes to the environment do not move it. That is what makes it safe to build
before CUDA graph capture: a captured graph and the eager path it mirrors see the same choice.
Only :func:`is_capturing`, which must reflect the moment of the call, is read per call.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from .backends.aiter import AITER_TOPK, lookup_aiter_symbol
from .contract import Layout, parse_layout
from .versions import MX_STREAM_TRITON
from .envs import envs, interpreting

LOGGER_NAME = "indexer_topk"

DEVICES = ("cuda", "hip", "cpu")
AITER_ARCH = "gfx950"
KILL_SWITCH = "SGLANG_DSV4_FP4_FUSED_TOPK"

# SGLang ForwardMode names, lower-cased. Decode-like modes score one row per request against
# the whole context, are graph-captured in serving, and stay on the legacy path.
DECODE_MODES = frozenset({"decode", "idle"})
PREFILL_MODES = frozenset(
    {"extend", "mixed", "target_verify", "draft_extend", "draft_extend_v2", "split_prefill", "dllm_extend"}
)

# What the committed H200 benchmark measured (benchmark/results/bench_nvidia-h200.md, 5d0d405;
# SGLang's path beside ours in benchmark/results/sglang_cuda/): the numbers behind the NVIDIA
# defaults, at 1024 prefill rows, 768K tokens, topk 1024.
MEASURED_FP8 = (
    "for the FP8 cache the legacy path measured faster than the fused kernel on an H200 (7.5 vs 7.9 ms "
    "at 1024 rows x 768K tokens), and SGLang's own CUDA path faster than both (4.1 ms)"
)
MEASURED_FP8_STREAM = (
    "for the FP8 cache on sm_90 the fused backend's Hopper stream measured faster than the legacy path on an "
    "H200 (4.45 vs 7.46 ms at 1024 rows x 768K tokens, 1.87 vs 2.70 at 256K, 0.84 vs 0.84 at 64K) from 128 rows "
    "and 64K tokens up, and slower below (0.81 vs 0.49 ms at 8 rows x 768K, 0.38 vs 0.33 at 64 rows x 64K); "
    "SGLang's own CUDA path measured faster than both (4.30 ms)"
)
# The FP8 calls the Hopper stream takes (benchmark/results/hopper/rows_sweep_nvidia-h200.log): at
# 64K tokens it ties legacy from 128 rows (0.99x at 128 and 1024, 0.88x at 256) and loses at 64
# (1.14x); at 768K it wins from 32 rows. Shorter contexts were not measured, so they stay legacy's.
STREAM_MIN_ROWS = 128
STREAM_MIN_C4 = 16384  # 64K tokens
MEASURED_MXFP4 = (
    "for the MXFP4 caches the fused kernel measured faster than the legacy path on an H200 (sglang_mxfp4 "
    "12.8 vs 13.7 ms, aiter_mxfp4 13.0 vs 14.4 ms at 1024 rows x 768K tokens; slower at 64K: 1.58 vs 1.39 ms)"
)
# The sglang_mxfp4 stream (benchmark/results/hopper/grid_mxfp4_stream/, rows_sweep_sglang_mxfp4_nvidia-h200.log):
# it takes the FP8 stream's shape rule, where Triton is the release its tile follows (MX_STREAM_TRITON).
MEASURED_MXFP4_STREAM = (
    "for sglang_mxfp4 on sm_90 the Hopper stream measured faster than the legacy path on an H200 (9.11 vs "
    "13.74 ms at 1024 rows x 768K tokens, 1.06 vs 1.39 at 64K, 69.2 vs 107.4 at 8192 rows x 768K) from 128 rows "
    "and 64K tokens up, and slower at 8 rows (0.65 vs 0.29 ms at 64K), so it follows the FP8 stream's rule"
)

# Decode steps (benchmark/results/decode/decode_fc40b20_nvidia-h200.json, SGLang's own decode in
# decode_nvidia-h200.json: one query row per request,
# topk 1024, each backend replayed from a CUDA graph through the out operator). The fused path
# wins against the legacy path at every measured shape (from 128K tokens, 8 to 256 requests) for
# every layout, where sglang_mxfp4 runs on the Hopper stream; SGLang's own decode is faster still,
# so inside SGLang decode stays on SGLang's path unless INDEXER_TOPK_FUSED_DECODE=1.
DECODE_MIN_C4 = 32768  # 128K tokens, the shortest measured context
DECODE_MAX_ROWS = 256
MEASURED_DECODE = (
    "decode steps of 128K tokens and up on sm_90 take the fused path, measured faster than the legacy path on "
    "an H200 (FP8, one row per request: 0.22 vs 0.71 ms at 8 x 768K tokens, 0.50 vs 1.55 at 64 x 768K, 0.35 vs "
    "0.75 at 256 x 128K), though slower than SGLang's own decode (0.07, 0.46, 0.30 ms)"
)


@dataclass(frozen=True)
class Probe:
    """What this process can run, read once. Every field has a default so tests can build one.

    Attributes
    ----------
    fused_enabled : bool
        The kill switch ``SGLANG_DSV4_FP4_FUSED_TOPK``: True when unset or set to true/1/on/yes;
        false/0/off/no and any value it cannot read turn it off.
    device : str
        ``"cuda"`` (NVIDIA), ``"hip"`` (AMD) or ``"cpu"`` (no usable GPU).
    device_name : str
        e.g. ``"NVIDIA H200"``, ``"AMD Instinct MI355X"``, ``"cpu"``.
    compute_capability : tuple of int, optional
        NVIDIA ``(major, minor)``.
    gfx_arch : str, optional
        AMD architecture without feature suffixes, e.g. ``"gfx950"``.
    triton_version : str, optional
        ``None`` when Triton cannot be imported (see ``triton_error``).
    triton_interpret : bool
        ``TRITON_INTERPRET`` is on: Triton kernels run on the CPU interpreter.
    aiter_symbol : bool
        ``aiter.ops.flydsl.flydsl_pa_mqa_topk_fp4_prefill`` exists (looked up on AMD only).
    aiter_error, torch_error, device_error, triton_error : str, optional
        ``repr`` of the exception raised by the AITER lookup, by asking torch for a GPU, by
        reading the GPU's properties, or by importing Triton.
    triton_rocm : bool
        ``INDEXER_TOPK_TRITON_ROCM``: our Triton fused path is opted in on AMD.
    fused_prefill : bool
        ``INDEXER_TOPK_FUSED_PREFILL``: our fused path is opted in for eager prefill on NVIDIA
        (and, inside a serving engine, instead of the engine's own path), for its memory.
    hopper_stream : bool
        The fused backend's Hopper stream serves the FP8 cache: an sm_90 GPU, a Triton with
        Gluon's Hopper operations, ``INDEXER_TOPK_HOPPER_STREAM`` on.
    fused_decode : bool
        ``INDEXER_TOPK_FUSED_DECODE``: decode and graph-captured calls are opted in to our fused
        path (off: the proven path takes them).
    kill_switch_raw : str, optional
        The kill switch's raw value, for the log line (``None``: unset).
    """

    fused_enabled: bool = True
    device: str = "cpu"
    device_name: str = "cpu"
    compute_capability: Optional[Tuple[int, int]] = None
    gfx_arch: Optional[str] = None
    triton_version: Optional[str] = None
    triton_interpret: bool = False
    aiter_symbol: bool = False
    aiter_error: Optional[str] = None
    torch_error: Optional[str] = None
    device_error: Optional[str] = None
    triton_error: Optional[str] = None
    triton_rocm: bool = False
    fused_prefill: bool = False
    hopper_stream: bool = False
    fused_decode: bool = False
    kill_switch_raw: Optional[str] = None

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"device: expected one of {DEVICES}, got {self.device!r}")
        if self.compute_capability is not None:
            object.__setattr__(self, "compute_capability", tuple(int(x) for x in self.compute_capability))

    @property
    def errors(self) -> dict:
        """The probe exceptions that were recorded, ``{field: repr}``."""
        names = ("torch_error", "device_error", "triton_error", "aiter_error")
        return {n: getattr(self, n) for n in names if getattr(self, n)}


# ---------------------------------------------------------------------------------------------
# Probing
# ---------------------------------------------------------------------------------------------

def _probe_device() -> dict:
    """Device kind, name and architecture; exceptions are recorded, never raised."""
    import torch

    try:
        hip = getattr(torch.version, "hip", None)
        available = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001
        return {"device": "cpu", "device_name": "cpu", "torch_error": repr(exc)}
    if not available:
        return {"device": "cpu", "device_name": "cpu"}
    kind = "hip" if hip else "cuda"
    try:
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        name = str(getattr(props, "name", "") or kind)
        if kind == "hip":
            arch = str(getattr(props, "gcnArchName", "") or "").split(":")[0] or None
            return {"device": kind, "device_name": name, "gfx_arch": arch}
        return {"device": kind, "device_name": name, "compute_capability": (int(props.major), int(props.minor))}
    except Exception as exc:  # noqa: BLE001
        return {"device": kind, "device_name": kind, "device_error": repr(exc)}


def _probe_triton() -> dict:
    try:
        import triton

        return {"triton_version": str(getattr(triton, "__version__", "unknown"))}
    except Exception as exc:  # noqa: BLE001 - a broken install is "not available"
        return {"triton_error": repr(exc)}


def _probe_hopper_stream(env: Mapping[str, str]) -> bool:
    """Whether the fused backend's Hopper stream can serve the FP8 cache here (an sm_90 GPU is
    already known): its switch is on and this Triton has the Gluon operations it uses."""
    if not envs.INDEXER_TOPK_HOPPER_STREAM.get(env):
        return False
    from .backends.hopper import hopper_kernels

    return hopper_kernels() is not None


def _probe_aiter() -> dict:
    fn, error = lookup_aiter_symbol()  # never raises
    return {"aiter_symbol": fn is not None, "aiter_error": error}


def probe_environment(env: Optional[Mapping[str, str]] = None) -> Probe:
    """Read what this process can run. Never raises: a failing sub-probe means "not available".

    Parameters
    ----------
    env : mapping, optional
        Environment variables to read flags from (default ``os.environ``).

    AITER is looked up only on AMD GPUs: it is a ROCm library, and importing it elsewhere
    costs start-up time for nothing.
    """
    env = os.environ if env is None else env
    fields: dict = {
        "fused_enabled": envs.SGLANG_DSV4_FP4_FUSED_TOPK.get(env),
        "kill_switch_raw": envs.SGLANG_DSV4_FP4_FUSED_TOPK.raw(env),
        "triton_rocm": envs.INDEXER_TOPK_TRITON_ROCM.get(env),
        "fused_prefill": envs.INDEXER_TOPK_FUSED_PREFILL.get(env),
        "fused_decode": envs.INDEXER_TOPK_FUSED_DECODE.get(env),
        "triton_interpret": interpreting(env),
    }
    fields.update(_probe_device())
    fields.update(_probe_triton())
    if fields["device"] == "cuda" and fields.get("compute_capability") == (9, 0) and "triton_version" in fields:
        fields["hopper_stream"] = _probe_hopper_stream(env)
    if fields["device"] == "hip":
        fields.update(_probe_aiter())
    return Probe(**fields)


# ---------------------------------------------------------------------------------------------
# Capture detection
# ---------------------------------------------------------------------------------------------

# (module, function) pairs, first found wins within a group. Only modules already imported
# are consulted: each predicate reads a flag that lives in its own module, so a module that is
# not loaded cannot report a capture, and importing SGLang's graph runner from inside a
# forward pass would be slow and could close an import cycle.
_SGLANG_CAPTURE_PREDICATES = (
    (
        # SGLang 0.5.23 keeps the flag in runner_utils; older trees in the graph runner.
        ("sglang.srt.model_executor.runner_utils.capture_mode", "get_is_capture_mode"),
        ("sglang.srt.model_executor.cuda_graph_runner_utils.capture_mode", "get_is_capture_mode"),
        ("sglang.srt.model_executor.cuda_graph_runner", "get_is_capture_mode"),
    ),
    (("sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph", "is_in_tc_piecewise_cuda_graph"),),
    (
        ("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context", "is_in_breakable_cuda_graph"),
        ("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph", "is_in_breakable_cuda_graph"),
    ),
)


def _torch_capturing() -> bool:
    import torch

    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - a torch without a GPU runtime cannot be capturing
        return False


def _sglang_capturing() -> bool:
    for group in _SGLANG_CAPTURE_PREDICATES:
        for module_name, fn_name in group:
            module = sys.modules.get(module_name)
            fn = getattr(module, fn_name, None) if module is not None else None
            if fn is None:
                continue
            try:
                if fn():
                    return True
            except Exception:  # noqa: BLE001
                # The predicate exists, so SGLang runs graphs here; when it cannot answer,
                # the path that is safe under capture is the right guess.
                return True
            break
    return False


def is_capturing() -> bool:
    """Whether the current call is being recorded into a CUDA/HIP graph.

    True if ``torch.cuda.is_current_stream_capturing()``, or, where SGLang is loaded, if
    ``get_is_capture_mode()``, ``is_in_tc_piecewise_cuda_graph()`` or
    ``is_in_breakable_cuda_graph()`` says so. Missing predicates count as False. Cheap enough
    to call per forward.
    """
    return _torch_capturing() or _sglang_capturing()


def _mode_is_decode(forward_mode: Any) -> bool:
    """Decode-like (decode, idle) vs prefill, for a string or an SGLang ``ForwardMode``.

    An unknown mode name counts as decode-like: the legacy path is correct for every mode,
    the fused path only for those listed in :data:`PREFILL_MODES`.
    """
    if forward_mode is None:
        return False
    if isinstance(forward_mode, str):
        name = forward_mode.strip().lower()
        return name in DECODE_MODES or name not in PREFILL_MODES
    decode_or_idle = getattr(forward_mode, "is_decode_or_idle", None)
    if callable(decode_or_idle):
        return bool(decode_or_idle())
    decode = getattr(forward_mode, "is_decode", None)
    idle = getattr(forward_mode, "is_idle", None)
    if callable(decode) or callable(idle):
        return bool(callable(decode) and decode()) or bool(callable(idle) and idle())
    name = getattr(forward_mode, "name", None)
    if isinstance(name, str):
        return _mode_is_decode(name)
    raise TypeError(f"forward_mode: expected a string or a ForwardMode-like object, got {type(forward_mode).__name__}")


# ---------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------

def can_use_aiter(probe: Probe) -> bool:
    """AITER's fused kernel: an AMD gfx950 whose AITER exports ``flydsl_pa_mqa_topk_fp4_prefill``."""
    return probe.device == "hip" and probe.gfx_arch == AITER_ARCH and probe.aiter_symbol


def can_use_triton(probe: Probe) -> bool:
    """Our Triton kernels: Triton imports, and a GPU is there or the interpreter is on."""
    if probe.triton_version is None:
        return False
    if probe.device == "cpu":
        return probe.triton_interpret
    return probe.device_error is None


def _why_not_aiter(probe: Probe) -> str:
    if probe.gfx_arch is None:
        return "the AMD GPU's architecture is unknown"
    if probe.gfx_arch != AITER_ARCH:
        return f"AITER's fused kernel needs {AITER_ARCH}, this GPU is {probe.gfx_arch}"
    if probe.aiter_error:
        return f"AITER could not be imported ({probe.aiter_error})"
    return "the installed AITER lacks flydsl_pa_mqa_topk_fp4_prefill"


def _decide_decode(p: Probe) -> Tuple[str, str]:
    """``(backend, reason)`` for decode and graph-captured calls: the proven path unless
    ``INDEXER_TOPK_FUSED_DECODE`` opts them in to our fused path and it can run here."""
    if not p.fused_enabled:
        return "legacy", "the kill switch is off"
    if not p.fused_decode:
        measured = f", except that {MEASURED_DECODE}" if _decode_measured_here(p) else ""
        return "legacy", f"the proven path{measured}; INDEXER_TOPK_FUSED_DECODE=1 opts them in to the fused path"
    if can_use_triton(p) and (p.device != "hip" or p.triton_rocm):
        return "fused", "opted in to the fused path (INDEXER_TOPK_FUSED_DECODE=1)"
    return "legacy", "INDEXER_TOPK_FUSED_DECODE=1, but our Triton fused path cannot run here"


def _decode_measured_here(p: Probe) -> bool:
    """Whether this device is the one :data:`MEASURED_DECODE` was measured on (sm_90, the stream)."""
    return p.fused_enabled and p.device == "cuda" and p.hopper_stream and can_use_triton(p)


def _decode_measured(layout, p: Probe, rows: Optional[int], c4_len: Optional[int]) -> bool:
    """Whether a decode call of ``layout`` and this shape is one :data:`MEASURED_DECODE` covers:
    a known layout (sglang_mxfp4 where the stream serves it), at least :data:`DECODE_MIN_C4` C4
    positions (an unknown length stays on the proven path) and at most :data:`DECODE_MAX_ROWS` rows."""
    if not _decode_measured_here(p) or layout is None or c4_len is None or c4_len < DECODE_MIN_C4:
        return False
    if rows is not None and rows > DECODE_MAX_ROWS:
        return False
    return layout is not Layout.SGLANG_MXFP4 or _mx_stream(p)


def _kill_switch_off(p: Probe) -> str:
    """Why the kill switch is off, in words: set off, or set to a value it cannot read."""
    raw = {} if p.kill_switch_raw is None else {KILL_SWITCH: p.kill_switch_raw}
    if not envs.SGLANG_DSV4_FP4_FUSED_TOPK.readable(raw):
        return f"kill switch {KILL_SWITCH}={p.kill_switch_raw!r} is not a recognised value, so the fused path is off"
    return f"kill switch {KILL_SWITCH} is off"


def _decide(p: Probe) -> Tuple[str, str, dict]:
    """``(fused_backend, reason, backend per layout)``; a ``"reference"`` fused backend means
    every call runs the reference (no GPU and no interpreter)."""

    def every(backend: str) -> dict:
        return {layout: backend for layout in Layout}

    if p.device == "cpu":
        why_cpu = "no GPU" + (f" (torch raised {p.torch_error})" if p.torch_error else "")
        if not p.triton_interpret:
            return "reference", f"{why_cpu} and the Triton interpreter is off", every("reference")
        if p.triton_version is None:
            return "reference", f"{why_cpu} and Triton cannot be imported ({p.triton_error})", every("reference")
        if not p.fused_enabled:
            return "legacy", f"{why_cpu}; {_kill_switch_off(p)}", every("legacy")
        return "fused", f"{why_cpu}; Triton kernels run under the interpreter", every("fused")

    if not p.fused_enabled:
        return "legacy", _kill_switch_off(p), every("legacy")

    if p.device == "hip":
        ours = "fused" if (p.triton_rocm and can_use_triton(p)) else "legacy"
        if can_use_aiter(p):
            return "aiter", f"AITER's fused FP4 kernel on {p.gfx_arch}", {**every(ours), Layout.AITER_MXFP4: "aiter"}
        why = _why_not_aiter(p)
        if ours == "fused":
            return "fused", f"{why}; our Triton path is opted in (INDEXER_TOPK_TRITON_ROCM=1)", every("fused")
        if p.triton_rocm:
            return "legacy", f"{why}; INDEXER_TOPK_TRITON_ROCM=1 but {_why_not_triton(p)}", every("legacy")
        return "legacy", f"{why}; our Triton path on AMD is opt-in (INDEXER_TOPK_TRITON_ROCM=1)", every("legacy")

    if not can_use_triton(p):
        return "legacy", _why_not_triton(p), every("legacy")
    if p.fused_prefill:
        return "fused", (
            "our Triton fused kernel on NVIDIA for every layout, opted in for its memory (INDEXER_TOPK_FUSED_PREFILL=1)"
        ), every("fused")
    if p.hopper_stream:
        mx = f"; {MEASURED_MXFP4_STREAM}" if _mx_stream(p) else ""
        return "fused", (
            f"the faster exact path per layout as measured: {MEASURED_MXFP4}, so they take it{mx}; "
            f"{MEASURED_FP8_STREAM}, so it takes the fused path from {STREAM_MIN_ROWS} rows and {STREAM_MIN_C4} C4 "
            "positions and the legacy path below (INDEXER_TOPK_FUSED_PREFILL=1 puts every call on the fused path, "
            "for its memory)"
        ), every("fused")
    return "fused", (
        f"the faster exact path per layout as measured: {MEASURED_MXFP4}, so they take it; {MEASURED_FP8}, so it "
        "takes the legacy path (INDEXER_TOPK_FUSED_PREFILL=1 puts it on the fused kernel too, for its memory)"
    ), {**every("fused"), Layout.SGLANG_FP8: "legacy"}


def _mx_stream(p: Probe) -> bool:
    """Whether the Hopper stream serves the sglang_mxfp4 cache too (its tile follows one Triton)."""
    return p.hopper_stream and (p.triton_version or "").startswith(MX_STREAM_TRITON)


def _stream_shape_rule(layout, p: Probe) -> bool:
    """Whether ``layout``'s fused calls go to legacy below the stream's measured shapes."""
    return layout is Layout.SGLANG_FP8 or (layout is Layout.SGLANG_MXFP4 and _mx_stream(p))


def _below_stream_shape(rows: Optional[int], c4_len: Optional[int]) -> bool:
    return (rows is not None and rows < STREAM_MIN_ROWS) or (c4_len is not None and c4_len < STREAM_MIN_C4)


def sglang_has_path(layout, probe: Probe) -> bool:
    """Whether SGLang 0.5.23 serves ``layout``'s prefill with a path of its own on this device:
    the FP8 cache on NVIDIA (DeepGEMM's paged logits, its radix top-k), the FP4 cache from SM100
    on (DeepGEMM's FP4 logits; SGLang refuses the FP4 indexer below SM100). On AMD its FP4 path
    is AITER's, which the policy routes itself."""
    layout = parse_layout(layout)
    if probe.device != "cuda":
        return False
    if layout is Layout.SGLANG_FP8:
        return True
    return layout is Layout.SGLANG_MXFP4 and (probe.compute_capability or (0, 0))[0] >= 10


def _why_not_triton(p: Probe) -> str:
    if p.triton_version is None:
        return f"Triton cannot be imported ({p.triton_error})"
    if p.device_error:
        return f"the GPU's properties could not be read ({p.device_error})"
    return "Triton cannot run here"


def _hardware_words(p: Probe) -> str:
    if p.device == "cuda":
        arch = f" sm_{p.compute_capability[0]}{p.compute_capability[1]}" if p.compute_capability else ""
        hw = f"{p.device_name}{arch}"
    elif p.device == "hip":
        hw = f"{p.device_name} {p.gfx_arch or 'gfx?'}"
        hw += ", aiter fused top-k " + ("found" if p.aiter_symbol else "absent")
    else:
        hw = "no GPU" + (", TRITON_INTERPRET=1" if p.triton_interpret else "")
    triton = f"triton {p.triton_version}" if p.triton_version else "no triton"
    return f"{hw}, {triton}"


class PathPolicy:
    """The frozen choice of backend for this process.

    Parameters
    ----------
    probe : Probe, optional
        What the process can run; :func:`probe_environment` is called when omitted.
    logger : logging.Logger, optional
        Where the one INFO line describing the decision goes (default: ``"indexer_topk"``).

    Attributes
    ----------
    probe : Probe
    fused_backend : str
        ``"fused"``, ``"aiter"`` or ``"legacy"`` (``"reference"`` on a CPU without the Triton
        interpreter): the fused path of this process, what eager prefill of a call without a
        layout takes. Each layout's backend (the FP8 one takes ``"legacy"`` on NVIDIA unless
        the fused kernel is opted in; layouts other than ``aiter_mxfp4`` on an AITER host take
        ours), see :meth:`route`.
    reason : str
        Why, in words.
    decode_backend, decode_reason : str
        What decode and graph-captured calls take (``"legacy"`` unless
        ``INDEXER_TOPK_FUSED_DECODE`` opts them in to ``"fused"``), and why.
    """

    __slots__ = ("probe", "fused_backend", "reason", "decode_backend", "decode_reason", "_layout_backends", "_frozen")

    def __init__(self, probe: Optional[Probe] = None, *, logger: Optional[logging.Logger] = None):
        probe = probe_environment() if probe is None else probe
        fused, reason, per_layout = _decide(probe)
        self.probe = probe
        self.fused_backend = fused
        self.reason = reason
        self._layout_backends = per_layout
        self.decode_backend, self.decode_reason = _decide_decode(probe)
        if fused == "reference":  # no GPU and no interpreter: nothing of ours runs
            self.decode_backend, self.decode_reason = "reference", "no kernel can run here"
        self._frozen = True
        (logger or logging.getLogger(LOGGER_NAME)).info("%s", self.log_line())

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError("PathPolicy is frozen once built; build a new one instead")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"PathPolicy(fused_backend={self.fused_backend!r}, reason={self.reason!r})"

    def log_line(self) -> str:
        """The one-line summary logged at construction."""
        p = self.probe
        switch = f"{KILL_SWITCH} unset" if p.kill_switch_raw is None else f"{KILL_SWITCH}={p.kill_switch_raw.strip()}"
        line = (
            f"indexer-topk: fused top-k path = {self.fused_backend} "
            f"({_hardware_words(p)}; kill switch {switch}): {self.reason}; "
            f"decode and graph capture: {self.decode_backend} ({self.decode_reason})"
        )
        errors = p.errors
        if errors:
            line += " [probe errors: " + "; ".join(f"{k}={v}" for k, v in errors.items()) + "]"
        return line

    def route(
        self,
        *,
        layout=None,
        is_decode: bool = False,
        capturing: Optional[bool] = None,
        forward_mode: Any = None,
        topk: Optional[int] = None,
        rows: Optional[int] = None,
        c4_len: Optional[int] = None,
    ) -> str:
        """The backend name for one call: ``"fused"``, ``"aiter"``, ``"legacy"`` or ``"reference"``.
        Decode and graph-captured calls take :attr:`decode_backend`, except decode calls of the
        shapes :data:`MEASURED_DECODE` covers (which need ``layout`` and ``c4_len``), which take
        the fused path; eager prefill its layout's backend.

        Parameters
        ----------
        layout : str or Layout, optional
            The call's layout; on an AITER host only ``aiter_mxfp4`` goes to AITER.
        is_decode : bool
            The call serves decode rows.
        capturing : bool, optional
            Whether a graph is being captured; ``None`` asks :func:`is_capturing`.
        forward_mode : str or ForwardMode-like, optional
            ``"extend"``, ``"mixed"``, ``"target_verify"``, ``"draft_extend"``, ``"decode"``,
            ``"idle"``, ... or an object with ``is_decode()``; decode and idle count as decode.
        topk : int, optional
            The call's ``topk``; AITER's kernel takes only 512 and 1024.
        rows, c4_len : int, optional
            The call's query rows and C4 positions per row it may score (its page table's
            columns x 64): an FP8 call below :data:`STREAM_MIN_ROWS` or :data:`STREAM_MIN_C4`
            takes the legacy path, where the Hopper stream measured slower. Unknown (``None``)
            counts as large for prefill; a decode call of unknown length stays on the proven path.
        """
        return self._route(layout, is_decode, capturing, forward_mode, topk, rows, c4_len)[1]

    def _route(self, layout, is_decode, capturing, forward_mode, topk, rows=None, c4_len=None) -> Tuple[bool, str]:
        """``(on the prefill route, backend)``: the first is False for the calls the proven path
        takes whatever was chosen (decode, capture)."""
        layout = None if layout is None else parse_layout(layout)
        if self.fused_backend == "reference":
            return False, "reference"
        if is_decode or _mode_is_decode(forward_mode):
            if self.decode_backend == "legacy" and _decode_measured(layout, self.probe, rows, c4_len):
                return False, "fused"
            return False, self.decode_backend
        if capturing is None:
            capturing = is_capturing()
        if capturing:
            return False, self.decode_backend
        backend = self.fused_backend if layout is None else self._layout_backends[layout]
        if backend == "aiter" and topk is not None and topk not in AITER_TOPK:
            return True, self._layout_backends[Layout.SGLANG_MXFP4]  # AITER's kernel takes 512 and 1024 only
        if (backend == "fused" and self.probe.hopper_stream and _stream_shape_rule(layout, self.probe)
                and not self.probe.fused_prefill and _below_stream_shape(rows, c4_len)):
            return True, "legacy"
        return True, backend

    def engine_route(
        self,
        *,
        engine_path: bool,
        layout=None,
        is_decode: bool = False,
        capturing: Optional[bool] = None,
        forward_mode: Any = None,
        topk: Optional[int] = None,
        rows: Optional[int] = None,
        c4_len: Optional[int] = None,
    ) -> Optional[str]:
        """Which of our backends serves a call inside a serving engine, or ``None`` for the
        engine's own path.

        The engine's own path is the proven path: it takes decode and graph capture (unless
        ``INDEXER_TOPK_FUSED_DECODE`` opts them in to our fused path) and every call under the
        kill switch. ``engine_path`` says the engine serves this call's layout with a
        path of its own on this device; such a call stays there unless our fused path is opted
        in (``INDEXER_TOPK_FUSED_PREFILL``), because the engine's is measured faster (SGLang's
        CUDA path for the FP8 cache, see :data:`MEASURED_FP8`); AITER's kernel, where it is
        the choice, serves its layout. Other calls take our prefill route. The other parameters
        are :meth:`route`'s.
        """
        prefill, backend = self._route(layout, is_decode, capturing, forward_mode, topk, rows, c4_len)
        if not self.probe.fused_enabled or backend == "reference":
            return None
        if not prefill:  # decode and capture: ours only where opted in (the engine's decode is faster)
            return backend if backend == "fused" and self.decode_backend == "fused" else None
        if engine_path:
            return backend if backend == "aiter" or (backend == "fused" and self.probe.fused_prefill) else None
        return backend

    def warm_up(self, layout, topk: int, device=None) -> float:
        """Compile (or load from Triton's cache) the kernels eager prefill of ``layout`` takes,
        by running it once on a small synthetic call; returns the seconds it took.

        A server calls this when it builds the policy, so its first prefill does not stall on
        compilation (20-30 s per layout for the fused kernel). Without a GPU it does nothing. Kernels specialise on the call's
        shape class (``topk``; for the fused kernel also the context split count, one for
        calls of hundreds of rows), so a first call of another class may still compile.
        """
        import time

        from .api import indexer_topk
        from .workload import make_workload

        backend = self.route(layout=layout, capturing=False, topk=topk)
        t0 = time.perf_counter()
        # under the interpreter nothing is compiled
        if backend in ("legacy", "fused") and self.probe.device in ("cuda", "hip"):
            if device is None:
                device = "cuda"
            from .backends.fused import program_slots
            from .kernels.launch import tile_config

            # enough rows that the fused plan takes one context split, as a large prefill does
            rows = program_slots(device) * tile_config(layout).rows
            w = make_workload(layout, context_tokens=[4 * topk + 256], rows_per_request=[rows], topk=topk,
                              seed=0, device=device)
            indexer_topk(*w.args(), **w.kwargs(), backend=backend, check_values=False)
            if str(device).startswith("cuda"):
                import torch

                torch.cuda.synchronize()
        return time.perf_counter() - t0

    def describe(self) -> dict:
        """Probe fields, the decision, its reason and the route of each kind of call (for ``info``)."""
        routes = {
            f"prefill/{layout.value}": self.route(layout=layout, capturing=False) for layout in Layout
        }
        if self.probe.hopper_stream and not self.probe.fused_prefill:
            for layout in (Layout.SGLANG_FP8, Layout.SGLANG_MXFP4):
                if _stream_shape_rule(layout, self.probe):
                    small = self.route(layout=layout, capturing=False, rows=1, c4_len=1)
                    routes[f"prefill/{layout.value} below {STREAM_MIN_ROWS} rows or {STREAM_MIN_C4} C4 positions"] = small
        routes["decode"] = self.route(is_decode=True, capturing=False)
        routes["capture"] = self.route(capturing=True)
        for kind, kw in (("decode", dict(is_decode=True, capturing=False)), ("capture", dict(capturing=True))):
            routes[f"sglang {kind}"] = self.engine_route(engine_path=True, **kw) or "sglang"
        # inside SGLang: its own path serves the FP8 cache (and the FP4 one from SM100 on)
        for layout in Layout:
            ours = self.engine_route(engine_path=sglang_has_path(layout, self.probe), layout=layout, capturing=False)
            routes[f"sglang prefill/{layout.value}"] = ours or "sglang"
        return {
            **dataclasses.asdict(self.probe),
            "fused_backend": self.fused_backend,
            "reason": self.reason,
            "decode_backend": self.decode_backend,
            "decode_reason": self.decode_reason,
            "routes": routes,
        }


_DEFAULT: Optional[PathPolicy] = None
_DEFAULT_LOCK = threading.Lock()


def _apply_log_level() -> None:
    """Apply ``INDEXER_TOPK_LOG_LEVEL`` to the ``"indexer_topk"`` logger.

    Setting the variable asks to see those lines, so where no handler would print them (none
    on the logger or its ancestors: a process that configured no logging) one stderr handler
    is attached to the package logger; where the application has its own, none is added, so
    nothing prints twice.
    """
    level = envs.INDEXER_TOPK_LOG_LEVEL.get()
    if level is None:
        return
    log = logging.getLogger(LOGGER_NAME)
    log.setLevel(level)
    if not log.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)


def default_policy() -> PathPolicy:
    """The process-wide policy: built on first use, then frozen for the life of the process.

    Build it (call this once) before any CUDA graph capture so captured and eager passes see
    the same decision. Applies ``INDEXER_TOPK_LOG_LEVEL`` to the ``"indexer_topk"`` logger
    first, so the decision line honours it. Thread-safe: the line is logged once.
    """
    global _DEFAULT
    policy = _DEFAULT
    if policy is not None:
        return policy
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _apply_log_level()
            _DEFAULT = PathPolicy()
        return _DEFAULT


def _clear_default_policy() -> None:
    """Forget the process-wide policy (tests only; serving code never rebuilds it)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        _DEFAULT = None


default_policy.cache_clear = _clear_default_policy  # the functools.lru_cache spelling

__all__ = [
    "DECODE_MODES",
    "PREFILL_MODES",
    "PathPolicy",
    "Probe",
    "can_use_aiter",
    "can_use_triton",
    "default_policy",
    "is_capturing",
    "probe_environment",
]
