"""Record the kernel launches of one backend call; replay them for later calls of the same kind.

An eager prefill pays the operator's host time on every layer call. Almost all of that time
goes to work that depends only on the call's *signature*: its shapes, dtypes, strides and
devices, each tensor's address modulo 16, the scalar arguments, the backend and the
environment flags the backend reads. Planning, carving the workspace, building kernel
arguments and Triton's own dispatch (argument specialisation, cache keys) all repeat the same
answer for the same signature. What changes between two such calls is only where the tensors
are, and every address a kernel receives is a fixed byte offset into one of the call's tensors
(its *roots*) or into scratch the call allocates.

So the first call of a signature runs the backend as written, under a :class:`Recorder`:

- every launch made through :func:`launch` is kept with the compiled kernel Triton returned,
  each tensor argument (and each tensor descriptor's base) as ``(root, byte offset)``;
- every scratch allocation is kept as a step that allocates again (a replay makes them as one);
- every other torch operation on the host (``torch.topk``, ``zero_``, a read of a value)
  marks the call as not replayable: its host work depends on more than the signature;
- every environment flag the backend reads is kept with its value
  (:func:`note_env`, called by :mod:`indexer_topk.envs`).

A later call of the signature calls :meth:`Replay.run`: the same allocations (as one), then
each kernel with the new addresses, on the current stream: through the CUDA driver with a
parameter block built at recording (:mod:`indexer_topk.kernels.driver_launch`, where it
reproduces the launch exactly and ``INDEXER_TOPK_DRIVER_LAUNCH`` is on), else through the
kernel's Triton launcher directly. Under Triton's interpreter (no compiled kernels) a replay
rebuilds each tensor argument as a view of the new roots and launches through the interpreter,
so the same mapping runs on a CPU.

What a replay skips is Triton's per-launch dispatch: launch hooks (profilers attach there) do
not see replayed launches; a launch recorded while a hook is set keeps Triton's launcher.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .contract import storage_span
from .environ import Snapshot

# The interpreter patches triton.language's module state for the length of a launch, so two
# interpreted launches at once (threads) break each other: every interpreted launch holds this.
INTERPRETER_LOCK = threading.RLock()

_LOCAL = threading.local()
_ALLOCATIONS = (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default)
SCRATCH_ALIGN = 512  # bytes: the CUDA caching allocator's block alignment


class NotReplayable(Exception):
    """A recorded call cannot be replayed (the reason is the message)."""


def current() -> Optional["Recorder"]:
    """The recorder watching this thread's backend call, or ``None``."""
    return getattr(_LOCAL, "recorder", None)


def note_env(name: str, raw: Optional[str]) -> None:
    """Remember that the call being recorded read environment variable ``name`` as ``raw``."""
    rec = current()
    if rec is not None:
        rec.env.setdefault(name, raw)


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, recorded when a :class:`Recorder` watches this thread.

    Every launch of this package goes through here, so a call whose launches all do can be
    replayed.
    """
    rec = current()
    if rec is None:
        return kernel[grid](*args, **kwargs)
    rec.in_launch += 1  # what Triton (or its interpreter) does inside a launch is not host work of ours
    try:
        compiled = kernel[grid](*args, **kwargs)
    finally:
        rec.in_launch -= 1
    rec.add_launch(kernel, grid, args, kwargs, compiled)
    return compiled


class _Address:
    """A tensor descriptor's base at replay: the launcher only asks it for its address."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def _rebased(desc, base):
    """A copy of the tensor descriptor ``desc`` over ``base`` (its validation already ran once)."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


def _is_descriptor(a) -> bool:
    return hasattr(a, "block_shape") and isinstance(getattr(a, "base", None), torch.Tensor)


class _Watch(TorchDispatchMode):
    """Sees every torch operation of the recorded call: allocations become steps, views are
    free, anything else makes the call not replayable."""

    def __init__(self, rec: "Recorder"):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        rec = self.rec
        if not rec.in_launch:
            if func in _ALLOCATIONS:
                rec.add_alloc(out)
            elif not getattr(func, "is_view", False):
                rec.fail(f"it runs {func} on the host")
        return out


class Recorder:
    """Watches one backend call over ``roots`` (the call's tensors, ``None`` where absent).

    Use as a context manager around the call; afterwards :meth:`replay` gives the
    :class:`Replay`, or ``None`` with :attr:`why_not` saying why there is none.
    """

    def __init__(self, roots: Sequence[Optional[torch.Tensor]], driver_launches: bool = False):
        self.driver_launches = driver_launches
        self.spans: List[Optional[Tuple[int, int]]] = [storage_span(t) for t in roots]
        self._located: Dict[int, Tuple[int, int]] = {}  # address -> (span, offset), while the spans hold
        self.steps: list = []
        self.env: Dict[str, Optional[str]] = {}
        self.why_not: Optional[str] = None
        self.scratch_bytes = 0  # of the scratch allocations so far, each at an aligned offset
        self.in_launch = 0
        self._watch = _Watch(self)

    def __enter__(self) -> "Recorder":
        if current() is not None:
            raise RuntimeError("a backend call is already being recorded on this thread")
        _LOCAL.recorder = self
        self._watch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._watch.__exit__(*exc)
        finally:
            _LOCAL.recorder = None

    def fail(self, why: str) -> None:
        if self.why_not is None:
            self.why_not = why

    def _locate(self, ptr: int) -> Optional[Tuple[int, int]]:
        hit = self._located.get(ptr)  # the kernels of a call share most of their arguments
        if hit is not None:
            return hit
        hits = [(i, ptr - s[0]) for i, s in enumerate(self.spans) if s is not None and s[0] <= ptr < s[1]]
        if len(hits) != 1:
            # outside every root (a tensor of its own), or inside two that overlap: which one it
            # follows in another call is unknown
            self.fail(f"a kernel argument at {ptr:#x} lies in {len(hits)} of the call's tensors")
            return None
        hit = self._located[ptr] = hits[0]
        return hit

    def add_alloc(self, t: torch.Tensor) -> None:
        # laid out in the replay's one scratch allocation as the allocator aligns its blocks
        nbytes = t.untyped_storage().nbytes()
        self.steps.append(_Alloc(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, self.scratch_bytes, nbytes))
        self.scratch_bytes += -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        self.spans.append(storage_span(t) or (-1, -1))
        self._located.clear()  # an address outside every span so far may lie in this one

    def add_launch(self, kernel, grid, args, kwargs, compiled) -> None:
        if self.why_not is not None:
            return
        if callable(grid) or not 1 <= len(grid) <= 3:
            return self.fail("a launch grid is not a tuple")
        names = list(kernel.arg_names)
        params = list(args)
        for name in names[len(args):]:
            if name in kwargs:
                params.append(kwargs[name])
            else:
                default = _defaults(kernel.fn).get(name, inspect.Parameter.empty)
                if default is inspect.Parameter.empty:
                    return self.fail(f"{name} of {kernel} has no value")
                params.append(default)
        options = {k: v for k, v in kwargs.items() if k not in names}
        template: List[Any] = []
        tensors, descriptors = [], []
        for i, a in enumerate(params):
            if isinstance(a, torch.Tensor):
                where = self._locate(a.data_ptr())
                if where is None:
                    return
                tensors.append((i, *where, a.dtype, tuple(a.shape), tuple(a.stride())))
                template.append(None)
            elif _is_descriptor(a):
                where = self._locate(a.base.data_ptr())
                if where is None:
                    return
                descriptors.append((i, *where, _rebased(a, None)))
                template.append(None)
            else:
                template.append(a)
        if any(isinstance(v, torch.Tensor) for v in options.values()):
            return self.fail("a launch option is a tensor")
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        if all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
            step = _Launch(grid3, template, tensors, descriptors, compiled)
            if self.driver_launches:
                from .kernels.driver_launch import driver_launch
                try:
                    step.driver = driver_launch(compiled, grid3, params, step.ptrs, descriptors,
                                                torch.cuda.current_device())
                except Exception:  # noqa: BLE001 - whatever it cannot build keeps Triton's launcher
                    step.driver = None
            self.steps.append(step)
        elif compiled is None and not descriptors:  # the interpreter: launch it again through it
            self.steps.append(_Interpreted(kernel, tuple(grid), template, tensors, options))
        else:
            self.fail(f"a launch of {kernel} returned {type(compiled).__name__}")

    def replay(self) -> Optional["Replay"]:
        if len({s.device for s in self.steps if isinstance(s, _Alloc)}) > 1:
            self.fail("its scratch lies on two devices")
        if self.why_not is not None:
            return None
        return Replay(tuple(self.steps), tuple(self.env.items()), self.scratch_bytes)


@functools.lru_cache(maxsize=256)
def _defaults(fn) -> Dict[str, Any]:
    """The default of each parameter of a kernel's Python function (read from its signature:
    an interpreted kernel has no ``.signature`` of its own), read once per kernel."""
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()}


class _Alloc:
    """A scratch tensor of the recorded call: its view, and where its ``nbytes`` lie in the
    replay's one allocation (``offset``)."""

    __slots__ = ("shape", "stride", "dtype", "device", "offset", "nbytes")

    def __init__(self, shape, stride, dtype, device, offset, nbytes):
        self.shape, self.stride, self.dtype, self.device = shape, stride, dtype, device
        self.offset, self.nbytes = offset, nbytes


class _Launch:
    """A compiled launch: the launcher, its function handle and metadata, the arguments with
    their address slots."""

    __slots__ = ("grid", "template", "ptrs", "descs", "compiled", "launcher", "function", "metadata", "driver")

    def __init__(self, grid, template, tensors, descriptors, compiled):
        self.driver = None  # a DriverLaunch (kernels/driver_launch.py) where one reproduces this launch
        self.compiled = compiled  # keeps its module loaded: Triton unloads it with the last reference
        self.grid = grid
        self.template = tuple(template)
        self.ptrs = tuple((i, r, off) for i, r, off, *_ in tensors)
        self.descs = tuple(descriptors)
        self.launcher, self.function, self.metadata = compiled.run, compiled.function, compiled.packed_metadata

    def run(self, ptrs: List[int], tensors, stream: int) -> None:
        if self.driver is not None:
            return self.driver.run(ptrs, stream)
        params = list(self.template)
        for i, r, off in self.ptrs:
            params[i] = ptrs[r] + off
        for i, r, off, desc in self.descs:
            params[i] = _rebased(desc, _Address(ptrs[r] + off))
        gx, gy, gz = self.grid
        self.launcher(gx, gy, gz, stream, self.function, self.metadata, None, None, None, *params)


class _Interpreted:
    """An interpreted launch: tensor arguments are rebuilt as views of the new roots."""

    __slots__ = ("kernel", "grid", "template", "tensors", "options")

    def __init__(self, kernel, grid, template, tensors, options):
        self.kernel, self.grid, self.template, self.tensors, self.options = kernel, grid, template, tensors, options

    def run(self, ptrs: List[int], tensors, stream: int) -> None:
        params = list(self.template)
        for i, r, off, dtype, shape, stride in self.tensors:
            params[i] = _view_at(tensors[r], off, dtype, shape, stride)
        with INTERPRETER_LOCK:
            self.kernel[self.grid](*params, **self.options)


def _view_at(root: torch.Tensor, offset: int, dtype, shape, stride) -> torch.Tensor:
    start = root.storage_offset() * root.element_size() + offset
    if start % dtype.itemsize:
        raise NotReplayable(f"byte {start} is not a {dtype} boundary")
    return torch.empty(0, dtype=dtype, device=root.device).set_(root.untyped_storage(), start // dtype.itemsize,
                                                                  shape, stride)


class Replay:
    """The recorded launches of one call signature (see the module docstring).

    ``env``: the environment values the recorded call read (``(name, value or None)`` pairs, kept
    as a :class:`~indexer_topk.environ.Snapshot`); :meth:`matches_env` says whether they still hold.
    """

    __slots__ = ("steps", "env", "compiled", "scratch_bytes", "device")

    def __init__(self, steps, env, scratch_bytes: int = 0):
        self.steps = steps
        self.env = Snapshot(env)
        self.compiled = not any(isinstance(s, _Interpreted) for s in steps)
        # the call's scratch tensors, made as one allocation at the start of a replay (one
        # allocator call instead of one per tensor), at the offsets the recorder laid out
        self.scratch_bytes = scratch_bytes
        self.device = next((s.device for s in steps if isinstance(s, _Alloc)), None)

    def matches_env(self) -> bool:
        return self.env.holds()

    def run(self, roots: Sequence[Optional[torch.Tensor]], ptrs: List[Optional[int]], stream: int) -> None:
        """Launch the recorded kernels over ``roots`` (the call's tensors in the recorded order,
        ``ptrs`` their addresses) on ``stream`` (a raw CUDA stream; unused when interpreted)."""
        ptrs = list(ptrs)
        tensors = list(roots) if not self.compiled else None
        # scratch lives until its kernels are queued; the allocator orders reuse by stream
        scratch = base = None
        if self.device is not None:
            scratch = torch.empty(self.scratch_bytes, dtype=torch.uint8, device=self.device)
            base = scratch.data_ptr()
        for step in self.steps:
            if isinstance(step, _Alloc):
                ptrs.append(base + step.offset)
                if tensors is not None:
                    tensors.append(_view_at(scratch, step.offset, step.dtype, step.shape, step.stride))
            else:
                step.run(ptrs, tensors, stream)


__all__ = ["INTERPRETER_LOCK", "NotReplayable", "Recorder", "Replay", "current", "launch", "note_env"]
