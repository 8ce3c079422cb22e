"""Backends behind :func:`indexer_topk.indexer_topk`, one module each, all with one signature::

    fn(inputs, *, out, workspace) -> IndexerTopKResult

where ``inputs`` is the :class:`~indexer_topk.contract.IndexerInputs` validation returned. Modules are imported on first use only (``api._backend_fn``), so importing the
package never imports Triton kernels or vendor libraries.

A backend that cannot run raises :class:`indexer_topk.errors.BackendUnavailable` before it
computes anything; :func:`require_runnable` says so for our Triton backends: before their
modules (and Triton) are imported when Triton or the interpreter is missing, and when a
dependency their import needs is not installed (numpy, which Triton's interpreter imports).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Optional

import torch

from ..envs import interpreting
from ..errors import BackendUnavailable, missing_dependency, missing_dependency_words

# Ours, written in Triton: they need Triton, and a GPU or the Triton interpreter.
TRITON_BACKENDS = ("legacy", "fused")


def _triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken parent package, or triton set to None in sys.modules
        return False


def triton_problem(device=None) -> Optional[str]:
    """Why our Triton kernels cannot run on ``device`` (``None``: wherever), or ``None``.

    Triton must be importable (GPU builds of torch bring their own; a CPU needs ``pip install
    triton``), and inputs on a CPU need the Triton interpreter, ``TRITON_INTERPRET=1``: the
    interpreter is chosen when the kernels are imported, so the variable must be set before
    that. Once they are imported, how they were imported decides, whatever the variable says
    now (a call replayed from a recording runs them as they are, so the full path must judge
    alike).
    """
    if not _triton_installed():
        return "Triton is not installed (GPU builds of torch bring it; on a CPU: pip install triton)"
    if device is not None and torch.device(device).type == "cpu" and not _interpreter_on():
        return ("the inputs are on a CPU and the Triton interpreter is off: set TRITON_INTERPRET=1 before the "
                "kernels are first imported (e.g. before starting Python), or pass tensors on a GPU")
    return None


def _interpreter_on() -> bool:
    """Whether our kernels run (or, not imported yet, will run) on Triton's interpreter."""
    launch = sys.modules.get(f"{__package__.rpartition('.')[0]}.kernels.launch")
    return launch.kernels_interpreted() if launch is not None else interpreting()


def _import_backend(backend: str) -> None:
    importlib.import_module(f"{__name__}.{backend}")


def require_runnable(backend: str, device=None) -> None:
    """Raise :class:`BackendUnavailable` if ``backend`` is one of :data:`TRITON_BACKENDS` and
    cannot run on ``device``: :func:`triton_problem` names a reason, or importing its module
    needs a package that is not installed (the message names it). Any other import error is
    raised as it is: a broken installation is a failure, not "cannot run here"."""
    if backend not in TRITON_BACKENDS:
        return
    problem = triton_problem(device)
    if problem:
        raise BackendUnavailable(f"backend {backend!r} is not available: {problem}")
    try:
        _import_backend(backend)
    except ModuleNotFoundError as exc:
        missing = missing_dependency(exc)
        if missing is None:
            raise
        raise BackendUnavailable(f"backend {backend!r} is not available: {missing_dependency_words(missing)}") from exc


__all__ = ["TRITON_BACKENDS", "require_runnable", "triton_problem"]
