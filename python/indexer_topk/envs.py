"""Typed environment flags, declared in one place.

Read a flag with ``envs.NAME.get()``; override it in a test with
``with envs.NAME.override(value): ...``. A value that does not parse logs a warning and the
default is used instead, so a typo in a deployment never crashes a server; a switch that
turns a path off declares its own fail-safe value instead (``invalid=``), so a typo in it
never leaves the path on. An empty value counts as unset (``FOO= cmd`` is the shell idiom for
clearing a variable), except in a field with a fail-safe value: there it says nothing the
switch can read, so it reads as the fail-safe value, with the warning. Truth-testing a field
(``if envs.NAME:``) raises, because a field object is always truthy and that bug would
silently ignore the variable.

Example::

    from indexer_topk.envs import envs

    if envs.SGLANG_DSV4_FP4_FUSED_TOPK.get():
        ...
    with envs.INDEXER_TOPK_TRITON_ROCM.override(True):
        ...
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from .environ import Var
from .replay import note_env

logger = logging.getLogger("indexer_topk.envs")

T = TypeVar("T")

_TRUE = frozenset({"1", "true", "on", "yes"})
_FALSE = frozenset({"0", "false", "off", "no"})
_WARNED: set = set()  # (variable, value) pairs already warned about


class EnvField(Generic[T]):
    """One environment variable: its name (the attribute name), its type and its default.

    ``default`` may be a zero-argument callable, resolved at each :meth:`get` (for defaults
    that depend on the machine).
    """

    _UNSET = object()

    def __init__(self, default: Union[T, Callable[[], T]], *, invalid: Any = _UNSET, invalid_means: str = ""):
        self.default = default
        self.invalid = invalid
        self.invalid_means = invalid_means
        self.name: str = ""
        self._var: Optional[Var] = None

    def __set_name__(self, owner, name: str) -> None:
        self.name = name
        self._var = Var(name)  # os.environ's value of it at a dict lookup's cost: read on every call

    def __get__(self, obj, owner=None) -> "EnvField[T]":
        return self

    def __set__(self, obj, value) -> None:
        raise AttributeError(f"use envs.{self.name}.set(...) or .override(...) to change {self.name}")

    def __bool__(self) -> bool:
        raise TypeError(f"Please use `envs.{self.name}.get()` instead of `envs.{self.name}`")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, default={self.default_value()!r})"

    def default_value(self) -> T:
        """The default, with a callable default resolved."""
        return self.default() if callable(self.default) else self.default

    def parse(self, raw: str) -> T:
        """Convert the raw string to the field's type; raise ``ValueError`` if it is invalid."""
        raise NotImplementedError

    def format(self, value: Any) -> str:
        """The string :meth:`set` writes for ``value``; a ``str`` is written unchanged."""
        return value if isinstance(value, str) else str(value)

    def get(self, environ: Optional[Mapping[str, str]] = None) -> T:
        """The typed value from ``environ`` (default ``os.environ``), or the default.

        Unset or empty gives the default silently; an invalid value logs a warning naming the
        variable and its value and gives the field's fail-safe value if it declares one, else
        the default. A field with a fail-safe value reads a set but empty value as invalid.
        """
        if environ is None:
            raw = self._var.get() if self._var is not None else os.environ.get(self.name)
            note_env(self.name, raw)  # a recorded backend call is replayed only while this value holds
        else:
            raw = environ.get(self.name)
        if self._unset(raw):
            return self.default_value()
        try:
            return self._parse_set(raw)
        except ValueError as exc:
            # once per variable and value: flags read on every call would repeat it per call
            first = (self.name, raw) not in _WARNED
            _WARNED.add((self.name, raw))
            if self.invalid is not EnvField._UNSET:
                if first:
                    logger.warning("%s=%r is not valid (%s); read as %r, the fail-safe value: %s",
                                   self.name, raw, exc, self.invalid, self.invalid_means)
                return self.invalid
            default = self.default_value()
            if first:
                logger.warning("%s=%r is not valid (%s); using the default %r", self.name, raw, exc, default)
            return default

    def readable(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        """Whether the variable is unset, a value :meth:`parse` accepts, or empty in a field
        without a fail-safe value."""
        raw = self.raw(environ)
        if self._unset(raw):
            return True
        try:
            self._parse_set(raw)
        except ValueError:
            return False
        return True

    def _unset(self, raw: Optional[str]) -> bool:
        # A switch that fails safe must not read an empty value as its default: the default
        # is the path it guards, on.
        return raw is None or (raw.strip() == "" and self.invalid is EnvField._UNSET)

    def _parse_set(self, raw: str) -> T:
        if raw.strip() == "":
            raise ValueError("set but empty")
        return self.parse(raw)

    def is_set(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        """Whether the variable is present in ``environ`` (default ``os.environ``), even if invalid."""
        env = os.environ if environ is None else environ
        return self.name in env

    def raw(self, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The unparsed string, or ``None`` when unset."""
        env = os.environ if environ is None else environ
        return env.get(self.name)

    def set(self, value: Any) -> None:
        """Write ``value`` to ``os.environ``; ``None`` removes the variable."""
        if value is None:
            os.environ.pop(self.name, None)
        else:
            os.environ[self.name] = self.format(value)

    @contextmanager
    def override(self, value: Any) -> Iterator["EnvField[T]"]:
        """Set the variable for the duration of a ``with`` block, then restore it exactly.

        ``None`` unsets it inside the block; a ``str`` is written verbatim, so tests can try
        spellings and invalid values.
        """
        previous = os.environ.get(self.name)
        self.set(value)
        try:
            yield self
        finally:
            self.set(previous)  # a str is written back verbatim, None unsets


class EnvBool(EnvField[bool]):
    """true/1/on/yes and false/0/off/no, case-insensitive, surrounding spaces ignored."""

    def parse(self, raw: str) -> bool:
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError("expected one of true/1/on/yes or false/0/off/no")

    def format(self, value: Any) -> str:
        if isinstance(value, bool):
            return "1" if value else "0"
        return super().format(value)


class EnvInt(EnvField[int]):
    """A base-10 integer, optionally bounded (inclusive)."""

    def __init__(self, default, *, min_value: Optional[int] = None, max_value: Optional[int] = None):
        super().__init__(default)
        self.min_value = min_value
        self.max_value = max_value

    def parse(self, raw: str) -> int:
        try:
            value = int(raw.strip(), 10)
        except ValueError:
            raise ValueError("expected an integer") from None
        if self.min_value is not None and value < self.min_value:
            raise ValueError(f"expected at least {self.min_value}")
        if self.max_value is not None and value > self.max_value:
            raise ValueError(f"expected at most {self.max_value}")
        return value


class EnvStr(EnvField[Optional[str]]):
    """A string; with ``choices``, matched case-insensitively and returned as spelled there."""

    def __init__(self, default=None, *, choices: Optional[Sequence[str]] = None):
        super().__init__(default)
        self.choices: Optional[Tuple[str, ...]] = tuple(choices) if choices is not None else None

    def parse(self, raw: str) -> str:
        value = raw.strip()
        if self.choices is None:
            return value
        for choice in self.choices:
            if value.lower() == choice.lower():
                return choice
        raise ValueError(f"expected one of {', '.join(self.choices)}")


class Envs:
    """Every environment variable this package reads. Fields are read with ``.get()``."""

    # ============================================================
    # Path policy (read once, when the policy is built)
    # ============================================================
    # Kill switch of the fused score + top-k path (SGLang's name): false/0/off/no sends every call to legacy.
    # It fails safe: a value it cannot read, or set but empty, turns the fused path off too.
    SGLANG_DSV4_FP4_FUSED_TOPK = EnvBool(True, invalid=False, invalid_means="the fused top-k path is off")
    # Opt-in of our Triton fused path on AMD GPUs (off: AMD hosts use AITER's kernel or the legacy path).
    INDEXER_TOPK_TRITON_ROCM = EnvBool(False)
    # Opt-in of our fused path for eager prefill on NVIDIA, for its memory (scratch independent of
    # the context instead of a [rows, context] score matrix) where it is measured slower: than our
    # legacy path, and inside SGLang than SGLang's own CUDA path for the FP8 cache.
    INDEXER_TOPK_FUSED_PREFILL = EnvBool(False)
    # Put decode and graph-captured calls on our fused path (the operator form captures: no host
    # sync, no value-dependent launch, a caller-owned workspace). Off by default: no committed
    # measurement yet shows it faster than the legacy path, or inside SGLang than SGLang's decode.
    INDEXER_TOPK_FUSED_DECODE = EnvBool(False)
    # A routes table file (JSON, see indexer_topk.routes) used instead of the shipped ones, e.g.
    # one `indexer-topk tune` wrote. One that cannot be read or is for another device warns once.
    INDEXER_TOPK_ROUTES = EnvStr(None)

    # ============================================================
    # Fused path
    # ============================================================
    # The warp-specialised Hopper stream for the FP8 cache on sm_90 GPUs (off: the plain-Triton
    # fused kernel serves it, as every other layout and GPU). Read at each fused call; it fails
    # safe to the plain kernel.
    INDEXER_TOPK_HOPPER_STREAM = EnvBool(True, invalid=False, invalid_means="the plain-Triton fused kernel serves")
    # Replay the recorded launches of a call signature seen before (the host path of every call
    # after the first of its shape); 0 runs every call through validation, planning and Triton's
    # own launch path.
    INDEXER_TOPK_REPLAY = EnvBool(True, invalid=False, invalid_means="every call takes the full host path")
    # Replayed launches go straight to the CUDA driver with their parameter blocks built once
    # (indexer_topk.kernels.driver_launch), where that reproduces Triton's launch exactly; 0
    # replays every launch through Triton's launcher. Read when a signature is recorded.
    INDEXER_TOPK_DRIVER_LAUNCH = EnvBool(True, invalid=False, invalid_means="replays launch through Triton's launcher")
    # Programmatic dependent launch of the kernels that follow a call's first kernel (sm_90 and
    # later): each starts while the one before it finishes and waits for it on the GPU, which
    # hides the gap between them. Read at each legacy call; off (or unreadable) launches them
    # one after another as plain stream order does.
    INDEXER_TOPK_PDL = EnvBool(True, invalid=False, invalid_means="kernels launch one after another")
    # An FP8 decode step through the split select at a shape where it measured faster
    # (backends/legacy.py, scored_gate_measured_faster) takes its gate ahead of the score kernel:
    # the gate's sample scored from the cache, the score kernel gathering the keys that reach it
    # (backends/legacy.py, scored_split; the same bits).
    # Read at each such legacy call; 0 (or unreadable) keeps the gate after the score kernel.
    INDEXER_TOPK_SCORED_GATE = EnvBool(True, invalid=False,
                                       invalid_means="decode keeps the gate after the score kernel")

    # ============================================================
    # Legacy path
    # ============================================================
    # MiB of FP32 logits the legacy path materialises at once; larger batches run in row chunks.
    # A chunk is at least two rows, so this is a bound only above two rows of the matrix (4 bytes
    # per C4 position, 1.5 MiB at a 768K-token context); a smaller budget takes two rows, with a
    # warning.
    INDEXER_TOPK_LOGITS_BUDGET_MB = EnvInt(2048, min_value=1)

    # ============================================================
    # Logging
    # ============================================================
    # Level of the "indexer_topk" logger; unset leaves the level to the application.
    INDEXER_TOPK_LOG_LEVEL = EnvStr(None, choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))

    def fields(self) -> Tuple[EnvField, ...]:
        """All declared fields, in declaration order."""
        return tuple(v for v in vars(type(self)).values() if isinstance(v, EnvField))

    def snapshot(self, environ: Optional[Mapping[str, str]] = None) -> dict:
        """``{name: typed value}`` for every field (what the process would read now)."""
        return {f.name: f.get(environ) for f in self.fields()}


envs = Envs()

# Triton's own flag, read with the spellings Triton accepts (not an Envs field: Triton owns it).
_TRITON_INTERPRET_TRUE = frozenset({"1", "true", "on", "yes", "y"})


def interpreting(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether Triton kernels run under the interpreter (``TRITON_INTERPRET``), read from
    ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    return str(env.get("TRITON_INTERPRET", "0")).strip().lower() in _TRITON_INTERPRET_TRUE


__all__ = ["EnvBool", "EnvField", "EnvInt", "EnvStr", "Envs", "envs", "interpreting"]
