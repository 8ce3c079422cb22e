"""The mode of a call, one of a routes table's keys: prefill, decode, or capture (being recorded
into a CUDA/HIP graph), from SGLang's forward mode and the capture state of the moment."""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

# SGLang ForwardMode names, lower-cased. Decode-like modes score one row per request against
# the whole context and are graph-captured in serving.
DECODE_MODES = frozenset({"decode", "idle"})
PREFILL_MODES = frozenset(
    {"extend", "mixed", "target_verify", "draft_extend", "draft_extend_v2", "split_prefill", "dllm_extend"}
)

# (module, function) pairs, first found wins within a group. Only modules already imported are
# consulted: importing SGLang's graph runner from inside a forward pass would be slow and could
# close an import cycle, and a module that is not loaded cannot report a capture.
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


def _sglang_capturing() -> bool:
    modules = sys.modules
    if "sglang" not in modules:
        return False
    for group in _SGLANG_CAPTURE_PREDICATES:
        for module_name, fn_name in group:
            fn = getattr(modules.get(module_name), fn_name, None)
            if fn is None:
                continue
            try:
                if fn():
                    return True
            except Exception:  # noqa: BLE001 - SGLang runs graphs here; unsure counts as capturing
                return True
            break
    return False


def is_capturing() -> bool:
    """Whether the current call is being recorded into a CUDA/HIP graph: torch's stream capture,
    or, where SGLang is loaded, its capture mode, piecewise or breakable graph. Missing
    predicates count as False; cheap enough to call per forward."""
    try:
        if torch.cuda.is_current_stream_capturing():
            return True
    except Exception:  # noqa: BLE001 - a torch without a GPU runtime cannot be capturing
        pass
    return _sglang_capturing()


def mode_is_decode(forward_mode: Any) -> bool:
    """Decode-like (decode, idle) vs prefill, for a string or an SGLang ``ForwardMode``. An
    unknown mode name counts as decode-like: the proven path is correct for every mode."""
    if forward_mode is None:
        return False
    if isinstance(forward_mode, str):
        name = forward_mode.strip().lower()
        return name in DECODE_MODES or name not in PREFILL_MODES
    decode_or_idle = getattr(forward_mode, "is_decode_or_idle", None)
    if callable(decode_or_idle):
        return bool(decode_or_idle())
    decode, idle = getattr(forward_mode, "is_decode", None), getattr(forward_mode, "is_idle", None)
    if callable(decode) or callable(idle):
        return bool(callable(decode) and decode()) or bool(callable(idle) and idle())
    if isinstance(getattr(forward_mode, "name", None), str):
        return mode_is_decode(forward_mode.name)
    raise TypeError(f"forward_mode: expected a string or a ForwardMode-like object, got {type(forward_mode).__name__}")


def call_mode(is_decode: bool, capturing: Optional[bool], forward_mode: Any) -> str:
    """``"capture"`` when ``capturing`` (``None``: :func:`is_capturing` decides, asked only for
    calls that are not decode), else ``"decode"`` for decode rows, else ``"prefill"``."""
    if capturing is True:
        return "capture"
    if is_decode or (forward_mode is not None and mode_is_decode(forward_mode)):
        return "decode"
    if capturing is None and is_capturing():
        return "capture"
    return "prefill"


__all__ = ["DECODE_MODES", "PREFILL_MODES", "call_mode", "is_capturing", "mode_is_decode"]
