"""The parameter block of a replayed launch through the CUDA driver
(:mod:`indexer_topk.kernels.driver_launch`): laid out from the kernel's signature, checked against
its PTX, and refused wherever the two disagree. The launches themselves run on the GPU
(``test_replay.py::test_compiled_replays_give_the_full_paths_bits``)."""

import ctypes
import re
import types

import pytest
import torch
import triton.language as tl

from indexer_topk.kernels.driver_launch import build_launch, ptx_params


def _probe_kernel(x, n, scale, big, y, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0)
    tl.store(y + offs, v * scale + big.to(tl.float32), mask=offs < n)


# Both kernels compiled for sm_90 in a process of their own, without the interpreter: an
# interpreted launch patches triton.language while it runs, and a process that has run kernels
# under the interpreter cannot be trusted to compile (one run of the suite found it patched).
_BUILDS = {
    "probe": ("_probe_kernel", {"x": "*fp32", "n": "i32", "scale": "fp32", "big": "i64", "y": "*fp32",
                                "BLOCK": "constexpr"}, {"BLOCK": 128}),
    "descriptor": ("_descriptor_kernel", {"n": "i32", "desc": "tensordesc<fp16[64, 64]>", "out": "*fp32",
                                          "scale": "fp32", "BLOCK": "constexpr"}, {"BLOCK": 64}),
}
_COMPILE = """
import pickle, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
sys.path.insert(0, sys.argv[1])
import test_driver_launch as here
out = {}
for key, (name, sig, const) in here._BUILDS.items():
    k = triton.compile(ASTSource(JITFunction(getattr(here, name)), sig, const), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    out[key] = (k.metadata._asdict(), {"ptx": k.asm["ptx"]}, list(k.src.fn.arg_names))
sys.stdout.buffer.write(pickle.dumps(out))
"""


@pytest.fixture(scope="module")
def hopper_builds():
    """``_BUILDS`` compiled for sm_90 (no GPU needed), each as a launch would have it: metadata,
    the PTX, and the source's argument names and signature."""
    import collections
    import os
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent / "python"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(here)], env=env, capture_output=True, timeout=600)
    if done.returncode:
        pytest.fail(f"compiling for sm_90 without a GPU failed: {done.stderr.decode()[-2000:]}")
    builds = {}
    for key, (md, asm, names) in pickle.loads(done.stdout).items():
        metadata = collections.namedtuple("KernelMetadata", md)(**md)
        src = types.SimpleNamespace(fn=types.SimpleNamespace(arg_names=names), signature=_BUILDS[key][1])
        builds[key] = types.SimpleNamespace(metadata=metadata, src=src, asm=asm)
    return builds


@pytest.fixture(scope="module")
def compiled(hopper_builds):
    """``_probe_kernel`` compiled for sm_90 (no GPU needed), as a launch would have it."""
    return types.SimpleNamespace(**vars(hopper_builds["probe"]), function=1234)


PARAMS = [None, 1000, 0.5, 1 << 40, None, 128]
TENSORS = [(0, 0, 16), (4, 2, 0)]  # (argument, root, byte offset)


def test_ptx_params():
    ptx = """
    .visible .entry k(
        .param .u64 .ptr .global .align 1 k_param_0,
        .param .u32 k_param_1,
        .param .align 64 .b8 k_param_2[128],
        .param .f32 k_param_3,
        .param .u64 k_param_4
    )
    .maxntid 128, 1, 1
    {"""
    assert ptx_params(ptx, "k") == (("u", 8), ("u", 4), ("b", 128), ("f", 4), ("u", 8))
    assert ptx_params(ptx, "other") is None


def test_block_matches_the_kernels_ptx(compiled):
    dl = build_launch(compiled, (3, 1, 1), PARAMS, TENSORS, [])
    assert dl is not None
    sizes = [size for _, size in ptx_params(compiled.asm["ptx"], compiled.metadata.name)]
    assert [ctypes.sizeof(c) for c in dl.cells] == sizes
    # the arguments in order (the constexpr dropped), then Triton's null scratch pointers
    assert [c.value for c in dl.cells[:5]] == [0, 1000, 0.5, 1 << 40, 0]
    assert all(c.value == 0 for c in dl.cells[5:])
    assert len(sizes) in (5, 6, 7)
    assert dl.params[1] == ctypes.addressof(dl.cells[1])
    # the address slots follow their roots
    (c0, r0, o0), (c4, r4, o4) = dl.ptr_slots
    assert (c0 is dl.cells[0], r0, o0) == (True, 0, 16) and (c4 is dl.cells[4], r4, o4) == (True, 2, 0)
    cfg = dl.config
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX) == (3, 1, 1, 128)
    assert (cfg.sharedMemBytes, cfg.numAttrs) == (compiled.metadata.shared, 0)


def test_launch_attributes_follow_the_metadata(compiled):
    md = compiled.metadata._replace(launch_pdl=True)
    dl = build_launch(types.SimpleNamespace(**{**vars(compiled), "metadata": md}), (3, 1, 1), PARAMS, TENSORS, [])
    assert dl.config.numAttrs == 1 and dl.attrs[0].id == 6 and dl.attrs[0].value[0] == 1


@pytest.mark.parametrize("change", ["ptx_param_missing", "ptx_param_wider", "ptx_float_as_bits", "ptx_scratch_missing",
                                    "global_scratch", "clusters", "tensor_not_recorded", "float_for_int",
                                    "grid_empty", "hook"])
def test_anything_it_cannot_reproduce_keeps_tritons_launcher(compiled, change, monkeypatch):
    k = types.SimpleNamespace(**vars(compiled))
    params, tensors, grid = list(PARAMS), list(TENSORS), (3, 1, 1)
    name = compiled.metadata.name
    if change == "ptx_param_missing":
        k.asm = {**k.asm, "ptx": k.asm["ptx"].replace(f".param .u32 {name}_param_1,", "")}
    elif change == "ptx_param_wider":
        k.asm = {**k.asm, "ptx": k.asm["ptx"].replace(f".param .u32 {name}_param_1", f".param .u64 {name}_param_1")}
    elif change == "ptx_float_as_bits":  # same size, another kind: a float passed as bits is another value
        k.asm = {**k.asm, "ptx": k.asm["ptx"].replace(f".param .f32 {name}_param_2", f".param .u32 {name}_param_2")}
    elif change == "ptx_scratch_missing":  # one trailing pointer fewer than the two Triton appends
        ptx = k.asm["ptx"]
        last = max(i for i in range(7) if f"{name}_param_{i}" in ptx)
        k.asm = {**k.asm, "ptx": re.sub(r",\s*\.param[^,)]*" + f"{name}_param_{last}" + r"\b", "", ptx)}
    elif change == "global_scratch":
        k.metadata = k.metadata._replace(global_scratch_size=64)
    elif change == "clusters":
        k.metadata = k.metadata._replace(num_ctas=2)
    elif change == "tensor_not_recorded":
        tensors = tensors[:1]
    elif change == "float_for_int":  # a value the i32 parameter cannot hold as recorded
        params[1] = 2.5
    elif change == "grid_empty":
        grid = (0, 1, 1)
    elif change == "hook":
        from triton import knobs
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert build_launch(compiled, (3, 1, 1), PARAMS, TENSORS, []) is not None or change == "hook"
    assert build_launch(k, grid, params, tensors, []) is None


class FakeDriver:
    """Stands in for libcuda: records what each launch would have read from its parameter block."""

    def __init__(self, codes=()):
        self.codes = list(codes)  # CUresult of the next launches (then 0)
        self.launches = []
        self.made_current = []
        self.read = (0, 1)  # the parameters that point into a block (read as they are at launch)

    def launch_ex(self, config, function, params, extra):
        cfg = config._obj
        block = [ctypes.c_uint64.from_address(params[i]).value for i in self.read]
        self.launches.append((cfg.hStream, function, block, params[0]))
        return self.codes.pop(0) if self.codes else 0

    def error_string(self, rc, out):
        out._obj.value = b"an error"
        return 0

    def make_current(self, ordinal):
        self.made_current.append(ordinal)
        return 0


@pytest.fixture
def fake_driver(monkeypatch):
    from indexer_topk.kernels import driver_launch as dl

    fake = FakeDriver()
    monkeypatch.setitem(dl._DRIVER, "fns", (fake.launch_ex, fake.error_string, fake.make_current))
    return fake


def two_pointer_launch(compiled):
    """A launch of a kernel taking two pointers: argument 0 at root 0 + 16, argument 1 at root 2."""
    from indexer_topk.kernels.driver_launch import DriverLaunch

    cells = [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    return DriverLaunch(compiled, (2, 1, 1), cells, [(cells[0], 0, 16), (cells[1], 2, 0)], [], None, device=3)


def test_run_writes_each_address_into_its_slot(compiled, fake_driver):
    dl = two_pointer_launch(compiled)
    dl.run([1000, 5, 7000], stream=42)
    dl.run([2000, 5, 9000], stream=43)
    assert fake_driver.launches == [(42, 1234, [1016, 7000], ctypes.addressof(dl.cells[0])),
                                    (43, 1234, [2016, 9000], ctypes.addressof(dl.cells[0]))]


def test_run_makes_a_context_current_once_asked_and_reports_errors(compiled, fake_driver):
    dl = two_pointer_launch(compiled)
    fake_driver.codes = [201]  # no context on this thread: the device's primary one, then again
    dl.run([0, 0, 0], stream=1)
    assert fake_driver.made_current == [3] and len(fake_driver.launches) == 2
    fake_driver.codes = [700]
    with pytest.raises(RuntimeError, match=r"an error \(CUresult 700\)"):
        dl.run([0, 0, 0], stream=1)


def test_a_descriptor_is_encoded_once_per_address(compiled, fake_driver, monkeypatch):
    from indexer_topk.kernels import driver_launch as dl_module
    from indexer_topk.kernels.driver_launch import DriverLaunch

    encoded = []

    def expand(desc, meta):
        encoded.append(desc.base.data_ptr())
        return [types.SimpleNamespace(addr=desc.base.data_ptr() + 1)]

    monkeypatch.setattr(dl_module, "_tmap_address", lambda obj: obj.addr)
    cells = [(ctypes.c_uint8 * 128)(), ctypes.c_uint64(0)]
    class Descriptor:  # a host tensor descriptor as replay rebases it: attributes, one of them base
        def __init__(self):
            self.base, self.block_shape = None, [64, 128]

    desc = Descriptor()
    dl = DriverLaunch(compiled, (1, 1, 1), cells, [(cells[1], 1, 0)], [(0, None, desc, 0, 64)], expand)
    fake_driver.read = (1,)  # slot 0 points at the (fake) encoded map
    for base in (1000, 1000, 3000, 1000):
        dl.run([base, 77], stream=0)
    assert encoded == [1064, 3064]  # a map per distinct base (root + offset), reused after
    assert [(launch[3], launch[2]) for launch in fake_driver.launches] == [(1065, [77]), (1065, [77]), (3065, [77]),
                                                                            (1065, [77])]


def test_concurrent_replays_never_launch_each_others_addresses(compiled, monkeypatch):
    """ctypes lets go of the GIL inside the driver call: two threads replaying one launch must
    each launch with their own addresses (the block is locked until the driver has copied it)."""
    import threading
    import time

    from indexer_topk.kernels import driver_launch as dl_module

    seen = []

    def slow_launch(config, function, params, extra):
        first = ctypes.c_uint64.from_address(params[0]).value
        time.sleep(0.0005)  # the window another thread would write in
        seen.append((first, ctypes.c_uint64.from_address(params[1]).value))
        return 0

    monkeypatch.setitem(dl_module._DRIVER, "fns", (slow_launch, None, None))
    dl = two_pointer_launch(compiled)

    def worker(k):
        for _ in range(50):
            dl.run([k * 100, 0, k * 100 + 1], stream=0)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 200
    assert all(b == a - 16 + 1 for a, b in seen), [p for p in seen if p[1] != p[0] - 15][:5]


class _Map:
    """Stands in for Triton's ``PyCUtensorMap``: owns a 128-byte block."""

    def __init__(self, tag):
        self.buf = (ctypes.c_uint64 * 16)(*([tag] * 16))


class _Descriptor:
    """A host tensor descriptor as a replay rebases it: plain attributes, one of them ``base``."""

    def __init__(self):
        self.base, self.block_shape, self.shape, self.strides = None, [64, 64], [64, 64], [64, 1]


def test_every_map_of_a_launch_lives_until_the_driver_copies_it(compiled, monkeypatch):
    """Two descriptors, the cache full: the maps a launch points at are alive when it launches,
    also when its second slot's miss would start the cache over."""
    import weakref

    from indexer_topk.kernels import driver_launch as dl_module
    from indexer_topk.kernels.driver_launch import DriverLaunch

    alive = {}

    def expand(desc, meta):
        m = _Map(desc.base.data_ptr())
        alive[ctypes.addressof(m.buf)] = weakref.ref(m)
        return [m, 64, 64, 64, 1]

    seen = []

    def launch(config, function, params, extra):
        for slot in (0, 1):
            ref = alive.get(params[slot])
            seen.append(ref is not None and ref() is not None
                        and ctypes.c_uint64.from_address(params[slot]).value == {0: bases[0], 1: bases[1]}[slot])
        return 0

    monkeypatch.setattr(dl_module, "_tmap_address", lambda obj: ctypes.addressof(obj.buf))
    monkeypatch.setitem(dl_module._DRIVER, "fns", (launch, None, None))
    cells = [(ctypes.c_uint8 * 128)(), (ctypes.c_uint8 * 128)()]
    dl = DriverLaunch(compiled, (1, 1, 1), cells, [], [(0, None, _Descriptor(), 0, 0), (1, None, _Descriptor(), 1, 0)],
                      expand)
    for i in range(dl_module._TMAPS_KEPT + 40):  # queries at drifting addresses, keys fixed, then keys moving
        bases = (0x10000 * (i + 1), 0x900000 + (0x100 * i if i >= dl_module._TMAPS_KEPT - 2 else 0))
        dl.run(list(bases), stream=0)
    assert seen and all(seen)
    assert len(dl.tmaps) <= dl_module._TMAPS_KEPT + 1


def _descriptor_kernel(n, desc, out, scale, BLOCK: tl.constexpr):
    x = desc.load([0, 0])
    offs = tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :]
    tl.store(out + offs, x.to(tl.float32) * scale, mask=offs < n)


def test_descriptor_block_from_a_real_compile(hopper_builds, monkeypatch):
    """A kernel taking a tensor descriptor, compiled for sm_90: its map, shape and strides take
    the PTX's slots, expanded by Triton's own function in either spelling (Triton 3.6 takes two
    arguments, 3.9 three); a descriptor Triton would pass decomposed is refused."""
    import triton.backends.nvidia.driver as nv

    from indexer_topk.kernels import driver_launch as dl_module

    k = hopper_builds["descriptor"]
    compiled = types.SimpleNamespace(**vars(k), function=1)
    metas = []

    def three(arg, metadata, _):
        metas.append(metadata)
        return [_Map(7), *arg.shape, *arg.strides]

    monkeypatch.setattr(dl_module, "_tmap_address", lambda obj: ctypes.addressof(obj.buf) if isinstance(obj, _Map) else None)
    desc = _Descriptor()
    params, tensors, descs = [5, desc, None, 0.5, 64], [(2, 1, 0)], [(1, 0, 0, desc)]
    monkeypatch.setattr(nv, "make_tensordesc_arg", three)
    dl = build_launch(compiled, (1, 1, 1), params, tensors, descs)
    assert dl is not None and metas == [k.metadata.tensordesc_meta[0]]
    assert [ctypes.sizeof(c) for c in dl.cells] == [size for _, size in ptx_params(k.asm["ptx"], k.metadata.name)]
    assert [c.value for c in dl.cells[2:6]] == [64, 64, 64, 1]  # shape (i32), strides (i64)
    assert [type(c) for c in dl.cells[2:6]] == [ctypes.c_int32] * 2 + [ctypes.c_int64] * 2
    assert dl.desc_slots == ((1, k.metadata.tensordesc_meta[0], desc, 0, 0),)
    monkeypatch.setattr(nv, "make_tensordesc_arg", lambda arg, metadata: three(arg, metadata, None))
    assert build_launch(compiled, (1, 1, 1), params, tensors, descs) is not None
    monkeypatch.setattr(nv, "make_tensordesc_arg", lambda arg, metadata, _: [arg.base, *arg.shape, *arg.strides])
    assert build_launch(compiled, (1, 1, 1), params, tensors, descs) is None


def test_a_recorded_launch_takes_the_driver_where_one_is_built(compiled, monkeypatch):
    """The recorder's wiring: a compiled launch gets its driver launch when driver launches are on
    and one can be built; off, or where building fails, it keeps Triton's launcher."""
    from indexer_topk import replay
    from indexer_topk.kernels import driver_launch as dl_module

    fake = FakeDriver()
    monkeypatch.setitem(dl_module._DRIVER, "fns", (fake.launch_ex, fake.error_string, fake.make_current))
    monkeypatch.setattr(replay.torch.cuda, "current_device", lambda: 0)
    kernel = types.SimpleNamespace(arg_names=["x", "n", "scale", "big", "y", "BLOCK"], signature=None)
    run = types.SimpleNamespace(**{**vars(compiled), "run": lambda *a: None, "packed_metadata": None})
    x, y = torch.zeros(8), torch.zeros(8)
    for on, breaks, want in ((True, False, True), (False, False, False), (True, True, False)):
        if breaks:
            monkeypatch.setattr(dl_module, "build_launch", lambda *a: 1 / 0)
        rec = replay.Recorder([x, y], driver_launches=on)
        rec.add_launch(kernel, (3,), (x, 1000, 0.5, 1 << 40, y), {"BLOCK": 128}, run)
        [step] = rec.steps
        assert (step.driver is not None) == want, (on, breaks)
