"""Workspaces an engine integration owns, so that its calls allocate no scratch of their own.

A call given a ``workspace`` of :func:`indexer_topk.workspace_size` bytes allocates nothing on
the fused path (and legacy takes it as its score matrix where that fits): no allocator call on
an eager prefill's host path, and under graph capture one fixed buffer instead of scratch in each
captured graph's pool. :class:`Workspaces` keeps one per (device, stream, capturing or not,
layout, ``topk``), sized for the most rows a call of that key has asked for, and hands it to
every call of the key.

Why per stream: calls on one stream run in order, so one buffer serves them all; two streams
(two overlapped micro-batches) could run calls at once, so each has its own (each thread its
own on the per-thread default stream, which is a different stream in every thread). Calls made
while a CUDA graph is captured get buffers apart from eager calls: a graph replays on whatever
stream is current when it is replayed, so an eager call on its capture stream could run beside
it. Graphs captured on one stream share a buffer, as graphs sharing a memory pool do, and like
them must not be replayed at once. A buffer outgrown by a larger call is replaced by one for at
least twice the rows, unless it already holds that many bytes (the scratch stops growing once
every program holds a tile of rows); a replaced buffer that a graph captured is kept for the
life of the object, since the graph replays its address.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import torch

from .api import workspace_size
from .routes.modes import is_capturing


_PER_THREAD_STREAM = 2  # cudaStreamPerThread (hipStreamPerThread): another stream in each thread


def _stream_of(device: torch.device) -> Tuple[int, int, Optional[int]]:
    """``(device index, raw current stream, thread)`` of a CUDA (or HIP) device, ``thread`` the
    calling thread's id on the per-thread default stream and ``None`` on any other;
    ``(-1, 0, None)`` for another device."""
    if device.type != "cuda":
        return -1, 0, None
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch._C._cuda_getCurrentRawStream(index)
    return index, stream, threading.get_ident() if stream == _PER_THREAD_STREAM else None


class _Slot:
    __slots__ = ("rows", "buffer")

    def __init__(self, rows: int, buffer: torch.Tensor):
        self.rows = rows  # the most rows the buffer serves
        self.buffer = buffer


class Workspaces:
    """A workspace for each (device, current stream, graph capture or not, layout, ``topk``) a
    caller asks for.

    ``get(rows, topk, layout, device)`` returns a contiguous uint8 tensor of at least
    ``workspace_size(rows, topk, layout, device)`` bytes on ``device`` (a ``torch.device`` or its
    name); the same tensor for every call of the key while ``rows`` fits it. Its contents are
    scratch: the operator reads nothing it did not write in the same call. ``rows``, ``topk``
    and ``layout`` are checked as :func:`indexer_topk.workspace_size` checks them.
    """

    def __init__(self) -> None:
        self._slots: Dict[tuple, _Slot] = {}
        self._kept: List[torch.Tensor] = []  # outgrown buffers a captured graph may still use
        self._lock = threading.Lock()

    def get(self, rows: int, topk: int, layout: str, device) -> torch.Tensor:
        if type(rows) is not int or rows < 0:  # as workspace_size, checked on every call: a slot may answer
            raise ValueError(f"rows: expected a non-negative int, got {rows!r}")
        if not isinstance(device, torch.device):
            device = torch.device(device)
        capturing = is_capturing()
        key = (device.type, *_stream_of(device), capturing, layout, topk)
        slot = self._slots.get(key)
        if slot is None or slot.rows < rows:
            with self._lock:
                slot = self._grow(key, capturing, rows, topk, layout, device)
        return slot.buffer

    def _grow(self, key, capturing: bool, rows: int, topk: int, layout: str, device: torch.device) -> _Slot:
        slot = self._slots.get(key)
        if slot is not None and slot.rows >= rows:
            return slot  # another thread grew it
        if slot is not None:
            rows = max(rows, 2 * slot.rows)  # a few sizes over a growing batch, not one per size
        nbytes = workspace_size(rows, topk, layout, device)
        if slot is not None and slot.buffer.numel() >= nbytes:
            slot.rows = rows
            return slot
        if slot is not None and capturing:  # a graph replays its address
            self._kept.append(slot.buffer)
        slot = self._slots[key] = _Slot(rows, torch.empty(nbytes, dtype=torch.uint8, device=device))
        return slot

    def nbytes(self) -> int:
        """Bytes held: the current buffers and the outgrown ones kept for captured graphs."""
        return sum(s.buffer.numel() for s in self._slots.values()) + sum(t.numel() for t in self._kept)


__all__ = ["Workspaces"]
