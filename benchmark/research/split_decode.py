#!/usr/bin/env python3
"""The legacy path's decode step (one-row score tiles, the split select) under other settings:
graph-replayed time, device time per kernel, and bits against the default settings.

    PYTHONPATH=python python3 benchmark/research/split_decode.py [--shapes 1x128K,8x768K,64x4K..768K,...]
        [--configs "SPLIT_WARPS=8;SCORE_PROGRAMS_PER_SM=8,SCORE_MIN_SPAN=256;INDEXER_TOPK_PDL=0"]
        [--patterns random,increasing]

``--timeline``: instead, where each kernel of the step runs within a replay: the step captured in
a CUDA graph and replayed under the profiler (CUPTI's kernel records of the replays), each
kernel's start and end after the replay's first kernel started, medians over the replays, in us;
with programmatic dependent launch the kernels of a step overlap, which per-kernel times summed
do not show (whether CUPTI itself keeps them apart is what the first run of it says).

``--profile``: instead, the finishing kernel's ``PROF`` build on each shape's key matrix (under
each config): SM cycles per row from its start to the candidates loaded, the k-th found, the
selection appended and the row sorted and written (by bins: the histogram read, the runs placed,
the ranks written), medians over the rows finished the commoner way, and how many rows were
finished by bins, by the search and trimmed first.

Each ``;``-separated config sets attributes of :mod:`indexer_topk.backends.legacy` (an empty
config: the shipped settings, always run first as the reference). Every run goes through the out
operator with ``backend="legacy"`` and ``rows_per_request=1``, as an engine's captured decode
calls it, and is compared bit for bit with the first config's outputs. The table is printed
last; the JSON goes to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import indexer_topk  # noqa: E402
from indexer_topk import api  # noqa: E402
from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.bench.mix import MixShape, graph_times  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.envs import envs  # noqa: E402
from indexer_topk.workload import make_workload  # noqa: E402

from decode_bench import parse_shape  # noqa: E402
from decode_probe import kernel_times  # noqa: E402


def parse_config(text: str) -> dict:
    """``NAME=value,...``: each value an integer, or ``None``; ``ValueError`` naming an entry that
    is neither."""
    config = {}
    for entry in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = (part.strip() for part in entry.partition("="))
        try:
            if not sep or not name:
                raise ValueError
            config[name] = None if value == "None" else int(value)
        except ValueError:
            raise ValueError(f"--configs: {entry!r} is not NAME=integer or NAME=None") from None
    return config


class Settings:
    """The ``;``-separated configs of ``--configs`` (the shipped settings first, as ``""``) and
    the shipped values of every module attribute they set, to set one config at a time and
    restore the shipped ones at the end. A name starting ``INDEXER_TOPK_`` is the package's
    environment variable of that name (set to the value, or unset where it was)."""

    def __init__(self, text: str):
        self.configs = [""] + [c for c in text.split(";") if c.strip()]
        # a misspelt variable would be set, read by nothing, and its config measured as shipped
        unknown = sorted({k for c in self.configs for k in parse_config(c) if _is_env(k)} - ENV_NAMES)
        if unknown:
            raise ValueError(f"--configs: {', '.join(unknown)}: not a variable of indexer_topk.envs")
        self.shipped = {k: os.environ.get(k) if _is_env(k) else getattr(legacy_backend, k)
                        for c in self.configs for k in parse_config(c)}

    def apply(self, text: str = "") -> None:
        for k, v in {**self.shipped, **parse_config(text)}.items():
            if not _is_env(k):
                setattr(legacy_backend, k, v)
            elif v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)


def _is_env(name: str) -> bool:
    return name.startswith("INDEXER_TOPK_")


ENV_NAMES = frozenset(f.name for f in envs.fields())


def workloads(a, device):
    """``(pattern, shape label, rows per request, workload)`` for each pattern and shape."""
    for pattern in a.patterns.split(","):
        for text in a.shapes.split(","):
            spread = "4k.." in text.lower()  # "64x4K..768K": the serving mix's mixed batch
            requests, tokens, per_request = parse_shape(text.lower().replace("4k..", ""))
            lengths = MixShape("decode", a.layout, a.topk, requests, per_request, tokens, spread).context_lengths()
            w = make_workload(a.layout, context_tokens=lengths, rows_per_request=[per_request] * requests,
                              topk=a.topk, seed=a.seed, device=device, pattern=pattern,
                              page_table_pad=a.page_table_pad)
            shape = (f"{requests}x{'4K..' if spread else ''}{tokens // 1024}K"
                     + (f"x{per_request}" if per_request > 1 else ""))
            yield pattern, shape, per_request, w
            w = None
            torch.cuda.empty_cache()  # the caller has let go of the workload and its tensors


def decode_step(w, out, per_request):
    """The step every mode times: the out operator with ``backend="legacy"`` and the rows per
    request as a hint, as an engine's captured decode calls it, writing ``out``."""
    def step():
        torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, w.layout.value, *out, None,
                                                w.weight_scale, "legacy", False, per_request)
    return step


def replay_spans(events, kernels_per_replay: int) -> dict:
    """``{kernel: (median start, median end)}`` in us after each replay's first kernel start, from
    ``events``: ``(name, start_us, end_us)`` of the device kernels of whole replays (every replay
    launches the same ``kernels_per_replay`` kernels), in any order. Replays are cut by start
    time, so a kernel of one replay must not start before the previous replay's first kernel."""
    events = sorted(events, key=lambda e: e[1])
    if not events or len(events) % kernels_per_replay:
        raise ValueError(f"{len(events)} kernel records are not whole replays of {kernels_per_replay} kernels")
    starts, ends = {}, {}
    for r in range(0, len(events), kernels_per_replay):
        replay = events[r:r + kernels_per_replay]
        t0 = replay[0][1]
        for name, start, end in replay:
            starts.setdefault(name, []).append(start - t0)
            ends.setdefault(name, []).append(end - t0)
    return {n: (statistics.median(starts[n]), statistics.median(ends[n])) for n in starts}


def timeline(a, device) -> int:
    """Each shape's step (per config) as kernel spans within a graph replay (module docstring)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from indexer_topk.bench.mix import capture_graph

    settings = Settings(a.configs)
    lines = []
    for pattern, shape, per_request, w in workloads(a, device):
        for text in settings.configs:
            settings.apply(text)
            api._KNOWN.clear()
            out = indexer_topk.allocate_result(w.rows, w.topk, device)

            step = decode_step(w, out, per_request)
            step()
            graph = capture_graph(step)
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(a.iters):
                    graph.replay()
                    torch.cuda.synchronize()  # replays apart, so that none overlaps the next
            kernels = [(ev.name.split("(")[0].replace("_kernel", "")[:16], ev.time_range.start, ev.time_range.end)
                       for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
            try:
                spans = replay_spans(kernels, len(kernels) // a.iters)
                cells = "  ".join(f"{n} {b:.1f}-{e:.1f}" for n, (b, e) in sorted(spans.items(), key=lambda x: x[1]))
            except ValueError as exc:
                cells = f"({exc})"
            lines.append(f"{pattern:10s} {shape:9s} {text or 'shipped':44s} {cells}")
            print(lines[-1], flush=True)
            graph = out = None
        w = None
    settings.apply()
    print("\neach kernel's start-end in us after the replay's first kernel started (medians over the replays)")
    print("\n".join(lines))
    return 0


def profile(a, device) -> int:
    """Phase cycles of the finishing kernel per shape and config (see the module docstring)."""
    from indexer_topk.kernels import split_topk
    from indexer_topk.kernels.split_topk import HOW_BINS, HOW_SEARCH, PROF_FIELDS

    HOW_TRIMMED = getattr(split_topk, "HOW_TRIMMED", 0)  # builds before the trim have none

    settings = Settings(a.configs)
    lines = []
    for pattern, shape, per_request, w in workloads(a, device):
        keys = legacy_backend.legacy_score(w.inputs(), rows_per_request=per_request)
        for text in settings.configs:
            settings.apply(text)
            prof = torch.zeros((w.rows, PROF_FIELDS), dtype=torch.int64, device=device)
            out = indexer_topk.allocate_result(w.rows, w.topk, device)
            for _ in range(3):  # compile, warm, then the counted run
                legacy_backend.split_select(keys, w.seq_lens, w.page_table, topk=w.topk, out=out, prof=prof)
            torch.cuda.synchronize()
            hows = prof[:, 4]
            n_bins, n_search = int((hows == HOW_BINS).sum()), int((hows == HOW_SEARCH).sum())
            n_trimmed = int(((hows & HOW_TRIMMED) != 0).sum())
            took = hows == (HOW_BINS if n_bins >= n_search else HOW_SEARCH)
            cyc = prof[took].double().median(dim=0).values.tolist() if bool(took.any()) else [float("nan")] * 4
            phases = {"load": cyc[0], "search": cyc[1] - cyc[0], "append": cyc[2] - cyc[1],
                      "sort+write": cyc[3] - cyc[2], "all": cyc[3], "slowest": float(prof[:, 3].max())}
            lines.append(f"{pattern:10s} {shape:9s} {text or 'shipped':16s} rows {w.rows:4d} bins {n_bins:4d} "
                         f"search {n_search:4d} trimmed {n_trimmed:4d}  " + "  ".join(f"{k} {v:8.0f}" for k, v in phases.items()))
            print(lines[-1], flush=True)
        keys = w = None  # freed before the next shape's workload is built
    settings.apply()
    print("\nfinishing kernel, SM cycles per row (median over the rows finished the commoner way: by bins, the\n"
          "phases are the histogram read and checked, the runs placed, the ranks written; slowest: any row's all)")
    print("\n".join(lines))
    return 0


def output_digest(out) -> str:
    """A short hash of the four outputs' bytes: equal across builds on the same workload (same
    ``--seed``) where their bits are equal."""
    h = hashlib.sha256()
    for t in out:
        h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def report_registers() -> None:
    """Registers and spilled bytes per thread of each split-select kernel this process compiled
    (what the device's own Triton and ptxas made of them)."""
    from indexer_topk.kernels import split_topk

    for name in ("gate_rows_kernel", "gather_rows_kernel", "finish_rows_kernel"):
        fn = getattr(split_topk, name)
        for caches in getattr(fn, "device_caches", {}).values():
            for kernel in caches[0].values():
                try:
                    kernel._init_handles()
                    print(f"{name}: regs {kernel.n_regs} spills {kernel.n_spills} shared {kernel.metadata.shared} "
                          f"warps {kernel.metadata.num_warps}", flush=True)
                except Exception as exc:  # noqa: BLE001 - a report, not a check
                    print(f"{name}: {type(exc).__name__}: {exc}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1x128K,1x768K,8x128K,8x768K,32x768K,64x128K,256x32K")
    p.add_argument("--layout", default="sglang_fp8")
    p.add_argument("--patterns", default="random")
    p.add_argument("--configs", default="")
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=1, help="the workload's seed (the serving mix uses 0)")
    p.add_argument("--page-table-pad", type=int, default=1,
                   help="spare page-table columns past the longest row (the serving mix uses 0)")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "split_decode.json"))
    p.add_argument("--profile", action="store_true", help="the finishing kernel's phase cycles (PROF build)")
    p.add_argument("--timeline", action="store_true",
                   help="instead, each kernel's start and end within a graph replay (the profiler's records)")
    p.add_argument("--cold", action="store_true",
                   help="also time each step with the L2 cache overwritten before every replay (its keys from HBM)")
    p.add_argument("--registers", action="store_true", help="print the split kernels' registers and spills at the end")
    p.add_argument("--hold-cycles", type=int, default=None,
                   help="cycles the GPU spins ahead of each timed replay (bench.timing.HOLD_CYCLES; 0: none)")
    a = p.parse_args(argv)
    from indexer_topk.bench import timing

    if a.hold_cycles is not None:
        timing.HOLD_CYCLES = a.hold_cycles
    device = "cuda"
    if a.timeline:
        return timeline(a, device)
    if a.profile:
        rc = profile(a, device)
        if a.registers:
            report_registers()
        return rc
    settings = Settings(a.configs)
    records = []
    for pattern, shape, per_request, w in workloads(a, device):
        ref = None
        for text in settings.configs:
            settings.apply(text)
            api._KNOWN.clear()  # a signature's recorded launches would replay the earlier settings
            out = indexer_topk.allocate_result(w.rows, w.topk, device)

            step = decode_step(w, out, per_request)
            try:
                step()
                torch.cuda.synchronize()
                ms, ms_cold = graph_times(step, iters=a.iters, device=device, cold=a.cold)
                kt = kernel_times(step, a.iters)
                same = True if ref is None else bitwise_equal(out, ref)
                if ref is None:
                    ref = type(out)(*(t.clone() for t in out))
                digest = output_digest(out)
            except Exception as exc:  # noqa: BLE001 - a config that does not build is a finding
                ms, kt, same, digest = float("nan"), {"error": f"{type(exc).__name__}: {exc}"[:300]}, None, None
                ms_cold = float("nan") if a.cold else None
            rec = {"pattern": pattern, "shape": shape, "config": text or "shipped", "graph_ms": ms,
                   "kernels": kt, "matches_shipped": same, "digest": digest}
            if a.cold:
                rec["graph_ms_cold"] = ms_cold
            records.append(rec)
            print(f"{pattern} {shape} {rec['config']}: {ms:.4f} ms eq={same} digest={digest} "
                  + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in kt.items()),
                  flush=True)
        w = ref = out = None  # freed before the next shape's workload is built
    settings.apply()
    Path(a.out).write_text(json.dumps({"records": records, "graph_hold_cycles": timing.hold_cycles(device)},
                                      indent=1) + "\n")
    cold = " L2-cold" if a.cold else ""
    print(f"\n{'pattern':10s} {'shape':10s} {'config':44s} {'graph ms':>9s}{cold} eq  kernels (device ms)")
    for r in records:
        kt = " ".join(f"{k.replace('_kernel', '')[:14]}={v:.4f}" for k, v in r["kernels"].items() if isinstance(v, float))
        c = f" {r['graph_ms_cold']:7.4f}" if a.cold else ""
        print(f"{r['pattern']:10s} {r['shape']:10s} {r['config'][:44]:44s} {r['graph_ms']:9.4f}{c} "
              f"{'Y' if r['matches_shipped'] else 'N'}   {kt}")
    if a.registers:
        report_registers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
