"""Workspaces an engine integration owns, so that its calls allocate no scratch of their own.

A call given a ``workspace`` of :func:`indexer_topk.workspace_size` bytes allocates nothing on
the fused path (and legacy takes it as its score matrix where that fits): no allocator call on
an eager prefill's host path, and under graph capture one fixed buffer instead of scratch in each
captured graph's pool. :class:`Workspaces` keeps one per (device, stream, layout, ``topk``),
sized for the most rows a call of that key has asked for, and hands it to every call of the key.

Why per stream: calls on one stream run in order, so one buffer serves them all; two streams
(a captured graph's and the eager one's, two overlapped micro-batches) could run calls at once,
so each has its own. A buffer outgrown by a larger call is replaced by one for at least twice
the rows; a replaced buffer that was handed out while a CUDA graph was being captured is kept
for the life of the object, since the graph replays its address.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import torch

from .api import workspace_size
from .routes.modes import is_capturing


def _stream_of(device: torch.device) -> Tuple[int, int]:
    """``(device index, raw current stream)`` of a CUDA (or HIP) device; ``(-1, 0)`` otherwise."""
    if device.type != "cuda":
        return -1, 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, torch._C._cuda_getCurrentRawStream(index)


class _Slot:
    __slots__ = ("rows", "buffer", "captured")

    def __init__(self, rows: int, buffer: torch.Tensor):
        self.rows = rows  # the most rows the buffer serves
        self.buffer = buffer
        self.captured = False  # handed out during a graph capture: its address is in a graph


class Workspaces:
    """A workspace for each (device, current stream, layout, ``topk``) a caller asks for.

    ``get(rows, topk, layout, device)`` returns a contiguous uint8 tensor of at least
    ``workspace_size(rows, topk, layout, device)`` bytes on ``device``; the same tensor for every
    call of the key while ``rows`` fits it. Its contents are scratch: the operator reads nothing
    it did not write in the same call.
    """

    def __init__(self) -> None:
        self._slots: Dict[tuple, _Slot] = {}
        self._kept: List[torch.Tensor] = []  # outgrown buffers a captured graph may still use
        self._lock = threading.Lock()

    def get(self, rows: int, topk: int, layout: str, device: torch.device) -> torch.Tensor:
        index, stream = _stream_of(device)
        key = (device.type, index, stream, layout, topk)
        slot = self._slots.get(key)
        if slot is None or slot.rows < rows:
            with self._lock:
                slot = self._grow(key, rows, topk, layout, device)
        if not slot.captured and is_capturing():
            slot.captured = True
        return slot.buffer

    def _grow(self, key, rows: int, topk: int, layout: str, device: torch.device) -> _Slot:
        slot = self._slots.get(key)
        if slot is not None and slot.rows >= rows:
            return slot  # another thread grew it
        if slot is not None:
            rows = max(rows, 2 * slot.rows)  # a few sizes over a growing batch, not one per size
            if slot.captured:
                self._kept.append(slot.buffer)
        nbytes = workspace_size(rows, topk, layout, device)
        slot = self._slots[key] = _Slot(rows, torch.empty(nbytes, dtype=torch.uint8, device=device))
        return slot

    def nbytes(self) -> int:
        """Bytes held: the current buffers and the outgrown ones kept for captured graphs."""
        return sum(s.buffer.numel() for s in self._slots.values()) + sum(t.numel() for t in self._kept)


__all__ = ["Workspaces"]
