"""Reads of the process environment at the cost of a dict lookup, for flags read on every call.

``os.environ.get(name)`` encodes the name and decodes the value on each read, several times a
dict lookup; the switches an eager call reads (``INDEXER_TOPK_REPLAY``, the ones a replay
recorded) would pay that on every layer. :class:`Var` and :class:`Snapshot` read the store
behind ``os.environ`` instead, with the names (and a snapshot's values) encoded once. Every
write through ``os.environ`` (``os.environ[...] = ...``, ``pop``, ``clear``, pytest's
``monkeypatch.setenv``) goes through that store, so a read here sees exactly what
``os.environ.get`` would. Where ``os.environ`` is not the mapping this module found at import
(a test replaced it, an interpreter without CPython's ``_Environ``), every read takes
``os.environ.get``.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Tuple

_ENVIRON = os.environ
_STORE = getattr(_ENVIRON, "_data", None)
_ENCODE_KEY = getattr(_ENVIRON, "encodekey", None)
_ENCODE_VALUE = getattr(_ENVIRON, "encodevalue", None)
_DECODE_VALUE = getattr(_ENVIRON, "decodevalue", None)
_USABLE = isinstance(_STORE, dict) and all(callable(f) for f in (_ENCODE_KEY, _ENCODE_VALUE, _DECODE_VALUE))


def _direct() -> bool:
    """Whether ``os.environ`` is still the mapping whose store this module reads."""
    return _USABLE and os.environ is _ENVIRON


class Var:
    """One variable's raw value: :meth:`get` is ``os.environ.get(name)``."""

    __slots__ = ("name", "_key", "_last")

    def __init__(self, name: str):
        self.name = name
        self._key = _ENCODE_KEY(name) if _USABLE else None
        self._last: Tuple[object, Optional[str]] = (None, None)  # (stored value, its decoded str)

    def get(self) -> Optional[str]:
        if not _direct():
            return os.environ.get(self.name)
        stored = _STORE.get(self._key)
        if stored is None:
            return None
        last = self._last
        if last[0] is stored or last[0] == stored:  # the value read last time: decoded once
            return last[1]
        value = _DECODE_VALUE(stored)
        self._last = (stored, value)
        return value


class Snapshot:
    """Variables' raw values at one moment (``(name, value or None)`` pairs, which it iterates):
    :meth:`holds` says whether each still reads so."""

    __slots__ = ("items", "_encoded")

    def __init__(self, items: Iterable[Tuple[str, Optional[str]]]):
        self.items = tuple(items)
        self._encoded = (tuple((_ENCODE_KEY(name), None if raw is None else _ENCODE_VALUE(raw))
                               for name, raw in self.items) if _USABLE else None)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def holds(self) -> bool:
        if _direct():
            get = _STORE.get
            for key, stored in self._encoded:
                if get(key) != stored:
                    return False
            return True
        environ = os.environ
        for name, raw in self.items:
            if environ.get(name) != raw:
                return False
        return True


__all__ = ["Snapshot", "Var"]
