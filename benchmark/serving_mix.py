#!/usr/bin/env python3
"""The serving mix on a GPU: every prefill and decode shape, ours beside SGLang's path, one process.

    PYTHONPATH=python python3 benchmark/serving_mix.py [--sglang-kit KIT] [--shapes SUBSTR,...]
        [--iters 10] [--host-calls 200] [--out FILE] [--commit REV]
    python3 benchmark/serving_mix.py --render FILE.json     # the markdown table and the plot, on any machine
    python3 benchmark/serving_mix.py --smoke                # two tiny shapes on a CPU (Triton interpreter)

What is timed and how: :mod:`indexer_topk.bench.mix`. ``--sglang-kit`` is the SGLang CUDA
anchor kit with DeepGEMM built and importable (its ``run.sh`` / ``build_and_test.sh`` do that);
without it SGLang's column stays empty. The JSON is ``{"env": {...}, "summary": {...},
"records": [...]}``, rewritten after every shape; ``--render`` writes ``<stem>.md`` and
``<stem>.png`` beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def write_atomic(text: str, path: Path) -> None:
    from indexer_topk.files import write_atomically  # imported late: --smoke sets TRITON_INTERPRET first

    write_atomically(path, lambda f: f.write(text))


def _f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def _portable(arg: str) -> str:
    """A command-line argument as the record keeps it: no path of the machine that ran it."""
    repo = Path(__file__).resolve().parents[1]
    if os.environ.get("OUT") and arg.startswith(os.environ["OUT"]):
        return "$OUT" + arg[len(os.environ["OUT"]):]
    if os.path.isabs(arg):
        from indexer_topk.files import relative_name  # imported late, as in write_atomic

        return relative_name(arg, repo)
    return arg


def render(doc: dict) -> str:
    """The mix as a markdown table (ratios are ours / SGLang: below 1 means ours is faster); a
    run with L2-cold decode replays (``ours_ms_cold``) gets their columns too."""
    env = doc["env"]
    cold = any(r.get("ours_ms_cold") is not None for r in doc["records"])
    head = ("| shape | route | ours ms | SGLang ms | ours / SGLang | legacy ms | host us (steady / first / checked) "
            "| = legacy | SGLang overlap | % of HBM floor rate |")
    lines = [
        f"Serving mix on {env.get('gpu')} (torch {env.get('torch_version')}, Triton {env.get('triton_version')}, "
        f"commit {env.get('commit')}, {env.get('timestamp')}). Prefill: median CUDA-event time of eager calls "
        "(host included); decode: CUDA-graph replays"
        + (f", each behind a {env['graph_hold_cycles']:,}-cycle spin of the GPU (its events time its kernels, "
           "not its launch)" if env.get("graph_hold_cycles") else "")
        + ". Ratios are ours / SGLang (below 1: ours faster)."
        + (" Routes marked \"by position\" return each row in ascending positions (`order=\"position\"`, what "
           "the SGLang plugin asks of them; SGLang's own path returns rows unordered), ours and legacy alike; "
           "the others best first." if any(r.get("order") == "position" for r in doc["records"]) else "")
        + (" L2-cold: decode replays with the L2 cache overwritten before each (the keys read from HBM, as "
           "in serving, where each layer reads its own cache); the other decode columns replay with the "
           "keys left in L2 by the replay before where they fit." if cold else ""),
        "",
        head + (" L2-cold ours / SGLang ms | L2-cold ratio |" if cold else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if cold else ""),
    ]
    from indexer_topk.bench.mix import MixShape

    for r in doc["records"]:
        shape = MixShape.from_record(r)
        if r.get("error"):
            lines.append(f"| {shape.label} | error: {r['error'][:80]} | | | | | | | | |" + (" | |" if cold else ""))
            continue
        ratio = r["ours_ms"] / r["sglang_ms"] if r.get("ours_ms") and r.get("sglang_ms") else None
        host = "-" if r.get("host_us") is None else (
            f"{r['host_us']:.0f} / {r['host_us_first']:.0f} / {r['host_us_checked']:.0f}")
        floor = r.get("decode_floor_ms")
        pct = f"{100 * floor / r['ours_ms']:.0f}%" if floor and r.get("ours_ms") else "-"
        route = r.get("route") if not r.get("source") else f"{r.get('route')} (commit {r['source'].get('commit')})"
        if r.get("order") == "position":
            route += ", by position"
        line = (f"| {shape.label} | {route} | {_f(r.get('ours_ms'))} | {_f(r.get('sglang_ms'))} | "
                f"{_f(ratio, '{:.2f}x')} | {_f(r.get('legacy_ms'))} | {host} | {r.get('matches_legacy')} | "
                f"{_f(r.get('sglang_overlap'), '{:.4f}')} | {pct} |")
        if cold:
            oc, sc = r.get("ours_ms_cold"), r.get("sglang_ms_cold")
            line += f" {_f(oc)} / {_f(sc)} | {_f(oc / sc if oc and sc else None, '{:.2f}x')} |"
        lines.append(line)
    s = doc.get("summary", {})
    for kind, words in (("prefill", "prefill"), ("decode", "decode"), ("decode_l2_cold", "decode, L2-cold")):
        k = s.get(kind) or {}
        if k.get("shapes_with_sglang"):
            lines.append(f"\n{words}: geometric mean of ours / SGLang {k['geomean_ours_over_sglang']:.2f}x over "
                         f"{k['shapes_with_sglang']} shapes, worst {k['worst']:.2f}x.")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from indexer_topk.bench.mix import MixShape, sglang_ratios

    rows = [(MixShape.from_record(r).label, ratio) for r, ratio in sglang_ratios(doc["records"])]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.2))
    labels, ratios = zip(*rows)
    ax.barh(range(len(rows)), ratios, color=["tab:green" if x <= 1 else "tab:red" for x in ratios])
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ours / SGLang (time; below 1: ours faster)")
    ax.set_title(f"Serving mix, {doc['env'].get('gpu')}, commit {doc['env'].get('commit')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def retune(doc: dict, out: Path, a) -> None:
    """The routes table of this run (``<stem>_routes.json``), then ``auto`` timed again under it
    wherever it routes a shape otherwise, so that every record shows what that table serves."""
    from indexer_topk import policy, routes
    from indexer_topk.bench.mix import retime_auto, shape_route, summarize

    table = routes.table_from_file(out, source=a.cite or out.name)
    path = out.with_name(out.stem + "_routes.json")
    routes.write_table(table, path)
    os.environ["INDEXER_TOPK_ROUTES"] = str(path)
    policy.default_policy.cache_clear()
    doc["env"]["routes"] = f"{path.name} (built from this run's candidates)"
    for rec in doc["records"]:
        if rec.get("error") or rec.get("ours_ms") is None or shape_route(rec) == rec.get("route"):
            continue
        before = rec.get("route")
        try:
            retime_auto(rec, iters=a.iters, host_calls=a.host_calls)
        except Exception as exc:  # noqa: BLE001
            rec["retune_error"] = f"{type(exc).__name__}: {exc}"
        print(f"retuned {rec['kind']} {rec['layout']} {rec['rows']} x {rec['context_tokens'] // 1024}K: {before} -> "
              f"{rec.get('route')} {_f(rec.get('ours_ms'))} ms", flush=True)
    doc["summary"] = summarize(doc["records"])
    write_atomic(json.dumps(doc, indent=1, default=str) + "\n", out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sglang-kit", metavar="DIR", help="the SGLang CUDA anchor kit, DeepGEMM built and importable")
    p.add_argument("--shapes", default=None, help="comma list of substrings: run the shapes whose label has one")
    p.add_argument("--candidates", default="fused,legacy,aiter")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--host-calls", type=int, default=200)
    p.add_argument("--out", default=None, help="JSON path, where {gpu} stands for the device's file-name form "
                   "(default: a dated file in $OUT or benchmark/results)")
    p.add_argument("--commit", default=None, help="the source revision to record (default: git, when there is one)")
    p.add_argument("--smoke", action="store_true", help="two tiny shapes on a CPU under the Triton interpreter")
    p.add_argument("--retune", action="store_true",
                   help="build the routes table of this run, then time auto again where it routes otherwise")
    p.add_argument("--cite", default=None, help="the records file the table cites (default: the output's name)")
    p.add_argument("--render", metavar="JSON", help="write the markdown table and the plot of a finished run")
    a = p.parse_args(argv)
    if a.render:
        src = Path(a.render)
        doc = json.loads(src.read_text())
        write_atomic(render(doc), src.with_suffix(".md"))
        made = plot(doc, src.with_suffix(".png"))
        print(f"wrote {src.with_suffix('.md')}" + (f" and {src.with_suffix('.png')}" if made else ""))
        return 0
    if a.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from indexer_topk.bench import timing
    from indexer_topk.bench.environment import environment, gpu_slug
    from indexer_topk.bench.mix import SGLangPath, default_shapes, run_mix, summarize
    from indexer_topk.envs import envs

    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    shapes = default_shapes(smoke=a.smoke)
    if a.shapes:
        wanted = [x.strip() for x in a.shapes.split(",") if x.strip()]
        shapes = [s for s in shapes if any(x in s.label for x in wanted)]
    env = environment(device)
    env["commit"] = a.commit or env.get("source_revision")
    env["torch"], env["triton"] = env.get("torch_version"), env.get("triton_version")
    if device == "cuda":
        env["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        env["arch"] = "sm_{}{}".format(*torch.cuda.get_device_capability())
    env["flags"] = {k: v for k, v in envs.snapshot().items() if v is not None}  # the switches this run read
    if device == "cuda":
        env["graph_hold_cycles"] = timing.hold_cycles(device)  # the spin ahead of each timed replay
    sglang = SGLangPath(a.sglang_kit) if a.sglang_kit else None
    env["sglang_path"] = "SGLang 0.5.23: DeepGEMM MQA logits + topk_v2 (anchor kit)" if sglang else None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    slug = gpu_slug(env["gpu"])
    out = Path(a.out.replace("{gpu}", slug)) if a.out else out_dir / f"serving_mix_{slug}_{stamp}.json"
    doc = {"env": env, "command": "python3 benchmark/serving_mix.py " + " ".join(
               _portable(x) for x in (sys.argv[1:] if argv is None else argv)),
           "summary": {}, "records": []}

    def saved(rec):
        doc["records"].append(rec)
        doc["summary"] = summarize(doc["records"])
        write_atomic(json.dumps(doc, indent=1, default=str) + "\n", out)
        ratio = rec["ours_ms"] / rec["sglang_ms"] if rec.get("ours_ms") and rec.get("sglang_ms") else None
        print(f"  route {rec.get('route')} ours {_f(rec.get('ours_ms'))} ms, SGLang {_f(rec.get('sglang_ms'))} ms "
              f"({_f(ratio, '{:.2f}x')}), legacy {_f(rec.get('legacy_ms'))}, host {_f(rec.get('host_us'), '{:.0f}')} us "
              f"(first {_f(rec.get('host_us_first'), '{:.0f}')}), exact {rec.get('matches_legacy')}, candidates "
              f"{ {k: round(v, 3) for k, v in rec.get('candidates', {}).items()} }"
              + (f" ERROR {rec['error']}" if rec.get("error") else "")
              + (f" SGLANG ERROR {rec['sglang_error']}" if rec.get("sglang_error") else ""), flush=True)

    def progress(i, n, shape):
        print(f"[{i + 1}/{n}] {shape.label}", flush=True)

    candidates = [c for c in a.candidates.split(",") if c]
    run_mix(shapes, device=device, candidates=candidates, sglang=sglang, iters=2 if a.smoke else a.iters,
            host_calls=5 if a.smoke else a.host_calls, progress=progress, on_record=saved)
    # every record was saved as it came; this leaves a file for a run of no shapes too
    write_atomic(json.dumps(doc, indent=1, default=str) + "\n", out)
    if a.retune and device == "cuda":
        retune(doc, out, a)
    print(render(doc))
    print(f"wrote {out}")
    bad = [r for r in doc["records"] if r.get("error") or r.get("matches_legacy") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
