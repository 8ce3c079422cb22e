"""The ``indexer-topk`` command, run as a user runs it: ``python -m indexer_topk`` in a subprocess.

Kernels run under the Triton interpreter (``--device cpu``), on configurations small enough
to finish in seconds. Backends that cannot run here must say so ("unavailable: <why>");
those that run must agree with legacy bit for bit and with the reference under the tolerant
rule of :mod:`indexer_topk.compare`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from indexer_topk.contract import IndexerTopKResult

REPO = Path(__file__).resolve().parents[1]
TINY_DEMO = ["--device", "cpu", "--context", "2200", "--rows", "2"]
TINY_CHECK = ["--device", "cpu", "--layout", "sglang_mxfp4", "--patterns", "zero_plateau", "--context", "2200", "--rows", "2"]


@pytest.fixture
def cli(monkeypatch):
    """The CLI module for in-process calls, with TRITON_INTERPRET set (main() sets it for
    --device cpu) and restored after the test."""
    from indexer_topk import cli as module

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return module


def run_cli(*args, env_extra=None, timeout=240):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env["TRITON_INTERPRET"] = "1"
    env.pop("SGLANG_DSV4_FP4_FUSED_TOPK", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "indexer_topk", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


def no_gpu_env():
    return {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}


def assert_one_line_error(proc, code, *needles):
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    for n in needles:
        assert n in lines[0], lines[0]


# ============================================================================================
# info
# ============================================================================================


def test_info_reports_versions_switch_and_policy():
    p = run_cli("info", "--device", "cpu", env_extra={"SGLANG_DSV4_FP4_FUSED_TOPK": "false"})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"torch {torch.__version__}" in out
    for needle in ("triton", "SGLang", "AITER", "flydsl_pa_mqa_topk_fp4_prefill", "kill switch", "SGLANG_DSV4_FP4_FUSED_TOPK=false", "policy"):
        assert needle in out, needle


def test_info_says_what_decode_and_capture_take():
    env = {"INDEXER_TOPK_FUSED_DECODE": "1", "TRITON_INTERPRET": "1"}
    p = run_cli("info", "--device", "cpu", "--json", env_extra=env)
    assert p.returncode == 0, p.stderr
    desc = json.loads(p.stdout)["policy"]["describe"]
    assert desc["decode_backend"] == "fused" and "INDEXER_TOPK_FUSED_DECODE=1" in desc["decode_reason"]
    assert desc["routes"]["decode"] == desc["routes"]["capture"] == desc["routes"]["sglang decode"] == "fused"
    p = run_cli("info", "--device", "cpu", env_extra=env)
    assert p.returncode == 0 and "decode and graph" in p.stdout  # the policy row of the table


def test_info_json(cli, monkeypatch, capsys):
    monkeypatch.delenv("SGLANG_DSV4_FP4_FUSED_TOPK", raising=False)
    assert cli.main(["info", "--device", "cpu", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["torch"] == torch.__version__
    assert info["kill_switch"] == {"name": "SGLANG_DSV4_FP4_FUSED_TOPK", "value": "unset"}
    assert info["device"]["device"] == "cpu"
    pol = info["policy"]
    # Either the frozen decision with its reason, or a clear reason why there is none.
    assert pol["reason"]
    if pol["available"]:
        assert pol["fused_backend"] in ("fused", "aiter", "legacy", "reference")


# ============================================================================================
# demo
# ============================================================================================


def _check_demo_doc(doc):
    results = {r["backend"]: r for r in doc["results"]}
    assert set(results) == {"reference", "legacy", "fused", "aiter"}
    ref = results["reference"]
    assert ref["status"] == "ok" and ref["median_ms"] > 0
    # The reference "matches" legacy under the tolerant rule.
    assert ref["matches_legacy"] is True
    # Our Triton kernels run under the interpreter; AITER cannot run here (layout, CPU tensors).
    aiter = results["aiter"]
    assert aiter["status"] == "unavailable" and aiter["reason"].startswith("BackendUnavailable: "), aiter["reason"]
    for name in ("legacy", "fused"):
        r = results[name]
        assert r["status"] == "ok", f"{name}: {r['reason']}"
        assert r["matches_reference"] is True, r.get("reference_comparison")
        assert r["matches_legacy"] is True
        assert r["peak_mib"] is None  # CPU: "n/a", never a made-up number
    assert doc["ok"] is True and doc["failures"] == []
    assert doc["memory"]["legacy_logits_bytes"] > 0 and "legacy" in doc["memory"]["line"]
    assert doc["policy"]["reason"]


def test_demo_json_on_a_tiny_cpu_batch():
    p = run_cli("demo", "--json", *TINY_DEMO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert doc["device"] == "cpu" and doc["timing"]["triton_interpreter"] is True
    w = doc["workload"]
    assert (w["layout"], w["rows"], w["c4_len"], w["topk"], w["context_tokens"]) == ("sglang_fp8", 2, 550, 512, [2200])
    _check_demo_doc(doc)


def test_demo_is_the_default_and_prints_the_table(cli, capsys):
    # In process and with the reference only (the subprocess test above runs the kernels);
    # no subcommand: the options go to `demo`.
    assert cli.main([*TINY_DEMO, "--backends", "reference"]) == 0
    out = capsys.readouterr().out
    for needle in ("backend", "time (ms)", "peak MiB", "TFLOP/s", "identical to legacy", "reference",
                   "no legacy output", "memory", "policy:", "rtol"):
        assert needle in out, needle
    assert "fused" not in out.split("memory")[0]  # --backends is honoured
    assert "n/a" in out  # no CPU peak memory


# ============================================================================================
# check
# ============================================================================================


def test_check_on_a_tiny_config():
    p = run_cli("check", "--json", *TINY_CHECK)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert doc["ok"] is True and "near-tie" in doc["rule"]
    seen = {(r["pattern"], r["backend"]) for r in doc["results"]}
    assert seen == {("zero_plateau", "fused"), ("zero_plateau", "legacy")}  # the policy's fused path, and legacy
    for r in doc["results"]:
        assert r["status"] == "ok" and r["comparison"]["ok"] is True, r


def test_check_exits_1_on_a_mismatch(cli, monkeypatch, capsys):
    """In process, with a backend that returns the reference's answer with one index moved."""
    import indexer_topk
    from indexer_topk.reference import reference_indexer_topk

    def wrong(*args, backend, out=None, workspace=None, check_values=True, **kw):
        res = reference_indexer_topk(*args, **kw)
        res.raw_indices[0, 0] = -5
        return res

    monkeypatch.setattr(indexer_topk, "indexer_topk", wrong)
    rc = cli.main(["check", "--device", "cpu", "--backend", "legacy", "--layout", "sglang_fp8", "--patterns", "random"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "MISMATCH" in out and "FAILED" in out


def test_check_reports_unavailable_backends(cli, monkeypatch, capsys):
    import indexer_topk

    def missing(*args, **kw):
        raise indexer_topk.BackendUnavailable("backend 'aiter' is not available: No module named 'aiter'")

    monkeypatch.setattr(indexer_topk, "indexer_topk", missing)
    rc = cli.main(["check", "--device", "cpu", "--backend", "aiter", "--layout", "aiter_mxfp4", "--patterns", "equal"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "unavailable" in out and "No module named 'aiter'" in out and "0 run(s) compared" in out


@pytest.mark.parametrize("exc", [RuntimeError("CUDA error: an illegal memory access was encountered"),
                                 ImportError("cannot import name 'launch'")])
def test_check_fails_when_a_backend_crashes(cli, monkeypatch, capsys, exc):
    """Only BackendUnavailable means "cannot run here"; a crash is a failure (exit 1)."""
    import indexer_topk

    def crash(*args, **kw):
        raise exc

    monkeypatch.setattr(indexer_topk, "indexer_topk", crash)
    rc = cli.main(["check", "--device", "cpu", "--backend", "legacy", "--layout", "sglang_fp8", "--patterns", "equal"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "error" in out and type(exc).__name__ in out and "FAILED" in out and "0 run(s) compared, 1 failed" in out


# ============================================================================================
# Errors
# ============================================================================================


def test_bad_option_is_one_line_exit_2():
    assert_one_line_error(run_cli("demo", "--bogus"), 2, "--bogus")


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["demo", "--context", "12X"], ("--context", "12X")),
        (["demo", "--topk", "7"], ("--topk",)),
        (["check", "--layout", "nope", "--device", "cpu"], ("--layout", "nope")),
        (["demo", "--backends", "legacy,warp", "--device", "cpu"], ("--backends", "warp")),
        (["frobnicate"], ("frobnicate",)),
    ],
)
def test_bad_values_are_one_line_errors(cli, argv, needles, capsys):
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err


def test_bench_without_a_gpu_is_a_clear_error():
    p = run_cli("bench", "--quick", env_extra=no_gpu_env())
    assert_one_line_error(p, 2, "needs a CUDA or ROCm GPU")
    assert p.stdout == ""


def test_bench_script_without_a_gpu_is_a_clear_error():
    env = dict(os.environ, **no_gpu_env())
    env["PYTHONPATH"] = str(REPO / "python")
    p = subprocess.run([sys.executable, str(REPO / "benchmark" / "bench_indexer_topk.py")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert_one_line_error(p, 2, "needs a CUDA or ROCm GPU")


def test_help_lists_the_subcommands(cli, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for sub in ("demo", "bench", "info", "check"):
        assert sub in out
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--out-dir" in out and "indexer-topk bench" in out


# ============================================================================================
# Tolerances that cannot tell a wrong answer
# ============================================================================================

CHECK_ONE = ["check", "--device", "cpu", "--backend", "legacy", "--layout", "sglang_fp8", "--patterns", "random",
             "--context", "2200", "--rows", "2"]


@pytest.mark.parametrize(
    "option, value",
    [("--atol", "inf"), ("--atol", "nan"), ("--atol", "-1e-6"), ("--rtol", "inf"), ("--rtol", "-0.1"), ("--rtol", "0.5")],
)
def test_check_rejects_tolerances_that_accept_anything(cli, option, value, capsys):
    try:
        rc = cli.main(CHECK_ONE + [f"{option}={value}"])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and option in err, err


def _wrong_positions(monkeypatch):
    """``indexer_topk`` replaced by the reference's answer with row 0 selecting other positions."""
    import indexer_topk
    from indexer_topk.reference import reference_indexer_topk

    def wrong(*args, backend, out=None, workspace=None, check_values=True, **kw):
        res = reference_indexer_topk(*args, **kw)
        n = int(res.counts[0])
        taken = set(res.raw_indices[0, :n].tolist())
        others = [p for p in range(int(args[6][0])) if p not in taken][:n]
        res.raw_indices[0, : len(others)] = torch.tensor(others, dtype=torch.int32)
        return res

    monkeypatch.setattr(indexer_topk, "indexer_topk", wrong)


def test_check_fails_wrong_positions_under_a_huge_atol(cli, monkeypatch, capsys):
    """A finite but enormous atol makes every boundary a near-tie; it is refused next to the
    scores, so the run does not report OK."""
    _wrong_positions(monkeypatch)
    rc = cli.main(CHECK_ONE + ["--atol", "1e30"])
    captured = capsys.readouterr()
    assert rc == 1, captured.out
    assert "atol" in captured.err and "OK" not in captured.out


def test_compare_refuses_tolerances_wider_than_the_scores():
    from indexer_topk.compare import compare_to_reference

    e = IndexerTopKResult(torch.tensor([[3.0, 2.0]]), torch.tensor([[4, 7]], dtype=torch.int32),
                          torch.tensor([[4, 7]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    a = e._replace(raw_indices=torch.tensor([[4, 9]], dtype=torch.int32), physical_indices=torch.tensor([[4, 9]], dtype=torch.int32))
    assert not compare_to_reference(a, e, next_values=torch.tensor([1.0])).ok
    for bad in (dict(atol=1e30), dict(atol=float("inf")), dict(atol=-1.0), dict(rtol=float("nan")), dict(rtol=1.0),
                dict(atol=torch.tensor([1e30]))):
        with pytest.raises(ValueError, match="^(atol|rtol): "):
            compare_to_reference(a, e, next_values=torch.tensor([1.0]), **bad)
    # a tolerance small next to the scores still recognises a boundary near-tie (accepted only
    # with the inputs, which score the listed positions)
    c = compare_to_reference(a, e, next_values=torch.tensor([2.0 - 1e-7]))
    assert c.set_rows == [0] and "accepted only with the inputs" in c.messages[0]
