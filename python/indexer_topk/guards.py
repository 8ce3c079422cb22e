"""Poisoned outputs and guard-banded buffers: how the tests and the stress run catch a call
that leaves a slot unwritten or writes outside its outputs and workspace.

Outputs start as sentinels a correct call overwrites (a NaN with a payload for ``values``,
``0x5A5A5A5A`` for indices and counts) and sit in the middle of larger buffers of the same
sentinels; a workspace sits in the middle of a buffer of one garbage byte. After the call,
anything before or after a slice that changed was written out of bounds.
"""

from __future__ import annotations

from typing import List

import torch

from .contract import IndexerTopKResult

# Sentinels a correct call must overwrite: a signalling NaN with a payload, and a byte pattern.
NAN_SENTINEL_BITS = 0x7FBADBAD
INDEX_SENTINEL = 0x5A5A5A5A
GUARD_BYTE = 0xA5


def poisoned_result(rows: int, topk: int, device) -> IndexerTopKResult:
    """Output tensors filled with sentinels: NaN-with-payload values, 0x5A5A5A5A indices and counts."""
    values = torch.full((rows, topk), NAN_SENTINEL_BITS, dtype=torch.int32, device=device).view(torch.float32)
    fill = lambda shape: torch.full(shape, INDEX_SENTINEL, dtype=torch.int32, device=device)  # noqa: E731
    return IndexerTopKResult(values, fill((rows, topk)), fill((rows, topk)), fill((rows,)))


def unwritten_slots(result: IndexerTopKResult) -> List[str]:
    """The outputs of ``result`` (from :func:`poisoned_result` or :class:`GuardedResult`) that
    still hold a sentinel somewhere: slots the call never wrote."""
    found = []
    if bool((result.values.view(torch.int32) == NAN_SENTINEL_BITS).any()):
        found.append("values")
    for name in ("raw_indices", "physical_indices", "counts"):
        if bool((getattr(result, name) == INDEX_SENTINEL).any()):
            found.append(name)
    return found


class GuardedResult:
    """Outputs that are slices in the middle of larger sentinel-filled buffers.

    ``out`` is what the call gets; :meth:`violations` lists the buffers written before or
    after their slice, :meth:`assert_guards_intact` raises on any.
    """

    def __init__(self, rows: int, topk: int, device, guard: int = 1000):
        self.guard = guard
        self.bases = []
        parts = []
        for n, sentinel in (
            (rows * topk, NAN_SENTINEL_BITS),
            (rows * topk, INDEX_SENTINEL),
            (rows * topk, INDEX_SENTINEL),
            (rows, INDEX_SENTINEL),
        ):
            base = torch.full((guard + n + guard,), sentinel, dtype=torch.int32, device=device)
            self.bases.append((base, n, sentinel))
            parts.append(base[guard : guard + n])
        self.out = IndexerTopKResult(
            parts[0].view(torch.float32).view(rows, topk),
            parts[1].view(rows, topk),
            parts[2].view(rows, topk),
            parts[3],
        )

    def violations(self) -> List[str]:
        g = self.guard
        found = []
        for (base, n, sentinel), name in zip(self.bases, IndexerTopKResult._fields):
            if not bool((base[:g] == sentinel).all()):
                found.append(f"out.{name}: written before its start")
            if not bool((base[g + n :] == sentinel).all()):
                found.append(f"out.{name}: written past its end")
        return found

    def assert_guards_intact(self) -> None:
        found = self.violations()
        assert not found, "; ".join(found)


class GuardedWorkspace:
    """A uint8 workspace of ``nbytes`` in the middle of a larger buffer, all of it garbage.

    The workspace itself starts full of ``fill`` too: a backend must not depend on its scratch
    being zeroed. The default fill reads as small int32 keys; ``0x7F`` reads as keys above
    every finite score's, which a read past the workspace would select.
    """

    def __init__(self, nbytes: int, device, guard: int = 4096, fill: int = GUARD_BYTE):
        self.guard = guard
        self.nbytes = nbytes
        self.fill = fill
        self.base = torch.full((guard + nbytes + guard,), fill, dtype=torch.uint8, device=device)
        self.workspace = self.base[guard : guard + nbytes]

    def violations(self) -> List[str]:
        g = self.guard
        before, after = self.base[:g], self.base[g + self.nbytes :]
        bad_before = (before != self.fill).nonzero().flatten()
        bad_after = (after != self.fill).nonzero().flatten()
        found = []
        if len(bad_before):
            last = g - int(bad_before[-1])
            found.append(f"{len(bad_before)} byte(s) written before the workspace, the last at -{last}")
        if len(bad_after):
            first = int(bad_after[0])
            found.append(f"{len(bad_after)} byte(s) written past the workspace, the first at +{first}")
        return found

    def assert_guards_intact(self) -> None:
        found = self.violations()
        if found:
            raise AssertionError("; ".join(found))


__all__ = [
    "GUARD_BYTE",
    "INDEX_SENTINEL",
    "NAN_SENTINEL_BITS",
    "GuardedResult",
    "GuardedWorkspace",
    "poisoned_result",
    "unwritten_slots",
]
