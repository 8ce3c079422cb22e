"""How a backend says it cannot run, and how callers tell that apart from a failure.

A backend that cannot run in this process -- its library is missing, the GPU is the wrong
one, there is no GPU and no Triton interpreter, it does not implement the call's layout or
``topk`` -- raises :class:`BackendUnavailable` before it computes anything. Every other
exception a backend raises is a failure: a bug, a CUDA fault, running out of memory. The
benchmark records the first as ``"unavailable"`` and the second as ``"error"``; ``indexer-topk
check`` and ``demo`` exit non-zero on an error.
"""

from __future__ import annotations

from typing import Optional

import torch


class BackendUnavailable(RuntimeError):
    """This backend cannot run here, or not for this call's layout or ``topk``; nothing ran.

    The message names the backend and says why (and, where there is one, what would make it
    run). A subclass of ``RuntimeError``, so code written against the earlier ``RuntimeError``
    still catches it.
    """


def value_words(value, limit: int = 200) -> str:
    """``value`` for an error message: its repr, cut to ``limit`` characters; an int past 64 bits
    by its size (past 4,300 digits Python refuses to print one at all)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's ``OutOfMemoryError`` or any error whose message says "out of memory"."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def describe_exception(exc: BaseException) -> str:
    """``"Type: first line of the message"`` (or just the type when the message is empty)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def failure_reason(exc: BaseException) -> str:
    """:func:`describe_exception`, prefixed ``"OOM: "`` when ``exc`` is an out-of-memory error."""
    return ("OOM: " if is_out_of_memory(exc) else "") + describe_exception(exc)


def failure_status(exc: BaseException) -> str:
    """``"unavailable"`` for :class:`BackendUnavailable`, ``"error"`` for anything else."""
    return "unavailable" if isinstance(exc, BackendUnavailable) else "error"


def missing_dependency(exc: BaseException) -> Optional[str]:
    """The module that ``exc`` says is not installed, when ``exc`` is a ``ModuleNotFoundError``
    for another package's module (a dependency missing here, e.g. ``"numpy"``, which Triton's
    interpreter imports); ``None`` otherwise, and for this package's own modules, whose absence
    is a broken installation rather than a missing dependency."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    if exc.name.split(".")[0] == __name__.split(".")[0]:
        return None
    return exc.name


def missing_dependency_words(module: str) -> str:
    """What to tell a user about a missing ``module`` (see :func:`missing_dependency`)."""
    package = module.split(".")[0]
    if package == module or not _importable(package):
        return f"it needs the Python package {package!r}, which is not installed here (pip install {package})"
    return f"it needs the module {module!r}, which the installed {package!r} does not have (another version may)"


def _importable(package: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a package set to None in sys.modules, or a broken one
        return False


__all__ = [
    "BackendUnavailable",
    "describe_exception",
    "failure_reason",
    "failure_status",
    "is_out_of_memory",
    "missing_dependency",
    "missing_dependency_words",
]
