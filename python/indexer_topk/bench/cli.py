"""The benchmark's command line: ``indexer-topk bench`` and ``benchmark/bench_indexer_topk.py``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from ..options import LAYOUTS, argparse_type, format_tokens, one_of, parse_list, parse_seed, parse_tokens
from ..workload import PATTERNS
from .environment import environment, gpu_slug
from .grid import (
    DEFAULT_BACKENDS,
    DEFAULT_CONTEXTS,
    DEFAULT_ROWS,
    DEFAULT_TOPKS,
    EXTRA_PATTERNS,
    KNOWN_BACKENDS,
    QUICK_EXTRA_SHAPE,
    QUICK_GRID,
    BenchCase,
    build_grid,
    run_cases,
)
from .report import SUFFIXES, new_stem, render_table, write_json, write_markdown, write_plot

NO_GPU_MESSAGE = (
    "the benchmark needs a CUDA or ROCm GPU, and torch.cuda.is_available() is False here "
    "(torch {torch}); run `indexer-topk demo` for the CPU demo"
)


def build_parser(prog: Optional[str] = None, parser_class=argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The benchmark's options; ``parser_class`` lets ``indexer-topk bench`` use its own error style."""
    p = parser_class(
        prog=prog or "bench_indexer_topk.py",
        description="GPU benchmark of the indexer top-k backends (time, peak memory, TFLOP/s, agreement).",
    )
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma list of layouts (default: all three)")
    p.add_argument("--contexts", default=",".join(format_tokens(c) for c in DEFAULT_CONTEXTS),
                   help="comma list of raw context lengths, K/M suffixes allowed (default: 64K,256K,768K,1M)")
    p.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="comma list of prefill rows (default: 1024,4096)")
    p.add_argument("--topk", default=",".join(map(str, DEFAULT_TOPKS)), help="comma list of topk values (default: 512,1024)")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help="comma list from reference,legacy,fused,aiter (default: legacy,fused; "
                        "the fp64 reference is for small --quick grids only)")
    p.add_argument("--pattern", default="random", choices=PATTERNS, help="score pattern of the main grid")
    p.add_argument("--extra-patterns", default=",".join(EXTRA_PATTERNS),
                   help="adversarial patterns run once per layout at rows=1024, 768K, topk=1024 "
                        "('none' to skip; default: increasing)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls before timing (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed calls; the median is reported (default 10)")
    p.add_argument("--seed", type=argparse_type(parse_seed, "seed"), default=0,
                   help="workload seed, 0 to 2**64 - 1 (default 0)")
    p.add_argument("--out-dir", default="benchmark/results",
                   help="folder of the run's new, dated files bench_<gpu>_<YYYYmmdd-HHMMSS>.json/.md/.png; "
                        "an earlier run's files are never replaced (default benchmark/results)")
    p.add_argument("--output", metavar="STEM",
                   help="name the run's files STEM.json, STEM.md and STEM.png instead, replacing any there "
                        "(e.g. benchmark/results/bench_nvidia-h200 to replace the committed results)")
    p.add_argument("--quick", action="store_true",
                   help="small grid: contexts 16K,64K, rows 256, topk 512,1024; extra set at 64K")
    return p


def grid_from_args(a, given: set) -> List[BenchCase]:
    """The cases the parsed options ``a`` ask for; ``given`` names the options set on the
    command line (``--quick`` replaces only the dimensions not among them)."""
    layouts = parse_list(a.layouts, one_of(LAYOUTS), name="--layouts")
    contexts = parse_list(a.contexts, parse_tokens, name="--contexts")
    rows = parse_list(a.rows, int, name="--rows")
    topks = parse_list(a.topk, int, name="--topk")
    if any(r <= 0 for r in rows):
        raise ValueError("--rows: rows must be positive")
    extra = [] if a.extra_patterns.strip().lower() in ("", "none") else parse_list(a.extra_patterns, one_of(PATTERNS), name="--extra-patterns")
    extra_shape = None
    if a.quick:
        contexts = contexts if "contexts" in given else list(QUICK_GRID["contexts"])
        rows = rows if "rows" in given else list(QUICK_GRID["rows"])
        topks = topks if "topk" in given else list(QUICK_GRID["topks"])
        extra_shape = QUICK_EXTRA_SHAPE
    return build_grid(layouts, contexts, rows, topks, pattern=a.pattern, extra_patterns=extra, extra_shape=extra_shape)


def main(argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None, parser_class=argparse.ArgumentParser) -> int:
    """Run the benchmark from command-line arguments; returns the exit status.

    2 without a GPU or on a bad option; 1 if any backend disagreed with legacy or failed
    (status ``"error"``: a crash, a CUDA fault, out of memory), or if no backend ran at all;
    else 0. Backends that cannot run here (status ``"unavailable"``) do not fail a run in
    which others ran.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog, parser_class)
    a = parser.parse_args(argv)
    given = {opt.lstrip("-").split("=")[0].replace("-", "_") for opt in argv if opt.startswith("--")}
    try:
        cases = grid_from_args(a, given)
        backends = parse_list(a.backends, one_of(KNOWN_BACKENDS), name="--backends")
        if a.warmup < 0 or a.iters < 1:
            raise ValueError("--warmup must be >= 0 and --iters >= 1")
        if a.output is not None and "out_dir" in given:
            raise ValueError("--output names the files itself; give --output or --out-dir, not both")
        if a.output is not None and not Path(a.output).name:
            raise ValueError(f"--output: {a.output!r} names a folder, not a file stem")
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"{parser.prog}: error: " + NO_GPU_MESSAGE.format(torch=torch.__version__), file=sys.stderr)
        return 2

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    device = torch.device("cuda", torch.cuda.current_device())
    env = environment(device)
    command = " ".join([prog or "python benchmark/bench_indexer_topk.py", shlex.join(argv)]).strip()
    err = Console(stderr=True)
    stem = _output_stem(a.output) if a.output is not None else new_stem(a.out_dir, f"bench_{gpu_slug(env['gpu'])}")
    paths = {suffix: Path(f"{stem}{suffix}") for suffix in SUFFIXES}
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    ) as progress:
        task = progress.add_task("benchmark", total=len(cases))

        def on_case(case, so_far):
            progress.update(task, advance=1, description=case.name)
            # Keep what is measured if a long sweep is stopped part way.
            write_json(so_far, paths[".json"])
            if not err.is_terminal:
                err.print(f"[{progress.tasks[0].completed}/{len(cases)}] {case.name}", highlight=False)

        records = run_cases(cases, backends, warmup=a.warmup, iters=a.iters, seed=a.seed, device=device, env=env, on_case=on_case)

    json_path = write_json(records, paths[".json"])
    md_path = write_markdown(records, paths[".md"], env=env, command=command)
    png_path = write_plot(records, paths[".png"], title=f"indexer top-k on {env['gpu']}")
    console = Console()
    if not console.is_terminal:  # piped output would fold the table at 80 columns
        console = Console(width=200)
    console.print(f"wrote {json_path}, {md_path}, {png_path}")
    console.print(render_table(records, title=f"indexer top-k on {env['gpu']} (torch {env['torch_version']}, triton {env['triton_version']})"))
    return exit_status(records)


def _output_stem(text: str) -> Path:
    """``--output``'s stem; a name given with one of the run's suffixes loses it."""
    path = Path(text)
    return path.with_suffix("") if path.suffix in SUFFIXES else path


def exit_status(records: Sequence[dict]) -> int:
    """1 if a record disagrees with legacy or failed with an error, or if none ran (nothing
    measured is no pass); else 0."""
    bad = [r for r in records if r.get("matches_legacy") is False or r.get("status") == "error"]
    ran = [r for r in records if r.get("status") == "ok"]
    return 1 if bad or not ran else 0


__all__ = ["NO_GPU_MESSAGE", "build_parser", "exit_status", "grid_from_args", "main"]
