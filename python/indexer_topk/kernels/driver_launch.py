"""Replayed launches straight through the CUDA driver's ``cuLaunchKernelEx``.

A replayed call (:mod:`indexer_topk.replay`) knows everything about each of its launches except
where the call's tensors are. Triton's launcher still rebuilds the whole launch every time: its
Python wrapper allocates scratch, expands each tensor descriptor (encoding a fresh ``CUtensorMap``
on every launch), and its C part parses every argument again. A :class:`DriverLaunch` builds the
kernel's parameter block once, from the compiled kernel and the recorded arguments, and a later
launch rewrites only the address slots before one ``cuLaunchKernelEx``, with the same grid, block,
shared memory and launch attributes (programmatic dependent launch, cooperative grid) as
Triton's own launcher sets.

The parameter block is laid out from the kernel's signature (constexprs dropped, each tensor
descriptor expanded as Triton expands it) and then checked, parameter by parameter, against the
``.entry`` declaration of the kernel's PTX, which must hold exactly those parameters (each of
the same size and kind, float or bits) and the two scratch pointers Triton appends. Where they
disagree, or the kernel needs global or profile scratch, clusters or launch hooks, or a recorded
value does not fit its parameter's type, :func:`driver_launch` returns ``None`` and the replay
keeps Triton's launcher. A tensor descriptor's ``CUtensorMap`` is encoded by Triton's own code
once per base address and kept (up to a bound) for the launches that follow.
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

# CUlaunchAttributeID values of cuda.h (CUDA 12)
_ATTR_COOPERATIVE = 2
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_TMAP_BYTES = 128  # sizeof(CUtensorMap)
_TMAPS_KEPT = 256  # encoded maps a launch keeps (per distinct base address) before it starts over


class _Attr(ctypes.Structure):
    # CUlaunchAttribute: the id, padding to 8 bytes, then the 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):
    # CUlaunchConfig
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)), ("numAttrs", ctypes.c_uint),
    ]


_DRIVER: Dict[str, Any] = {}


_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT: no context current on the calling thread


def _driver():
    """The process's libcuda entry points this module calls, as ``(cuLaunchKernelEx,
    cuGetErrorString, make_current)``, or ``None`` without a driver; ``make_current(ordinal)``
    makes that device's primary context current on the calling thread."""
    if "fns" not in _DRIVER:
        fns = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            launch_ex = lib.cuLaunchKernelEx
            launch_ex.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            launch_ex.restype = ctypes.c_int
            err = lib.cuGetErrorString
            err.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            err.restype = ctypes.c_int
            get_device, retain, set_current = lib.cuDeviceGet, lib.cuDevicePrimaryCtxRetain, lib.cuCtxSetCurrent

            def make_current(ordinal: int) -> int:
                dev, ctx = ctypes.c_int(), ctypes.c_void_p()
                return (get_device(ctypes.byref(dev), ordinal) or retain(ctypes.byref(ctx), dev)
                        or set_current(ctx))

            fns = (launch_ex, err, make_current)
        except (OSError, AttributeError):
            pass
        _DRIVER["fns"] = fns
    return _DRIVER["fns"]


# one parameter of a PTX .entry: ".param .u64 .ptr .global .align 1 name", ".param .u32 name",
# ".param .align 64 .b8 name[128]": its type, then (an array) its element count at the end
_PTX_PARAM_TYPE = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\b")
_PTX_PARAM_COUNT = re.compile(r"\[(\d+)\]$")


@functools.lru_cache(maxsize=256)
def ptx_params(ptx: str, name: str) -> Optional[Tuple[Tuple[str, int], ...]]:
    """``(kind, bytes)`` of each parameter of kernel ``name``'s ``.entry`` in ``ptx``, in order;
    ``kind`` is the PTX type's letter (``f`` float, ``u`` / ``s`` / ``b`` bits). Kept per kernel:
    every signature that records a launch of it asks again (a string hashes once)."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\(([^)]*)\)", ptx)
    if m is None:
        return None
    params = []
    for part in m.group(1).split(","):
        part = part.strip()
        if not part:
            continue
        p = _PTX_PARAM_TYPE.match(part)
        if p is None:
            return None
        width = int(p.group(2)) // 8
        count = _PTX_PARAM_COUNT.search(part)
        params.append((p.group(1)[0], width * int(count.group(1)) if count else width))
    return tuple(params)


# the ctypes type of each Triton signature type of a scalar parameter
_SCALARS = {
    "i8": ctypes.c_int8, "u8": ctypes.c_uint8, "i16": ctypes.c_int16, "u16": ctypes.c_uint16,
    "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64,
    "fp32": ctypes.c_float, "f32": ctypes.c_float, "fp64": ctypes.c_double,
}


def _tensordesc_expander():
    """Triton's own expansion of a host tensor descriptor into kernel arguments
    (``[CUtensorMap, *shape, *strides]``), or ``None`` where this Triton has none we know."""
    try:
        from triton.backends.nvidia import driver as nv
    except ImportError:
        return None
    fn = getattr(nv, "make_tensordesc_arg", None)
    n = None if fn is None else _arity(fn)
    if n == 2:
        return lambda desc, meta: fn(desc, meta)
    if n == 3:
        return lambda desc, meta: fn(desc, meta, None)
    return None


@functools.lru_cache(maxsize=16)
def _arity(fn) -> Optional[int]:
    """How many parameters ``fn`` takes (read with ``inspect`` once per function)."""
    try:
        import inspect
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _tmap_address(obj) -> Optional[int]:
    """Address of the ``CUtensorMap`` inside Triton's ``PyCUtensorMap`` object: the struct's last
    member (``PyObject_HEAD``, then the 64-byte-aligned 128-byte map)."""
    size = getattr(type(obj), "__basicsize__", 0)
    if type(obj).__name__ != "PyCUtensorMap" or size < _TMAP_BYTES + 16:
        return None
    return id(obj) + size - _TMAP_BYTES


def _launch_hooks() -> bool:
    """Whether Triton's launch enter or exit hook is set (a chain of hooks counts when it holds
    one)."""
    try:
        from triton import knobs
        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    except (ImportError, AttributeError):
        return False
    return any(h is not None and (not hasattr(h, "calls") or len(h.calls) > 0) for h in hooks)


class DriverLaunch:
    """One recorded launch's parameter block, launched again by :meth:`run` at new addresses.

    Built by :func:`driver_launch`. ``ptr_slots``: ``(cell, root, byte offset)`` of each tensor
    argument's parameter; ``desc_slots``: ``(parameter, metadata, descriptor, root, byte
    offset)`` of each tensor descriptor's map.
    """

    __slots__ = ("compiled", "device", "config", "attrs", "cells", "params", "ptr_slots", "desc_slots", "tmaps",
                 "expand", "lock")

    def __init__(self, compiled, grid, cells, ptr_slots, desc_slots, expand, device: int = 0):
        md = compiled.metadata
        self.compiled = compiled  # keeps the module (and so the function) loaded
        self.device = device  # the CUDA ordinal the function was loaded on
        # one parameter block per launch: a replay on another thread waits for this one's
        # launch to copy it (ctypes lets go of the GIL inside the driver call)
        self.lock = threading.Lock()
        self.cells = cells  # the parameters' storage, which self.params points into
        self.params = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
        self.ptr_slots = tuple(ptr_slots)
        self.desc_slots = tuple(desc_slots)
        self.tmaps: Dict[Tuple[int, int], Tuple[Any, int]] = {}
        self.expand = expand
        attrs = []
        if getattr(md, "launch_pdl", False):
            attrs.append(_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
        if getattr(md, "launch_cooperative_grid", False):
            attrs.append(_ATTR_COOPERATIVE)
        self.attrs = (_Attr * max(len(attrs), 1))()
        for i, a in enumerate(attrs):
            self.attrs[i].id = a
            self.attrs[i].value[0] = 1
        gx, gy, gz = grid
        self.config = _Config(gx, gy, gz, 32 * md.num_warps, 1, 1, md.shared, None, self.attrs, len(attrs))

    def run(self, ptrs: Sequence[int], stream: int) -> None:
        """Launch on ``stream`` over the roots at addresses ``ptrs`` (indexed as the recording's)."""
        launch_ex, err, make_current = _driver()
        with self.lock:
            if len(self.tmaps) >= _TMAPS_KEPT:
                # one map per layer's key pages and per query buffer: a bound, not a working set.
                # Cleared before any slot is written, never between two of one launch's slots,
                # whose maps must all live until the driver has copied the block.
                self.tmaps.clear()
            for cell, r, off in self.ptr_slots:
                cell.value = ptrs[r] + off
            for first, meta, desc, r, off in self.desc_slots:
                base = ptrs[r] + off
                hit = self.tmaps.get((first, base))
                if hit is None:
                    hit = self._encode(first, meta, desc, base)
                self.params[first] = hit[1]
            self.config.hStream = stream
            rc = launch_ex(ctypes.byref(self.config), self.compiled.function, self.params, None)
            if rc == _INVALID_CONTEXT and not make_current(self.device):
                # a thread that never made a CUDA call: as Triton's own launcher does, it gets the
                # device's primary context
                rc = launch_ex(ctypes.byref(self.config), self.compiled.function, self.params, None)
        if rc:
            msg = ctypes.c_char_p()
            err(rc, ctypes.byref(msg))
            raise RuntimeError(f"cuLaunchKernelEx of {self.compiled.metadata.name}: "
                               f"{(msg.value or b'').decode()} (CUresult {rc})")

    def _encode(self, first, meta, desc, base):
        from ..replay import _Address, _rebased
        obj = self.expand(_rebased(desc, _Address(base)), meta)[0]
        hit = (obj, _tmap_address(obj))  # the object owns the map's memory: it is kept with it
        self.tmaps[(first, base)] = hit
        return hit


def driver_launch(compiled, grid, params: Sequence[Any], tensors: Sequence[Tuple[int, int, int]],
                  descriptors: Sequence[Tuple[int, int, int, Any]], device: int = 0) -> Optional[DriverLaunch]:
    """A :class:`DriverLaunch` of ``compiled`` (a Triton ``CompiledKernel``) over ``grid`` (3
    ints) with the recorded arguments ``params`` (one per Python parameter, constexprs
    included), where ``tensors`` gives ``(argument, root, byte offset)`` of each tensor argument
    and ``descriptors`` ``(argument, root, byte offset, descriptor)`` of each tensor descriptor;
    ``None`` where the launch is not one this module reproduces exactly (see the module
    docstring), or where no CUDA driver is loaded. ``device``: the CUDA ordinal it ran on."""
    if _driver() is None:
        return None
    return build_launch(compiled, grid, params, tensors, descriptors, device)


def build_launch(compiled, grid, params, tensors, descriptors, device: int = 0) -> Optional[DriverLaunch]:
    """:func:`driver_launch` without its look for a CUDA driver (the parameter block alone is
    built and checked; :meth:`DriverLaunch.run` needs the driver)."""
    md = getattr(compiled, "metadata", None)
    src = getattr(compiled, "src", None)
    asm = getattr(compiled, "asm", None) or {}
    if md is None or src is None or "ptx" not in asm or not isinstance(getattr(compiled, "function", None), int):
        return None
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        return None
    if getattr(md, "shared", 0) > 228 * 1024 or len(grid) != 3 or min(grid) <= 0:
        return None
    if _launch_hooks():
        return None  # a profiler watches Triton's launches: leave them to Triton
    ptx = ptx_params(asm["ptx"], md.name)
    sizes = None if ptx is None else [size for _, size in ptx]
    names = list(src.fn.arg_names)
    signature = src.signature
    if sizes is None or len(names) != len(params) or any(n not in signature for n in names):
        return None
    where = {i: (r, off) for i, r, off in tensors}
    descs = {i: (r, off, d) for i, r, off, d in descriptors}
    metas = list(getattr(md, "tensordesc_meta", None) or [])
    expand = _tensordesc_expander() if descs else None
    if descs and expand is None:
        return None
    cells: List[Any] = []
    ptr_slots, desc_slots, desc_ints = [], [], []
    for i, name in enumerate(names):
        ty = signature[name]
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            return None  # tuples: no kernel of this package takes one
        if i in descs:
            r, off, desc = descs[i]
            meta = metas[len(desc_slots)] if len(desc_slots) < len(metas) else None
            try:
                expanded = expand(params[i], meta)
            except Exception:  # noqa: BLE001 - whatever fails keeps Triton's launcher
                return None
            if not expanded or _tmap_address(expanded[0]) is None or not all(isinstance(v, int) for v in expanded[1:]):
                return None
            desc_slots.append((len(cells), meta, desc, r, off))
            desc_ints.append((len(cells) + 1, expanded[1:]))
            cells.append(_TMAP_BYTES)  # the map's slot, pointed at its encoded map at each launch
            cells.extend([None] * (len(expanded) - 1))  # shape and strides: widths from the PTX
            continue
        if ty.startswith("*"):
            if i not in where:
                return None
            cell = ctypes.c_uint64(0)
            ptr_slots.append((cell, *where[i]))
            cells.append(cell)
            continue
        scalar = _SCALARS.get(ty)
        v = params[i]
        floating = scalar in (ctypes.c_float, ctypes.c_double)
        if scalar is None or isinstance(v, bool) or not isinstance(v, (int, float) if floating else int):
            return None
        cells.append(scalar(v))
    # the global and profile scratch pointers Triton appends to every kernel: null, as both
    # scratch sizes are 0 (checked above)
    if len(sizes) != len(cells) + 2 or sizes[-2:] != [8, 8]:
        return None
    cells.extend(ctypes.c_uint64(0) for _ in range(2))
    for first, ints in desc_ints:
        for j, v in enumerate(ints):
            width = sizes[first + j]
            if width not in (4, 8):
                return None
            cells[first + j] = (ctypes.c_int32 if width == 4 else ctypes.c_int64)(v)
    for cell, (kind, size) in zip(cells, ptx):
        if (cell if isinstance(cell, int) else ctypes.sizeof(cell)) != size:
            return None
        if isinstance(cell, (ctypes.c_float, ctypes.c_double)) != (kind == "f"):
            return None  # a float where the kernel takes bits, or the other way
    # a map's slot holds a zeroed block until its first launch points it at the encoded map
    cells = [(ctypes.c_uint8 * c)() if isinstance(c, int) else c for c in cells]
    return DriverLaunch(compiled, tuple(grid), cells, ptr_slots, desc_slots, expand, device)


__all__ = ["DriverLaunch", "build_launch", "driver_launch", "ptx_params"]
