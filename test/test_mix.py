"""The serving-mix benchmark (:mod:`indexer_topk.bench.mix`) on a CPU: its record, its checks."""

import json
import statistics
import time

import pytest
import torch

from indexer_topk.bench import mix


def test_selection_overlap_counts_what_theirs_selects_that_ours_selects_too():
    theirs = torch.tensor([[5, 3, -1, -1], [1, 2, 3, 4]], dtype=torch.int32)
    ours = torch.tensor([[3, 9, 5, 7], [4, 3, 8, -1]], dtype=torch.int32)
    assert mix.selection_overlap(theirs, ours) == 4 / 6  # row 0: both of two; row 1: two of four
    assert mix.selection_overlap(torch.full((2, 3), -1), ours) == 1.0


def test_mixed_batch_lengths_and_labels():
    s = mix.MixShape("decode", "sglang_fp8", 1024, 64, 1, 786432, spread=True)
    lengths = s.context_lengths()
    assert len(lengths) == 64 and lengths[0] == 4096 and lengths[-1] == 786432 and lengths == sorted(lengths)
    assert s.label == "decode 64 x 4K..768K"
    assert mix.MixShape("prefill", "aiter_mxfp4", 512, 1, 1024, 65536).label == "prefill 1024 x 64K (aiter_mxfp4, topk 512)"
    shapes = mix.default_shapes()
    prefill = {(s.layout, s.topk, s.rows, s.context_tokens) for s in shapes if s.kind == "prefill"}
    assert {("sglang_fp8", 1024, r, c * 1024) for r in (128, 1024, 8192) for c in (16, 64, 256, 768)} <= prefill
    assert mix.decode_floor_ms(mix.MixShape("decode", "sglang_fp8", 1024, 1, 1, 786432)) > 0


def test_run_mix_records_a_tiny_shape_on_the_cpu(tmp_path):
    shape = mix.MixShape("prefill", "sglang_fp8", 512, 1, 2, 2600)
    seen = []
    records = mix.run_mix([shape], device="cpu", candidates=("legacy",), iters=1, host_calls=1,
                          progress=lambda i, n, s: seen.append((i, n, s.label)), on_record=seen.append)
    (rec,) = records
    assert "error" not in rec, rec.get("error")
    assert seen[0] == (0, 1, shape.label) and seen[1] is rec
    assert rec["matches_legacy"] is True and rec["route"] in ("legacy", "fused", "reference")
    assert rec["candidates"].keys() == {"legacy"} and rec["ours_ms"] > 0 and rec["host_us"] > 0
    assert rec["host_us_run_median"] == pytest.approx(rec["host_us"])  # one call: one run
    assert rec["host_us_api"] > 0
    assert "sglang_ms" not in rec and rec["timing"] == "eager"  # SGLang's path not timed: no key
    json.dumps(records)  # the record is what the JSON file holds


def test_run_mix_keeps_auto_when_a_candidate_breaks(monkeypatch):
    """A candidate that fails (not as unavailable) is recorded with its error; ``auto`` and the
    other candidates keep their records."""
    real = mix.OurPath.step

    def step(self, check_values=False):
        if self.backend == "fused":
            raise RuntimeError("compile failed")
        return real(self, check_values)

    monkeypatch.setattr(mix.OurPath, "step", step)
    shape = mix.MixShape("prefill", "sglang_fp8", 512, 1, 2, 2600)
    (rec,) = mix.run_mix([shape], device="cpu", candidates=("fused", "legacy"), iters=1, host_calls=1)
    assert "error" not in rec, rec.get("error")
    assert rec["ours_ms"] > 0 and rec["matches_legacy"] is True and rec["candidates"].keys() == {"legacy"}
    assert "compile failed" in rec["candidates_all"]["fused"]["error"]


def test_retime_auto_times_auto_again_in_turn_with_legacy(monkeypatch):
    """A re-routed shape's ``auto`` is timed again beside legacy (:func:`mix.interleaved_ms`):
    its record keeps the earlier route and takes the new time and host fields."""
    shape = mix.MixShape("prefill", "sglang_fp8", 512, 1, 2, 2600)
    rec = {**{k: getattr(shape, k) for k in shape.__dataclass_fields__}, "route": "earlier", "ours_ms": -1.0}
    timed = []
    real = mix.interleaved_ms
    monkeypatch.setattr(mix, "interleaved_ms", lambda steps, **kw: (timed.append(sorted(steps)), real(steps, **kw))[1])
    mix.retime_auto(rec, device="cpu", iters=1, host_calls=1)
    assert timed == [["auto", "legacy"]]
    assert rec["route_before"] == "earlier" and rec["ours_ms"] > 0 and rec["matches_legacy"] is True
    assert rec["host_us"] > 0


def test_interleaved_ms_takes_the_paths_in_turn():
    """Each round a warm-up and its share of the calls for every path, the order reversed every
    other round; a median per path."""
    calls = []
    steps = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    ms = mix.interleaved_ms(steps, iters=5, device="cpu", rounds=3)  # 2 calls a round: 6 timed a path
    assert sorted(ms) == ["a", "b", "c"] and all(v >= 0 for v in ms.values())
    assert calls == list("aaabbbccc") + list("cccbbbaaa") + list("aaabbbccc")


def test_host_us_runs_and_their_median():
    """A run the host's scheduler stalls moves the mean of the runs, not their median."""
    calls = []

    def step():
        calls.append(None)
        if len(calls) == 25:  # inside the second run of 20
            time.sleep(0.2)

    runs = []
    mean = mix.host_us(step, 60, "cpu", runs)
    assert len(calls) == 60 and len(runs) == 3
    assert mean == pytest.approx(sum(runs) / 3, rel=1e-6)
    assert runs[1] > 5000 and statistics.median(runs) < mean / 10


def test_host_us_in_turn_takes_runs_in_turn():
    """The steps take runs of ``HOST_RUN`` calls in turn, in reverse order every other round, each
    mean over all its calls (a last run shorter) and each run's mean kept."""
    calls = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "ab"}
    got = mix.host_us_in_turn(steps, 2 * mix.HOST_RUN + 3, "cpu")
    n = mix.HOST_RUN
    assert calls == ["a"] * n + ["b"] * n + ["b"] * n + ["a"] * n + ["a"] * 3 + ["b"] * 3
    for name in "ab":
        mean, runs = got[name]
        assert len(runs) == 3 and mean > 0
        assert mean == pytest.approx((runs[0] * n + runs[1] * n + runs[2] * 3) / (2 * n + 3), rel=1e-6)


def _script(name: str):
    """``benchmark/<name>.py`` loaded as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmark" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reroute_module():
    return _script("mix_reroute")


def test_committed_mix_is_its_sessions_run():
    """The committed serving mix is fbfd3ff's session, as its folder keeps it: one device call
    (``--retune``) that its time limit cut after 28 shapes, a second call for three more, and the
    two shapes neither reached (MXFP4 decode at 32 and 64 x 768K: no SGLang path to time) taken
    from cfb45cb's run, cited as such and left out of the ratios. ``mix_reroute.py`` assembles
    them into the same records and summary (next test)."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmark" / "results"
    run = json.loads((results / "serving_mix" / "fbfd3ff" / "serving_mix_run1.json").read_text())
    want = json.loads((results / "serving_mix_nvidia-h200.json").read_text())
    assert run["records"] == want["records"] and run["summary"] == want["summary"]
    assert want["env"]["commit"] == "fbfd3ff"
    assert len(want["records"]) == 33 and all(r["matches_legacy"] for r in want["records"])
    earlier = [r for r in want["records"] if r.get("source")]
    assert [(r["layout"], r["rows"], r["source"]["commit"]) for r in earlier] == [
        ("sglang_mxfp4", 32, "cfb45cb"), ("sglang_mxfp4", 64, "cfb45cb")]
    assert all(r.get("sglang_ms") is None for r in earlier)  # the ratios are this commit's alone
    assert want["summary"]["decode"]["shapes_with_sglang"] == 13
    assert want["summary"]["prefill"]["shapes_with_sglang"] == 13


def test_committed_mix_is_reassembled_from_its_parts(tmp_path):
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmark" / "results"
    part = results / "serving_mix" / "fbfd3ff"
    out = tmp_path / "serving_mix_run1.json"
    assert _reroute_module().main([str(part / "serving_mix_run1_part1.json"), "--add",
                                   str(part / "serving_mix_run1_part2.json"), "--earlier",
                                   str(results / "serving_mix" / "cfb45cb" / "serving_mix_run1.json"),
                                   "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    want = json.loads((part / "serving_mix_run1.json").read_text())
    assert got["records"] == want["records"] and got["summary"] == want["summary"]
    table = json.loads((tmp_path / "serving_mix_run1_routes.json").read_text())
    assert table["entries"] == json.loads((part / "serving_mix_run1_routes.json").read_text())["entries"]


def test_mix_reroute_joins_two_calls_of_a_session(tmp_path):
    """mix_reroute.py joins the two calls of 06e814c's session (the second call's decode shapes,
    then the first call's other shapes) into every shape once, and writes the joined table."""
    from pathlib import Path

    parts = Path(__file__).resolve().parents[1] / "benchmark" / "results" / "serving_mix" / "06e814c"
    out = tmp_path / "serving_mix_nvidia-h200.json"
    assert _reroute_module().main([str(parts / "serving_mix_run2_decode.json"), "--add",
                                   str(parts / "serving_mix_run1.json"), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["env"]["commit"] == "06e814c" and got["env"]["assembled"]
    assert len(got["records"]) == 33 and all(r["matches_legacy"] for r in got["records"])
    assert len({(r["kind"], r["layout"], r["topk"], r["requests"], r["rows_per_request"], r["context_tokens"],
                 r.get("spread")) for r in got["records"]}) == 33
    assert (tmp_path / "serving_mix_nvidia-h200_routes.json").exists()


def test_mix_reroute_routes_a_cut_run_by_its_candidates(tmp_path):
    """An earlier session's first call ended before ``--retune``: its records whose shape the
    joined table routes otherwise take the routed candidate's time from the same run."""
    from pathlib import Path

    parts = Path(__file__).resolve().parents[1] / "benchmark" / "results" / "serving_mix" / "fbd5b98"
    out = tmp_path / "mix.json"
    assert _reroute_module().main([str(parts / "serving_mix_run1.json"), "--add", str(parts / "serving_mix_run2_rest.json"),
                                   "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    rerouted = [r for r in got["records"] if "route_before" in r]
    assert len(rerouted) == 12
    assert all(r["ours_ms"] == r["candidates"][r["route"]] != r["candidates"][r["route_before"]] for r in rerouted)


def test_mix_reroute_refuses_another_commit_and_keeps_untimed_routes(tmp_path):
    import pytest

    m = _reroute_module()
    rec = {"kind": "decode", "layout": "sglang_fp8", "topk": 1024, "requests": 1, "rows_per_request": 1,
           "context_tokens": 131072, "spread": False, "rows": 1, "route": "fused", "ours_ms": 0.1, "candidates": {"fused": 0.1}}
    doc = {"env": {"commit": "a"}, "records": [dict(rec)]}
    with pytest.raises(SystemExit, match="commit"):
        m.merge(doc, [("other.json", {"env": {"commit": "b"}, "records": []})])
    assert m.merge(doc, [("same.json", {"env": {"commit": "a"}, "records": [dict(rec), dict(rec, requests=8, rows=8)]})])
    assert [r["requests"] for r in doc["records"]] == [1, 8]  # the repeated shape is not taken twice

    class Table:  # routes every shape to legacy, which these records did not time
        def lookup(self, *args):
            return ("engine", "legacy")

    notes = m.reroute(doc["records"], Table())
    assert all(r["route"] == "fused" and "route_before" not in r for r in doc["records"])
    assert all("not timed" in n for n in notes) and len(notes) == 2


def test_mix_reroute_earlier_fills_only_missing_shapes_and_stays_out_of_the_ratios():
    import pytest

    from indexer_topk.bench.mix import summarize

    m = _reroute_module()
    rec = {"kind": "decode", "layout": "sglang_fp8", "topk": 1024, "requests": 1, "rows_per_request": 1,
           "context_tokens": 131072, "spread": False, "rows": 1, "route": "legacy", "ours_ms": 0.2,
           "sglang_ms": 0.1, "candidates": {"legacy": 0.2}}
    doc = {"env": {"commit": "b", "gpu": "NVIDIA H200"}, "records": [dict(rec)]}
    with pytest.raises(SystemExit, match="another commit"):
        m.take_earlier(doc, "same.json", {"env": {"commit": "b"}, "records": [dict(rec, requests=8, rows=8)]})
    with pytest.raises(SystemExit, match="measured on NVIDIA B200"):
        m.take_earlier(doc, "b200.json", {"env": {"commit": "a", "gpu": "NVIDIA B200"},
                                           "records": [dict(rec, requests=8, rows=8)]})
    assert len(doc["records"]) == 1
    old = {"env": {"commit": "a", "gpu": "NVIDIA H200"},
           "records": [dict(rec, ours_ms=9.0), dict(rec, requests=8, rows=8, ours_ms=0.4)]}
    notes = m.take_earlier(doc, "old.json", old)
    assert [r["requests"] for r in doc["records"]] == [1, 8] and doc["records"][0]["ours_ms"] == 0.2
    assert doc["records"][1]["source"] == {"file": "old.json", "commit": "a"} and "decode 8 x 128K" in notes[0]
    assert summarize(doc["records"])["decode"] == {"shapes_with_sglang": 1, "geomean_ours_over_sglang": 2.0,
                                                   "worst": 2.0}
    # a record the earlier file itself cited keeps its citation; a failed record is not taken
    cited = {"file": "older.json", "commit": "z"}
    older = {"env": {"commit": "a", "gpu": "NVIDIA H200"},
             "records": [dict(rec, requests=32, rows=32, source=cited), dict(rec, requests=64, rows=64, error="x")]}
    m.take_earlier(doc, "old.json", older)
    assert [(r["requests"], r.get("source")) for r in doc["records"][2:]] == [(32, cited)]


def test_rendered_mix_names_the_commit_of_a_cited_record():
    """``serving_mix.py --render``: a record taken from an earlier run shows that run's commit
    beside its route; the committed mix's two such records are cfb45cb's."""
    from pathlib import Path

    cli = _script("serving_mix")
    doc = json.loads((Path(__file__).resolve().parents[1] / "benchmark" / "results" /
                      "serving_mix_nvidia-h200.json").read_text())
    lines = [x for x in cli.render(doc).splitlines() if x.startswith("| decode")]
    cited = [x for x in lines if "(commit cfb45cb)" in x]
    assert len(cited) == 2 and all("sglang_mxfp4" in x for x in cited)
    assert len(lines) == 16


def test_time_call_runs_before_ahead_of_every_call_and_outside_it():
    """``before`` (the L2 evictor of the cold replays) runs ahead of each call, warm-ups too, and
    its time is not the call's."""
    from indexer_topk.bench import timing

    log = []

    def before():
        log.append("before")
        time.sleep(0.02)

    times = timing.time_call(lambda: log.append("call"), warmup=2, iters=3, device="cpu", before=before)
    assert log == ["before", "call"] * 5
    assert len(times) == 3 and max(times) < 10  # ms: the 20 ms sleeps are outside the calls
    assert timing.l2_evictor("cpu") is None  # no cache of ours to clear on a CPU


def test_graph_replays_are_timed_behind_a_spin_and_cold_ones_after_the_evictor(monkeypatch):
    """Warm replays are timed behind :func:`queue_hold`'s spin, cold ones behind the evictor's
    fill and then the spin (so the replay is queued before its start event is reached); neither
    exists on a CPU."""
    from indexer_topk.bench import timing

    assert timing.queue_hold("cpu") is None
    log = []

    class Graph:
        def replay(self):
            log.append("replay")

    monkeypatch.setattr(mix, "capture_graph", lambda step: Graph())
    monkeypatch.setattr(mix, "queue_hold", lambda device: lambda: log.append("hold"))
    monkeypatch.setattr(mix, "l2_evictor", lambda device: lambda: log.append("evict"))
    monkeypatch.setattr(mix, "synchronize", lambda device: None)

    def median_ms(fn, *, warmup, iters, device, before=None):
        log.append("timed")
        before()
        fn()
        return 1.0 if len(log) < 4 else 2.0

    monkeypatch.setattr(mix, "median_ms", median_ms)
    assert mix.graph_times(lambda: None, iters=5, device="cuda", cold=True) == (1.0, 2.0)
    assert log == ["timed", "hold", "replay", "timed", "evict", "hold", "replay", "replay"]
    log.clear()
    assert mix.graph_times(lambda: None, iters=5, device="cuda") == (1.0, None)
    assert log == ["timed", "hold", "replay", "replay"]
    monkeypatch.setattr(timing, "HOLD_CYCLES", 0)
    assert timing.queue_hold("cuda") is None  # the replays timed as before the spin


def test_queue_hold_spins_the_set_cycles(monkeypatch):
    """The hold enqueues ``torch.cuda._sleep`` of :data:`HOLD_CYCLES` cycles (and nothing on
    being made): checked on a CPU with the sleep recorded, not run; a negative count is none."""
    from indexer_topk.bench import timing

    slept = []
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    monkeypatch.setattr(timing, "HOLD_CYCLES", 1234)
    hold = timing.queue_hold("cuda")
    assert slept == []
    hold()
    hold()
    assert slept == [1234, 1234]
    assert timing.hold_cycles("cuda") == 1234 and timing.hold_cycles("cpu") == 0  # what the records say
    monkeypatch.setattr(timing, "HOLD_CYCLES", -1)
    assert timing.queue_hold("cuda:0") is None
    assert timing.hold_cycles("cuda:0") == 0


def test_cold_decode_ratios_are_summarized_and_rendered():
    """A record with L2-cold times on both sides enters ``decode_l2_cold``; one without them, or
    cited from another run, does not; the table gets the cold columns only when a record has
    them."""
    base = {"kind": "decode", "layout": "sglang_fp8", "topk": 1024, "requests": 1, "rows_per_request": 1,
            "context_tokens": 131072, "spread": False, "rows": 1, "route": "legacy", "ours_ms": 0.02,
            "sglang_ms": 0.01, "candidates": {}, "legacy_ms": 0.02, "matches_legacy": True, "sglang_overlap": 1.0}
    recs = [dict(base, ours_ms_cold=0.03, sglang_ms_cold=0.02), dict(base, requests=8, rows=8),
            dict(base, requests=32, rows=32, ours_ms_cold=0.5, sglang_ms_cold=0.1, source={"commit": "x"})]
    s = mix.summarize(recs)
    assert s["decode_l2_cold"] == {"shapes_with_sglang": 1, "geomean_ours_over_sglang": pytest.approx(1.5),
                                   "worst": pytest.approx(1.5)}
    assert "decode_l2_cold" not in mix.summarize(recs[1:2])
    cli = _script("serving_mix")
    doc = {"env": {"commit": "c"}, "records": recs, "summary": s}
    lines = cli.render(doc).splitlines()
    assert lines[2].endswith("L2-cold ours / SGLang ms | L2-cold ratio |")
    assert lines[4].endswith("| 0.030 / 0.020 | 1.50x |") and lines[5].endswith("| - / - | - |")
    assert "decode, L2-cold: geometric mean of ours / SGLang 1.50x over 1 shapes" in cli.render(doc)
    assert "spin" not in lines[0]  # a run from before the spin says nothing of one
    held = cli.render({"env": {"graph_hold_cycles": 200000}, "records": recs, "summary": s}).splitlines()[0]
    assert "decode: CUDA-graph replays, each behind a 200,000-cycle spin of the GPU" in held
    plain = cli.render({"env": {}, "records": recs[1:2], "summary": {}}).splitlines()
    assert "L2-cold" not in "\n".join(plain) and plain[2].endswith("% of HBM floor rate |")


@pytest.mark.gpu
def test_graph_times_on_the_gpu():
    """On a GPU the spin and the evictor run as the timing's ``before`` and the replayed step's
    outputs are the graph's: both medians positive, the step's last write in place."""
    out = torch.zeros(4, device="cuda")
    src = torch.arange(4.0, device="cuda")

    def step():
        out.copy_(src * 2)

    warm, cold = mix.graph_times(step, iters=5, device="cuda", cold=True)
    assert warm > 0 and cold > 0
    assert torch.equal(out, src * 2)


def test_mix_names_its_file_for_the_device(tmp_path, capsys):
    """``--out`` with ``{gpu}``: the file is named for the device the run found (``cpu`` under the
    interpreter), as ``mix_session.sh`` asks, and a run of no shapes still leaves it."""
    mix = _script("serving_mix")
    assert mix.main(["--smoke", "--shapes", "no-such-shape", "--out", str(tmp_path / "serving_mix_{gpu}.json")]) == 0
    written = tmp_path / "serving_mix_cpu.json"
    doc = json.loads(written.read_text())
    assert doc["env"]["gpu"] == "cpu" and doc["records"] == []
    assert f"wrote {written}" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["serving_mix_cpu.json"]
