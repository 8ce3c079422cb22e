"""The benchmark harness pieces that run on a CPU (:mod:`indexer_topk.bench`).

Timing and peak memory on a GPU are exercised by the GPU benchmark itself; here: the grid,
records from real (interpreted) backend runs and from failures, the JSON / markdown / plot
writers on fake records, and the benchmark command's options and exit status.
"""

import json
import math

import pytest
import torch

from indexer_topk import compare
from indexer_topk.bench import cli as bench_cli
from indexer_topk.bench import environment, grid, report, runs, timing
from indexer_topk.contract import IndexerTopKResult
from indexer_topk.errors import BackendUnavailable
from indexer_topk.reference import reference_indexer_topk
from indexer_topk.workload import make_workload

# ============================================================================================
# The grid and the clocks
# ============================================================================================


def test_gpu_slug():
    assert environment.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert environment.gpu_slug("AMD Instinct MI355X (gfx950)") == "amd-instinct-mi355x-gfx950"
    assert environment.gpu_slug("???") == "device"


def test_default_grid_has_every_case_and_the_adversarial_set():
    cases = grid.build_grid()
    main = [c for c in cases if c.pattern == "random"]
    extra = [c for c in cases if c.pattern != "random"]
    assert len(main) == 3 * 4 * 2 * 2
    assert len(extra) == 3
    assert {(c.rows, c.context_tokens, c.topk, c.pattern) for c in extra} == {(1024, 768 * 1024, 1024, "increasing")}
    assert len(set(cases)) == len(cases)
    # Cases sharing a workload are adjacent, so each workload is built once.
    keys = [c.workload_key for c in cases]
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(runs) == len(set(keys))


def test_effective_tflops_counts_rows_times_c4():
    # 1024 rows x 196608 positions is 3.30e12 FLOP; in 3.3 ms that is ~1000 TFLOP/s.
    tf = timing.effective_tflops(1024, 196608, 3.3)
    assert tf == pytest.approx(2 * 1024 * 196608 * 64 * 128 / 3.3e-3 / 1e12)
    assert 990 < tf < 1010
    assert timing.effective_tflops(1, 1, 0) is None


def test_time_call_runs_warmup_then_iters_on_cpu():
    calls = []
    times = timing.time_call(lambda: calls.append(1), warmup=2, iters=5, device="cpu")
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)
    assert timing.peak_memory_mib(lambda: None, "cpu") is None


# ============================================================================================
# Records
# ============================================================================================


@pytest.fixture(scope="module")
def tiny():
    # One long row (C4 550 > topk) and one short row (C4 250 < topk) in one program pair.
    return make_workload("sglang_fp8", context_tokens=[2200, 1000], rows_per_request=[1, 1], topk=512, seed=3)


def test_run_backend_reference_record(tiny):
    run = runs.run_backend(tiny, "reference", warmup=1, iters=2, device="cpu")
    r = run.record
    assert run.ok and r["status"] == "ok" and r["reason"] is None
    for key in ("layout", "rows", "context_tokens", "c4_len", "topk", "backend", "median_ms", "tflops", "peak_mib", "matches_legacy"):
        assert key in r
    assert (r["layout"], r["rows"], r["context_tokens"], r["c4_len"], r["topk"]) == ("sglang_fp8", 2, 2200, 550, 512)
    assert r["median_ms"] > 0 and r["tflops"] > 0
    assert r["peak_mib"] is None  # CPU: no allocator statistics
    assert r["matches_legacy"] is None  # no baseline given
    ref = reference_indexer_topk(*tiny.args(), **tiny.kwargs())
    assert compare.bitwise_equal(run.outputs, ref)
    # A baseline sets matches_legacy by the bitwise rule.
    assert runs.run_backend(tiny, "reference", iters=0, device="cpu", baseline=ref).record["matches_legacy"] is True
    bent = IndexerTopKResult(ref.values.clone(), ref.raw_indices, ref.physical_indices, ref.counts)
    bent.values[0, 0] = torch.nextafter(bent.values[0, 0], torch.tensor(math.inf))
    assert runs.run_backend(tiny, "reference", iters=0, device="cpu", baseline=bent).record["matches_legacy"] is False


def test_run_backend_times_first_call_when_asked(tiny):
    r = runs.run_backend(tiny, "reference", iters=0, device="cpu", time_first_call=True).record
    assert r["median_ms"] > 0 and "first call" in r["timed_calls"]
    assert runs.run_backend(tiny, "reference", iters=0, device="cpu").record["median_ms"] is None


@pytest.mark.parametrize(
    "exc, status, reason",
    [
        (BackendUnavailable("backend 'aiter' is not available: no aiter"), "unavailable",
         "BackendUnavailable: backend 'aiter' is not available"),
        # A fault inside a kernel is a failure, never "cannot run here".
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "error",
         "RuntimeError: CUDA error: an illegal memory access"),
        (RuntimeError("CUDA out of memory. Tried to allocate 4 GiB"), "error", "OOM: RuntimeError: CUDA out of memory"),
        (ImportError("cannot import name 'launch'"), "error", "ImportError: cannot import name 'launch'"),
        (NotImplementedError("no decode path"), "error", "NotImplementedError: no decode path"),
        (ValueError("values disagree"), "error", "ValueError: values disagree"),
        (ZeroDivisionError("bug"), "error", "ZeroDivisionError: bug"),
    ],
)
def test_run_backend_failures_become_records(tiny, monkeypatch, exc, status, reason):
    import indexer_topk.api as api

    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(api, "_backend_fn", lambda name: boom)
    run = runs.run_backend(tiny, "legacy", iters=1, device="cpu")
    assert run.outputs is None
    assert run.record["status"] == status
    assert run.record["reason"].startswith(reason)
    assert run.record["median_ms"] is None


def test_run_cases_on_real_backends():
    """legacy + fused on one tiny case, both run under the interpreter: records, stage times,
    agreement and speed-up."""
    case = grid.BenchCase("sglang_fp8", 2200, 2, 512)
    recs = grid.run_cases([case], ["legacy", "fused"], warmup=0, iters=1, device="cpu")
    assert [r["backend"] for r in recs] == ["legacy", "fused"]
    legacy, fused = recs
    for r in recs:
        assert r["case"] == case.name and r["gpu"] == "cpu" and r["torch_version"] == torch.__version__
        assert "peak_memory_method" in r and "timing_method" in r and r["timestamp"]
        assert r["status"] == "ok" and r["reason"] is None and "error" not in r, r.get("reason")
    assert legacy["matches_legacy"] is True
    for key in ("score_ms", "select_ms", "torch_topk_ms"):
        assert legacy[key] is not None and legacy[key] > 0, legacy.get("stage_error")
    assert fused["workspace_mib"] > 0
    assert fused["matches_legacy"] is True
    assert fused["speedup_vs_legacy"] == pytest.approx(legacy["median_ms"] / fused["median_ms"])


def test_run_cases_failing_case_becomes_error_records_and_continues(monkeypatch):
    built = []

    def fake_workload(case, *, seed, device):
        built.append(case)
        if case.context_tokens == 1 << 20:
            raise RuntimeError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return make_workload(case.layout, context_tokens=[case.context_tokens], rows_per_request=[case.rows],
                             topk=case.topk, device=device)

    monkeypatch.setattr(grid, "_workload_for", fake_workload)
    cases = [grid.BenchCase("sglang_fp8", 1 << 20, 1024, 512), grid.BenchCase("sglang_fp8", 1000, 2, 512)]
    recs = grid.run_cases(cases, ["reference"], warmup=0, iters=1, device="cpu")
    assert len(built) == 2 and len(recs) == 2
    assert recs[0]["status"] == "error" and recs[0]["error"].startswith("OOM:")
    assert recs[0]["c4_len"] == (1 << 20) // 4
    assert recs[1]["status"] == "ok"


# ============================================================================================
# Writers
# ============================================================================================


def fake_records():
    recs = []
    for layout in ("sglang_fp8", "aiter_mxfp4"):
        for ctx in (64 * 1024, 256 * 1024, 768 * 1024, 1 << 20):
            c4 = ctx // 4
            legacy_ms = c4 / 40000
            recs.append({
                "layout": layout, "rows": 1024, "context_tokens": ctx, "c4_len": c4, "topk": 1024, "pattern": "random",
                "backend": "legacy", "status": "ok", "median_ms": legacy_ms, "tflops": 100.0, "peak_mib": c4 * 4096 / 2**20,
                "matches_legacy": True, "score_ms": legacy_ms * 0.8, "select_ms": legacy_ms * 0.2, "torch_topk_ms": 1.0,
            })
            recs.append({
                "layout": layout, "rows": 1024, "context_tokens": ctx, "c4_len": c4, "topk": 1024, "pattern": "random",
                "backend": "fused", "status": "ok", "median_ms": legacy_ms / 2, "tflops": 200.0, "peak_mib": 0.0,
                "matches_legacy": layout == "sglang_fp8", "workspace_mib": 0.4, "speedup_vs_legacy": 2.0,
            })
    recs.append({
        "layout": "sglang_fp8", "rows": 4096, "context_tokens": 1 << 20, "c4_len": 1 << 18, "topk": 512, "pattern": "random",
        "backend": "legacy", "status": "error", "reason": "OOM: OutOfMemoryError: CUDA out of memory", "error": "OOM",
        "median_ms": None, "tflops": None, "peak_mib": None, "matches_legacy": None,
    })
    return recs


def test_table_rows_render_every_state():
    rows = report.table_rows(fake_records())
    assert all(len(r) == len(report.TABLE_COLUMNS) for r in rows)
    legacy = rows[0]
    assert legacy[:6] == ("sglang_fp8", "1024", "64K", "1024", "random", "legacy")
    assert legacy[9] == "baseline" and "score" in legacy[11] and "torch.topk" in legacy[11]
    fused_bad = [r for r in rows if r[0] == "aiter_mxfp4" and r[5] == "fused"][0]
    assert fused_bad[9] == "NO" and fused_bad[10] == "2.00x"
    err = rows[-1]
    assert err[6] == "-" and err[11].startswith("error: OOM")


def test_write_json_and_markdown(tmp_path):
    recs = fake_records()
    env = {"gpu": "NVIDIA H200", "torch_version": "2.13.0", "triton_version": "3.9.0", "timestamp": "2026-01-01T00:00:00+00:00"}
    jp = report.write_json(recs, tmp_path / "out" / "bench_nvidia-h200.json")
    assert json.loads(jp.read_text()) == recs
    cmd = "python benchmark/bench_indexer_topk.py --quick"
    md = report.write_markdown(recs, tmp_path / "bench.md", env=env, command=cmd).read_text()
    assert "NVIDIA H200" in md and "torch 2.13.0" in md and "triton 3.9.0" in md
    assert f"`{cmd}`" in md
    assert "reset_peak_memory_stats" in md and "max_memory_allocated" in md
    assert "| layout | rows | ctx | topk |" in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(recs)  # header + one line per record


def _is_png(path):
    return path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_plot(tmp_path):
    assert _is_png(report.write_plot(fake_records(), tmp_path / "a.png"))
    # Without rows=1024/topk=1024 records the most common shape is plotted.
    other = [dict(r, rows=256, topk=512) for r in fake_records()]
    sel, rows, topk = report.plot_selection(other, 1024, 1024)
    assert (rows, topk) == (256, 512) and len(sel) == 16
    assert _is_png(report.write_plot(other, tmp_path / "b.png"))
    # Nothing to plot still leaves a file behind.
    assert _is_png(report.write_plot([], tmp_path / "c.png"))


def test_render_table():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(report.render_table(fake_records()))
    text = console.export_text()
    assert "sglang_fp8" in text and "baseline" in text and "error: OOM" in text


def test_main_rejects_bad_options_before_looking_for_a_gpu(capsys):
    assert bench_cli.main(["--layouts", "nope"]) == 2
    assert "--layouts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench_cli.main(["--pattern", "nope"])
    assert exc.value.code == 2


def test_environment_fields_are_the_declared_keys():
    """render_results reads a run's environment by ENV_KEYS: the harness must write exactly those."""
    assert tuple(environment.environment("cpu")) == environment.ENV_KEYS


def test_exit_status_fails_on_errors_and_disagreement_not_on_unavailable():
    ok = {"status": "ok", "matches_legacy": True}
    assert bench_cli.exit_status([ok, {"status": "unavailable", "matches_legacy": None}]) == 0
    assert bench_cli.exit_status([ok, {"status": "ok", "matches_legacy": False}]) == 1
    assert bench_cli.exit_status([ok, {"status": "error", "matches_legacy": None}]) == 1


def test_exit_status_fails_when_nothing_ran():
    """A sweep in which no backend could run has measured nothing: that is no pass."""
    unavailable = {"status": "unavailable", "matches_legacy": None}
    assert bench_cli.exit_status([unavailable, unavailable]) == 1
    assert bench_cli.exit_status([]) == 1


def test_decode_bench_smoke_records_decode_batches(tmp_path):
    """``benchmark/decode_bench.py --smoke``: one row per request, legacy then fused through the
    out operator, eager on a CPU; records with the grid's fields plus ``requests``."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import decode_bench

    assert decode_bench.parse_shape("8x768K") == (8, 786432, 1)
    assert decode_bench.parse_shape("32x768Kx2") == (32, 786432, 2)
    for bad in ("8768K", "8x768Kx0", "8x768Kx2x2"):
        with pytest.raises(Exception, match="REQUESTSxTOKENS"):
            decode_bench.parse_shape(bad)
    status = decode_bench.main(["--smoke", "--layouts", "sglang_fp8", "--shapes", "3x4K,2x4Kx2",
                                "--out-dir", str(tmp_path)])
    assert status == 0
    (path,) = tmp_path.glob("decode_*.json")
    records = json.loads(path.read_text())
    assert [r["backend"] for r in records] == ["legacy", "fused"] * 2
    for r, per_request in zip(records, (1, 1, 2, 2)):
        assert (r["requests"], r["rows"] // per_request, r["rows_per_request"]) == (3 if per_request == 1 else 2,
                                                                                    r["requests"], per_request)
        assert (r["context_tokens"], r["topk"]) == (4096, 512)
        assert r["matches_legacy"] is True and r["graph_ms"] is None and r["eager_ms"] > 0
        assert {"gpu", "torch_version", "triton_version", "source_revision", "command"} <= set(r)


# ============================================================================================
# Where a run writes: never over an earlier run, never half a file
# ============================================================================================

FAKE_ENV = {"gpu": "NVIDIA H200", "device": "cuda:0", "torch_version": "2.13.0", "triton_version": "3.6.0",
            "indexer_topk_version": "0", "source_revision": None, "timestamp": "2026-01-01T00:00:00+00:00"}


@pytest.fixture
def fake_gpu_run(monkeypatch):
    """``bench_cli.main`` as on a GPU, with the sweep replaced by :func:`fake_records` (reported
    through ``on_case`` as the real sweep does)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(bench_cli, "environment", lambda device: dict(FAKE_ENV))

    def fake_cases(cases, backends, *, on_case=None, **kw):
        recs = fake_records()
        if on_case is not None:
            on_case(cases[0], recs[:1])
        return recs

    monkeypatch.setattr(bench_cli, "run_cases", fake_cases)
    return bench_cli.main


COMMITTED = {".json": b'[{"committed": true}]\n', ".md": b"# committed\n", ".png": b"\x89PNG committed"}


def _commit_results(folder):
    for suffix, data in COMMITTED.items():
        (folder / f"bench_nvidia-h200{suffix}").write_bytes(data)


def _assert_committed_intact(folder):
    for suffix, data in COMMITTED.items():
        assert (folder / f"bench_nvidia-h200{suffix}").read_bytes() == data, suffix


def test_bench_writes_new_dated_files_never_the_committed_ones(fake_gpu_run, tmp_path):
    _commit_results(tmp_path)
    assert fake_gpu_run(["--quick", "--out-dir", str(tmp_path)]) == 1  # fake_records hold a disagreement
    assert fake_gpu_run(["--quick", "--out-dir", str(tmp_path)]) == 1  # a second run, maybe the same second
    _assert_committed_intact(tmp_path)
    runs_json = sorted(p for p in tmp_path.glob("bench_nvidia-h200_*.json"))
    assert len(runs_json) == 2, sorted(p.name for p in tmp_path.iterdir())
    for path in runs_json:
        assert path.stem.split("_")[-1][:8].isdigit()  # dated: bench_<gpu>_<YYYYmmdd>-...
        assert json.loads(path.read_text()) == fake_records()
        assert path.with_suffix(".md").read_text().startswith("# indexer-topk benchmark")
        assert _is_png(path.with_suffix(".png"))
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


@pytest.mark.parametrize("name", ["mine", "mine.json", "sub/mine"])
def test_bench_output_option_names_the_files(fake_gpu_run, tmp_path, name):
    _commit_results(tmp_path)
    fake_gpu_run(["--quick", "--output", str(tmp_path / name)])
    stem = tmp_path / name.replace(".json", "")
    assert json.loads(stem.with_suffix(".json").read_text()) == fake_records()
    assert stem.with_suffix(".md").exists() and _is_png(stem.with_suffix(".png"))
    _assert_committed_intact(tmp_path)
    assert not list(tmp_path.glob("bench_nvidia-h200_*"))
    # Naming the committed files is the one way to replace them, and it is explicit.
    fake_gpu_run(["--quick", "--output", str(tmp_path / "bench_nvidia-h200")])
    assert json.loads((tmp_path / "bench_nvidia-h200.json").read_text()) == fake_records()


def test_bench_rejects_output_with_out_dir(capsys):
    assert bench_cli.main(["--output", "x", "--out-dir", "y"]) == 2
    assert "--output" in capsys.readouterr().err


class _CutShort(KeyboardInterrupt):
    pass


def _cut_short_open(real_open):
    """``Path.open`` whose files take half of the first write, then the process is interrupted."""

    def cut_open(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        if "w" not in mode and "x" not in mode:
            return f

        class Half:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                f.write(data[: max(1, len(data) // 2)])
                f.flush()
                raise _CutShort()

            def __getattr__(self, name):
                return getattr(f, name)

        return Half()

    return cut_open


@pytest.mark.parametrize("writer", ["json", "markdown", "plot"])
def test_an_interrupted_write_leaves_the_previous_file_whole(tmp_path, monkeypatch, writer):
    import pathlib

    import matplotlib.figure

    suffix = {"json": ".json", "markdown": ".md", "plot": ".png"}[writer]
    path = tmp_path / f"bench_nvidia-h200{suffix}"
    path.write_bytes(COMMITTED[suffix])
    monkeypatch.setattr(pathlib.Path, "open", _cut_short_open(pathlib.Path.open))
    real_savefig = matplotlib.figure.Figure.savefig

    def cut_savefig(fig, fname, *args, **kwargs):
        if isinstance(fname, (str, pathlib.PurePath)):  # a path: matplotlib opens it itself
            with open(fname, "wb") as f:
                f.write(b"\x89PNG half")
            raise _CutShort()
        return real_savefig(fig, fname, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut_savefig)
    with pytest.raises(_CutShort):
        if writer == "json":
            report.write_json(fake_records(), path)
        elif writer == "markdown":
            report.write_markdown(fake_records(), path, env=FAKE_ENV, command="bench")
        else:
            report.write_plot(fake_records(), path)
    assert path.read_bytes() == COMMITTED[suffix]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the partial file is gone


@pytest.mark.parametrize("seed", [str(2**64), "-1"])
def test_bench_refuses_a_seed_torch_cannot_take(fake_gpu_run, tmp_path, seed, capsys):
    with pytest.raises(SystemExit) as exc:
        fake_gpu_run(["--quick", "--out-dir", str(tmp_path), "--seed", seed])
    assert exc.value.code == 2
    assert "--seed" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything is written


# ============================================================================================
# The CPU demo's cost, estimated before it runs
# ============================================================================================

ALL = ("reference", "legacy", "fused", "aiter")


def _demo_cost(contexts, rows, layout="sglang_fp8", topk=512, backends=ALL):
    from indexer_topk.bench import cost
    from indexer_topk.cli import REFERENCE_MAX_PAIRS

    return cost.demo_cost(layout, contexts, [rows] * len(contexts), topk, backends, reference_max_pairs=REFERENCE_MAX_PAIRS)


def test_demo_cost_of_the_default_cpu_demo_is_seconds_and_little_memory():
    c = _demo_cost([3000, 5000], 2)
    assert 0.5 < c.seconds < 60 and c.memory_bytes < 2 << 30


def test_demo_cost_grows_with_rows_context_and_backends():
    base = _demo_cost([4400], 4)
    for bigger in (_demo_cost([4400], 16), _demo_cost([70400], 4), _demo_cost([4400, 4400], 4)):
        assert bigger.seconds > base.seconds and bigger.memory_bytes > base.memory_bytes
    assert _demo_cost([4400], 4, backends=("legacy",)).seconds < base.seconds
    assert _demo_cost([4400], 4, backends=("aiter",)).seconds == 0  # AITER never runs on a CPU
    # Within a small factor of what the interpreter took for 4 rows x 17,600 C4 positions
    # (15-19 s of CPU time per kernel backend): the estimate is rough, not made up.
    assert 5 < _demo_cost([70400], 4, backends=("legacy",)).seconds < 60
    # further kernel calls (warm-up, timed iterations) repeat the kernels' time, not the reference's
    from indexer_topk.bench import cost
    from indexer_topk.cli import REFERENCE_MAX_PAIRS

    thrice = cost.demo_cost("sglang_fp8", [4400], [4], 512, ALL, reference_max_pairs=REFERENCE_MAX_PAIRS,
                            kernel_calls=3)
    kernels = _demo_cost([4400], 4, backends=("legacy", "fused")).seconds
    assert thrice.seconds == pytest.approx(base.seconds + 2 * kernels)
    assert thrice.memory_bytes == base.memory_bytes


def test_demo_cost_of_the_runs_that_hurt():
    """100,000 rows per request held 24 GB before it was killed; 768K tokens on a CPU ran for
    minutes: the estimates say so."""
    huge = _demo_cost([3000, 5000], 100_000)
    assert huge.memory_bytes > 20 << 30 and huge.seconds > 3600
    long = _demo_cost([768 * 1024], 2)
    assert 60 < long.seconds < 3600 and long.memory_bytes < 4 << 30
    assert "GiB" in str(huge) and ("h" in str(huge) or "days" in str(huge))


@pytest.mark.parametrize("seconds, text", [(0.2, "1 s"), (40, "40 s"), (200, "3.3 min"), (7200, "2 h"),
                                           (125_000, "35 h"), (10 * 86400, "10 days")])
def test_format_seconds(seconds, text):
    from indexer_topk.bench.cost import format_seconds

    assert format_seconds(seconds) == text
