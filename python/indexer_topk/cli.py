"""The ``indexer-topk`` command (also ``python -m indexer_topk``).

Subcommands:

``demo`` (the default)
    Build an embedded DeepSeek-V4-shaped prefill batch sized for this machine, run every
    available backend on it and print time, peak memory, effective TFLOP/s and whether the
    outputs agree; then how much memory the fused path saves and which path the policy picks.
``bench``
    The GPU benchmark (:mod:`indexer_topk.bench.cli`); options pass through.
``info``
    Versions, device, AITER symbol, kill switch, the routes table in force and the route of each
    mode and layout, as this environment's processes will run them.
``check``
    The fp64 reference against the chosen backends on random and adversarial inputs.
``tune``
    Time the serving mix's candidates on this GPU and write a routes table for
    ``INDEXER_TOPK_ROUTES`` (or build one from a records file with ``--from-records``).

Without a GPU the Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` is set in
:func:`main` before any backend module (and so triton) is imported, except for ``info`` and
``tune``, which report and measure the environment as it is.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
from typing import List, Optional, Sequence

from .contract import PAGE_SIZE
from .errors import describe_exception, failure_reason, failure_status, missing_dependency, missing_dependency_words
from .options import LAYOUTS, argparse_type, one_of, parse_list, parse_seed, parse_tokens

PROG = "indexer-topk"
KERNEL_BACKENDS = ("legacy", "fused", "aiter")
# The fp64 reference materialises per-block fp64 scores; beyond this many row x position
# pairs it takes minutes, so the demo leaves it out of GPU-sized runs.
REFERENCE_MAX_PAIRS = 1 << 22

# Demo shapes. CPU: finishes in well under a minute under the Triton interpreter (C4 lengths
# 749-1250, so both the selection path and, with topk 512, real competition for slots).
# GPU: the 768K-token, 1024-row V4-Pro prefill chunk whose FP32 score matrix is 768 MiB.
CPU_DEMO = {"layout": "sglang_fp8", "context": "3000,5000", "rows": 2, "topk": 512}
GPU_DEMO = {"layout": "sglang_fp8", "context": "768K", "rows": 1024, "topk": 1024}
CPU_CHECK = {"context": (4100, 1000), "rows": (1, 1)}  # one long row, one short (seq_len < topk)
GPU_CHECK = {"context": (64 * 1024, 16 * 1024, 2000), "rows": (32, 16, 4)}
# The CPU demo's size guard (indexer_topk.bench.cost estimates a run before it is built): a
# run estimated beyond these is refused unless --force, one beyond the warning levels warned.
CPU_DEMO_MAX_SECONDS = 600
CPU_DEMO_WARN_SECONDS = 60
CPU_DEMO_MAX_MEMORY_SHARE = 0.5  # of the machine's physical memory
CPU_DEMO_MAX_MEMORY_FALLBACK = 8 << 30  # where the system does not say how much it has
CPU_DEMO_WARN_MEMORY = 2 << 30


class CliError(Exception):
    """A user-facing error: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2) instead of usage + error, and
    output that cannot be written (``--help``, ``--version``, usage) fails: argparse's writer
    for all of them drops the write error and exits 0."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def _print_message(self, message, file=None):  # argparse's one writer (help, usage, version, exit)
        if message:
            (file or sys.stderr).write(message)


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------

def _resolve_device(name: str):
    """``--device``: auto, cpu, cuda or cuda:N. The kernels run on CUDA/ROCm GPUs (ROCm's torch
    calls them cuda) and on a CPU under the Triton interpreter; torch's other device types
    (meta, xpu, mps, ...) would fail deep inside a kernel, so they are refused here."""
    import torch

    text = name.strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", text)
    if not m or (m.group(1) == "cpu" and m.group(2) not in (None, "0")):
        raise CliError(f"--device: {name!r} is not supported; expected auto, cpu, cuda or cuda:N "
                       "(the kernels run on CUDA/ROCm GPUs, and on a CPU under the Triton interpreter)")
    if m.group(1) == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise CliError(f"--device {name}: no CUDA/ROCm GPU is visible to torch {torch.__version__}")
    if m.group(2) is not None and int(m.group(2)) >= torch.cuda.device_count():
        raise CliError(f"--device {name}: torch sees {torch.cuda.device_count()} GPU(s), numbered from 0")
    return torch.device(text)


def _policy_summary(layout=None, topk=None, rows=None, c4_len=None) -> dict:
    """The frozen policy's decision, or why it cannot be read (never raises); with ``layout``,
    the route of a prefill call of that layout, ``topk``, ``rows`` and C4 positions."""
    try:
        from .policy import default_policy

        pol = default_policy()
        out = {"available": True, "fused_backend": getattr(pol, "fused_backend", None), "reason": getattr(pol, "reason", None)}
        if layout is not None:
            out["route"] = pol.route(layout=layout, is_decode=False, topk=topk, rows=rows, c4_len=c4_len)
        try:
            out["describe"] = pol.describe()
        except Exception as exc:  # describe() is informational only
            out["describe"] = {"error": f"{type(exc).__name__}: {exc}"}
        return out
    except Exception as exc:
        return {"available": False, "reason": f"unavailable: {describe_exception(exc)}"}


def _policy_line(pol: dict) -> str:
    if not pol.get("available"):
        return f"policy: {pol.get('reason')}"
    fused = pol.get("fused_backend")
    route = pol.get("route", fused)
    if route == fused:
        return f"policy: a prefill here runs on '{route}': {pol.get('reason')}"
    return (
        f"policy: a prefill of this layout and topk runs on '{route}'; the process's fused path is "
        f"'{fused}': {pol.get('reason')}"
    )


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=not (enabled and console.is_terminal),
    )


def _mib(nbytes: float) -> str:
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:,.1f} MiB"
    if nbytes >= 2**10:
        return f"{nbytes / 2**10:,.1f} KiB"
    return f"{int(nbytes)} B"


def _workspace_bytes(rows: int, topk: int, layout: str, device) -> Optional[int]:
    try:
        from .api import workspace_size

        return int(workspace_size(rows, topk, layout, device=device))
    except Exception:
        return None


def _option_list(text: str, convert, name: str) -> list:
    """A comma-list option; a bad item is a usage error (exit 2), like argparse's own."""
    try:
        return list(dict.fromkeys(parse_list(text, convert, name=name)))
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _parse_contexts(text: str) -> List[int]:
    return _option_list(text, parse_tokens, "--context")


def _tolerance(name: str):
    """argparse type for ``--rtol`` / ``--atol``: a float the comparison can still fail under."""

    def parse(text: str) -> float:
        from .compare import check_tolerance

        try:
            value = float(text)
            check_tolerance(**{name: value})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
        return value

    parse.__name__ = name  # argparse names the type in its message
    return parse


_SEED = argparse_type(parse_seed, "seed")


def _choice_list(text: str, allowed: Sequence[str], name: str) -> List[str]:
    """A comma-list option whose items must be among ``allowed``."""
    return _option_list(text, one_of(allowed), name)


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------

def _demo_workload_args(a, device) -> dict:
    on_gpu = device.type == "cuda"
    base = GPU_DEMO if on_gpu else CPU_DEMO
    contexts = _parse_contexts(a.context or base["context"])
    rows = a.rows if a.rows is not None else base["rows"]
    if rows <= 0:
        raise CliError("--rows: must be positive")
    layout = a.layout or base["layout"]
    if a.layout is None and on_gpu and _policy_summary().get("fused_backend") == "aiter":
        layout = "aiter_mxfp4"  # the only layout AITER's kernel reads; show it running
    return {
        "layout": layout,
        "context_tokens": contexts,
        "rows_per_request": [rows] * len(contexts),
        "topk": a.topk if a.topk is not None else base["topk"],
        "seed": a.seed,
        "device": device,
        "pattern": a.pattern,
    }


def _cpu_demo_guard(wargs: dict, backends: Sequence[str], force: bool, *, what: str = "demo", runs: int = 1,
                    kernel_calls: int = 1, reference_max_pairs: int = REFERENCE_MAX_PAIRS,
                    layouts: Optional[Sequence[str]] = None) -> None:
    """Refuse (``CliError``, exit 2) a CPU run estimated beyond :data:`CPU_DEMO_MAX_SECONDS` or
    half the machine's memory unless ``force``; warn on stderr above the warning levels.

    The run is ``runs`` workloads of ``wargs`` per layout of ``layouts`` (``wargs``'s alone by
    default), each run once by the reference and ``kernel_calls`` times by each kernel backend
    (warm-up and timed iterations included)."""
    from .backends import triton_problem
    from .bench.cost import DemoCost, demo_cost, format_bytes, format_seconds, physical_memory_bytes

    if triton_problem(wargs["device"]) is not None:  # our kernels will not run: they cost nothing
        backends = [b for b in backends if b not in ("legacy", "fused")]
    rows, contexts = wargs["rows_per_request"], wargs["context_tokens"]
    seconds, memory = 0.0, 0
    for layout in layouts or (wargs["layout"],):
        one = demo_cost(layout, contexts, rows, wargs["topk"], backends, reference_max_pairs=reference_max_pairs,
                        kernel_calls=kernel_calls)
        seconds += runs * one.seconds
        memory = max(memory, one.memory_bytes)
    cost = DemoCost(seconds, memory)
    physical = physical_memory_bytes()
    max_memory = int(physical * CPU_DEMO_MAX_MEMORY_SHARE) if physical else CPU_DEMO_MAX_MEMORY_FALLBACK
    shape = f"{len(contexts)} request(s), {sum(rows):,} rows, up to {max(contexts):,} tokens"
    workloads = runs * len(layouts or (1,))
    if workloads > 1:
        shape += f", {workloads} workloads"
    if kernel_calls > 1:
        shape += f", {kernel_calls} calls a kernel backend"
    where = "half this machine's memory" if physical else "this system does not say how much memory it has"
    limits = f"the CPU limits are {format_seconds(CPU_DEMO_MAX_SECONDS)} and {format_bytes(max_memory)} ({where})"
    options = "--rows/--context" + ("/--warmup/--iters" if kernel_calls > 1 else "")
    smaller = "smaller --rows/--context" + (", fewer --warmup/--iters" if kernel_calls > 1 else "")
    if cost.seconds > CPU_DEMO_MAX_SECONDS or cost.memory_bytes > max_memory:
        if not force:
            raise CliError(f"{options}: this CPU {what} ({shape}) is estimated at {cost} under the Triton "
                           f"interpreter; {limits}. Use {smaller}, a GPU, or --force to run it anyway")
    elif cost.seconds <= CPU_DEMO_WARN_SECONDS and cost.memory_bytes <= CPU_DEMO_WARN_MEMORY:
        return
    print(f"{PROG}: warning: this CPU {what} ({shape}) is estimated at {cost} under the Triton interpreter "
          f"(a rough estimate); {smaller} run faster", file=sys.stderr)


def _memory_statement(runs: dict, w, device) -> dict:
    """Memory saved by the fused path: measured on GPU, exact arithmetic on CPU."""
    legacy, fused = runs.get("legacy"), runs.get("fused")
    from .backends.key_matrix import key_matrix_bytes  # arithmetic only: no Triton needed

    logits_bytes = key_matrix_bytes(w.rows, w.page_table.shape[1])
    ws = _workspace_bytes(w.rows, w.topk, w.layout.value, device)
    out = {"legacy_logits_bytes": logits_bytes, "fused_workspace_bytes": ws}
    if device.type == "cuda":
        lp = legacy.record.get("peak_mib") if legacy is not None and legacy.ok else None
        fp = fused.record.get("peak_mib") if fused is not None and fused.ok else None
        out.update(legacy_peak_mib=lp, fused_peak_mib=fp, method="CUDA peak above inputs and outputs")
        if lp is not None and fp is not None:
            # Count the fused path's preallocated scratch against it: that is what it really holds.
            fused_total = fp + (ws or 0) / 2**20
            ratio = f", {lp / fused_total:,.0f}x less" if fused_total > 0.01 else ""
            out.update(fused_total_mib=fused_total, saved_mib=lp - fused_total)
            out["line"] = (
                f"memory above inputs and outputs: legacy {lp:,.1f} MiB (its score matrix: {_mib(logits_bytes)}); "
                f"fused {fused_total:,.1f} MiB ({_mib(ws or 0)} preallocated workspace + {fp:,.1f} MiB allocated "
                f"by the call): {lp - fused_total:,.1f} MiB saved{ratio}"
            )
        else:
            out["line"] = (
                f"memory: legacy's FP32 score matrix for this call is {_mib(logits_bytes)}; "
                "no fused measurement to compare on this machine"
            )
        return out
    # CPU: allocator statistics say nothing useful, but both sizes are exact by construction.
    gpu_rows = GPU_DEMO["rows"]
    gpu_c4 = _parse_contexts(GPU_DEMO["context"])[0] // 4
    gpu_logits = key_matrix_bytes(gpu_rows, -(-gpu_c4 // 64) + 1)
    out.update(
        method="exact sizes (no measurement on CPU)",
        gpu_shape={"rows": gpu_rows, "c4_len": gpu_c4, "topk": GPU_DEMO["topk"]},
        gpu_legacy_logits_bytes=gpu_logits,
    )
    here_ws = f"a {_mib(ws)}" if ws is not None else "an unknown (fused backend unavailable)"
    out["line"] = (
        f"memory (exact sizes, not measurements): legacy writes a {_mib(logits_bytes)} score matrix here, "
        f"the fused path {here_ws} scratch (workspace_size). The matrix grows with context: "
        f"{_mib(gpu_logits)} at the GPU demo shape ({gpu_rows} rows x 768K tokens); the fused scratch "
        "depends on rows, topk and the GPU's SM count, never on context."
    )
    return out


def cmd_demo(a, device) -> int:
    import torch
    from rich.table import Table

    from .bench.runs import BackendRun, run_backend, workload_record
    from .compare import compare_to_reference, comparison_rule, mma_tolerance
    from .reference import reference_with_next_values
    from .workload import make_workload

    on_gpu = device.type == "cuda"
    # Under the interpreter a call takes seconds and there is nothing to warm up, so the CPU
    # default times the single checked call (--iters 0).
    warmup = a.warmup if a.warmup is not None else (3 if on_gpu else 0)
    iters = a.iters if a.iters is not None else (10 if on_gpu else 0)
    if warmup < 0 or iters < 0:
        raise CliError("--warmup and --iters must be >= 0")
    wargs = _demo_workload_args(a, device)
    requested = _choice_list(a.backends, ("reference",) + KERNEL_BACKENDS, "--backends") if a.backends else None
    if not on_gpu:
        _cpu_demo_guard(wargs, requested or ("reference",) + KERNEL_BACKENDS, a.force,
                        kernel_calls=1 + (warmup + iters if iters else 0))  # no timing: no warm-up

    runs: dict = {}
    with _progress(not a.json) as progress:
        task = progress.add_task("building the workload", total=None)
        w = make_workload(**wargs)
        pairs = w.rows * w.c4_len
        order = ["legacy", "reference", "fused", "aiter"]  # legacy first: it is the baseline
        if requested is not None:
            order = [b for b in order if b in requested]
        progress.update(task, total=len(order), completed=0)
        baseline = None
        for b in order:
            progress.update(task, description=f"running {b}")
            if b == "reference" and pairs > REFERENCE_MAX_PAIRS:
                rec = workload_record(w)
                rec.update(backend=b, status="skipped", reason=(
                    f"{pairs:,} row x position pairs is beyond the fp64 reference's demo budget "
                    f"({REFERENCE_MAX_PAIRS:,}); run `indexer-topk check` for reference comparisons"))
                runs[b] = BackendRun(rec, None)
            else:
                # The reference is held to legacy by the tolerant rule below, not bitwise.
                runs[b] = run_backend(w, b, warmup=warmup, iters=iters, device=device,
                                      baseline=None if b == "reference" else baseline, time_first_call=True)
            if b == "legacy":
                baseline = runs[b].outputs
            progress.advance(task)

        # Against the fp64 reference: kernels use the hardware's MMA precision, so the rule is
        # tolerant (see indexer_topk.compare); between kernels it is bitwise.
        ref = runs.get("reference")
        if ref is not None and ref.ok:
            progress.update(task, description="comparing with the reference")
            next_values = reference_with_next_values(*w.args(), **w.kwargs())[1]
            for b, run in runs.items():
                if b == "reference" or not run.ok:
                    continue
                cmp = compare_to_reference(run.outputs, ref.outputs, next_values=next_values, inputs=w,
                                           **mma_tolerance(w.layout, device, ref.outputs, inputs=w))
                run.record["matches_reference"] = cmp.ok
                run.record["reference_comparison"] = cmp.summary()
            ref.record["matches_legacy"] = runs["legacy"].record.get("matches_reference") if baseline is not None else None
            ref.record["matches_reference"] = True

    pol = _policy_summary(w.layout.value, w.topk, w.rows, w.page_table.shape[1] * PAGE_SIZE)
    mem = _memory_statement(runs, w, device)
    rule = comparison_rule(device=device, magnitudes=True)
    failures = []
    for b, run in runs.items():
        r = run.record
        if r.get("status") == "error":
            failures.append(f"{b}: {r.get('reason')}")
        if r.get("matches_legacy") is False:
            failures.append(f"{b}: outputs differ from legacy")
        if r.get("matches_reference") is False:
            failures.append(f"{b}: outputs differ from the reference ({r.get('reference_comparison')})")
    if not any(run.ok for run in runs.values()):
        failures.append("nothing ran: no requested backend could run here, so nothing was compared")

    display = [b for b in ("reference", "legacy", "fused", "aiter") if b in runs]
    if a.json:
        doc = {
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if on_gpu else None,
            "torch_version": torch.__version__,
            "workload": {
                **workload_record(w),
                "context_tokens": list(w.context_tokens),
                "seq_lens": [int(x) for x in w.seq_lens.tolist()] if w.rows <= 64 else None,
                "seed": a.seed,
            },
            "timing": {"warmup": warmup, "iters": iters,
                       "clock": "CUDA events" if iters and on_gpu else "time.perf_counter",
                       "triton_interpreter": not on_gpu},
            "comparison": {"kernels_vs_legacy": "bitwise (values as int32 bits)", "vs_reference": rule},
            "results": [runs[b].record for b in display],
            "memory": mem,
            "policy": pol,
            "failures": failures,
            "ok": not failures,
        }
        print(json.dumps(doc, indent=1, default=str))
        return 1 if failures else 0

    console = _console()
    ctx_txt = " + ".join(f"{c:,}" for c in w.context_tokens)
    where = torch.cuda.get_device_name(device) if on_gpu else "CPU, Triton interpreter"
    console.print(
        f"[bold]indexer top-k demo[/bold] ({where}): {w.layout.value}, {len(w.context_tokens)} request(s) of "
        f"{ctx_txt} tokens, {w.rows} rows, C4 length up to {w.c4_len:,}, topk {w.topk}"
    )
    table = Table()
    for col, just in (("backend", "left"), ("time (ms)", "right"), ("peak MiB", "right"), ("TFLOP/s", "right"),
                      ("identical to legacy", "left"), ("vs reference", "left")):
        table.add_column(col, justify=just)
    notes = []
    for b in display:
        r = runs[b].record
        if r.get("status") != "ok":
            notes.append(f"[{len(notes) + 1}] {b}: {r.get('reason')}")
            table.add_row(b, "-", "-", "-", f"{r.get('status')} [{len(notes)}]", "-")
            continue
        peak = "n/a" if r.get("peak_mib") is None else f"{r['peak_mib']:,.1f}"
        t = f"{r['median_ms']:,.2f}" if r.get("median_ms") is not None else "-"
        tf = f"{r['tflops']:.3g}" if r.get("tflops") is not None else "-"
        m = r.get("matches_legacy")
        if b == "legacy":
            same = "baseline"
        elif m is None:
            same = "no legacy output"
        elif b == "reference":
            same = "matches" if m else "[bold red]DIFFERS[/bold red]"
        else:
            same = "yes" if m else "[bold red]NO[/bold red]"
        vs_ref = "-" if b == "reference" else r.get("reference_comparison", "not compared")
        table.add_row(b, t, peak, tf, same, vs_ref)
    console.print(table)
    for n in notes:
        console.print(n, highlight=False)
    # Say what a comparison means only where one was made: a legend over no run reads as a pass.
    legend = []
    if any(runs[b].record.get("matches_legacy") is not None for b in display if b not in ("legacy", "reference")):
        legend.append("identical to legacy: all four outputs bitwise equal.")
    if ref is not None and ref.ok:
        legend.append(f"The reference is the fp64-accurate spec and kernels use MMA precision, so 'matches' means: {rule}.")
    if legend:
        console.print("[dim]" + " ".join(legend) + "[/dim]")
    if not on_gpu:
        console.print("[dim]CPU: the Triton kernels run under the interpreter; times show the run, not kernel speed.[/dim]")
    console.print(mem["line"], highlight=False)
    console.print(_policy_line(pol), highlight=False)
    if failures:
        console.print("[bold red]FAILED:[/bold red] " + "; ".join(failures), highlight=False)
    return 1 if failures else 0


def _console():
    from rich.console import Console

    console = Console()
    # Piped output would otherwise wrap at 80 columns and fold the table.
    return console if console.is_terminal else Console(width=120)


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------

def _device_info(device) -> dict:
    import torch

    if device.type != "cuda":
        return {"device": "cpu", "arch": "n/a"}
    props = torch.cuda.get_device_properties(device)
    if getattr(torch.version, "hip", None):
        arch = getattr(props, "gcnArchName", "unknown").split(":")[0]
        runtime = f"ROCm/HIP {torch.version.hip}"
    else:
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
        runtime = f"CUDA {torch.version.cuda}"
    return {"device": torch.cuda.get_device_name(device), "arch": arch, "runtime": runtime,
            "memory_gib": round(props.total_memory / 2**30, 1), "sms": props.multi_processor_count}


def _aiter_symbol_state() -> str:
    try:
        from .backends.aiter import aiter_symbol

        sym = aiter_symbol()
    except Exception as exc:
        return f"unknown ({describe_exception(exc)})"
    if not sym:
        return "absent"
    name = getattr(sym, "__qualname__", None) or getattr(sym, "__name__", None) or str(sym)
    return f"present ({name})"


def cmd_info(a, device) -> int:
    """Print what this environment's processes run: :func:`main` leaves ``TRITON_INTERPRET`` as
    the user set it for ``info``, so a CPU without it reports the reference, as a program would."""
    import platform

    import torch

    from . import __version__
    from .envs import envs
    from .policy import KILL_SWITCH
    from .versions import package_version, triton_version

    raw = envs.SGLANG_DSV4_FP4_FUSED_TOPK.raw()
    info = {
        "indexer_topk": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "sglang": package_version("sglang"),
        "aiter": package_version("amd-aiter", "aiter"),
        "device": _device_info(device),
        "aiter_symbol": _aiter_symbol_state(),
        "kill_switch": {"name": KILL_SWITCH, "value": raw if raw is not None else "unset"},
        "policy": _policy_summary(),
    }
    if a.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    dev = info["device"]
    lines = [
        f"indexer-topk {info['indexer_topk']}: python {info['python']}, torch {info['torch']}, triton {info['triton']}, "
        f"SGLang {info['sglang']}, AITER {info['aiter']}",
        "gpu: " + (", ".join(f"{k} {v}" if k != "device" else str(v) for k, v in dev.items())
                   if dev.get("device") != "cpu" else "none"),
        f"AITER symbol flydsl_pa_mqa_topk_fp4_prefill: {info['aiter_symbol']}",
    ]
    pol = info["policy"]
    desc = pol.get("describe") if isinstance(pol.get("describe"), dict) else {}
    if pol.get("available"):
        lines.append(f"policy: fused path = {pol.get('fused_backend')} ({pol.get('reason')})")
    else:
        lines.append(f"policy: {pol.get('reason')}")
    lines += [str(x) for x in desc.get("lines") or [f"kill switch: {KILL_SWITCH}={info['kill_switch']['value']}"]]
    errors = {k: desc[k] for k in ("torch_error", "device_error", "triton_error", "aiter_error") if desc.get(k)}
    if errors:
        lines.append("probe errors: " + "; ".join(f"{k}={v}" for k, v in errors.items()))
    print("\n".join(lines))
    return 0


# ---------------------------------------------------------------------------------------------
# tune
# ---------------------------------------------------------------------------------------------

def _mix_module():
    try:
        from .bench import mix
    except ImportError as exc:
        raise CliError(f"tune: the serving-mix benchmark (indexer_topk.bench.mix) cannot be imported "
                       f"({describe_exception(exc)})", code=1) from None
    return mix


def _mix_records(a, device, probe, cls) -> tuple:
    """Run the mix on this GPU; ``(records, whether SGLang's path was timed)``."""
    from .policy import can_use_aiter

    mix = _mix_module()
    shapes = list(mix.default_shapes(a.smoke))
    if a.shapes:
        wanted = [w.strip() for w in a.shapes.split(",") if w.strip()]
        names = [shape.label for shape in shapes]
        shapes = [shape for shape, name in zip(shapes, names) if any(w in name for w in wanted)]
        if not shapes:
            raise CliError(f"--shapes: none of {wanted} names a shape of the mix; its shapes: {', '.join(names)}")
    candidates = ("fused", "legacy") + (("aiter",) if can_use_aiter(probe) else ())
    # SGLang's path, from its anchor kit (DeepGEMM built and importable), or not timed
    sglang = mix.SGLangPath(a.sglang_kit) if a.sglang_kit and not a.no_sglang else None
    with _progress(True) as progress:
        task = progress.add_task(f"tuning on {cls.words()}", total=len(shapes))

        def step(i, n, shape):
            progress.update(task, completed=i, total=n, description=f"{i + 1}/{n} {shape.label}")

        records = list(mix.run_mix(shapes, device=device, candidates=candidates, sglang=sglang, progress=step))
        progress.update(task, completed=len(shapes))
    return records, sglang is not None


def cmd_tune(a, device) -> int:
    """Write a routes table measured on this GPU (or built from ``--from-records``) to ``--out``."""
    from pathlib import Path

    from . import routes
    from .policy import probe_environment
    from .versions import source_revision

    out = Path(a.out)
    if routes.is_shipped_path(out):
        raise CliError(f"--out: {out} is in the package's own routes folder, which tune never writes; "
                       "write elsewhere and set INDEXER_TOPK_ROUTES to that file")
    if out.is_dir():
        raise CliError(f"--out: {out} is a folder; name a file")
    if out.exists() and not out.is_file():  # a device, a pipe: renamed over, it would become a plain file
        raise CliError(f"--out: {out} is not a regular file; name a file")
    if out.exists() and not a.force:
        raise CliError(f"--out: {out} exists; pass --force to replace it")
    sglang_timed = None
    try:
        if a.from_records:
            doc = routes.table_from_file(a.from_records)
        else:
            probe = probe_environment()
            cls = routes.device_class_of(probe)
            if cls is None or device.type != "cuda":
                raise CliError("tune times the kernels on this machine's GPU and finds none it can name "
                               f"({probe.device_name}); --from-records FILE builds a table from records measured "
                               "on another machine", code=1)
            records, sglang_timed = _mix_records(a, device, probe, cls)
            env = {"device": str(device), "gpu": probe.device_name, "sm_count": cls.sm_count, "arch": cls.arch,
                   "torch": __import__("torch").__version__, "triton": probe.triton_version,
                   "commit": source_revision() or "unknown", "hopper_stream": probe.hopper_stream}
            records_path = out.with_name(out.stem + ".records.json")
            routes.write_atomic(json.dumps({"env": env, "records": records}, indent=1) + "\n", records_path,
                                force=True)
            doc = routes.table_from_file(records_path)  # the table --from-records would build from them
        routes.write_table(doc, out, force=a.force)
    except routes.RoutesError as exc:
        raise CliError(str(exc), code=1) from None
    timed = {None: "", True: "; SGLang's path timed too", False: "; SGLang's path not timed (kept where it has one)"}
    print(f"wrote {out}: {len(doc['entries'])} entries for {routes.parse_table(doc).device.words()}"
          f"{timed[sglang_timed]}. Use it: INDEXER_TOPK_ROUTES={out}")
    return 0


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------

def _default_check_backends() -> List[str]:
    pol = _policy_summary()
    fused = pol.get("fused_backend") if pol.get("available") else None
    fused = fused if fused in ("fused", "aiter") else "fused"
    return [fused, "legacy"]


def cmd_check(a, device) -> int:
    from rich.table import Table

    from . import allocate_result, indexer_topk
    from .compare import compare_to_reference, comparison_rule, mma_tolerance
    from .reference import reference_with_next_values
    from .workload import PATTERNS, make_workload

    backends = _choice_list(a.backend, KERNEL_BACKENDS, "--backend") if a.backend else _default_check_backends()
    layouts = _choice_list(a.layout, LAYOUTS, "--layout") if a.layout else list(LAYOUTS)
    patterns = _choice_list(a.patterns, PATTERNS, "--patterns") if a.patterns else list(PATTERNS)
    if a.rows is not None and a.rows <= 0:
        raise CliError("--rows: must be positive")
    shape = GPU_CHECK if device.type == "cuda" else CPU_CHECK
    contexts = _parse_contexts(a.context) if a.context else list(shape["context"])
    rows = [a.rows] * len(contexts) if a.rows is not None else list(shape["rows"])[: len(contexts)] + [2] * max(0, len(contexts) - len(shape["rows"]))
    if device.type != "cuda":  # every pattern of every layout, each through the reference and the backends
        wargs = {"layout": layouts[0], "context_tokens": contexts, "rows_per_request": rows, "topk": a.topk,
                 "device": device}
        _cpu_demo_guard(wargs, ("reference",) + tuple(backends), a.force, what="check", runs=len(patterns),
                        reference_max_pairs=1 << 62, layouts=layouts)

    results = []
    with _progress(not a.json) as progress:
        task = progress.add_task("check", total=len(layouts) * len(patterns))
        for layout in layouts:
            for pattern in patterns:
                progress.update(task, description=f"{layout} / {pattern}")
                w = make_workload(layout, context_tokens=contexts, rows_per_request=rows, topk=a.topk,
                                  seed=a.seed, device=device, pattern=pattern)
                expected, next_values = reference_with_next_values(*w.args(), **w.kwargs())
                tol = mma_tolerance(layout, device, expected, rtol=a.rtol, atol=a.atol, inputs=w)
                for b in backends:
                    entry = {"layout": layout, "pattern": pattern, "backend": b, "rows": w.rows, "c4_len": w.c4_len, "topk": w.topk}
                    try:
                        out = allocate_result(w.rows, w.topk, device)
                        got = indexer_topk(*w.args(), **w.kwargs(), backend=b, out=out, check_values=True)
                    except Exception as exc:
                        entry.update(status=failure_status(exc), detail=failure_reason(exc))
                        results.append(entry)
                        continue
                    cmp = compare_to_reference(got, expected, next_values=next_values, inputs=w, **tol)
                    entry.update(status="ok" if cmp.ok else "mismatch", detail=cmp.summary(), comparison=cmp.to_dict())
                    results.append(entry)
                progress.advance(task)

    bad = [r for r in results if r["status"] in ("mismatch", "error")]
    checked = [r for r in results if r["status"] in ("ok", "mismatch")]
    unavailable = sorted({f"{r['backend']} ({r['detail']})" for r in results if r["status"] == "unavailable"})
    rule = comparison_rule(a.rtol, a.atol, device, magnitudes=True)
    summary = f"{len(checked)} run(s) compared, {len(bad)} failed"
    if unavailable:
        summary += "; not checked (unavailable): " + "; ".join(unavailable)
    # A check that compared nothing has shown nothing: it is no pass.
    reason = "nothing was compared: no chosen backend could run here" if not checked and not bad else None
    failed = bool(bad) or reason is not None
    if a.json:
        print(json.dumps({"device": str(device), "rule": rule, "results": results, "ok": not failed,
                          "reason": reason}, indent=1, default=str))
        return 1 if failed else 0
    t = Table(title=f"reference vs {', '.join(backends)} on {device}", title_justify="left")
    for c in ("layout", "pattern", "backend", "rows", "C4 len", "result"):
        t.add_column(c, justify="right" if c in ("rows", "C4 len") else "left")
    for r in results:
        style = {"ok": "green", "mismatch": "bold red", "error": "bold red"}.get(r["status"], "yellow")
        label = r["detail"] if r["status"] in ("ok", "mismatch") else f"{r['status']}: {r['detail']}"
        t.add_row(r["layout"], r["pattern"], r["backend"], str(r["rows"]), str(r["c4_len"]), f"[{style}]{label}[/{style}]")
    console = _console()
    console.print(t)
    console.print(f"[dim]rule: {rule}[/dim]")
    if reason is not None:
        summary = f"{reason}; {summary}"
    console.print(("[bold red]FAILED[/bold red]: " if failed else "OK: ") + summary, highlight=False)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from .workload import PATTERNS

    p = _Parser(prog=PROG, description="Exact streaming score + top-k for DeepSeek-V4's sparse-attention indexer. "
                                       "Without a subcommand, runs `demo`.")
    from . import __version__

    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{demo,bench,info,check,tune}")

    d = sub.add_parser("demo", help="run every available backend on an embedded DSv4-shaped workload (default)",
                       description="Run every available backend on one embedded DSv4-shaped prefill batch "
                                   "(CPU: a small batch under the Triton interpreter; GPU: 768K tokens, 1024 rows, topk 1024).")
    d.add_argument("--layout", choices=("aiter_mxfp4", "sglang_mxfp4", "sglang_fp8"),
                   help="cache layout (default sglang_fp8; aiter_mxfp4 where the policy picks AITER)")
    d.add_argument("--context", help="raw context tokens per request, comma list, K/M suffixes (default: CPU 3000,5000; GPU 768K)")
    d.add_argument("--rows", type=int, help="query rows per request, at the end of its context (default: CPU 2; GPU 1024)")
    d.add_argument("--topk", type=int, choices=(512, 1024, 2048), help="positions kept per row (default: CPU 512; GPU 1024)")
    d.add_argument("--pattern", default="random", choices=PATTERNS, help="score pattern (default random)")
    d.add_argument("--seed", type=_SEED, default=0, help="workload seed, 0 to 2**64 - 1 (default 0)")
    d.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    d.add_argument("--backends", help="comma list from reference,legacy,fused,aiter (default: all that can run)")
    d.add_argument("--warmup", type=int, help="warm-up calls before timing (default: GPU 3, CPU 0)")
    d.add_argument("--iters", type=int, help="timed calls, median reported; 0 times the first, checked call "
                                              "(default: GPU 10, CPU 0)")
    d.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    d.add_argument("--force", action="store_true",
                   help="on a CPU, run a demo estimated beyond the size guard's limits (10 min, or half this "
                        "machine's memory) instead of refusing it")
    d.set_defaults(func=cmd_demo)

    sub.add_parser("bench", add_help=False, help="GPU benchmark; `indexer-topk bench --help` for its options")

    i = sub.add_parser("info", help="versions, device, AITER symbol, kill switch, routes table and routes")
    i.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    i.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    i.set_defaults(func=cmd_info, interpreter=False)

    t = sub.add_parser("tune", help="measure this GPU and write a routes table (INDEXER_TOPK_ROUTES)",
                       description="Time the serving mix's candidates (our exact backends and, where DeepGEMM is "
                                   "importable, SGLang's path) on this GPU and write a routes table to --out; "
                                   "INDEXER_TOPK_ROUTES=<that file> makes the policy use it.")
    t.add_argument("--out", required=True, help="the table file to write (never the package's own)")
    t.add_argument("--shapes", help="comma list: keep the mix's shapes whose name contains one of these")
    t.add_argument("--smoke", action="store_true", help="the mix's few smoke shapes (a quick check, not a table to use)")
    t.add_argument("--from-records", metavar="FILE", help="build the table from a serving-mix records file instead")
    t.add_argument("--no-sglang", action="store_true", help="do not time SGLang's path (the table keeps it where it has one)")
    t.add_argument("--sglang-kit", metavar="DIR", help="time SGLang's own path with the SGLang CUDA anchor kit at DIR "
                   "(DeepGEMM built and importable, its sglang_topk_v2 folder); without it the table keeps SGLang's "
                   "path wherever SGLang has one")
    t.add_argument("--force", action="store_true", help="replace --out if it exists")
    t.add_argument("--device", default="auto", help="auto or cuda (default auto)")
    t.set_defaults(func=cmd_tune, interpreter=False)

    c = sub.add_parser("check", help="compare backends with the fp64 reference on random and adversarial inputs",
                       description="Run the fp64 reference and the chosen backends on fresh inputs of every pattern "
                                   "and compare under the tolerant rule of indexer_topk.compare; exit 1 on a mismatch.")
    c.add_argument("--backend", help="comma list from legacy,fused,aiter (default: the policy's fused path and legacy)")
    c.add_argument("--layout", help="comma list of layouts (default: all three)")
    c.add_argument("--patterns", help=f"comma list from {','.join(PATTERNS)} (default: all)")
    c.add_argument("--context", help="raw context tokens per request, comma list (default: small on CPU, up to 64K on GPU)")
    c.add_argument("--rows", type=int, help="query rows per request")
    c.add_argument("--topk", type=int, default=512, choices=(512, 1024, 2048), help="default 512")
    c.add_argument("--seed", type=_SEED, default=0, help="workload seed, 0 to 2**64 - 1 (default 0)")
    c.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    c.add_argument("--rtol", type=_tolerance("rtol"), default=None,
                   help="relative score tolerance, at most 0.01 (default: 1e-5, and for sglang_fp8 on a GPU the fp8 "
                        "MMA tolerance)")
    c.add_argument("--atol", type=_tolerance("atol"), default=1e-6,
                   help="absolute score tolerance, at most 1%% of the largest score (default 1e-6)")
    c.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    c.add_argument("--force", action="store_true",
                   help="on a CPU, run a check estimated beyond the size guard's limits (as demo's --force)")
    c.set_defaults(func=cmd_check)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``indexer-topk``; returns the exit status (0 ok, 1 mismatch/failure, 2 usage).

    Output that cannot be written (a full device, a reader that closed the pipe, as ``| head``
    does) is an error of one line and status 1, not a traceback or a silent 0."""
    try:
        try:
            status = _main(argv)
        except SystemExit:  # --help and --version print, then exit: their output must reach its reader too
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _stdout_to_devnull()  # the reader is gone: nothing to say, and nothing left to flush at exit
        return 1
    except OSError as exc:
        if exc.filename is not None or exc.errno not in _OUTPUT_ERRNOS:  # a file's, named in the message
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
        _stdout_to_devnull()
        print(f"{PROG}: error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return 1


# what a write to standard output fails with (a full device or quota, an I/O error, a closed descriptor)
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EBADF, errno.EPIPE})


def _stdout_to_devnull() -> None:
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:
        pass


def _main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["demo"] + argv
    if argv[0] == "bench":
        # The benchmark owns its options; parse nothing here so they pass through untouched.
        from .bench.cli import main as bench_main

        return bench_main(argv[1:], prog=f"{PROG} bench", parser_class=_Parser)

    a = build_parser().parse_args(argv)
    try:
        device = _resolve_device(a.device)
        if device.type == "cpu" and getattr(a, "interpreter", True):
            # Must precede the first import of triton, which happens inside the backends.
            os.environ["TRITON_INTERPRET"] = "1"
        return a.func(a, device)
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.code
    except (ValueError, RuntimeError) as exc:
        print(f"{PROG}: error: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        missing = missing_dependency(exc)
        if missing is None:
            raise
        print(f"{PROG}: error: {PROG} {a.command or 'demo'}: {missing_dependency_words(missing)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
