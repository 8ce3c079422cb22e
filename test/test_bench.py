"""The benchmark harness pieces that run on a CPU, and the output comparison rules.

Timing and peak memory on a GPU are exercised by the GPU benchmark itself; here: token and
grid parsing, records from real (interpreted) backend runs and from failures, the JSON /
markdown / plot writers on fake records, and :mod:`indexer_topk.compare`.
"""

import json
import math

import pytest
import torch

from indexer_topk import bench, compare
from indexer_topk.contract import IndexerTopKResult, order_keys
from indexer_topk.reference import reference_indexer_topk, reference_scores, reference_with_next_values
from indexer_topk.workload import make_workload

# ============================================================================================
# Parsing and the grid
# ============================================================================================


@pytest.mark.parametrize(
    "text, tokens",
    [("65536", 65536), ("64K", 65536), ("768k", 786432), ("1M", 1048576), (" 256K ", 262144)],
)
def test_parse_tokens(text, tokens):
    assert bench.parse_tokens(text) == tokens
    assert bench.parse_tokens(bench.format_tokens(tokens)) == tokens


@pytest.mark.parametrize("text", ["", "12X", "1.5M", "-4K", "0"])
def test_parse_tokens_rejects(text):
    with pytest.raises(ValueError):
        bench.parse_tokens(text)


def test_parse_list_names_the_option():
    assert bench.parse_list("1,2, 3", int, name="--rows") == [1, 2, 3]
    with pytest.raises(ValueError, match="--rows"):
        bench.parse_list("1,x", int, name="--rows")


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert bench.gpu_slug("AMD Instinct MI355X (gfx950)") == "amd-instinct-mi355x-gfx950"
    assert bench.gpu_slug("???") == "device"


def test_default_grid_has_every_case_and_the_adversarial_set():
    cases = bench.build_grid()
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
    tf = bench.effective_tflops(1024, 196608, 3.3)
    assert tf == pytest.approx(2 * 1024 * 196608 * 64 * 128 / 3.3e-3 / 1e12)
    assert 990 < tf < 1010
    assert bench.effective_tflops(1, 1, 0) is None


def test_time_call_runs_warmup_then_iters_on_cpu():
    calls = []
    times = bench.time_call(lambda: calls.append(1), warmup=2, iters=5, device="cpu")
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)
    assert bench.peak_memory_mib(lambda: None, "cpu") is None


# ============================================================================================
# Records
# ============================================================================================


@pytest.fixture(scope="module")
def tiny():
    # One long row (C4 550 > topk) and one short row (C4 250 < topk) in one program pair.
    return make_workload("sglang_fp8", context_tokens=[2200, 1000], rows_per_request=[1, 1], topk=512, seed=3)


def test_run_backend_reference_record(tiny):
    run = bench.run_backend(tiny, "reference", warmup=1, iters=2, device="cpu")
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
    assert bench.run_backend(tiny, "reference", iters=0, device="cpu", baseline=ref).record["matches_legacy"] is True
    bent = IndexerTopKResult(ref.values.clone(), ref.raw_indices, ref.physical_indices, ref.counts)
    bent.values[0, 0] = torch.nextafter(bent.values[0, 0], torch.tensor(math.inf))
    assert bench.run_backend(tiny, "reference", iters=0, device="cpu", baseline=bent).record["matches_legacy"] is False


def test_run_backend_times_first_call_when_asked(tiny):
    r = bench.run_backend(tiny, "reference", iters=0, device="cpu", time_first_call=True).record
    assert r["median_ms"] > 0 and "first call" in r["timed_calls"]
    assert bench.run_backend(tiny, "reference", iters=0, device="cpu").record["median_ms"] is None


@pytest.mark.parametrize(
    "exc, status, reason",
    [
        (ImportError("No module named 'aiter'"), "unavailable", "ImportError: No module named 'aiter'"),
        (NotImplementedError("no decode path"), "unavailable", "NotImplementedError: no decode path"),
        (RuntimeError("needs gfx950"), "unavailable", "RuntimeError: needs gfx950"),
        (ValueError("layout: only aiter_mxfp4"), "unavailable", "ValueError: layout: only aiter_mxfp4"),
        (RuntimeError("CUDA out of memory. Tried to allocate 4 GiB"), "error", "OOM: RuntimeError: CUDA out of memory"),
        (ValueError("values disagree"), "error", "ValueError: values disagree"),
        (ZeroDivisionError("bug"), "error", "ZeroDivisionError: bug"),
    ],
)
def test_run_backend_failures_become_records(tiny, monkeypatch, exc, status, reason):
    import indexer_topk.api as api

    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(api, "_backend_fn", lambda name: boom)
    run = bench.run_backend(tiny, "legacy", iters=1, device="cpu")
    assert run.outputs is None
    assert run.record["status"] == status
    assert run.record["reason"].startswith(reason)
    assert run.record["median_ms"] is None


def test_run_cases_on_real_backends():
    """legacy + fused on one tiny case: both run (under the interpreter) or say why not."""
    case = bench.BenchCase("sglang_fp8", 2200, 2, 512)
    recs = bench.run_cases([case], ["legacy", "fused"], warmup=0, iters=1, device="cpu")
    assert [r["backend"] for r in recs] == ["legacy", "fused"]
    legacy, fused = recs
    for r in recs:
        assert r["case"] == case.name and r["gpu"] == "cpu" and r["torch_version"] == torch.__version__
        assert "peak_memory_method" in r and "timing_method" in r and r["timestamp"]
        assert r["status"] in ("ok", "unavailable"), r.get("reason")
        if r["status"] != "ok":
            assert r["error"] and r["reason"]
    if legacy["status"] == "ok":
        assert legacy["matches_legacy"] is True
        for key in ("score_ms", "select_ms", "torch_topk_ms"):
            assert legacy[key] is not None and legacy[key] > 0, legacy.get("stage_error")
    if fused["status"] == "ok":
        assert fused["workspace_mib"] > 0
        if legacy["status"] == "ok":
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

    monkeypatch.setattr(bench, "_workload_for", fake_workload)
    cases = [bench.BenchCase("sglang_fp8", 1 << 20, 1024, 512), bench.BenchCase("sglang_fp8", 1000, 2, 512)]
    recs = bench.run_cases(cases, ["reference"], warmup=0, iters=1, device="cpu")
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
    rows = bench.table_rows(fake_records())
    assert all(len(r) == len(bench.TABLE_COLUMNS) for r in rows)
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
    jp = bench.write_json(recs, tmp_path / "out" / "bench_nvidia-h200.json")
    assert json.loads(jp.read_text()) == recs
    cmd = "python benchmark/bench_indexer_topk.py --quick"
    md = bench.write_markdown(recs, tmp_path / "bench.md", env=env, command=cmd).read_text()
    assert "NVIDIA H200" in md and "torch 2.13.0" in md and "triton 3.9.0" in md
    assert f"`{cmd}`" in md
    assert "reset_peak_memory_stats" in md and "max_memory_allocated" in md
    assert "| layout | rows | ctx | topk |" in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(recs)  # header + one line per record


def _is_png(path):
    return path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_plot(tmp_path):
    assert _is_png(bench.write_plot(fake_records(), tmp_path / "a.png"))
    # Without rows=1024/topk=1024 records the most common shape is plotted.
    other = [dict(r, rows=256, topk=512) for r in fake_records()]
    sel, rows, topk = bench._plot_selection(other, 1024, 1024)
    assert (rows, topk) == (256, 512) and len(sel) == 16
    assert _is_png(bench.write_plot(other, tmp_path / "b.png"))
    # Nothing to plot still leaves a file behind.
    assert _is_png(bench.write_plot([], tmp_path / "c.png"))


def test_render_table():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(bench.render_table(fake_records()))
    text = console.export_text()
    assert "sglang_fp8" in text and "baseline" in text and "error: OOM" in text


def test_main_rejects_bad_options_before_looking_for_a_gpu(capsys):
    assert bench.main(["--layouts", "nope"]) == 2
    assert "--layouts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench.main(["--pattern", "nope"])
    assert exc.value.code == 2


# ============================================================================================
# Comparison rules (indexer_topk.compare)
# ============================================================================================


def result(values, raw, counts, page=None):
    """An IndexerTopKResult from per-row lists; physical = page * 64 + raw (page 7 by default)."""
    v = torch.tensor(values, dtype=torch.float32)
    r = torch.tensor(raw, dtype=torch.int32)
    pg = 7 if page is None else page
    p = torch.where(r >= 0, r + pg * 64, torch.full_like(r, -1))
    return IndexerTopKResult(v, r, p, torch.tensor(counts, dtype=torch.int32))


NEG = float("-inf")


def test_identical_results_match():
    a = result([[3.0, 2.0, 1.0], [5.0, NEG, NEG]], [[4, 0, 9], [2, -1, -1]], [3, 1])
    c = compare.compare_to_reference(a, a)
    assert c.ok and c.summary() == "ok"
    assert compare.bitwise_equal(a, a)


def test_values_within_tolerance_match_and_beyond_do_not():
    e = result([[1000.0, 2.0]], [[1, 0]], [2])
    near = result([[1000.0 * (1 + 5e-6), 2.0]], [[1, 0]], [2])
    far = result([[1000.0 * (1 + 5e-5), 2.0]], [[1, 0]], [2])
    assert compare.compare_to_reference(near, e).ok
    assert not compare.bitwise_equal(near, e)
    c = compare.compare_to_reference(far, e)
    assert not c.ok and c.value_rows == [0] and "values" in c.summary()


def test_reordered_near_ties_inside_the_topk_match():
    e = result([[3.0, 2.0 + 1e-6, 2.0, 1.0]], [[0, 1, 2, 3]], [4])
    a = result([[3.0, 2.0 + 1e-6, 2.0, 1.0]], [[0, 2, 1, 3]], [4])
    assert compare.compare_to_reference(a, e).ok


def test_boundary_near_tie_is_accepted_only_with_the_next_value():
    # Reference: k-th score 2.0 at position 5; position 8 scores 2.0 * (1 - 2e-6) just below.
    e = result([[3.0, 2.0]], [[1, 5]], [2])
    a = result([[3.0, 2.0]], [[1, 8]], [2])
    tie = torch.tensor([2.0 * (1 - 2e-6)])
    c = compare.compare_to_reference(a, e, next_values=tie)
    assert c.ok and c.near_tie_rows == [0] and "near-tie" in c.summary()
    # Without the (k+1)-th value, or with a clear gap, it is a wrong selection.
    assert compare.compare_to_reference(a, e).set_rows == [0]
    c = compare.compare_to_reference(a, e, next_values=torch.tensor([1.5]))
    assert not c.ok and c.set_rows == [0] and "[8]" in c.messages[0] and "[5]" in c.messages[0]


def test_boundary_near_tie_still_needs_valid_positions():
    e = result([[3.0, 2.0]], [[1, 5]], [2])
    tie = torch.tensor([2.0])
    out_of_range = result([[3.0, 2.0]], [[1, 40]], [2])
    repeated = result([[3.0, 2.0]], [[1, 1]], [2])
    assert not compare.compare_to_reference(out_of_range, e, next_values=tie, seq_lens=torch.tensor([30])).ok
    assert not compare.compare_to_reference(repeated, e, next_values=tie).ok


def test_nan_matches_nan_only():
    e = result([[float("nan"), float("nan")]], [[0, 1]], [2])
    same = result([[float("nan"), float("nan")]], [[0, 1]], [2])
    number = result([[1.0, float("nan")]], [[0, 1]], [2])
    assert compare.compare_to_reference(same, e).ok
    assert compare.bitwise_equal(same, e)
    assert compare.compare_to_reference(number, e).value_rows == [0]
    # A NaN boundary (all-NaN row) counts as a near-tie.
    moved = result([[float("nan"), float("nan")]], [[0, 2]], [2])
    assert compare.compare_to_reference(moved, e, next_values=torch.tensor([float("nan")])).ok


def test_bitwise_equal_separates_signed_zeros():
    a = result([[0.0]], [[0]], [1])
    b = result([[-0.0]], [[0]], [1])
    assert compare.compare_to_reference(a, b).ok
    assert not compare.bitwise_equal(a, b)


def test_count_padding_and_physical_mismatches():
    e = result([[3.0, NEG]], [[4, -1]], [1])
    c = compare.compare_to_reference(result([[3.0, 2.0]], [[4, 0]], [2]), e)
    assert c.count_rows == [0] and not c.ok
    c = compare.compare_to_reference(result([[3.0, NEG]], [[4, 0]], [1]), e)
    assert c.padding_rows == [0] and not c.ok
    c = compare.compare_to_reference(result([[3.0, NEG]], [[4, -1]], [1], page=9), e)
    assert c.physical_rows == [0] and not c.ok
    # Against the page table: page 7 holds positions 0..63 of the row.
    pt = torch.tensor([[7, 2]], dtype=torch.int32)
    assert compare.compare_to_reference(e, e, page_table=pt).ok
    assert not compare.compare_to_reference(e, e, page_table=torch.tensor([[3, 2]], dtype=torch.int32)).ok


def test_reference_next_values_are_the_next_best_scores():
    w = make_workload("sglang_mxfp4", context_tokens=[2300, 1000], rows_per_request=[2, 1], topk=512, seed=5)
    expected, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    assert compare.bitwise_equal(expected, reference_indexer_topk(*w.args(), **w.kwargs()))
    scores = reference_scores(*w.args(), layout=w.layout, weight_scale=w.weight_scale)
    for r in range(w.rows):
        n = int(w.seq_lens[r])
        if n <= w.topk:
            assert next_values[r] == NEG
            continue
        pos = torch.arange(n)
        keys = order_keys(scores[r, :n], pos)
        kth_next = int(keys.argsort(descending=True)[w.topk])
        assert torch.equal(next_values[r].view(torch.int32), scores[r, kth_next].view(torch.int32))
    assert compare.compare_to_reference(expected, expected, next_values=next_values, seq_lens=w.seq_lens, page_table=w.page_table).ok


def test_comparison_rule_text_states_the_tolerance():
    text = compare.comparison_rule(1e-5, 1e-6)
    assert "1e-05" in text and "1e-06" in text and "near-tie" in text


def test_fp8_gpu_tolerance_scales_with_the_row():
    """On a GPU the FP8 rule adds 2e-3 of the row's largest score; elsewhere fp32 rounding."""
    from indexer_topk.compare import compare_to_reference, mma_tolerance

    vals = torch.tensor([[3.0, 0.02017], [3.0, 0.02017]])
    raw = torch.tensor([[5, 9], [5, 9]], dtype=torch.int32)
    exp = IndexerTopKResult(vals, raw, raw, torch.tensor([2, 2], dtype=torch.int32))
    got = IndexerTopKResult(torch.tensor([[3.001, 0.02040], [3.0, 0.02040 + 0.01]]), raw, raw, exp.counts)
    cpu = mma_tolerance("sglang_fp8", "cpu", exp)
    assert not compare_to_reference(got, exp, **cpu).ok
    assert mma_tolerance("sglang_mxfp4", "cuda", exp) == cpu
    cmp = compare_to_reference(got, exp, **mma_tolerance("sglang_fp8", "cuda", exp))
    assert cmp.value_rows == [1]  # row 0 within 2e-3 * 3.0 of the reference; row 1 is 1e-2 off


def test_tolerance_overrides_replace_the_rule():
    """A caller's rtol replaces the layout's rule; its atol is the floor of the FP8 per-row tolerance."""
    from indexer_topk.compare import comparison_rule, mma_tolerance

    vals = torch.tensor([[3.0, 0.5], [1e-6, 0.0]])
    raw = torch.tensor([[5, 9], [5, 9]], dtype=torch.int32)
    exp = IndexerTopKResult(vals, raw, raw, torch.tensor([2, 2], dtype=torch.int32))
    assert mma_tolerance("sglang_fp8", "cuda", exp, rtol=0.1, atol=0.5) == {"rtol": 0.1, "atol": 0.5}
    assert mma_tolerance("sglang_mxfp4", "cpu", exp, atol=0.25) == {"rtol": compare.DEFAULT_RTOL, "atol": 0.25}
    per_row = mma_tolerance("sglang_fp8", "cuda", exp, atol=1e-3)["atol"]
    assert per_row.tolist() == pytest.approx([compare.FP8_MMA_RTOL * 3.0, 1e-3])
    assert "sglang_fp8 on a GPU" in comparison_rule(device="cuda")
    assert "sglang_fp8 on a GPU" not in comparison_rule(1e-3, device="cuda") + comparison_rule(device="cpu")


def test_environment_fields_are_the_declared_keys():
    """render_results reads a run's environment by ENV_KEYS: the harness must write exactly those."""
    assert tuple(bench.environment("cpu")) == bench.ENV_KEYS
