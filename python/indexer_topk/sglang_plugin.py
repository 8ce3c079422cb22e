"""SGLang plugin: serve DeepSeek-V4's C4 indexer top-k through :func:`indexer_topk.indexer_topk`.

SGLang discovers this module through the ``sglang.srt.plugins`` entry point declared in
``pyproject.toml`` and calls :func:`load` in every process that runs ``load_plugins()``.
``load`` probes the installed SGLang for the exact symbols the hooks rely on and, when they
are all present, registers two hooks with SGLang's ``HookRegistry``:

``sglang.srt.layers.attention.dsv4.indexer.C4IndexerBackendMixin.__init__`` (AFTER)
    Builds the process's path policy (:func:`indexer_topk.policy.default_policy`, frozen
    once built) when SGLang builds a DSv4 attention backend: the device is selected by then
    and no graph is being captured, so the policy's probes never run inside a capture.

``sglang.srt.layers.attention.dsv4.indexer.C4IndexerBackendMixin.forward_c4_indexer`` (AROUND)
    On the two covered branches -- HIP with the FP4 indexer (AITER layout) and the CUDA paged
    indexer over an FP4 or FP8 cache -- asks the policy which backend serves each call
    (:meth:`indexer_topk.policy.PathPolicy.engine_route`: the routes table's entry for the
    call's layout, mode and shape, where ``"engine"`` keeps SGLang's path; outside the table,
    SGLang's path, except AITER's kernel and the opt-ins). Where the frozen policy sends no
    call of the call's kind (decode; or any other mode with the call's cache) to ours, the call
    goes back without asking. Where it names one of ours, runs SGLang's own query/weights
    preparation and index-K compression, then writes the physical page indices (and the raw
    indices when SGLang asks for them) through our operator in one call. Where it says SGLang's own path, and on every branch not covered (the non-paged
    indexer, HiSparse, XPU, HIP FP8, ...), SGLang's original method runs unchanged.

Importing this module never imports SGLang; without SGLang, :func:`load` logs and returns.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import threading
from typing import Any, List, Optional

import torch

from . import api as _api
from . import policy as _policy
from .contract import PAGE_SIZE, SGLANG_FP8_SLOT_BYTES, SGLANG_MXFP4_SLOT_BYTES, SUPPORTED_TOPK, IndexerTopKResult
from .orders import serving_order
from .workspaces import Workspaces

logger = logging.getLogger(__name__)

TARGET_SGLANG_VERSION = "0.5.23"
INDEXER_MODULE = "sglang.srt.layers.attention.dsv4.indexer"
MIXIN = "C4IndexerBackendMixin"
FORWARD_TARGET = f"{INDEXER_MODULE}.{MIXIN}.forward_c4_indexer"
INIT_TARGET = f"{INDEXER_MODULE}.{MIXIN}.__init__"

# Parameters of SGLang 0.5.23's forward_c4_indexer the fused route reads or forwards.
_FORWARD_PARAMS = (
    "self", "x", "q_lora", "c4_indexer", "forward_batch", "alt_streams",
    "enable_multi_stream", "q_lora_ready", "skip_compressor", "q_lora_quant",
)
# Module globals and mixin helpers the fused route calls, probed by name at load.
_MODULE_SYMBOLS = (
    "is_hip", "is_xpu", "envs", "get_global_indexer_capturer", "PagedIndexerMetadata",
    "FP4RowgroupDecodeWorkspace",
)
_MIXIN_HELPERS = ("_forward_prepare_normal", "_forward_prepare_multi_stream", "_get_nonpaged_indexer_plan")

# The INFO line logged when the kernels a route will run are compiled at start-up.
WARM_UP_LOG = "indexer_topk: compiled %s kernels for %s (topk 512 and 1024) in %.1f s, before the first prefill"
# The INFO line the first call served in a process logs (docs/sglang.md quotes it).
SERVING_LOG = "indexer_topk: serving DSv4 C4 indexer top-k (backend=%s, layout=%s, topk=%d, first call %d rows)"


class _PluginState:
    """Process-wide plugin state; one instance, replaced only by tests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registered = False
        self.indexer_module = None  # SGLang's dsv4 indexer module, once probed
        self.disabled: Optional[str] = None  # why our route is off for the rest of this process
        self.served_first_call = False
        self.decode_ours = False  # the frozen policy may send a decode or captured call to ours
        # ... or a call of another mode (prefill, target-verify), by its cache (FP4 or not): until
        # the policy is frozen, each call asks it
        self.prefill_ours = {False: True, True: True}
        self.frozen_policy = None  # the policy both answers were taken from
        self.warmed = False  # the kernels our routes run were compiled (or there were none)
        # the scratch of the calls our Triton backends serve: one buffer per device, stream,
        # layout and topk, so that no call allocates its own (nor a captured graph its copy)
        self.workspaces = Workspaces()


_STATE = _PluginState()


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------

def load(*_args: Any, **_kwargs: Any) -> bool:
    """Entry point of the ``sglang.srt.plugins`` group; SGLang calls it from ``load_plugins()``.

    Accepts and ignores any arguments, so a loader that passes a context still works. Returns
    True when the hooks were registered (SGLang's loader applies them right after), False
    when SGLang is absent or lacks a hook target, in which case SGLang is left untouched and
    the reason is logged.
    """
    with _STATE.lock:
        if _STATE.registered:
            return True
        try:
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType
        except ImportError as exc:
            if _installed("sglang"):
                logger.warning("indexer_topk: SGLang has no plugin HookRegistry (%s); leaving SGLang untouched", exc)
            else:
                logger.info("indexer_topk: SGLang is not installed; the SGLang plugin does nothing")
            return False
        except Exception as exc:  # noqa: BLE001 - a plugin must not take SGLang's start-up down
            logger.warning("indexer_topk: SGLang's HookRegistry failed to import (%s: %s); leaving SGLang untouched",
                           type(exc).__name__, exc)
            return False
        version = _sglang_version()
        try:
            problems = probe_sglang()
        except Exception as exc:  # noqa: BLE001 - as above: a module that raises while probed
            problems = [f"probing its modules raised {type(exc).__name__}: {exc}"]
        if problems:
            logger.warning(
                "indexer_topk: SGLang %s does not match the DSv4 indexer hooks (built for %s): %s; "
                "leaving SGLang's indexer untouched",
                version, TARGET_SGLANG_VERSION, "; ".join(problems),
            )
            return False
        hooks = ((INIT_TARGET, _freeze_after_backend_init, HookType.AFTER),
                 (FORWARD_TARGET, _forward_c4_indexer_hook, HookType.AROUND))
        done = []
        try:
            for target, hook, kind in hooks:
                HookRegistry.register(target, hook, kind)
                done.append((target, hook))
        except Exception as exc:  # noqa: BLE001 - both hooks or neither: a later load() starts clean
            left = _withdraw(HookRegistry, done)
            logger.warning("indexer_topk: SGLang's HookRegistry refused the DSv4 indexer hooks (%s: %s); %s",
                           type(exc).__name__, exc, "leaving SGLang untouched" if not left
                           else f"could not withdraw {', '.join(left)} (SGLang's registry has no _hooks)")
            return False
        _STATE.registered = True
        logger.info(
            "indexer_topk: registered DSv4 C4 indexer hooks on SGLang %s: %s, %s",
            version, INIT_TARGET, FORWARD_TARGET,
        )
        return True


def _withdraw(registry, done) -> list:
    """Remove the hooks in ``done`` (``(target, hook)``) from SGLang's registry, which has no
    public way to: through its ``_hooks`` lists. Returns the targets it could not clear."""
    hooks = getattr(registry, "_hooks", None)
    left = []
    for target, hook in done:
        entries = hooks.get(target) if isinstance(hooks, dict) else None
        if not isinstance(entries, list):
            left.append(target)
            continue
        entries[:] = [e for e in entries if not (isinstance(e, tuple) and len(e) > 1 and e[1] is hook)]
    return left


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken parent
        return False


def _sglang_version() -> str:
    try:
        from sglang.version import __version__

        return str(__version__)
    except Exception:  # a broken or partial install still gets probed by symbol
        return "unknown"


def probe_sglang() -> List[str]:
    """Check the installed SGLang for every symbol the hooks use; returns the problems found.

    Imports SGLang's DSv4 indexer module (``HookRegistry.apply_hooks`` would import it anyway).
    An empty list means the hooks can be registered.
    """
    try:
        module = importlib.import_module(INDEXER_MODULE)
    except Exception as exc:  # ImportError, or a dependency failing at import
        return [f"cannot import {INDEXER_MODULE} ({type(exc).__name__}: {exc})"]
    problems = [f"{INDEXER_MODULE}.{name} is missing" for name in _MODULE_SYMBOLS if not hasattr(module, name)]
    mixin = getattr(module, MIXIN, None)
    if not isinstance(mixin, type):
        return problems + [f"{INDEXER_MODULE}.{MIXIN} is missing"]
    forward = mixin.__dict__.get("forward_c4_indexer")
    if not callable(forward):
        problems.append(f"{FORWARD_TARGET} is missing")
    else:
        params = tuple(inspect.signature(forward).parameters)
        missing = [p for p in _FORWARD_PARAMS if p not in params]
        if missing:
            problems.append(f"{FORWARD_TARGET} lacks parameters {missing}")
    if "__init__" not in mixin.__dict__:
        problems.append(f"{INIT_TARGET} is missing")
    problems += [f"{MIXIN}.{name} is missing" for name in _MIXIN_HELPERS if not callable(getattr(mixin, name, None))]
    if not problems:
        _STATE.indexer_module = module
    return problems


# ---------------------------------------------------------------------------------------------
# Routing: the path policy decides, per call or, where nothing of ours can serve, once
# ---------------------------------------------------------------------------------------------

def _freeze_after_backend_init(_result, *_args, **_kwargs) -> None:
    """AFTER hook on the backend mixin's ``__init__``: SGLang builds attention backends
    (target, draft and per-step MTP backends alike) before it captures any graph, so building
    the policy here keeps its probes out of every capture, and compiling the kernels our routes
    will run here keeps compilation out of the first prefill."""
    policy = _policy_or_none()
    if policy is None:
        return None
    try:
        layouts = _policy.engine_layouts(policy.probe)
        decode_ours = any(_engine_backends(policy, x, m, SUPPORTED_TOPK) for x in layouts
                          for m in ("decode", "capture"))
        ix = _STATE.indexer_module  # the hook's own test for HIP, where SGLang is loaded
        hip = bool(ix.is_hip()) if ix is not None else policy.probe.device == "hip"
        prefill_ours = {}
        for fp4 in (False, True):
            layout = _covered_layout(fp4, hip)
            prefill_ours[fp4] = layout is not None and any(
                _engine_backends(policy, layout, m, SUPPORTED_TOPK) for m in ("prefill", "capture"))
    except Exception as exc:  # SGLang's start-up must not fail in a hook of ours
        _turn_off(f"the backend-init hook failed ({type(exc).__name__}: {exc})")
        return None
    _STATE.decode_ours, _STATE.prefill_ours, _STATE.frozen_policy = decode_ours, prefill_ours, policy
    _warm_up(policy)
    return None


def _frozen_policy_in_force() -> bool:
    """Whether the policy the shortcut's answers came from is still the process's (serving
    never rebuilds it; a test or tool that does gets the full path until a backend is built)."""
    try:
        return _policy.default_policy() is _STATE.frozen_policy
    except Exception:  # noqa: BLE001 - the full path reports it (our route off, SGLang's path)
        return False


def _covered_layout(fp4: bool, hip: bool) -> Optional[str]:
    """The layout of a covered call with an FP4 or an FP8 index cache on this vendor's GPU:
    HIP FP4 is AITER's, CUDA's are SGLang's; ``None`` for HIP FP8, which the hooks leave to
    SGLang."""
    if fp4:
        return "aiter_mxfp4" if hip else "sglang_mxfp4"
    return None if hip else "sglang_fp8"


def _engine_backends(policy, layout: str, mode: str, topks=(1024,)) -> set:
    """Our backends that SGLang's calls of ``layout`` in ``mode`` with one of ``topks`` may take
    here (the routes table's entries and the rule outside them)."""
    engine_path = _policy.sglang_has_path(layout, policy.probe)
    ours = set()
    for topk in topks:
        measured, other = policy.outcomes(layout, mode, engine_path, topk)
        ours |= {b for b in measured + [other] if b is not None}
    return ours


def _warm_up(policy) -> None:
    """Compile, once per process, the Triton kernels of every layout whose prefill our route may
    serve here, for DSv4-Flash's and -Pro's topk; logs how long it took. Nothing to do where
    SGLang's own path serves every call (an H200 without ``INDEXER_TOPK_FUSED_PREFILL``)."""
    with _STATE.lock:
        if _STATE.warmed:
            return
        _STATE.warmed = True
    for layout in _policy.engine_layouts(policy.probe):
        triton = sorted(_engine_backends(policy, layout, "prefill") & {"legacy", "fused"})
        if not triton:
            continue
        backend = "/".join(triton)
        try:
            seconds = sum(policy.warm_up(layout, topk) for topk in (512, 1024))
        except Exception as exc:  # a failed warm-up costs the first call its compile, nothing else
            logger.warning("indexer_topk: warming up %s for %s failed (%s: %s)", backend, layout, type(exc).__name__, exc)
            continue
        logger.info(WARM_UP_LOG, backend, layout, seconds)


def _turn_off(why: str) -> None:
    """Our route off for the rest of this process, with a warning saying ``why``."""
    _STATE.disabled = why
    logger.warning("indexer_topk: %s; SGLang's DSv4 indexer stays on its own path", why)


def _policy_or_none():
    """The process's frozen path policy; ``None``, and our route off for good, if it cannot
    be built."""
    if _STATE.disabled is not None:
        return None
    try:
        return _policy.default_policy()  # built once per process; logs its one decision line
    except Exception as exc:
        _turn_off(f"no path policy ({type(exc).__name__}: {exc})")
        return None


def _route(*, layout: str, topk: int, forward_mode, scored_as_decode: bool, prefill_graph: bool,
           rows: Optional[int] = None, c4_len: Optional[int] = None) -> Optional[str]:
    """Which of our backends serves this call, or ``None`` for SGLang's own path.

    The policy decides (:meth:`indexer_topk.policy.PathPolicy.engine_route`), from the call's
    layout, topk, mode (decode and idle modes, graph capture, which the policy detects itself)
    and shape. The plugin adds only what SGLang's metadata says: rows SGLang scores as decode in
    a prefill mode (``scored_as_decode``), its prefill CUDA graph (``prefill_graph``), and the
    call's shape (``rows``, ``c4_len``: its page table's rows and C4 columns).
    """
    policy = _policy_or_none()
    if policy is None:
        return None
    return policy.engine_route(
        engine_path=_policy.sglang_has_path(layout, policy.probe),
        layout=layout, topk=topk, is_decode=scored_as_decode, forward_mode=forward_mode,
        capturing=True if prefill_graph else None,  # None: the policy looks for a capture itself
        rows=rows, c4_len=c4_len,
    )


# ---------------------------------------------------------------------------------------------
# The forward_c4_indexer hook
# ---------------------------------------------------------------------------------------------

class _Call:
    """What the fused route needs to know about one covered call, decided before any work."""

    __slots__ = ("layout", "backend", "aiter", "fp4", "k_cache", "k_scale")

    def __init__(self, layout: str, backend: str, aiter: bool, fp4: bool, k_cache, k_scale) -> None:
        self.layout, self.backend, self.aiter, self.fp4 = layout, backend, aiter, fp4
        self.k_cache, self.k_scale = k_cache, k_scale  # the layer's index-K pool buffers, as uint8


def _forward_c4_indexer_hook(original, *args, **kwargs):
    """AROUND hook: our operator for covered calls the policy routes to our kernels, else SGLang's."""
    forward_batch = kwargs.get("forward_batch")
    if forward_batch is not None:
        # Where the frozen policy sends no call of this kind that SGLang can hand us here to ours
        # (the routes table, the opt-ins and the kill switch, read when it was built), answering
        # before binding the signature keeps the call at a few attribute reads: on an H200 every
        # FP8 call goes back to SGLang. A target-verify call may be scored as decode rows (AITER),
        # so other modes pass only when no decode call is ours either. Arguments passed
        # positionally still reach the policy below.
        mode = forward_batch.forward_mode
        if mode.is_decode_or_idle():
            if not _STATE.decode_ours or mode.is_idle():
                return original(*args, **kwargs)
        elif not _STATE.decode_ours and _STATE.frozen_policy is not None:
            c4_indexer = kwargs.get("c4_indexer")
            if (c4_indexer is not None and not _STATE.prefill_ours[bool(c4_indexer.use_fp4_indexer)]
                    and _frozen_policy_in_force()):
                return original(*args, **kwargs)
    a = _arguments(original, args, kwargs)
    if a is None:
        return original(*args, **kwargs)
    call = _plan_call(a)
    if call is None:
        return original(*args, **kwargs)
    return _run_fused(original, a, call)


class _Binder:
    """``inspect.Signature.bind`` + ``apply_defaults`` for one function, at the cost of a dict
    merge for the calls SGLang makes (``self`` positional, the rest by keyword): the hook runs
    on every indexer call, also the ones it hands back to SGLang, so binding must cost little."""

    def __init__(self, fn):
        self.signature = inspect.signature(fn)
        params = self.signature.parameters.values()
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY) for p in params):
            self.names = None  # nothing to shortcut: every call binds in full
            return
        self.names = tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
        self.keywords = frozenset(p.name for p in params)
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def __call__(self, args, kwargs) -> Optional[dict]:
        """The call's arguments by name, defaults filled in; ``None`` where they do not bind."""
        names = self.names
        if names is not None and len(args) <= len(names):
            given = names[: len(args)]
            if kwargs.keys() <= self.keywords and not any(n in kwargs for n in given):
                a = dict(self.defaults)
                a.update(zip(given, args))
                a.update(kwargs)
                if len(a) == len(self.keywords):  # every parameter without a default was given
                    return a
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        return dict(bound.arguments)


def _arguments(original, args, kwargs) -> Optional[dict]:
    binder = _BINDERS.get(original)
    if binder is None:
        binder = _BINDERS[original] = _Binder(original)
    return binder(args, kwargs)


_BINDERS: dict = {}


def _plan_call(a) -> Optional[_Call]:
    """A :class:`_Call` when this call is covered and the policy routes it to one of our
    kernels; None means: SGLang's path.

    Reads only metadata SGLang has already built, so declining costs a few attribute reads.
    """
    ix = _STATE.indexer_module
    backend_self, c4_indexer, forward_batch = a["self"], a["c4_indexer"], a["forward_batch"]
    mode = forward_batch.forward_mode
    if ix is None or _STATE.disabled is not None or mode.is_idle():  # SGLang returns at once on an idle batch, however it is passed
        return None
    if getattr(backend_self, "debug_use_external_c4_sparse_indices", False):
        return None
    if getattr(backend_self, "hisparse_coordinator", None) is not None:
        return None
    metadata = getattr(backend_self, "forward_metadata", None)
    indexer_metadata = getattr(metadata, "indexer_metadata", None)
    core = getattr(metadata, "core_metadata", None)
    if not isinstance(indexer_metadata, ix.PagedIndexerMetadata) or core is None:
        return None
    if getattr(indexer_metadata, "compress_ratio", 4) != 4 or indexer_metadata.compressed_page_size != PAGE_SIZE:
        return None

    fp4 = bool(c4_indexer.use_fp4_indexer)
    layout = _covered_layout(fp4, ix.is_hip())
    aiter = layout == "aiter_mxfp4"
    if layout is None or (not aiter and ix.is_xpu()):
        return None  # HIP FP8 may read a preshuffled cache, XPU has its own kernel
    if fp4 and not aiter and ix.envs.SGLANG_OPT_USE_TILELANG_INDEXER.get():
        return None  # SGLang raises for this combination; keep its error
    page_indices = core.c4_sparse_page_indices
    if page_indices is None or page_indices.dim() != 2 or page_indices.shape[1] not in SUPPORTED_TOPK:
        return None

    # SGLang scores an AITER target-verify as decode rows when it built a row-group decode workspace.
    scored_as_decode = aiter and mode.is_target_verify() and isinstance(
        getattr(metadata, "fp4_decode_workspace", None), ix.FP4RowgroupDecodeWorkspace
    )
    backend = _route(
        layout=layout, topk=page_indices.shape[1], forward_mode=mode, scored_as_decode=scored_as_decode,
        prefill_graph=bool(getattr(indexer_metadata, "use_prefill_cuda_graph", False)),
        rows=indexer_metadata.page_table.shape[0], c4_len=indexer_metadata.page_table.shape[1] * PAGE_SIZE,
    )
    if backend is None:
        return None

    pool = backend_self.token_to_kv_pool
    layer_id = c4_indexer.layer_id
    if aiter:
        payload = pool.get_index_k_fp4_payload_buffer(layer_id)
        scale = pool.get_index_k_fp4_scale_buffer(layer_id)
        if tuple(payload.shape[1:]) != (1, 4, PAGE_SIZE, 16) or tuple(scale.shape[1:]) != (1, 4, PAGE_SIZE):
            return None
        k_cache, k_scale = payload.view(torch.uint8), scale.view(torch.uint8)
    else:
        cache = pool.get_index_k_with_scale_buffer(layer_id=layer_id)
        slot = SGLANG_MXFP4_SLOT_BYTES if fp4 else SGLANG_FP8_SLOT_BYTES
        if cache.dim() != 2 or cache.shape[1] != PAGE_SIZE * slot:
            return None
        if _nonpaged_applies(a, indexer_metadata):
            return None  # SGLang's non-paged indexer is not one of the covered branches
        k_cache, k_scale = cache.view(torch.uint8), None
    return _Call(layout, backend, aiter, fp4, k_cache, k_scale)


def _nonpaged_applies(a, indexer_metadata) -> bool:
    """Whether SGLang would take its non-paged indexer here (it caches the plan it builds)."""
    backend_self = a["self"]
    rows = _num_queries(a, positions=backend_self.forward_metadata.core_metadata.positions)
    page_table = _match_rows(indexer_metadata.page_table, rows, 0)
    c4_seq_lens = _match_rows(indexer_metadata.compressed_seq_lens, rows, 1)
    plan = backend_self._get_nonpaged_indexer_plan(
        c4_indexer=a["c4_indexer"], forward_batch=a["forward_batch"], indexer_metadata=indexer_metadata,
        page_table=page_table, c4_seq_lens=c4_seq_lens, query_rows=rows,
    )
    return plan is not None


def _num_queries(a, *, positions) -> int:
    return min(a["x"].shape[0], a["q_lora"].shape[0], positions.shape[0])


def _match_rows(tensor: torch.Tensor, rows: int, value: int) -> torch.Tensor:
    """SGLang's ``match_num_queries``: truncate, or pad the leading dim with ``value``."""
    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        return tensor[:rows]
    pad = (0, 0) * (tensor.dim() - 1) + (0, rows - tensor.shape[0])
    return torch.nn.functional.pad(tensor, pad, value=value)


def _prepare(a, call: _Call):
    """SGLang's own query/weights preparation and index-K compression, as the original runs them."""
    backend_self, forward_batch = a["self"], a["forward_batch"]
    metadata = backend_self.forward_metadata
    positions = metadata.core_metadata.positions
    if call.aiter:
        widened = getattr(metadata, "fp4_q_positions", None)
        if widened is not None and widened.shape == positions.shape:
            positions = widened
    x, q_lora, q_lora_quant = a["x"], a["q_lora"], a["q_lora_quant"]
    rows = _num_queries(a, positions=positions)
    if x.shape[0] != rows:
        x = x[:rows]
    if q_lora.shape[0] != rows:
        q_lora = q_lora[:rows]
        q_lora_quant = None
    if positions.shape[0] != rows:
        positions = positions[:rows]
    if a["enable_multi_stream"]:
        return backend_self._forward_prepare_multi_stream(
            x=x, q_lora=q_lora, c4_indexer=a["c4_indexer"], positions=positions,
            forward_batch=forward_batch, alt_streams=a["alt_streams"], q_lora_ready=a["q_lora_ready"],
        )
    assert a["q_lora_ready"] is None
    return backend_self._forward_prepare_normal(
        x=x, q_lora=q_lora, c4_indexer=a["c4_indexer"], positions=positions, forward_batch=forward_batch,
        skip_compressor=a["skip_compressor"], q_lora_quant=q_lora_quant,
    )


def _operator_inputs(a, call: _Call, q_indexer, weights):
    """Map SGLang's prepared tensors and pools onto the operator's layout (see ``contract.Layout``).

    HIP FP4 passes raw bf16 weights and ``c4_indexer.weight_scale`` (as SGLang hands them to
    AITER); the CUDA query kernels already folded ``weight_scale`` (and FP8's query scale)
    into fp32 weights, so the scalar there is 1.
    """
    if call.aiter:
        q_fp4, q_scale = q_indexer
        return (q_fp4.view(torch.uint8), q_scale.view(torch.uint8), call.k_cache, call.k_scale,
                weights.contiguous(), float(a["c4_indexer"].weight_scale))
    weights = weights.squeeze(2).float()
    if call.fp4:
        q_fp4, q_sf = q_indexer
        return q_fp4.view(torch.uint8), q_sf, call.k_cache, None, weights, 1.0
    return q_indexer, None, call.k_cache, None, weights, 1.0


def _rows_per_request(forward_batch, rows: int) -> Optional[int]:
    """Rows per request of a decode step (each request's rows share its page-table row, so the
    fused backend tiles one request per work item: one row without draft rows); ``None`` in the
    other modes, where requests hold different numbers of rows."""
    mode = getattr(forward_batch, "forward_mode", None)
    batch = getattr(forward_batch, "batch_size", None)
    if mode is None or not mode.is_decode() or not isinstance(batch, int) or batch < 1 or rows % batch:
        return None
    return rows // batch


def _exact_out(t: Optional[torch.Tensor], shape, dtype) -> Optional[torch.Tensor]:
    if t is not None and tuple(t.shape) == tuple(shape) and t.dtype == dtype and t.is_contiguous():
        return t
    return None


def _run_fused(original, a, call: _Call):
    ix = _STATE.indexer_module
    backend_self, c4_indexer = a["self"], a["c4_indexer"]
    metadata = backend_self.forward_metadata
    indexer_metadata, core = metadata.indexer_metadata, metadata.core_metadata

    q_indexer, weights = _prepare(a, call)
    q, q_scale, k_cache, k_scale, weights, weight_scale = _operator_inputs(a, call, q_indexer, weights)
    rows = q.shape[0]
    # Padded rows score nothing on the AITER path and one position on the CUDA path, as in SGLang.
    c4_seq_lens = _match_rows(indexer_metadata.compressed_seq_lens, rows, 0 if call.aiter else 1)
    page_table = _match_rows(indexer_metadata.page_table, rows, 0)
    page_indices = _match_rows(core.c4_sparse_page_indices, rows, -1)
    topk = page_indices.shape[1]

    capturer = ix.get_global_indexer_capturer()
    raw_indices = core.c4_sparse_raw_indices
    if raw_indices is None and capturer is not None:
        raw_indices = torch.empty_like(page_indices)
    raw_rows = raw_indices[:rows] if raw_indices is not None else None

    device = q.device
    phys_out = _exact_out(page_indices, (rows, topk), torch.int32)
    raw_out = _exact_out(raw_rows, (rows, topk), torch.int32)
    out = IndexerTopKResult(
        torch.empty((rows, topk), dtype=torch.float32, device=device),
        raw_out if raw_out is not None else torch.empty((rows, topk), dtype=torch.int32, device=device),
        phys_out if phys_out is not None else torch.empty((rows, topk), dtype=torch.int32, device=device),
        torch.empty((rows,), dtype=torch.int32, device=device),
    )
    try:
        # AITER's kernel keeps its own workspace (SGLang's); ours take the plugin's
        workspace = (None if call.backend == "aiter"
                     else _STATE.workspaces.get(rows, topk, call.layout, device))
        rows_per_request = _rows_per_request(a["forward_batch"], rows)
        _api.indexer_topk(
            q, q_scale, k_cache, k_scale, weights,
            page_table.to(torch.int32).contiguous(), c4_seq_lens.reshape(-1).to(torch.int32).contiguous(),
            topk=topk, layout=call.layout, weight_scale=weight_scale, backend=call.backend,
            out=out, workspace=workspace, check_values=False, rows_per_request=rows_per_request,
            order=serving_order(call.layout, call.backend, rows, page_table.shape[1] * PAGE_SIZE, device,
                                decode=rows_per_request is not None),
        )
    except Exception as exc:
        return _demote_and_rerun(original, a, call, exc)
    if phys_out is None:
        page_indices.copy_(out.physical_indices)
    if raw_rows is not None and raw_out is None:
        raw_rows.copy_(out.raw_indices)
    if not _STATE.served_first_call:
        _STATE.served_first_call = True
        logger.info(SERVING_LOG, call.backend, call.layout, topk, rows)
    if capturer is not None:
        compress_layer_id = backend_self.token_to_kv_pool.layer_mapping[c4_indexer.layer_id].compress_layer_id
        capturer.capture(compress_layer_id, raw_indices)
    return None


def _demote_and_rerun(original, a, call: _Call, exc: Exception):
    """Our operator failed after SGLang's preparation ran: turn the fused route off for this
    process and score this call on SGLang's path. The index-K compression already ran, so the
    original is asked to skip it (and run single-stream, which recomputes only the query)."""
    _STATE.disabled = f"{call.backend} backend failed ({type(exc).__name__}: {exc})"
    logger.exception(
        "indexer_topk: %s; SGLang's DSv4 indexer path serves the rest of this process", _STATE.disabled
    )
    kwargs = {k: v for k, v in a.items() if k != "self"}
    kwargs.update(skip_compressor=True, enable_multi_stream=False, q_lora_ready=None)
    return original(a["self"], **kwargs)


__all__ = ["load", "probe_sglang", "TARGET_SGLANG_VERSION"]
