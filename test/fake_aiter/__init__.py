"""Fake AITER installations for tests, each a directory holding an ``aiter`` package.

``reference``    ``aiter.ops.flydsl`` exports the fused top-k kernel, implemented with
                 indexer_topk's reference and checking every argument.
``missing``      ``aiter.ops.flydsl`` imports but lacks the kernel (AITER's main branch).
``broken``       importing ``aiter.ops.flydsl`` raises.
``lazy_broken``  ``aiter.ops.flydsl`` imports; reading the kernel's name raises ImportError.
``absent``       no AITER at all (``import aiter`` raises ImportError).

Use :func:`install` with pytest's ``monkeypatch``, inside :func:`installed` so every fake
module is gone when the test ends, whichever modules it imported.
"""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VARIANTS = ("reference", "missing", "broken", "lazy_broken", "absent")


def _aiter_module_names():
    return [name for name in sys.modules if name == "aiter" or name.startswith("aiter.")]


def _is_fake(module) -> bool:
    return module is not None and str(ROOT) in str(getattr(module, "__file__", "") or "")


def leftovers():
    """Names of fake AITER modules still in ``sys.modules``, and fake paths still on ``sys.path``."""
    modules = [name for name in _aiter_module_names() if _is_fake(sys.modules.get(name))]
    return modules + [p for p in sys.path if str(ROOT) in p]


def install(monkeypatch, variant: str):
    """Make ``import aiter`` find the fake ``variant``; returns its flydsl module, if it imports."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown fake aiter variant {variant!r}")
    for name in _aiter_module_names():
        monkeypatch.delitem(sys.modules, name)
    if variant == "absent":
        monkeypatch.setitem(sys.modules, "aiter", None)  # None in sys.modules makes import raise
        return None
    monkeypatch.syspath_prepend(str(ROOT / variant))
    importlib.invalidate_caches()
    if variant in ("broken",):
        return None
    module = importlib.import_module("aiter.ops.flydsl")
    if hasattr(module, "CALLS"):
        monkeypatch.setattr(module, "CALLS", [])
    return module


@contextmanager
def installed(monkeypatch, variant: str):
    """:func:`install` for the duration of a ``with`` block (or a fixture's yield)."""
    try:
        yield install(monkeypatch, variant)
    finally:
        # monkeypatch restores the modules that were there before; remove what the fake added.
        for name in _aiter_module_names():
            module = sys.modules.get(name)
            if module is None or _is_fake(module):
                sys.modules.pop(name, None)
