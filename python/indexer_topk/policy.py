"""Which backend runs a call: probe the process once, decide, freeze, log one line.

Routes come from a measured table (:mod:`indexer_topk.routes`): the shipped one of this device
class, or the file ``INDEXER_TOPK_ROUTES`` names. A call is looked up by layout, mode (prefill,
decode, capture: :mod:`indexer_topk.routes.modes`), ``topk``, rows and C4 positions; the entry
names our fastest exact backend (what ``backend="auto"`` runs) and whether the engine's own path
is faster still (then :meth:`PathPolicy.engine_route` leaves the call there). Where no entry
applies, the proven rule: ``legacy`` for ours (the reference on a CPU without the Triton
interpreter; under it ``fused`` for prefill), the engine's own path inside an engine; AITER's
kernel for ``aiter_mxfp4`` prefill (topk 512, 1024) on a gfx950 whose AITER has
``flydsl_pa_mqa_topk_fp4_prefill``. On AMD our Triton kernels are opt-in inside an engine
(``INDEXER_TOPK_TRITON_ROCM=1``). ``SGLANG_DSV4_FP4_FUSED_TOPK=false`` (or a value it cannot
read) keeps every call on the proven path; ``INDEXER_TOPK_FUSED_PREFILL=1`` puts every eager
prefill on our fused kernel on NVIDIA (for its memory), ``INDEXER_TOPK_FUSED_DECODE=1`` every
decode and captured call. All of it is read once, when the policy is built, so a captured
graph and the eager path it mirrors see the same choice; only the capture state is per call.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from . import routes
from .backends.aiter import AITER_TOPK, lookup_aiter_symbol
from .contract import Layout, parse_layout
from .envs import envs, interpreting
from .routes.modes import DECODE_MODES, PREFILL_MODES, call_mode, is_capturing
from .routes.words import kill_switch_off, route_lines, route_rows, why_not_aiter, why_not_triton

LOGGER_NAME = "indexer_topk"
DEVICES = ("cuda", "hip", "cpu")
AITER_ARCH = "gfx950"
KILL_SWITCH = "SGLANG_DSV4_FP4_FUSED_TOPK"
_LAYOUT_KEYS = frozenset(list(Layout) + [x.value for x in Layout])


@dataclass(frozen=True)
class Probe:
    """What this process can run, read once; every field has a default so tests can build one.
    ``fused_enabled`` is the kill switch (off when set off or unreadable), ``device`` ``"cuda"``,
    ``"hip"`` or ``"cpu"``, ``sm_count`` its SMs (compute units), ``hopper_stream`` whether the
    fused backend's Hopper stream serves, ``routes_file`` ``INDEXER_TOPK_ROUTES``; ``*_error``
    the ``repr`` of what a sub-probe raised."""

    fused_enabled: bool = True
    device: str = "cpu"
    device_name: str = "cpu"
    compute_capability: Optional[Tuple[int, int]] = None
    gfx_arch: Optional[str] = None
    sm_count: Optional[int] = None
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
    routes_file: Optional[str] = None

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


def _probe_device() -> dict:
    """Device kind, name, architecture and SM count; exceptions are recorded, never raised."""
    import torch

    try:
        hip = getattr(torch.version, "hip", None)
        if not torch.cuda.is_available():
            return {"device": "cpu", "device_name": "cpu"}
    except Exception as exc:  # noqa: BLE001
        return {"device": "cpu", "device_name": "cpu", "torch_error": repr(exc)}
    kind = "hip" if hip else "cuda"
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        sms = getattr(props, "multi_processor_count", None)
        out = {"device": kind, "device_name": str(getattr(props, "name", "") or kind),
               "sm_count": sms if isinstance(sms, int) and sms > 0 else None}
        if kind == "hip":
            out["gfx_arch"] = str(getattr(props, "gcnArchName", "") or "").split(":")[0] or None
        else:
            out["compute_capability"] = (int(props.major), int(props.minor))
        return out
    except Exception as exc:  # noqa: BLE001
        return {"device": kind, "device_name": kind, "device_error": repr(exc)}


def probe_environment(env: Optional[Mapping[str, str]] = None) -> Probe:
    """Read what this process can run from ``env`` (default ``os.environ``) and the device.
    Never raises: a failing sub-probe means "not available". AITER is looked up only on AMD."""
    env = os.environ if env is None else env
    fields: dict = {
        "fused_enabled": envs.SGLANG_DSV4_FP4_FUSED_TOPK.get(env),
        "kill_switch_raw": envs.SGLANG_DSV4_FP4_FUSED_TOPK.raw(env),
        "triton_rocm": envs.INDEXER_TOPK_TRITON_ROCM.get(env),
        "fused_prefill": envs.INDEXER_TOPK_FUSED_PREFILL.get(env),
        "fused_decode": envs.INDEXER_TOPK_FUSED_DECODE.get(env),
        "routes_file": envs.INDEXER_TOPK_ROUTES.get(env),
        "triton_interpret": interpreting(env),
    }
    fields.update(_probe_device())
    try:
        import triton

        fields["triton_version"] = str(getattr(triton, "__version__", "unknown"))
    except Exception as exc:  # noqa: BLE001 - a broken install is "not available"
        fields["triton_error"] = repr(exc)
    sm90 = fields["device"] == "cuda" and fields.get("compute_capability") == (9, 0) and "triton_version" in fields
    if sm90 and envs.INDEXER_TOPK_HOPPER_STREAM.get(env):
        from .backends.hopper import hopper_kernels

        fields["hopper_stream"] = hopper_kernels() is not None
    if fields["device"] == "hip":
        fn, error = lookup_aiter_symbol()  # never raises
        fields.update(aiter_symbol=fn is not None, aiter_error=error)
    return Probe(**fields)


def can_use_aiter(probe: Probe) -> bool:
    """AITER's fused kernel: an AMD gfx950 whose AITER exports ``flydsl_pa_mqa_topk_fp4_prefill``."""
    return probe.device == "hip" and probe.gfx_arch == AITER_ARCH and probe.aiter_symbol


def can_use_triton(probe: Probe) -> bool:
    """Our Triton kernels: Triton imports, and a GPU is there or the interpreter is on."""
    runs = probe.triton_interpret if probe.device == "cpu" else probe.device_error is None
    return probe.triton_version is not None and runs


def sglang_has_path(layout, probe: Probe) -> bool:
    """Whether SGLang 0.5.23 serves ``layout`` with a path of its own on this device: the FP8
    cache on NVIDIA, the FP4 cache from SM100 on (it refuses the FP4 indexer below), AITER's
    layout on AMD (its ROCm FP4 indexer)."""
    layout = parse_layout(layout)
    if probe.device == "hip":
        return layout is Layout.AITER_MXFP4
    if probe.device != "cuda":
        return False
    return layout is Layout.SGLANG_FP8 or (layout is Layout.SGLANG_MXFP4 and (probe.compute_capability or (0,))[0] >= 10)


def engine_layouts(probe: Probe) -> Tuple[str, ...]:
    """The layouts SGLang 0.5.23 can hand its covered indexer branches on this device."""
    return tuple(x.value for x in Layout if probe.device in ("cuda", "hip") and sglang_has_path(x, probe))


def _decide(p: Probe) -> Tuple[str, str]:
    """``(fused_backend, reason)``: the process's fused path and why (``"reference"``: nothing
    of ours runs here)."""
    if p.device == "cpu":
        why_cpu = "no GPU" + (f" (torch raised {p.torch_error})" if p.torch_error else "")
        if not p.triton_interpret:
            return "reference", f"{why_cpu} and the Triton interpreter is off (TRITON_INTERPRET is not 1)"
        if p.triton_version is None:
            return "reference", f"{why_cpu} and Triton cannot be imported ({p.triton_error})"
        if not p.fused_enabled:
            return "legacy", f"{why_cpu}; {kill_switch_off(p)}"
        return "fused", f"{why_cpu}; Triton kernels run under the interpreter"
    if not p.fused_enabled:
        return "legacy", kill_switch_off(p)
    if p.device == "hip":
        if can_use_aiter(p):
            return "aiter", f"AITER's fused FP4 kernel on {p.gfx_arch}"
        why = why_not_aiter(p)
        if p.triton_rocm and can_use_triton(p):
            return "fused", f"{why}; our Triton path is opted in (INDEXER_TOPK_TRITON_ROCM=1)"
        if p.triton_rocm:
            return "legacy", f"{why}; INDEXER_TOPK_TRITON_ROCM=1 but {why_not_triton(p)}"
        return "legacy", f"{why}; our Triton path on AMD is opt-in (INDEXER_TOPK_TRITON_ROCM=1)"
    if not can_use_triton(p):
        return "legacy", why_not_triton(p)
    if p.fused_prefill:
        return "fused", "our Triton fused kernel for every prefill, opted in for its memory (INDEXER_TOPK_FUSED_PREFILL=1)"
    return "fused", "our Triton fused kernel runs here"


def _decide_decode(p: Probe, fused: str) -> Tuple[str, str]:
    """``(backend, reason)`` for decode and captured calls outside the table's entries."""
    if fused == "reference" or not p.fused_enabled:
        return fused, "no kernel can run here" if fused == "reference" else "the kill switch is off"
    if not p.fused_decode:
        return "legacy", "the proven path; INDEXER_TOPK_FUSED_DECODE=1 opts every one in to the fused path"
    if can_use_triton(p) and (p.device != "hip" or p.triton_rocm):
        return "fused", "opted in to the fused path (INDEXER_TOPK_FUSED_DECODE=1)"
    return "legacy", "INDEXER_TOPK_FUSED_DECODE=1, but our Triton fused path cannot run here"


def _aiter_call(layout, topk) -> bool:  # AITER's kernel takes its layout at topk 512 and 1024
    return layout == Layout.AITER_MXFP4 and (topk is None or topk in AITER_TOPK)


class PathPolicy:
    """The frozen choice of backend for this process, from ``probe`` (default:
    :func:`probe_environment`); ``logger`` gets the one INFO line and a routes file's warning.

    ``table`` is the routes table in force (``None``: the proven rule), ``table_note`` names it;
    ``fused_backend`` the process's fused path (``"fused"``, ``"aiter"``, ``"legacy"``, or
    ``"reference"`` where nothing of ours runs) and ``reason`` why; ``decode_backend`` and
    ``decode_reason`` what decode and captured calls take outside the table's entries.
    """

    __slots__ = ("probe", "table", "table_note", "fused_backend", "reason", "decode_backend", "decode_reason",
                 "_fixed", "_forced", "_proven", "_ours_ok", "_engine_ok", "_aiter", "_amd", "_frozen")

    def __init__(self, probe: Optional[Probe] = None, *, logger: Optional[logging.Logger] = None):
        p = self.probe = probe_environment() if probe is None else probe
        log = logger or logging.getLogger(LOGGER_NAME)
        self.fused_backend, self.reason = _decide(p)
        self.decode_backend, self.decode_reason = _decide_decode(p, self.fused_backend)
        self._fixed = "reference" if self.fused_backend == "reference" else (None if p.fused_enabled else "legacy")
        self.table, self.table_note = None, f"none: {self.reason}"
        if self._fixed is None:
            self.table, note = routes.select_table(p, warn=log.warning)
            self.table_note = note if self.table is not None else f"none ({note}): the proven rule"
        self._amd, triton, self._aiter = p.device == "hip", can_use_triton(p), can_use_aiter(p)
        decode = "fused" if self.decode_backend == "fused" else None
        self._forced = {"prefill": "fused" if p.device == "cuda" and p.fused_prefill and triton else None,
                        "decode": decode, "capture": decode}
        opted = {"fused", "legacy"} if not self._amd or (p.triton_rocm and triton) else set()
        ours = "fused" if p.device == "cpu" or (self._amd and opted) else "legacy"
        self._proven = {"prefill": ours, "decode": "legacy", "capture": "legacy"}
        self._engine_ok = frozenset(opted | ({"aiter"} if self._aiter else set()))
        self._ours_ok = self._engine_ok | {"legacy"}
        self._frozen = True
        log.info("%s", self.log_line())

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError("PathPolicy is frozen once built; build a new one instead")
        object.__setattr__(self, name, value)

    def pick(self, mode: str, cell, layout, topk, engine_path: Optional[bool]) -> Optional[str]:
        """The decision for a call of ``mode`` whose table cell is ``cell``: our backend
        (``engine_path`` None) or, inside an engine, ours or ``None`` for the engine's path."""
        if self._fixed is not None:
            return self._fixed if engine_path is None else None
        forced = self._forced[mode]
        if forced is not None:
            return forced
        if cell is not None and (cell[1] != "aiter" or _aiter_call(layout, topk)):
            if engine_path is None and cell[1] in self._ours_ok:
                return cell[1]
            if engine_path is not None and cell[1] in self._engine_ok:
                return None if (cell[0] == routes.ENGINE and engine_path) else cell[1]
        if self._aiter and mode == "prefill" and _aiter_call(layout, topk):
            return "aiter"
        proven = self._proven[mode]
        if engine_path is None:
            return proven
        # inside an engine: its own path, where it has one; on AMD our opted-in Triton path
        keep = mode != "prefill" or proven not in self._engine_ok or (engine_path and not self._amd)
        return None if keep else proven

    def route(self, *, layout=None, is_decode: bool = False, capturing: Optional[bool] = None,
              forward_mode: Any = None, topk: Optional[int] = None, rows: Optional[int] = None,
              c4_len: Optional[int] = None) -> str:
        """Our backend for one call: ``"fused"``, ``"aiter"``, ``"legacy"`` or ``"reference"``.

        ``layout``, ``topk``, ``rows`` (query rows) and ``c4_len`` (C4 positions a row may score:
        page-table columns x 64) key the lookup (an unknown size: the largest measured for
        prefill, the proven rule for decode and capture). ``is_decode`` or a decode-like
        ``forward_mode`` (``"extend"``, ``"decode"``, ``"idle"``, ..., or an object with
        ``is_decode()``) make it decode; ``capturing`` (``None``: :func:`is_capturing`) capture.
        """
        return self.pick(*self._lookup(layout, is_decode, capturing, forward_mode, topk, rows, c4_len), None)

    def _lookup(self, layout, is_decode, capturing, forward_mode, topk, rows, c4_len) -> tuple:
        """``(mode, table cell or None, layout, topk)`` of one call, for :meth:`pick`."""
        if layout is not None and layout not in _LAYOUT_KEYS:
            parse_layout(layout)  # raises, naming the argument
        mode, table = call_mode(is_decode, capturing, forward_mode), self.table
        cell = table.lookup(layout, mode, topk, rows, c4_len) if table is not None and layout is not None else None
        return mode, cell, layout, topk

    def engine_route(self, *, engine_path: bool, layout=None, is_decode: bool = False,
                     capturing: Optional[bool] = None, forward_mode: Any = None, topk: Optional[int] = None,
                     rows: Optional[int] = None, c4_len: Optional[int] = None) -> Optional[str]:
        """Which of our backends serves a call inside a serving engine, or ``None`` for the
        engine's own path. ``engine_path``: the engine serves this layout with a path of its
        own here (see :func:`sglang_has_path`). The table's entry decides (``"engine"`` keeps
        the call there); outside its entries the engine keeps every call it has a path for,
        except AITER's kernel and the opt-ins. The other parameters are :meth:`route`'s."""
        return self.pick(*self._lookup(layout, is_decode, capturing, forward_mode, topk, rows, c4_len),
                         bool(engine_path))

    def outcomes(self, layout, mode: str, engine_path: Optional[bool] = None, topk: int = 1024) -> Tuple[list, Optional[str]]:
        """``(backend of each measured table entry, backend outside them)`` of ``layout`` and
        ``mode`` for ``topk``, outside an engine (``engine_path`` None) or inside it."""
        cells = self.table.cells(layout, mode) if self.table is not None and self._fixed is None else []
        return ([self.pick(mode, c, layout, topk, engine_path) for c in cells],
                self.pick(mode, None, layout, topk, engine_path))

    def lines(self) -> list:
        """The table in force, the device and each route in short lines (:mod:`~indexer_topk.routes.words`)."""
        return route_lines(self)

    def log_line(self) -> str:
        """The one-line summary logged at construction."""
        line = "indexer-topk: " + "; ".join(self.lines())
        errors = self.probe.errors
        return line + (" [probe errors: " + "; ".join(f"{k}={v}" for k, v in errors.items()) + "]" if errors else "")

    def describe(self) -> dict:
        """Probe fields, the decision, the table in force and the routes (for ``info``)."""
        return {**dataclasses.asdict(self.probe), "fused_backend": self.fused_backend, "reason": self.reason,
                "decode_backend": self.decode_backend, "decode_reason": self.decode_reason,
                "table": self.table_note, "routes": route_rows(self), "lines": self.lines()}

    def warm_up(self, layout, topk: int, device=None) -> float:
        """Compile (or load from Triton's cache) the Triton kernels eager prefill of ``layout``
        may take here by running each backend once, directly, on a small synthetic call; the
        seconds it took. Nothing without a GPU; a call of another shape class may still compile."""
        import time

        t0 = time.perf_counter()
        measured, other = self.outcomes(layout, "prefill")
        backends = sorted({b for b in measured + [other] if b in ("legacy", "fused")})
        if backends and self.probe.device in ("cuda", "hip"):
            import torch

            from .backends.fused import fused_indexer_topk, program_slots
            from .backends.legacy import legacy_indexer_topk
            from .contract import IndexerInputs
            from .kernels.launch import tile_config
            from .workload import make_workload

            device = "cuda" if device is None else device
            rows = program_slots(device) * tile_config(layout).rows  # one context split, as a large prefill
            w = make_workload(layout, context_tokens=[4 * topk + 256], rows_per_request=[rows], topk=topk, device=device)
            for b in backends:
                (fused_indexer_topk if b == "fused" else legacy_indexer_topk)(IndexerInputs.of(w.args(), **w.kwargs()))
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0


_DEFAULT: Optional[PathPolicy] = None
_DEFAULT_LOCK = threading.Lock()


def _apply_log_level() -> None:
    """Apply ``INDEXER_TOPK_LOG_LEVEL`` to the ``"indexer_topk"`` logger; where nothing would
    print its lines (no handler on it or its ancestors), attach one stderr handler."""
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
    """The process-wide policy: built on first use (thread-safe, its line logged once), then
    frozen for the life of the process. Build it before any graph capture."""
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
    "DECODE_MODES", "PREFILL_MODES", "PathPolicy", "Probe", "can_use_aiter", "can_use_triton", "default_policy",
    "engine_layouts", "is_capturing", "probe_environment", "sglang_has_path",
]
