"""Benchmark records out: JSON, a markdown report, the time/memory plot and the console table.

The writers read only the records (and the environment fields they carry), so
``benchmark/render_results.py`` can redraw the markdown and the plot from a committed JSON.
Each writes a temporary file beside its target and renames it over the target, so a run
stopped part way leaves the previous file whole, never half of a new one.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..files import write_atomically
from ..options import format_tokens
from .runs import MATCH_RULE
from .timing import FLOP_RULE, PEAK_MEMORY_METHOD, TIMING_METHOD

PLOT_ROWS, PLOT_TOPK = 1024, 1024
TABLE_COLUMNS = ("layout", "rows", "ctx", "topk", "pattern", "backend", "ms", "TFLOP/s", "peak MiB", "matches", "vs legacy", "note")


def _fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def _note(r: dict, ok: bool) -> str:
    if not ok:
        return f"{r.get('status')}: {r.get('reason') or r.get('error')}"
    if r.get("backend") == "legacy" and r.get("score_ms") is not None:
        note = (
            f"score {r['score_ms']:.2f} + select {_fmt(r.get('select_ms'), '.2f')} ms; "
            f"torch.topk {_fmt(r.get('torch_topk_ms'), '.2f')} ms"
        )
        return note + (f"; stages: {r['stage_error']}" if r.get("stage_error") else "")
    if r.get("stage_error"):
        return f"stages: {r['stage_error']}"
    if r.get("workspace_mib") is not None:
        return f"workspace {r['workspace_mib']:.1f} MiB"
    return ""


def table_rows(records: Iterable[dict]) -> List[Tuple[str, ...]]:
    """Records as display strings in :data:`TABLE_COLUMNS` order."""
    out = []
    for r in records:
        ok = r.get("status") == "ok"
        m = r.get("matches_legacy")
        matches = "-" if m is None else ("yes" if m else "NO")
        if ok and r.get("backend") == "legacy":
            matches = "baseline"
        out.append(
            (
                str(r.get("layout")),
                str(r.get("rows")),
                format_tokens(int(r.get("context_tokens") or 0)),
                str(r.get("topk")),
                str(r.get("pattern", "random")),
                str(r.get("backend")),
                _fmt(r.get("median_ms"), ".3f"),
                _fmt(r.get("tflops"), ".1f"),
                _fmt(r.get("peak_mib"), ".1f", "n/a" if ok and r.get("peak_mib") is None else "-"),
                matches,
                _fmt(r.get("speedup_vs_legacy"), ".2f", "-") + ("x" if r.get("speedup_vs_legacy") else ""),
                _note(r, ok),
            )
        )
    return out


SUFFIXES = (".json", ".md", ".png")


def new_stem(out_dir, prefix: str, when: Optional[_dt.datetime] = None) -> Path:
    """A file stem no earlier run has used: ``out_dir/prefix_YYYYmmdd-HHMMSS`` (UTC, default
    now), with ``-2``, ``-3``, ... appended while a file of that stem exists.

    The ``.json`` is created empty-listed (``[]``) before this returns, so two runs started in
    the same second take different stems.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    when = when or _dt.datetime.now(_dt.timezone.utc)
    base = f"{prefix}_{when.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while True:
        stem = out_dir / (base if n == 1 else f"{base}-{n}")
        n += 1
        if any(stem.with_suffix(s).exists() for s in SUFFIXES):
            continue
        try:
            with stem.with_suffix(".json").open("x") as f:
                f.write("[]\n")
        except FileExistsError:
            continue
        return stem


def write_json(records: Sequence[dict], path) -> Path:
    """Write ``records`` as a JSON list (one object per backend x case), atomically."""
    text = json.dumps(list(records), indent=1, default=str) + "\n"
    return write_atomically(path, lambda f: f.write(text))


def markdown_table(records: Sequence[dict]) -> str:
    """The records as a markdown table with :data:`TABLE_COLUMNS`."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for row in table_rows(records):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)


def write_markdown(records: Sequence[dict], path, *, env: dict, command: str) -> Path:
    """Markdown report: a header (GPU, versions, command, methods) and the results table,
    written atomically."""
    first = records[0] if records else {}
    timing = first.get("timing_method", TIMING_METHOD.format(iters="?", warmup="?", clock="CUDA events"))
    text = "\n".join(
        [
            f"# indexer-topk benchmark: {env.get('gpu')}",
            "",
            f"- GPU: {env.get('gpu')}",
            f"- torch {env.get('torch_version')}, triton {env.get('triton_version')}, "
            f"indexer-topk {env.get('indexer_topk_version')} (source {env.get('source_revision') or 'unknown'})",
            f"- run at {env.get('timestamp')}",
            f"- command: `{command}`",
            f"- time: {timing}",
            f"- peak memory: `{PEAK_MEMORY_METHOD}`",
            f"- TFLOP/s: {FLOP_RULE}",
            f"- matches: {MATCH_RULE}",
            "- workload: one request; its `rows` query tokens are the last tokens of a `ctx`-token "
            "context, so every row scores about ctx/4 C4 positions",
            "",
            markdown_table(records),
            "",
        ]
    )
    return write_atomically(path, lambda f: f.write(text))


def plot_selection(records: Sequence[dict], rows: int, topk: int) -> Tuple[List[dict], int, int]:
    """The random-pattern records of shape ``rows`` x ``topk`` and that shape; a grid without
    it (e.g. ``--quick``) plots its most common shape instead."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("pattern", "random") == "random"]
    sel = [r for r in ok if r.get("rows") == rows and r.get("topk") == topk]
    if sel or not ok:
        return sel, rows, topk
    shapes: Dict[Tuple[int, int], int] = {}
    for r in ok:
        shapes[(r["rows"], r["topk"])] = shapes.get((r["rows"], r["topk"]), 0) + 1
    rows, topk = max(shapes, key=lambda s: (shapes[s], s))
    return [r for r in ok if r.get("rows") == rows and r.get("topk") == topk], rows, topk


def write_plot(records: Sequence[dict], path, *, rows: int = PLOT_ROWS, topk: int = PLOT_TOPK, title: str = "") -> Path:
    """Two panels, time and peak memory vs context (log x), one line per layout x backend.

    Uses ``rows`` x ``topk`` records of the random pattern (see :func:`plot_selection`); the
    file is written even when there is nothing to plot, atomically, as a PNG whatever its name.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel, rows, topk = plot_selection(records, rows, topk)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    series: Dict[Tuple[str, str], List[dict]] = {}
    for r in sel:
        series.setdefault((r["layout"], r["backend"]), []).append(r)
    colours = {lay: f"C{i}" for i, lay in enumerate(sorted({lay for lay, _ in series}))}
    styles = {"fused": "-", "legacy": "--", "aiter": "-.", "reference": ":"}
    for (layout, backend), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["context_tokens"])
        style = styles.get(backend, ":")
        label = f"{layout} / {backend}"
        xs = [r["context_tokens"] for r in rs]
        for ax, key in ((ax_t, "median_ms"), (ax_m, "peak_mib")):
            ys = [r.get(key) for r in rs]
            if any(y is not None for y in ys):
                ax.plot(xs, [float("nan") if y is None else y for y in ys], style, color=colours[layout], marker="o", label=label)
    for ax, ylabel in ((ax_t, "median time (ms)"), (ax_m, "peak memory above inputs/outputs (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("raw context (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if sel:
            ticks = sorted({r["context_tokens"] for r in sel})
            ax.set_xticks(ticks)
            ax.set_xticklabels([format_tokens(t) for t in ticks])
            ax.minorticks_off()
    if sel:
        ax_t.legend(fontsize=7)
    else:
        ax_t.text(0.5, 0.5, "no successful records", ha="center", va="center", transform=ax_t.transAxes)
    fig.suptitle(f"{title or 'indexer top-k'}: rows={rows}, topk={topk}, random scores")
    fig.tight_layout()
    try:
        return write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=120), binary=True)
    finally:
        plt.close(fig)


def render_table(records: Sequence[dict], title: str = "indexer top-k benchmark"):
    """A ``rich.table.Table`` of the records (same columns as the markdown)."""
    from rich.table import Table

    table = Table(title=title)
    for c in TABLE_COLUMNS:
        table.add_column(c, justify="right" if c in ("rows", "ctx", "topk", "ms", "TFLOP/s", "peak MiB", "vs legacy") else "left")
    for row in table_rows(records):
        table.add_row(*row)
    return table


__all__ = [
    "PLOT_ROWS",
    "PLOT_TOPK",
    "TABLE_COLUMNS",
    "SUFFIXES",
    "markdown_table",
    "new_stem",
    "plot_selection",
    "render_table",
    "table_rows",
    "write_json",
    "write_markdown",
    "write_plot",
]
