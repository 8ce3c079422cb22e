"""SGLang 0.5.23's own DSv4 indexer on a CUDA GPU, with and without the plugin, side by side.

    python -m sglang_doubles.run_cuda SGLANG_SRC [SGLANG_SRC ...] --kit KIT --out RESULT.json

SGLang's released Python runs its ``forward_c4_indexer`` on CUDA tensors, with DeepGEMM and
``topk_v2`` from the SGLang CUDA anchor kit ``KIT`` serving where sgl-kernel would (see
``cuda.py``). The plugin is loaded as a deployment loads it: SGLang's ``load_plugins()`` finds
the ``sglang.srt.plugins`` entry point of the installed package (``--entry-point DIR`` first
writes the checkout's distribution metadata to ``DIR``, which must be on ``PYTHONPATH``, for a
machine where the package cannot be pip-installed). The routes are the policy's own, read from
the environment: set ``INDEXER_TOPK_FUSED_PREFILL=1`` / ``INDEXER_TOPK_FUSED_DECODE=1`` to make
our kernels serve every call they can.

Each case runs SGLang's unhooked method and the hooked one on the same bytes: prefill
(EXTEND, with raw indices), TARGET_VERIFY (two rows a request), decode, and decode captured in
a CUDA graph and replayed after a new batch (new queries, keys, lengths and page tables) was
copied into the captured buffers. A case passes when both selections are identical per row
(page indices and raw indices) and complete (each row holds ``min(topk, length)`` distinct
valid positions, raw positions map to the page indices beside them through the page table,
spare rows of SGLang's buffers stay untouched). Times are per indexer call: CUDA-event time of
single eager calls (host included; median and quartiles), or the median of graph replays. One JSON line per case on stdout; the whole run in
``--out``. Exit status 0 when every case passes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Dict, List, Optional

import torch

from indexer_topk import sglang_plugin
from indexer_topk.bench.mix import capture_graph
from indexer_topk.bench.timing import median_ms, synchronize

from .cuda import open_sglang_cuda
from .run_scene import Served
from .scene import SceneSpec, build_scene, rows_differing

REPO = Path(__file__).resolve().parents[2]

# (name, spec fields): contexts are tokens seen after the step, extend the step's new tokens.
# topk 1024 (DSv4-Pro) unless a case says 512 (DSv4-Flash).
CASES = (
    ("extend 2 requests 64K+16K, 640 rows", dict(mode="EXTEND", contexts=(65536, 16384), extend=(512, 128),
                                                   raw_indices=True)),
    ("extend 1 request 256K, 1024 rows", dict(mode="EXTEND", contexts=(262144,), extend=(1024,), raw_indices=True)),
    ("extend topk 512, 2 requests 32K+8K", dict(mode="EXTEND", topk=512, contexts=(32768, 8192), extend=(256, 64),
                                                raw_indices=True)),
    ("target_verify 4 requests x 2 rows, 16K-128K", dict(mode="TARGET_VERIFY", contexts=(131072, 65536, 32768, 16384),
                                                          extend=(2, 2, 2, 2))),
    ("decode 8 requests, 4K-128K", dict(mode="DECODE", contexts=(131072, 98304, 65536, 32768, 16384, 8192, 4100, 4096),
                                        extend=(1,) * 8)),
    ("decode 1 request 128K", dict(mode="DECODE", contexts=(131072,), extend=(1,))),
)
CAPTURED = ("decode 8 requests, 4K-128K, captured, replayed with a new batch",
            dict(mode="DECODE", contexts=(131072, 98304, 65536, 32768, 16384, 8192, 4100, 4096), extend=(1,) * 8))
TOPK = 1024
QUICK = {"extend 2 requests 64K+16K, 640 rows", "target_verify 4 requests x 2 rows, 16K-128K",
         "decode 8 requests, 4K-128K"}


def write_entry_point(target: Path) -> Path:
    """Write the checkout's distribution metadata (name, version, entry points) to ``target``,
    as ``pip install`` would, so ``importlib.metadata`` finds the plugin's entry point."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dist = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in entries.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return dist


def eager_ms(fns, iters: int) -> List[Dict[str, float]]:
    """CUDA-event time of single calls of each of ``fns``, host time included (each call starts
    on an idle device): median and quartiles in ms. The functions take turns, in an order that
    alternates between iterations, so drift touches all alike."""
    times = [[] for _ in fns]
    for it in range(iters):
        order = list(range(len(fns)))
        if it % 2:
            order.reverse()
        for i in order:
            synchronize("cuda")
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fns[i]()
            b.record()
            b.synchronize()
            times[i].append(a.elapsed_time(b))
    out = []
    for t in times:
        q = statistics.quantiles(t, n=4)
        out.append({"median": statistics.median(t), "q1": q[0], "q3": q[2]})
    return out


def complete(sel: torch.Tensor, lens: torch.Tensor, topk: int) -> bool:
    """Each row holds ``min(topk, length)`` distinct non-negative entries and ``-1`` elsewhere."""
    valid = sel >= 0
    want = lens.clamp(max=topk).to(valid.device)
    if not torch.equal(valid.sum(1), want.to(torch.int64)) or bool(((sel < -1)).any()):
        return False
    s = sel.sort(dim=1).values
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    return not bool(dup.any())


def maps_through_table(raw: torch.Tensor, pages: torch.Tensor, table: torch.Tensor) -> bool:
    """Each raw position ``p`` sits beside page index ``table[row, p // 64] * 64 + p % 64``."""
    valid = raw >= 0
    if not torch.equal(valid, pages >= 0):
        return False
    p = raw.clamp(min=0).long()
    want = table.long().gather(1, p // 64) * 64 + p % 64
    return torch.equal(torch.where(valid, want, -1), pages.long())


def compare(scene, hooked, original) -> Dict[str, object]:
    """Both calls' selections against each other and each on its own (see the module docstring)."""
    rows, topk, lens = scene.rows, scene.spec.topk, scene.c4_lens
    (hp, hr), (op, orr) = hooked, original
    out = {
        "rows_differing": len(rows_differing(hp[:rows], op[:rows])),
        "complete": complete(op[:rows], lens, topk) and complete(hp[:rows], lens, topk),
        "spare_rows_untouched": bool((hp[rows:] == -1).all()) and bool((op[rows:] == -1).all()),
    }
    if orr is not None:
        table = scene.metadata.indexer_metadata.page_table[:rows]
        out["raw_rows_differing"] = len(rows_differing(hr[:rows], orr[:rows]))
        out["raw_complete"] = all(complete(r[:rows], lens, topk) and maps_through_table(r[:rows], p[:rows], table)
                                  for r, p in ((hr, hp), (orr, op)))
        out["spare_rows_untouched"] &= bool((hr[rows:] == -1).all()) and bool((orr[rows:] == -1).all())
    out["identical"] = (out["rows_differing"] == 0 and out.get("raw_rows_differing", 0) == 0 and out["complete"]
                        and out.get("raw_complete", True) and out["spare_rows_untouched"])
    return out


def run_case(sg, served: Served, name: str, fields: dict, iters: int) -> dict:
    spec = SceneSpec(layout="sglang_fp8", device="cuda", topk_backend="sgl-kernel", **{"topk": TOPK, **fields})
    t0 = time.perf_counter()
    scene = build_scene(sg, spec)
    built_s = time.perf_counter() - t0
    served.take()
    hooked = scene.forward()
    first = served.take()
    original = scene.forward(original=True)
    rec = {"case": name, "mode": spec.mode, "topk": spec.topk, "rows": scene.rows, "contexts": list(spec.contexts),
           "served_by": first or {"sglang": 1}, **compare(scene, hooked, original)}
    hooked_t, sglang_t = eager_ms([lambda: scene.call(), lambda: scene.call(original=True)], iters)
    rec["hooked_ms"], rec["sglang_ms"] = hooked_t["median"], sglang_t["median"]
    rec["hooked_ms_q1_q3"] = [hooked_t["q1"], hooked_t["q3"]]
    rec["sglang_ms_q1_q3"] = [sglang_t["q1"], sglang_t["q3"]]
    rec["scene_build_s"] = round(built_s, 1)
    if not first:  # the hook handed the call back: what does that cost on this host?
        rec.update(decline_host_us(scene))
    served.take()
    return rec


def decline_host_us(scene, calls: int = 500) -> dict:
    """Host time the plugin's hook adds to a call it hands back: the hook run with a stand-in
    original that does nothing (mean over ``calls``), and where that time goes (cProfile's top
    functions by own time, over as many calls)."""
    import cProfile
    import functools
    import io
    import pstats

    original = type(scene.backend).forward_c4_indexer.__wrapped__
    stand_in = functools.wraps(original)(lambda *a, **k: None)
    kwargs = dict(x=scene.x, q_lora=scene.q_lora, c4_indexer=scene.c4_indexer, forward_batch=scene.forward_batch)
    hook = sglang_plugin._forward_c4_indexer_hook

    def run():
        with scene.platform():
            for _ in range(calls):
                hook(stand_in, scene.backend, **kwargs)

    run()
    start = time.perf_counter()
    run()
    mean_us = (time.perf_counter() - start) / calls * 1e6
    profile = cProfile.Profile()
    profile.runcall(run)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(10)
    lines = [line.strip() for line in text.getvalue().splitlines() if line.strip()]
    return {"hook_decline_us": round(mean_us, 2), "hook_decline_profile": lines[-11:]}


def copy_batch(dst, src) -> None:
    """Copy ``src``'s inputs into ``dst``'s buffers (same rows, page-table width and pool size):
    the indexer metadata through SGLang's own ``PagedIndexerMetadata.copy_`` (what its graph
    runner does before a replay), the query and weight projections, the keys and positions."""
    pairs = [
        (dst.c4_indexer.wq_b.out, src.c4_indexer.wq_b.out),
        (dst.c4_indexer.weights_proj.out, src.c4_indexer.weights_proj.out),
        (dst.backend.token_to_kv_pool.with_scale, src.backend.token_to_kv_pool.with_scale),
        (dst.metadata.core_metadata.positions, src.metadata.core_metadata.positions),
    ]
    for d, s in pairs:
        if d.shape != s.shape:
            raise ValueError(f"the new batch does not fit the captured buffers: {tuple(s.shape)} vs {tuple(d.shape)}")
        d.copy_(s)
    dst.metadata.indexer_metadata.copy_(src.metadata.indexer_metadata)
    dst.c4_lens = src.c4_lens


def run_captured(sg, served: Served, name: str, fields: dict, iters: int) -> dict:
    spec = SceneSpec(layout="sglang_fp8", device="cuda", topk_backend="sgl-kernel", **{"topk": TOPK, **fields})
    scene = build_scene(sg, spec)
    # The new batch: the same lengths in another order (so the same rows, page-table width and
    # pool size), new keys, queries, weights and page scattering.
    new = build_scene(sg, dataclasses.replace(spec, seed=spec.seed + 1, contexts=tuple(reversed(spec.contexts))))
    if new.metadata.indexer_metadata.max_compressed_seq_len != scene.metadata.indexer_metadata.max_compressed_seq_len:
        raise ValueError("the new batch changes the captured width")
    served.take()
    # each captured after a run outside the capture, as SGLang warms up before it captures
    graphs = {arm: capture_graph(lambda o=original: scene.call(original=o))
              for arm, original in (("hooked", False), ("sglang", True))}
    warm = served.take()
    before = scene.forward(original=True)  # SGLang, eager, on the captured batch
    expected = new.forward(original=True)  # SGLang, eager, on the new batch's own buffers
    copy_batch(scene, new)
    results = {}
    core = scene.metadata.core_metadata
    for arm, graph in graphs.items():
        core.c4_sparse_page_indices.fill_(-1)
        graph.replay()
        synchronize("cuda")
        results[arm] = scene.outputs()
    rec = {"case": name, "mode": "DECODE (graph)", "topk": spec.topk, "rows": scene.rows,
           "contexts": list(new.spec.contexts), "served_by": warm or {"sglang": 1}}
    a = compare(scene, results["hooked"], results["sglang"])
    b = compare(scene, results["hooked"], expected)
    rec.update(a)
    rec["rows_differing_vs_eager_new_batch"] = b["rows_differing"]
    # The new batch must select otherwise than the captured one, or a stale replay would pass.
    rec["new_batch_rows_changed"] = len(rows_differing(before[0][: scene.rows], expected[0][: scene.rows]))
    rec["identical"] = a["identical"] and b["identical"] and rec["new_batch_rows_changed"] == scene.rows
    for key, arm in (("hooked_ms", "hooked"), ("sglang_ms", "sglang"), ("hooked_ms_again", "hooked")):
        rec[key] = median_ms(graphs[arm].replay, warmup=3, iters=iters, device="cuda")  # again: the drift
    return rec


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="SGLang's unpacked release (and msgspec's, if separate)")
    parser.add_argument("--kit", type=Path, required=True, help="the SGLang CUDA anchor kit, built")
    parser.add_argument("--out", type=Path, help="write every record here (JSON)")
    parser.add_argument("--entry-point", type=Path, help="write the checkout's entry point metadata here first")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--commit", default="unknown", help="the checkout's commit, recorded with the results")
    parser.add_argument("--quick", action="store_true", help="three small cases and the captured decode")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.entry_point is not None:
        write_entry_point(args.entry_point)

    sg = open_sglang_cuda([p.resolve() for p in args.paths], args.kit)
    served = Served()
    sg.plugins.load_plugins()
    hooked = hasattr(sg.indexer.C4IndexerBackendMixin.forward_c4_indexer, "__wrapped__")
    env = {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("INDEXER_TOPK_", "SGLANG_DSV4_"))}
    run = {"commit": args.commit, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "sglang": sg.version.__version__,
           "plugin_hooked": hooked, "env": env, "stubbed_imports": sorted(sg.stubbed()), "records": []}
    print(json.dumps({k: v for k, v in run.items() if k != "records"}), flush=True)
    cases = [c for c in CASES if not args.quick or c[0] in QUICK]
    ok = hooked
    for name, fields in cases + [CAPTURED]:
        fn = run_captured if name == CAPTURED[0] else run_case
        try:
            rec = fn(sg, served, name, fields, args.iters)
        except Exception as exc:  # one failing case must not hide the others
            logging.exception("case %s failed", name)
            rec = {"case": name, "error": f"{type(exc).__name__}: {exc}", "identical": False}
        rec["plugin_disabled"] = sglang_plugin._STATE.disabled
        ok = ok and rec["identical"] and rec["plugin_disabled"] is None
        run["records"].append(rec)
        print(json.dumps(rec), flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(run, indent=1) + "\n")
    run["calls"] = dict(sg.calls)
    if args.out is not None:
        args.out.write_text(json.dumps(run, indent=1) + "\n")
    for rec in run["records"]:
        served_by = ",".join(f"{k}:{v}" for k, v in rec.get("served_by", {}).items())
        print(f"SGLANG_GPU {rec['case']:<62} served={served_by:<12} identical={rec['identical']} "
              f"hooked={rec.get('hooked_ms', float('nan')):.3f} ms sglang={rec.get('sglang_ms', float('nan')):.3f} ms")
    sg.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
