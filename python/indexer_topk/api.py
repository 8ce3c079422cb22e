"""The public entry point: validate once, then hand the call to one backend."""

from __future__ import annotations

import math
from typing import Optional

import torch

from .backends import require_runnable
from .calls import KnownCall, KnownCalls, current_device_index, disjoint, make_guard, raw_stream, signature
from .contract import (
    PAGE_SIZE, IndexerInputs, IndexerTopKResult, _allocate_result, _check_values, allocate_result, validate_inputs,
)
from .envs import envs
from .errors import BackendUnavailable
from .replay import Recorder
from .routes.modes import is_capturing

BACKENDS = ("auto", "reference", "legacy", "fused", "aiter")


def _run_reference(inputs: IndexerInputs, *, out=None, workspace=None) -> IndexerTopKResult:
    """The reference needs no scratch: a validated ``workspace`` is accepted and left untouched."""
    from .reference import reference_indexer_topk

    res = reference_indexer_topk(*inputs.tensors, topk=inputs.topk, layout=inputs.layout,
                                 weight_scale=inputs.weight_scale, order=inputs.order)
    if out is None:
        return res
    # as the kernels write: an output that requires grad is written, not traced, and one made
    # under inference mode is written (outside it torch refuses in-place updates to it)
    inference = any(t.is_inference() for t in out)
    with torch.inference_mode() if inference else torch.no_grad():
        for dst, src in zip(out, res):
            dst.copy_(src)
    return out


def check_backend(name) -> str:
    """``name`` if it is one of :data:`BACKENDS`; ``ValueError`` naming ``backend`` otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"backend: unknown backend {name!r}; expected one of {BACKENDS}")
    return name


def check_rows_per_request(rows_per_request) -> None:
    """``ValueError`` naming ``rows_per_request`` unless it is a positive int (or ``None``)."""
    if rows_per_request is not None and (
        isinstance(rows_per_request, bool) or not isinstance(rows_per_request, int) or rows_per_request < 1
    ):
        raise ValueError(f"rows_per_request: expected a positive int or None, got {rows_per_request!r}")


def _backend_fn(name: str):
    if name == "reference":
        return _run_reference
    if name == "legacy":
        from .backends.legacy import legacy_indexer_topk

        return legacy_indexer_topk
    if name == "fused":
        from .backends.fused import fused_indexer_topk

        return fused_indexer_topk
    if name == "aiter":
        from .backends.aiter import aiter_indexer_topk

        return aiter_indexer_topk
    raise ValueError(f"backend: unknown backend {name!r}; expected one of {BACKENDS}")


def resolve_backend(backend: str, *, layout=None, topk=None, is_decode: bool = False, rows=None,
                    c4_len=None) -> str:
    """The concrete backend ``auto`` stands for in this call (see :mod:`indexer_topk.policy`).

    ``auto`` asks the process's frozen policy: a lookup of the call's layout, ``topk``, mode
    (``is_decode``; graph capture is detected), ``rows`` and ``c4_len`` (its page table's C4
    positions) in the measured routes table, or the proven rule where the table has no entry.
    """
    if backend != "auto":
        return check_backend(backend)
    return _default_policy().route(layout=layout, topk=topk, is_decode=is_decode, rows=rows, c4_len=c4_len)


def _default_policy():
    """The process's :func:`indexer_topk.policy.default_policy` (its module imported once: an
    import statement per call costs more than the lookup)."""
    global _policy_module
    if _policy_module is None:
        from . import policy

        _policy_module = policy
    return _policy_module.default_policy()


_policy_module = None


def indexer_topk(
    q: torch.Tensor,
    q_scale: Optional[torch.Tensor],
    k_cache: torch.Tensor,
    k_scale: Optional[torch.Tensor],
    weights: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    topk: int,
    layout: str,
    weight_scale: float = 1.0,
    backend: str = "auto",
    out: Optional[IndexerTopKResult] = None,
    workspace: Optional[torch.Tensor] = None,
    check_values: bool = True,
    rows_per_request: Optional[int] = None,
    order: str = "score",
) -> IndexerTopKResult:
    r"""Exact top-``k`` of DeepSeek-V4's C4 indexer scores over a paged index-K cache.

    For each query row ``r`` and C4 position ``j < seq_lens[r]``::

        score[r, j] = weight_scale * sum_h weights[r, h] * relu(q[r, h, :] . k[j, :])
        score[r, j] *= k_scale[j]          # sglang_fp8: the key's fp32 scale

    with the dot taken over dequantised values, and selects the ``topk`` best positions:
    higher score first, equal scores broken by the lower position, NaN below every number,
    ``+0`` above ``-0``.

    Parameters
    ----------
    q, q_scale, k_cache, k_scale, weights
        The quantised query, its scales, the paged C4 index-K cache, its scales and the per-head
        weights ``[rows, 64]``, in one of the layouts of :class:`indexer_topk.Layout` (``q_scale``
        / ``k_scale`` are ``None`` where the layout keeps scales elsewhere).
    page_table : torch.Tensor
        int32 ``[rows, max_pages]``; page ``p`` of row ``r`` holds C4 positions
        ``64 * p .. 64 * p + 63``.
    seq_lens : torch.Tensor
        int32 ``[rows]``, each row's causal C4 length.
    topk : int
        512 (V4-Flash), 1024 (V4-Pro) or 2048.
    layout : str
        ``"aiter_mxfp4"``, ``"sglang_mxfp4"`` or ``"sglang_fp8"``.
    weight_scale : float
        Scalar applied to every score (DeepSeek-V4: ``128 ** -0.5 * 64 ** -0.5``), taken as the
        nearest fp32 by every backend (the kernels multiply in fp32). A value fp32 cannot carry
        (beyond its range, infinite, NaN, non-zero below its smallest normal) is refused.
    backend : str
        ``"auto"`` (the process's frozen path policy), ``"reference"``, ``"legacy"``, ``"fused"``
        or ``"aiter"``.
    out : IndexerTopKResult, optional
        Preallocated outputs, written in place and returned.
    workspace : torch.Tensor, optional
        Caller-owned uint8 scratch (contiguous, 16-byte aligned, sharing no byte with an input
        or an output) of at least :func:`indexer_topk.workspace_size` bytes, so the fused call
        allocates nothing (``backend="auto"`` refuses a smaller one on every route, as the
        fused path would). Every backend accepts it: legacy uses it as its score matrix only
        when it holds the rows its logits budget allows at once, the reference never touches
        it. The aiter backend also takes AITER's own workspace tuple, which the other backends
        ignore.
    check_values : bool
        Also validate tensor contents (``seq_lens`` against the page table, page ids against the
        cache). Needs a device sync: turn it off under graph capture and in decode. Off, inputs
        that break those checks give unspecified outputs and may make the kernels read outside
        ``page_table`` and ``k_cache``, but no kernel writes outside ``out`` and ``workspace``.
    rows_per_request : int, optional
        How many consecutive rows share one page-table row: ``1`` for a decode step (each row a
        request of its own), the draft length for a decode step with MTP rows, ``None`` when
        unknown (prefill). A hint for the tiling of the fused and legacy backends (rows that
        share pages share each key tile; rows that do not are scored one at a time, and ``1``
        scores each row in a tile of its own); results never depend on it.
    order : str
        How each row's selection is laid out: ``"score"`` (below) or ``"position"``, the same
        entries in ascending positions in every row. SGLang's sparse attention reads the
        selection as a set (its own CUDA top-k returns it unordered): ``"position"`` spares the
        sort of each row where the selection is made in position order (the legacy backend's
        row select, the fused backend's merge of split rows; its one-split finish sorts by
        position in place of score). Legacy's split select (few rows) sorts best first, then lays
        rows out in a further pass (:func:`indexer_topk.orders.serving_order` asks for positions
        only where they cost nothing more).

    Values must keep the kernels' fp32 intermediates in range: for each row with positions to
    score, ``max(D, sum_h |weights[r, h]| * D * max(1, K)) <= 2**127``, where ``D`` is the
    largest ``|q . k|`` the layout's stored values allow (sglang_fp8: ``128 * 448**2``; MXFP4:
    ``128 * 36 * 2**(eq - 127) * 2**(ek - 127)`` from the row's largest query block exponent and
    the largest key block exponent of the pages the call uses) and ``K`` the largest sglang_fp8
    key scale of those pages (1 for MXFP4), non-finite values left out and ``weight_scale`` not
    counted; beyond it the kernels may return ``inf`` where the exact score is finite, so
    ``check_values=True`` (and the reference backend, always) refuses such inputs with
    ``ValueError``.

    Host path: the first call of a signature (shapes, dtypes, strides, devices, 16-byte
    alignment, scalar arguments) is validated in full, planned and, on the legacy and fused
    backends, recorded; later calls of that signature (the other layers of a forward pass)
    check what depends on addresses and values and replay the recorded launches
    (:mod:`indexer_topk.replay`; ``INDEXER_TOPK_REPLAY=0`` turns this off).

    Returns
    -------
    IndexerTopKResult
        ``values`` float32, ``raw_indices`` / ``physical_indices`` int32, all ``[rows, topk]``,
        best first and padded with ``-inf`` / ``-1`` past ``counts = min(seq_lens, topk)``. A
        row with ``seq_len <= topk`` returns positions ``0 .. seq_len - 1`` in ascending order
        with their scores, as every row does with ``order="position"``. NaN scores are returned
        as the canonical quiet NaN.

    Raises
    ------
    ValueError
        Naming the offending argument, before any kernel runs.
    indexer_topk.errors.BackendUnavailable
        The chosen backend cannot run here (no Triton; a CPU without the Triton interpreter;
        AITER missing, on another GPU, or asked for a layout or ``topk`` it lacks), before
        anything runs.
    """
    if rows_per_request is not None:
        check_rows_per_request(rows_per_request)
    outs = tuple(out) if isinstance(out, tuple) and len(out) == 4 else (None,) * 4
    topk_key, scale_key = _as_read(topk), _as_read(weight_scale)
    # -0.0 equals 0.0 (and hashes alike) but ranks scores the other way round: its sign is keyed too
    negative_zero = type(scale_key) is float and scale_key == 0.0 and math.copysign(1.0, scale_key) < 0
    device_index = current_device_index()
    scalars = (type(topk), topk_key, type(layout), layout, type(weight_scale), scale_key, negative_zero, type(backend),
               backend, type(check_values), check_values, rows_per_request, out is None, device_index, type(order),
               order)
    tensors = (q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *outs, workspace)
    # the signature of the call before, checked by its guard, else the key built and looked up;
    # with replays off, neither (nothing is remembered)
    key = known = ptrs = None
    if envs.INDEXER_TOPK_REPLAY.get():
        known, ptrs = _KNOWN.guarded(tensors, scalars)
        if known is None:
            key, ptrs = signature(tensors, scalars, _OFFSET_KEYED)
            if topk_key is _UNREAD or scale_key is _UNREAD:
                key = None
            known = _KNOWN.get(key) if key is not None else None
    if known is None or not disjoint(ptrs, known.lengths, known.sized):
        # a call whose tensors overlap takes the full path and leaves the signature's record
        # alone: its launches, recorded, would name one buffer for two arguments
        return _first_call(key if known is None else None, tensors, ptrs, q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk, layout=layout,
                           weight_scale=weight_scale, backend=backend, out=out, workspace=workspace,
                           check_values=check_values, rows_per_request=rows_per_request, order=order)
    # a signature validated before: only what depends on addresses and values is checked again
    if check_values and known.rows > 0:
        _check_values(known.inputs(tensors, topk))
    fresh_out = None
    if out is None:
        out = fresh_out = _allocate_result(known.rows, topk, known.device)  # both checked by the signature's first call
    elif not isinstance(out, IndexerTopKResult):
        out = IndexerTopKResult(*out)
    name = _known_route(known, backend, topk)
    replay = known.replays.get(name, _UNSEEN)
    if replay is not None and replay is not _UNSEEN and replay.matches_env():
        if fresh_out is None:  # the caller's outputs, whose addresses the signature read
            replay.run(tensors, ptrs, raw_stream(known.device, device_index))
        else:
            replay.run((*tensors[:7], *out, workspace), (*ptrs[:7], *(t.data_ptr() for t in out), ptrs[11]),
                       raw_stream(known.device, device_index))
        return out
    return _run(known, name, known.inputs(tensors, topk), out, workspace, rows_per_request)


def _as_read(x):
    """``x`` as a signature keys it: a subclass of ``int`` or ``float`` (numpy's float64, an
    ``IntEnum``) as the plain number validation reads from it, so that its own ``==`` and hash
    cannot make two different values one key; ``_UNREAD`` where that number cannot be read
    (the call then takes the full path, which says why)."""
    t = type(x)
    if t is int or t is float or t is bool or not isinstance(x, (int, float)):
        return x
    try:
        return float(x) if isinstance(x, float) else int(x)
    except Exception:  # noqa: BLE001 - validation gives the error
        return _UNREAD


_UNREAD = object()


def _known_route(known: KnownCall, backend: str, topk: int) -> str:
    """:func:`resolve_backend` for a call of a known signature: ``auto``'s answer is kept per
    signature, capturing or not, while the process's policy stays the one that gave it."""
    if backend != "auto":
        return resolve_backend(backend)
    policy = _default_policy()
    capturing = is_capturing()
    hit = known.routes.get(capturing)
    if hit is None or hit[0] is not policy:
        hit = known.routes[capturing] = (policy, policy.route(layout=known.layout, topk=topk, capturing=capturing,
                                                              rows=known.rows, c4_len=known.c4_len))
    return hit[1]


_KNOWN = KnownCalls()
_UNSEEN = object()
# the signature's tensors whose storage offset validation checks (the key cache, the workspace)
_OFFSET_KEYED = (2, 11)
# Our Triton backends: their host work is planning and launches, which a replay repeats.
_REPLAYABLE = ("legacy", "fused")


def _first_call(key, tensors, ptrs, q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *, topk, layout,
                weight_scale, backend, out, workspace, check_values, rows_per_request, order) -> IndexerTopKResult:
    """The full path: validate everything, route and run; with a ``key``, remember the
    signature and record the launches for the calls that follow (``ptrs``: the tensors'
    addresses)."""
    inputs, out = validate_inputs(
        q, q_scale, k_cache, k_scale, weights, page_table, seq_lens,
        topk=topk, layout=layout, weight_scale=weight_scale, out=out, workspace=workspace, check_values=check_values,
        order=order,
    )
    lengths = [t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0 for t in tensors]
    if key is not None and not disjoint(ptrs, lengths):
        # inputs that share bytes (validation allows it) would be recorded as one buffer and
        # leave the signature unreplayable for the disjoint calls after: not remembered
        key = None
    known = KnownCall(inputs.layout, inputs.weight_scale, inputs.rows, inputs.page_table.shape[1] * PAGE_SIZE,
                      inputs.device, lengths, inputs.order)
    if out is None:
        out = allocate_result(inputs.rows, inputs.topk, inputs.device)
    if backend == "auto" and isinstance(workspace, torch.Tensor):
        _check_auto_workspace(workspace, inputs)
    remember = key is not None and isinstance(workspace, (torch.Tensor, type(None)))  # a key only while replaying
    if remember:
        known.guard = make_guard(tensors, key[0], ptrs, _OFFSET_KEYED)
        _KNOWN.add(key, known)
    name = resolve_backend(backend, layout=known.layout, topk=topk, rows=known.rows, c4_len=known.c4_len)
    if name != "aiter" and workspace is not None and not isinstance(workspace, torch.Tensor):
        workspace = None  # AITER's own workspace, on a call the policy sent elsewhere: of no use there
    # nothing replays the launches of a call whose signature is not remembered: not recorded
    return _run(known, name, inputs, out, workspace, rows_per_request, record=remember)


def _check_auto_workspace(workspace: torch.Tensor, inputs: IndexerInputs) -> None:
    """``auto`` may send a call of these shapes to the fused path, which needs
    :func:`workspace_size` bytes: a smaller workspace is refused whichever route this call
    takes, so that it does not pass on the shapes the policy leaves to legacy and fail on the
    first it sends to the fused path."""
    if _default_policy().fused_backend != "fused":  # the kill switch, AITER's path, or nothing of ours
        return
    try:
        require_runnable("fused", inputs.device)
        need = workspace_size(inputs.rows, inputs.topk, inputs.layout.value, inputs.device)
    except BackendUnavailable:  # no fused path here for the policy to choose
        return
    have = workspace.numel()
    if have < need:
        raise ValueError(
            f"workspace: {have} bytes, less than workspace_size({inputs.rows}, {inputs.topk}, "
            f"{inputs.layout.value!r}) = {need}; backend 'auto' may send calls of this shape to the fused path"
        )


def _run(known: KnownCall, name: str, inputs: IndexerInputs, out: IndexerTopKResult, workspace,
         rows_per_request, record: bool = True) -> IndexerTopKResult:
    """Run backend ``name``; with ``record``, our Triton backends' launches are recorded for the
    calls that follow."""
    require_runnable(name, inputs.device)
    fn = _backend_fn(name)
    kwargs = {"rows_per_request": rows_per_request} if name in ("fused", "legacy") else {}
    if (not record or name not in _REPLAYABLE or not isinstance(workspace, (torch.Tensor, type(None)))
            or known.replays.get(name, _UNSEEN) is None):  # not replayable, or recorded before as not
        known.replays[name] = None
        return fn(inputs, out=out, workspace=workspace, **kwargs)
    recorder = Recorder((*inputs.tensors, *out, workspace))
    with recorder:
        recorder.driver_launches = envs.INDEXER_TOPK_DRIVER_LAUNCH.get()  # read inside: a replay checks it
        fn(inputs, out=out, workspace=workspace, **kwargs)
    known.replays[name] = recorder.replay()
    return out


def workspace_size(rows: int, topk: int, layout: str, device=None) -> int:
    """Bytes of scratch that serve every fused call of at most ``rows`` rows with this ``topk``
    and ``layout`` on ``device``, independent of the context length: an engine reserves one
    workspace for its largest batch and passes it to every call.

    ``rows`` a non-negative int, ``topk`` one of :data:`indexer_topk.SUPPORTED_TOPK`, ``layout``
    one of :class:`indexer_topk.Layout`: anything else is a ``ValueError`` naming the argument,
    before Triton is looked for (:class:`~indexer_topk.errors.BackendUnavailable` where it is
    missing)."""
    from .contract import check_topk, parse_layout

    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows: expected a non-negative int, got {rows!r}")
    check_topk(topk)
    layout = parse_layout(layout)
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device: expected a torch device such as 'cuda:0' or 'cpu', got {device!r}") from None
    require_runnable("fused")
    from .backends.fused import fused_workspace_size

    return fused_workspace_size(rows, topk, layout, device=device)


__all__ = ["indexer_topk", "workspace_size", "allocate_result", "BACKENDS", "resolve_backend"]
