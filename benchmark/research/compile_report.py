#!/usr/bin/env python3
"""Compile the kernels for a GPU target without a GPU and report their resources.

    python benchmark/research/compile_report.py [--arch 90] [--layouts sglang_fp8 sglang_mxfp4]

For the fused kernel, the legacy logits kernel (two-row and one-row tiles), the selection kernel
(legacy top-k and split merge), the split select's three kernels (legacy decode) and the row
select, it prints registers per thread, stack
(spilled registers), shared memory, counts of a few instructions in the PTX (barriers, atomics,
wgmma, cp.async, bulk tensor copies) and the local-memory loads and stores in the machine code,
also those between the first and the last warpgroup MMA (the scoring part of the streaming loop,
where a spill costs most). Triton and the ``ptxas`` / ``cuobjdump`` it ships compile here;
nothing runs, so it needs no device. The numbers are for the Triton installed here, which may
differ from the one on the GPU machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

if importlib.util.find_spec("indexer_topk") is None:  # running from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from indexer_topk.backends.fused import plan_fused  # noqa: E402
from indexer_topk.contract import Layout  # noqa: E402
from indexer_topk.kernels.fused import fused_topk_kernel  # noqa: E402
from indexer_topk.kernels.launch import SELECT_CHUNK, SELECT_WARPS, pack_args, tile_config  # noqa: E402
from indexer_topk.kernels.logits import gather_logits_kernel, logits_kernel  # noqa: E402
from indexer_topk.kernels.row_topk import topk_rows_kernel  # noqa: E402
from indexer_topk.kernels.scored_gate import score_sample_kernel  # noqa: E402
from indexer_topk.kernels.select import MODE_KEYS, MODE_SEGMENTS, select_rows_kernel  # noqa: E402
from indexer_topk.kernels.split_topk import finish_rows_kernel, gate_rows_kernel, gather_rows_kernel  # noqa: E402
from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.workload import make_workload  # noqa: E402

POINTER_TYPES = {torch.uint8: "*u8", torch.int32: "*i32", torch.float32: "*fp32", torch.bfloat16: "*bf16"}
KEY_DESCRIPTOR = "tensordesc<fp8e4nv[1, 64, 128]>"  # what a launch with bulk copies passes as kdesc


def _with_defaults(fn, constexprs) -> dict:
    """``constexprs`` and, for each constexpr of ``fn`` it leaves out, that parameter's default,
    as at a launch that does not pass it (else it would be compiled as an int32 buffer)."""
    return {**{q.name: q.default for q in fn.params if q.is_constexpr and q.has_default}, **(constexprs or {})}


def _signature(fn, tensors: dict, floats=("weight_scale",), constexprs: dict = None):
    constexprs = _with_defaults(fn, constexprs)
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "kdesc":
            sig[name] = KEY_DESCRIPTOR
        elif name in tensors:
            sig[name] = POINTER_TYPES[tensors[name].dtype]
        elif name in floats:
            sig[name] = "fp32"
        elif name.startswith(("stride", "n_", "row_start", "col0", "width", "span", "split_span", "splits")):
            sig[name] = "i32"
        elif name == "prof":  # the PROF builds' int64 counters
            sig[name] = "*i64"
        else:  # every other argument is an int32 buffer
            sig[name] = "*i32"
    return sig


def _compile(fn, sig, constexprs, arch, num_warps, num_stages, maxnreg=None):
    names = fn.arg_names
    # A launch specialises every pointer to 16-byte alignment (torch allocations are aligned
    # far beyond that); without the hint the loads compile unvectorised and never become
    # cp.async, which misstates the loop the GPU runs.
    aligned = {(names.index(k),): [["tt.divisibility", 16]] for k, t in sig.items() if t.startswith("*")}
    constexprs = _with_defaults(fn, constexprs)
    if sig.get("kdesc") == "constexpr":  # no descriptor: the kernel gathers keys with pointers
        constexprs["kdesc"] = None
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs=aligned)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def _report(kernel) -> str:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        sass = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True).stdout
    field = lambda key: re.search(rf"{key}:(\d+)", usage).group(1)  # noqa: E731
    ptx = kernel.asm["ptx"]
    counts = {k: ptx.count(k) for k in ("bar.sync", "atom.", "wgmma.mma_async", "cp.async.ca", "cp.async.bulk.tensor")}
    # local-memory traffic in the machine code: spills read and written, in all and between the
    # first and the last warpgroup MMA (the scoring part of the streaming loop)
    code = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", line)]
    mma = [i for i, line in enumerate(code) if re.search(r"\b[HQ]GMMA", line)]
    span = code[min(mma) : max(mma) + 1] if mma else []
    count = lambda lines, op: sum(1 for line in lines if re.search(rf"\b{op}\b", line))  # noqa: E731
    counts["LDL/STL"] = f"{count(code, 'LDL')}/{count(code, 'STL')}"
    counts["LDL in MMA span"] = count(span, "LDL")
    return (f"regs {field('REG'):>3s}  stack {field('STACK'):>4s} B  shared {kernel.metadata.shared:>6d} B  "
            + "  ".join(f"{k} {v}" for k, v in counts.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90, Hopper)")
    p.add_argument("--layouts", nargs="+", default=["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--fused-stages", type=int, default=None,
                   help="pipelining depth of the fused kernel instead of the layout's tile config")
    p.add_argument("--maxnreg", type=int, default=None, help="register cap of the fused kernel instead of the config's")
    p.add_argument("--no-tma", action="store_true", help="FP8 keys through pointer gathers, as without bulk copies")
    p.add_argument("--split-only", action="store_true", help="the split select's kernels alone")
    a = p.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    print(f"triton {triton.__version__}, target sm_{a.arch}, topk {a.topk}")
    for layout in a.layouts:
        w = make_workload(layout, context_tokens=[2000], rows_per_request=[2], topk=32, seed=0, device="cpu")
        ka = pack_args(w.inputs(), launch=False)
        cfg = tile_config(w.layout)
        tma = Layout(layout) is Layout.SGLANG_FP8 and not a.no_tma
        tensors = dict(q_ptr=ka.q, qs_ptr=ka.qs, w_ptr=ka.w, kc_ptr=ka.kc, kf_ptr=ka.kf, ks_ptr=ka.ks)
        const = dict(LAYOUT=ka.layout, R=cfg.rows, TMA=tma, INTERPRET=False, STAGES=cfg.logits_stages)
        if not tma:
            const["kdesc"] = None
        if not a.split_only:
            k = _compile(logits_kernel, _signature(logits_kernel, tensors, constexprs=const), const, a.arch,
                         cfg.num_warps, cfg.logits_stages)
            print(f"{layout:13s} legacy logits   {_report(k)}")
            const["R"] = 1  # a decode batch's one-row tile
            k = _compile(logits_kernel, _signature(logits_kernel, tensors, constexprs=const), const, a.arch,
                         cfg.num_warps, cfg.logits_stages)
            print(f"{layout:13s} logits, 1 row   {_report(k)}")
            if Layout(layout) is Layout.SGLANG_FP8:  # the decode step in three kernels (FP8 only)
                L = legacy_backend
                split = dict(TOPK=a.topk, TILE=L.SPLIT_TILE, BINS=L.SPLIT_BINS, PDL=True)
                const = {k: v for k, v in const.items() if k != "R"}
                const.update(split, BLOCK=L.SPLIT_BLOCK)
                # the shipped slots (SCORED_GATE_STRIDED), then the other order
                for strided in (L.SCORED_GATE_STRIDED, 1 - L.SCORED_GATE_STRIDED):
                    order = dict(const, STRIDE=L._slot_stride(strided, cfg.num_warps))
                    k = _compile(gather_logits_kernel, _signature(gather_logits_kernel, tensors, constexprs=order),
                                 order, a.arch, cfg.num_warps, cfg.logits_stages, maxnreg=L.SCORE_GATHER_MAXNREG)
                    print(f"{layout:13s} {'gather, strided' if strided else 'gather, by pos '} {_report(k)}")
                const["STRIDE"] = L._slot_stride(L.SCORED_GATE_STRIDED, cfg.num_warps)
                const["R"] = cfg.rows  # requests of two rows (a draft row each), the cap per tile row
                k = _compile(gather_logits_kernel, _signature(gather_logits_kernel, tensors, constexprs=const), const,
                             a.arch, cfg.num_warps, cfg.logits_stages, maxnreg=L.SCORE_GATHER_MAXNREG * cfg.rows)
                print(f"{layout:13s} gather, 2 rows  {_report(k)}")
                const = dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, INTERPRET=False, PDL=True)
                k = _compile(score_sample_kernel, _signature(score_sample_kernel, tensors, constexprs=const),
                             const, a.arch, cfg.num_warps, 1)
                print(f"{layout:13s} scored sample   {_report(k)}")
        if layout == a.layouts[0]:  # the split select's kernels, at the shipped settings
            L = legacy_backend
            for fn, name, warps, const in (
                    (gate_rows_kernel, "split gate", L.SPLIT_GATE_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=L.SPLIT_BINS,
                          SPREAD=L.split_spread(a.topk))),
                    (gate_rows_kernel, "gate, short", L.SPLIT_GATE_WARPS,  # split_sample's at short widths
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.split_sample(L.SPLIT_TILE + 1, a.topk),
                          BINS=L.SPLIT_BINS, SPREAD=L.split_spread(a.topk))),
                    (gate_rows_kernel, "gate, 256 bins", L.SPLIT_GATE_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=L.SPLIT_BINS, GATE_BINS=256,
                          SPREAD=L.split_spread(a.topk))),
                    (gather_rows_kernel, "split gather", L.SPLIT_GATHER_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, BLOCK=L.SPLIT_BLOCK, BINS=L.SPLIT_BINS,
                          PREFETCH=bool(L.SPLIT_GATHER_PREFETCH),
                          STRIDE=32 * L.SPLIT_GATHER_WARPS * L.SPLIT_GATHER_STRIDED)),
                    (gather_rows_kernel, "gather, by pos", L.SPLIT_GATHER_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, BLOCK=L.SPLIT_BLOCK, BINS=L.SPLIT_BINS,
                          PREFETCH=bool(L.SPLIT_GATHER_PREFETCH))),
                    (finish_rows_kernel, "split finish", L.SPLIT_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=L.SPLIT_BINS,
                          MAXSEG=L.SPLIT_MAXSEG, PROF=False)),
                    (finish_rows_kernel, "finish, few rows", L.split_finish_warps(1),
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=L.SPLIT_BINS,
                          MAXSEG=L.SPLIT_MAXSEG, PARTS=L.SPLIT_FINISH_PARTS, PROF=False)),
                    (finish_rows_kernel, "finish, 8 parts", L.SPLIT_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=L.SPLIT_BINS,
                          MAXSEG=L.SPLIT_MAXSEG, PARTS=8, PROF=False)),
                    (finish_rows_kernel, "finish, no bins", L.SPLIT_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=0, MAXSEG=L.SPLIT_MAXSEG,
                          PROF=False)),
                    (finish_rows_kernel, "finish PROF", L.SPLIT_WARPS,
                     dict(TOPK=a.topk, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=L.SPLIT_BINS,
                          MAXSEG=L.SPLIT_MAXSEG, PROF=True))):
                k = _compile(fn, _signature(fn, {}, constexprs=const), const, a.arch, warps, 1)
                print(f"{'any':13s} {name:15s} {_report(k)}")
            for bits in (64, 32):  # the sort's width (ROWS_SORT_BITS)
                const = dict(TOPK=a.topk, TILE=L.ROWS_TILE, SAMPLE=L.ROWS_SAMPLE, SORT_BITS=bits)
                sig = dict(_signature(topk_rows_kernel, {}, constexprs=const), rows="i32")
                k = _compile(topk_rows_kernel, sig, const, a.arch, L.ROWS_WARPS, 1, L.ROWS_MAXNREG)
                print(f"{'any':13s} {f'row select x{bits}':15s} {_report(k)}")
        if a.split_only:
            return 0
        if layout == a.layouts[0]:  # the selection kernels do not depend on the layout
            for mode, splits, known_t, name in ((MODE_KEYS, 1, True, "legacy top-k"), (MODE_SEGMENTS, 8, False, "split merge")):
                const = dict(MODE=mode, TOPK=a.topk, SPLITS=splits, CHUNK=SELECT_CHUNK, KNOWN_T=known_t)
                k = _compile(select_rows_kernel, _signature(select_rows_kernel, {}, constexprs=const), const, a.arch,
                             SELECT_WARPS, 1)
                print(f"{'any':13s} {name:15s} {_report(k)}")
        stages = a.fused_stages or cfg.fused_stages
        for splits in (1, 8):
            plan = plan_fused(1024, a.topk, "cpu", splits, None, cfg.rows)
            const = plan.constexprs(ka.layout, tma, False, stages)
            if not tma:
                const["kdesc"] = None
            k = _compile(fused_topk_kernel, _signature(fused_topk_kernel, tensors, constexprs=const), const, a.arch,
                         cfg.num_warps, stages, a.maxnreg or cfg.fused_maxnreg)
            print(f"{layout:13s} {f'fused splits {splits}':15s} {_report(k)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
