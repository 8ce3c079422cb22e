"""What the public entry point remembers between calls: validated signatures and their replays.

A serving engine calls the operator once per layer with the same shapes: 61 calls of one
batch differ only in where their tensors are (each layer has its own cache, queries and
weights). Validation, routing and the backend's host work depend on the shapes, not on the
addresses, so the first call of a *signature* pays for them and the others skip them:

- :func:`signature` reads the metadata every check depends on (type, dtype, shape, strides,
  device and the address modulo 16 of each tensor; the scalar arguments and their types)
  into a hashable key. Building it costs a few attribute reads per tensor.
- A :class:`KnownCall` holds what full validation established for that key: the parsed
  layout, the rows, the C4 positions of the page table, and per backend the
  :class:`~indexer_topk.replay.Replay` of its recorded launches (or ``None`` where the backend's
  host work is not a replayable sequence of launches).
- The call found last is checked first by its :class:`SignatureGuard` (the same key's checks,
  made by torch's C++ tensor guards without building the key): the layers of a forward pass
  call one signature back to back. A call it refuses builds its key.
- A later call of the key still checks what depends on addresses (that no two of its tensors
  share a byte: :func:`disjoint`), routes (the policy may answer differently during graph
  capture), runs the value checks when asked, and then replays.

Anything unusual (a tensor subclass, an unhashable argument, tensors that overlap) takes the
full path, which gives the precise error or the correct result.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import compress
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .contract import ORDER_SCORE, IndexerInputs

# Signatures remembered at once: an engine's forward reuses one per batch shape, so a few
# dozen cover prefill and decode with room to spare; the oldest is forgotten first.
MAX_KNOWN = 64

_TENSOR = torch.Tensor

try:  # torch's own tensor guards, in C++: what torch.compile checks a compiled graph's inputs with
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:  # noqa: BLE001 - a torch without them: every call builds its key in Python
    _TensorGuards = None


class KnownCall:
    """What full validation established for one call signature (see the module docstring)."""

    __slots__ = ("layout", "scale", "rows", "c4_len", "device", "lengths", "sized", "replays", "routes", "guard",
                 "order")

    def __init__(self, layout, scale: float, rows: int, c4_len: int, device: torch.device, lengths: Sequence[int],
                 order: str = ORDER_SCORE):
        self.layout = layout
        self.order = order  # how rows are laid out (the signature keys it)
        self.scale = scale  # weight_scale as the fp32 value the kernels multiply by
        self.rows = rows
        self.c4_len = c4_len
        self.device = device
        self.lengths = tuple(lengths)  # bytes of each tensor of the signature, for :func:`disjoint`
        self.sized = tuple(i for i, n in enumerate(self.lengths) if n)  # the tensors that hold a byte
        # backend name -> Replay, or None when its calls cannot be replayed
        self.replays: Dict[str, object] = {}
        # capturing or not -> (the policy asked, the backend ``auto`` stood for): the policy is
        # frozen, the call's shape fixed by the signature, so only a capture changes the answer
        self.routes: Dict[bool, tuple] = {}
        self.guard: Optional[SignatureGuard] = None  # set where the signature is remembered

    def inputs(self, tensors: Sequence, topk: int) -> IndexerInputs:
        """The backends' :class:`~indexer_topk.contract.IndexerInputs` of a call of this signature
        (``tensors``: its seven input tensors first)."""
        return IndexerInputs(*tensors[:7], self.layout, topk, self.scale, self.order)


def signature(tensors: Sequence, scalars: tuple,
              offsets: Sequence[int] = (2,)) -> Tuple[Optional[tuple], List[Optional[int]]]:
    """``(key, addresses)`` of a call's tensors (``None`` entries allowed); the key is ``None``
    when a tensor is not a plain ``torch.Tensor`` (subclasses take the full path).

    ``scalars``: the call's other arguments, each preceded by its type, so that ``1`` and
    ``True`` (equal as keys) are told apart the way validation tells them apart. Per tensor the
    key holds dtype, shape, strides, device, the address modulo 16 (Triton specialises kernels
    on 16-byte alignment; validation checks 4- and 16-byte alignment) and whether it is a
    negated view (``torch._neg_view``, the imaginary part of a conjugate), which validation
    refuses; for the tensors at ``offsets`` (the key cache, the workspace) also the storage
    offset modulo 16, which validation checks too.
    """
    parts: list = [scalars]
    ptrs: List[Optional[int]] = []
    for t in tensors:
        if t is None:
            parts.append(None)
            ptrs.append(None)
            continue
        if type(t) is not _TENSOR:
            return None, ptrs
        p = t.data_ptr()
        ptrs.append(p)
        parts.append((t.dtype, t.shape, t.stride(), t.device, p & 15, t.is_neg()))
    for i in offsets:
        if i < len(ptrs) and ptrs[i] is not None:
            parts.append(tensors[i].storage_offset() & 15)
    return tuple(parts), ptrs


class SignatureGuard:
    """A remembered signature, checked again without building its key.

    :func:`signature` reads five attributes of each of a call's dozen tensors in Python and
    hashes the result: several microseconds a call, most of what a replayed call's host path
    spends before its first launch. A guard holds what the key held and checks a later call
    against it directly: the scalars and each argument's exact type compared as tuples; dtype,
    shape, strides, device and dispatch keys (which carry negated and conjugate views) of the
    tensors by torch's ``TensorGuards`` in one C++ call (every size and stride given, so none is
    left unchecked; requires-grad is checked too, which the key does not hold: such a call
    merely takes the key's path); the addresses modulo 16 and the keyed storage offsets as the
    key holds them. A call it accepts has the signature's key; one it refuses may still have it
    (the caller then builds the key). Where torch has no ``TensorGuards``, or they refuse these
    tensors, :func:`make_guard` gives ``None`` and calls build their keys. The dispatch keys are
    compared as the thread's settings leave them: while a thread excludes the negated or
    conjugate views' keys (torch's private dispatch guards), such a view would look plain, so
    the guard refuses every call and the key, which reads the views' bits, decides.
    """

    __slots__ = ("scalars", "types", "present", "tensors", "aligns", "offsets")

    def __init__(self, tensors: Sequence, scalars: tuple, ptrs: Sequence[Optional[int]], offsets: Sequence[int]):
        present = [t is not None for t in tensors]
        live = list(compress(tensors, present))
        self.scalars = scalars
        self.types = tuple(map(type, tensors))
        self.present = tuple(present)
        self.tensors = _TensorGuards(*live, dynamic_dims_sizes=[list(t.shape) for t in live],
                                     dynamic_dims_strides=[list(t.stride()) for t in live])
        self.aligns = [p & 15 for p in compress(ptrs, present)]
        self.offsets = tuple((i, tensors[i].storage_offset() & 15) for i in offsets
                             if i < len(tensors) and tensors[i] is not None)

    def addresses(self, tensors: Sequence, scalars: tuple) -> Optional[List[Optional[int]]]:
        """The tensors' addresses (``None`` for no tensor) if ``tensors`` and ``scalars`` have
        this guard's signature, else ``None``."""
        if scalars != self.scalars or tuple(map(type, tensors)) != self.types or _views_unkeyed():
            return None
        if not self.tensors.check(*compress(tensors, self.present)):
            return None
        ptrs = [None if t is None else t.data_ptr() for t in tensors]
        if [p & 15 for p in compress(ptrs, self.present)] != self.aligns:
            return None
        for i, offset in self.offsets:
            if tensors[i].storage_offset() & 15 != offset:
                return None
        return ptrs


_NEGATIVE = _CONJUGATE = None
if hasattr(torch._C, "_dispatch_tls_is_dispatch_key_excluded"):
    _NEGATIVE, _CONJUGATE = torch._C.DispatchKey.Negative, torch._C.DispatchKey.Conjugate


def _views_unkeyed() -> bool:
    """Whether this thread excludes the dispatch key of negated or of conjugate views (or torch
    cannot say): a guard's dispatch keys would not tell such a view from a plain tensor."""
    if _NEGATIVE is None:
        return True
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    return excluded(_NEGATIVE) or excluded(_CONJUGATE)


def make_guard(tensors: Sequence, scalars: tuple, ptrs: Sequence[Optional[int]],
               offsets: Sequence[int] = (2,)) -> Optional[SignatureGuard]:
    """A :class:`SignatureGuard` of a call whose :func:`signature` was remembered (``ptrs`` its
    addresses, ``offsets`` as the key was built), or ``None`` where torch gives no guards."""
    if _TensorGuards is None:
        return None
    try:
        return SignatureGuard(tensors, scalars, ptrs, offsets)
    except Exception:  # noqa: BLE001 - guards refused (a torch whose TensorGuards differ): keys instead
        return None


def disjoint(ptrs: Sequence[Optional[int]], lens: Sequence[int], sized: Optional[Sequence[int]] = None) -> bool:
    """Whether no two of the tensors (addresses ``ptrs``, ``None`` for no tensor; ``lens`` bytes)
    share a byte (empty tensors share none). ``sized``: the indices of the tensors with bytes,
    where the caller knows them (:attr:`KnownCall.sized`).

    Validation allows inputs to overlap one another; such calls simply take the full path.
    """
    if sized is None:
        sized = [i for i, (p, n) in enumerate(zip(ptrs, lens)) if p is not None and n]
    end = -1
    # by start address, each must start at or past the end of the one before
    for i in sorted(sized, key=ptrs.__getitem__):
        start = ptrs[i]
        if start < end:
            return False
        end = start + lens[i]
    return True


class KnownCalls:
    """A bounded, thread-safe map from :func:`signature` keys to :class:`KnownCall`."""

    def __init__(self, limit: int = MAX_KNOWN):
        self.limit = limit
        self._calls: "OrderedDict[tuple, KnownCall]" = OrderedDict()
        self._lock = threading.Lock()
        # the call found last, checked first by its guard: the layers of a forward pass make one
        # signature's calls back to back (one attribute, so threads swap it whole)
        self.last: Optional[KnownCall] = None
        # bumped before each clear or eviction: a lookup that overlaps one does not set the last
        # call (it may be the one forgotten), without a lock on the lookup's path
        self._forgets = 0

    def get(self, key) -> Optional[KnownCall]:
        forgets = self._forgets
        try:
            call = self._calls.get(key)
        except TypeError:  # an unhashable argument: nothing to remember it by
            return None
        if call is not None and call.guard is not None:
            self.last = call
            if self._forgets != forgets:  # cleared or evicted since the lookup: not left as the last
                self.last = None
        return call

    def guarded(self, tensors: Sequence, scalars: tuple):
        """``(call, addresses)`` where the last call found has the signature of ``tensors`` and
        ``scalars`` by its guard (:class:`SignatureGuard`); ``(None, None)`` otherwise."""
        call = self.last
        if call is not None:
            ptrs = call.guard.addresses(tensors, scalars)
            if ptrs is not None:
                return call, ptrs
        return None, None

    def add(self, key, call: KnownCall) -> None:
        try:
            hash(key)
        except TypeError:
            return
        with self._lock:
            self._calls[key] = call
            if call.guard is not None:
                self.last = call
            while len(self._calls) > self.limit:
                self._forgets += 1
                _, gone = self._calls.popitem(last=False)
                if gone is self.last:
                    self.last = None

    def clear(self) -> None:
        with self._lock:
            self._forgets += 1
            self._calls.clear()
            self.last = None

    def __len__(self) -> int:
        return len(self._calls)


def current_device_index() -> int:
    """``torch.cuda.current_device()``, or ``-1`` before CUDA (or HIP) is initialised: read on
    every call, without the lazy-initialisation check of the public function."""
    return torch._C._cuda_getDevice() if torch.cuda.is_initialized() else -1


def raw_stream(device: torch.device, index: Optional[int] = None) -> int:
    """The current CUDA (or HIP) stream of the current device (``index``, where the caller read
    it), as the launcher takes it; 0 for a device of another type."""
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device() if index is None else index)


__all__ = ["KnownCall", "KnownCalls", "MAX_KNOWN", "SignatureGuard", "current_device_index", "disjoint", "make_guard",
           "raw_stream", "signature"]
