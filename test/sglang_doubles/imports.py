"""Import-only doubles: let SGLang's modules import on a machine without its dependencies.

SGLang's DSv4 indexer module pulls in much of the server at import time (configs, schedulers,
parsers), and with it third-party packages that play no part in the indexer's arithmetic.
Each package listed here that is *not installed* is replaced by a permissive stub: any
attribute is a class that can be subclassed, called, subscripted or used as a decorator
(a decorator stub returns the function unchanged). Installed packages are shadowed only when
asked (``shadow``: the GPU run, whose machine has other versions of them than SGLang pins);
a shadowed or stubbed package is then a stub for the whole process, whoever imports it.

The stubs are installed in two phases: ``transformers`` and friends only after
``import sglang`` ran, so SGLang's package initialiser sees no transformers (exactly as for a
frontend-only install) and skips its transformers patches.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import pickle
import re
import sys
import types
from typing import Iterable, List

# Needed by `import sglang` (its package initialiser and the environ/utils it loads).
BEFORE_SGLANG = ("orjson", "psutil", "pybase64", "requests", "starlette", "pydantic_core", "pydantic", "zmq",
                 "tqdm", "IPython", "aiohttp", "dill", "regex")
# Needed by the DSv4 indexer module's import chain, installed after `import sglang`.
AFTER_SGLANG = ("tvm_ffi", "transformers", "torchvision", "huggingface_hub", "sentencepiece", "safetensors",
                "compressed_tensors", "gguf", "einops", "openai", "partial_json_parser", "yaml")


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and cls is Anything:
            return args[0]  # used as a bare decorator
        return super().__call__(*args, **kwargs)

    def __or__(cls, other):
        return object

    __ror__ = __or__

    def __getitem__(cls, key):
        return Anything

    def __setitem__(cls, key, value):
        pass

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __contains__(cls, key):
        return False


class Anything(metaclass=_StubMeta):
    """Stands for any class, function or constant of a stubbed package."""

    def __init_subclass__(cls, **kwargs):
        pass

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # the decorator a decorator factory returned
        return Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything()

    def __getitem__(self, key):
        return Anything()

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``pkg`` and every ``pkg.sub.module`` of the stubbed top-level names."""

    def __init__(self, tops: Iterable[str]):
        self.tops = set(tops)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in self.tops:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


class _Hidden(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: the named top-level packages cannot be imported, installed
    or not (SGLang's initialiser must see no transformers, as on a machine without it). An
    import raises ``ModuleNotFoundError``; so does ``importlib.util.find_spec``, which would
    otherwise return None."""

    def __init__(self, tops: Iterable[str]):
        self.tops = set(tops)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.tops:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden while SGLang initialises)", name=name)
        return None


class _MissingFinder(_StubFinder):
    """Last on ``sys.meta_path``: a stub for a top-level package no other finder has, imported
    by a file under ``roots`` (SGLang's sources). A GPU machine takes SGLang's CUDA import
    branches, which name CUDA packages (sgl-kernel, FlashInfer, ...) this test does not carry.
    A first import from anywhere else (torch, Triton) fails as it would, and so does an
    availability probe (``importlib.util.find_spec``) from SGLang, which then takes the branch
    of a machine without the package; once stubbed, a package is a stub for every importer."""

    def __init__(self, roots: Iterable[str]):
        self.roots = tuple(os.path.join(os.path.abspath(r), "") for r in roots)
        self.stood_for: List[str] = []

    def _from_roots(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if name.endswith(os.path.join("importlib", "util.py")) and code.co_name == "find_spec":
                return False  # a probe for the package, not an import of it
            if not (name.startswith("<frozen") or "importlib" in name or name == __file__):
                return os.path.abspath(name).startswith(self.roots)
            frame = frame.f_back
        return False

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in self.stood_for and (path is not None or not self._from_roots()):
            return None
        if top not in self.stood_for:
            self.stood_for.append(top)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)


def _dill_double() -> types.ModuleType:
    # SGLang serialises a default logit processor with dill at import time.
    module = types.ModuleType("dill")
    module.dumps = lambda obj, *a, **k: pickle.dumps(repr(obj))
    module.loads = lambda data, *a, **k: None
    return module


class ImportDoubles:
    """Installs and removes the stubs; remembers what it added to ``sys.modules``."""

    def __init__(self):
        self.finders: List[importlib.abc.MetaPathFinder] = []
        self.stubbed: List[str] = []
        self.missing: "_MissingFinder | None" = None

    def install(self, names: Iterable[str], *, shadow: bool = False) -> None:
        """Stub each of ``names`` not imported yet that is not installed (or, with ``shadow``,
        even where it is installed)."""
        missing = [n for n in names if n not in sys.modules and (shadow or importlib.util.find_spec(n) is None)]
        special = {"dill": _dill_double, "regex": lambda: re}  # stdlib `re` stands in for `regex`
        plain = []
        for name in missing:
            if name in special:
                sys.modules[name] = special[name]()
            else:
                plain.append(name)
        if plain:
            finder = _StubFinder(plain)
            sys.meta_path.insert(0, finder)
            self.finders.append(finder)
        self.stubbed += missing

    def hide(self, names: Iterable[str]):
        """Hide ``names`` (not imported yet) until the returned finder is passed to :meth:`unhide`."""
        hidden = _Hidden(n for n in names if n not in sys.modules)
        sys.meta_path.insert(0, hidden)
        return hidden

    @staticmethod
    def unhide(hidden) -> None:
        if hidden in sys.meta_path:
            sys.meta_path.remove(hidden)

    def stub_missing(self, roots: Iterable[str]) -> None:
        """Stand for any package SGLang's files under ``roots`` import that is not installed."""
        self.missing = _MissingFinder(roots)
        sys.meta_path.append(self.missing)
        self.finders.append(self.missing)

    def stood_for(self) -> List[str]:
        """Every package a stub stood for, installed or missing."""
        return self.stubbed + (self.missing.stood_for if self.missing is not None else [])

    def uninstall(self) -> None:
        for finder in self.finders:
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
        tops = set(self.stood_for())
        for name in [n for n in sys.modules if n.split(".")[0] in tops]:
            del sys.modules[name]
        self.finders.clear()
        self.stubbed.clear()
