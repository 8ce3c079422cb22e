"""Open SGLang's released sources in this process, with doubles for what a CPU lacks.

:func:`open_sglang` puts the unpacked release on ``sys.path``, installs the import doubles,
imports SGLang's DSv4 indexer and plugin modules for real, installs the kernel doubles and
returns the modules. :meth:`SGLang.close` undoes all of it, so the rest of a test session
never sees SGLang or a stub.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

from .imports import AFTER_SGLANG, BEFORE_SGLANG, ImportDoubles
from .kernels import Calls, Patcher, install_kernel_doubles

MODULES = {
    "plugins": "sglang.srt.plugins",
    "hook_registry": "sglang.srt.plugins.hook_registry",
    "indexer": "sglang.srt.layers.attention.dsv4.indexer",
    "metadata": "sglang.srt.layers.attention.dsv4.metadata",
    "compressor_v2": "sglang.srt.layers.attention.dsv4.compressor_v2",
    "fp4_hip": "sglang.kernels.ops.attention.dsv4.fp4_indexer_hip",
    "norm_rope": "sglang.kernels.ops.attention.dsv4.norm_rope",
    "dsv4_ops": "sglang.kernels.ops.attention.dsv4",
    "forward_batch_info": "sglang.srt.model_executor.forward_batch_info",
    "dsa_topk_backend": "sglang.srt.layers.attention.dsa.dsa_topk_backend",
    "capture_mode": "sglang.srt.model_executor.runner_utils.capture_mode",
    "bcg_context": "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context",
    "version": "sglang.version",
}


class SGLang(SimpleNamespace):
    """SGLang's modules by short name (see ``MODULES``), plus ``calls`` and ``patcher``."""

    def close(self) -> None:
        self.patcher.undo()
        self._imports.uninstall()
        roots = [str(p) for p in self._paths]
        for name in list(sys.modules):
            module = sys.modules[name]
            path = getattr(module, "__file__", None) or ""
            if name == "sglang" or name.startswith("sglang.") or any(path.startswith(r) for r in roots):
                del sys.modules[name]
        for p in roots:
            while p in sys.path:
                sys.path.remove(p)
        # SGLang's import points third-party caches at its own dir (setdefault); undo that.
        for key in [k for k in os.environ if k not in self._environ]:
            del os.environ[key]
        os.environ.update(self._environ)


def open_sglang(paths: Sequence[Path], *, kernels: Optional[Callable[[SGLang], None]] = None,
                shadow_installed: bool = False, stub_missing: bool = False) -> SGLang:
    """Import SGLang from ``paths`` (see ``sglang_fetch.fetch_sglang_source``) with the doubles.

    ``kernels(sg)`` binds the kernels (default: the CPU doubles of ``kernels.py``);
    ``shadow_installed`` stubs the import-only packages even where installed; ``stub_missing``
    stubs any other package SGLang's files import that is missing (``sg.stubbed`` lists them).
    """
    environ = dict(os.environ)
    paths = [Path(p).resolve() for p in paths]
    sys.path[:0] = [str(p) for p in paths]
    imports = ImportDoubles()
    hidden = imports.hide(AFTER_SGLANG) if shadow_installed else None
    try:
        imports.install(BEFORE_SGLANG, shadow=shadow_installed)
        importlib.import_module("sglang")
        imports.unhide(hidden)
        imports.install(AFTER_SGLANG, shadow=shadow_installed)
        if stub_missing:
            imports.stub_missing(str(p) for p in paths)
        modules = {key: importlib.import_module(name) for key, name in MODULES.items()}
    except BaseException:
        imports.unhide(hidden)
        imports.uninstall()
        raise
    sg = SGLang(**modules, calls=Calls(), patcher=Patcher(), _imports=imports, _paths=list(paths), _environ=environ)
    sg.stubbed = imports.stood_for
    try:
        (kernels or (lambda s: install_kernel_doubles(s, s.patcher, s.calls)))(sg)
    except BaseException:
        sg.close()
        raise
    return sg
