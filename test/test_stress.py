"""benchmark/stress.py's CPU smoke mode: the GPU stress run's machinery on tiny shapes."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import indexer_topk

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stress():
    spec = importlib.util.spec_from_file_location("stress", REPO / "benchmark" / "stress.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def smoke(stress, tmp_path, calls, seed=1):
    rc = stress.main(["--smoke", "--calls", str(calls), "--seed", str(seed), "--out", str(tmp_path)])
    return rc, json.loads((tmp_path / "stress_smoke.json").read_text())


def test_smoke_run_passes_and_keeps_its_record(stress, tmp_path, capsys):
    """Four calls (seed 1: check_values on and off, one workspace reused by three calls):
    fused equals legacy bit for bit inside guard bands, and the record says so call by call."""
    rc, record = smoke(stress, tmp_path, 4)
    assert rc == 0, record
    assert record["finished"] and record["calls"] == record["ok"] == 4
    log = record["call_log"]
    assert [c["status"] for c in log] == ["ok"] * 4
    assert {c["check_values"] for c in log} == {True, False}
    slots = [c["workspace"] for c in log if c["workspace"] is not None]
    assert len(slots) > len(set(slots)), "a workspace reused across calls"
    assert "benchmark/stress.py --smoke" in record["command"]
    assert "all" in capsys.readouterr().out


def test_smoke_run_catches_a_bad_backend(stress, tmp_path, monkeypatch):
    """A fused path that writes one count past its output and changes one position is
    reported (out of bounds first) and the run exits 1."""
    real = indexer_topk.indexer_topk

    def bad(*args, backend, out, **kw):
        res = real(*args, backend=backend, out=out, **kw)
        if backend == "fused":
            torch.as_strided(out.counts, (out.counts.numel() + 1,), (1,))[-1] = 7
        return res

    monkeypatch.setattr(indexer_topk, "indexer_topk", bad)
    rc, record = smoke(stress, tmp_path, 1)
    assert rc == 1 and record["out_of_bounds"] == 1
    assert "fused: out.counts: written past its end" in record["call_log"][0]["detail"]

    def wrong(*args, backend, out, **kw):
        res = real(*args, backend=backend, out=out, **kw)
        if backend == "fused":
            out.raw_indices[0, 0] += 1
        return res

    monkeypatch.setattr(indexer_topk, "indexer_topk", wrong)
    rc, record = smoke(stress, tmp_path, 1)
    assert rc == 1 and record["mismatches"] == 1 and "raw_indices differ" in record["call_log"][0]["detail"]
