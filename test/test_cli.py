"""The ``indexer-topk`` command, run as a user runs it: ``python -m indexer_topk`` in a subprocess.

Kernels run under the Triton interpreter (``--device cpu``), on configurations small enough
to finish in seconds. Backends that cannot run here must say so ("unavailable: <why>");
those that run must agree with legacy bit for bit and with the reference under the tolerant
rule of :mod:`indexer_topk.compare`.
"""

import json
import os
import re
import stat
import subprocess
import sys
import types
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
    assert {"mode": "every call", "layout": "every layout", "auto": "fused", "sglang": None} in desc["routes"]
    p = run_cli("info", "--device", "cpu", env_extra=env)
    assert p.returncode == 0 and "every call: fused" in p.stdout


def _user_env(**extra):
    """The environment of a user's shell: no TRITON_INTERPRET unless given."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SGLANG_DSV4_FP4_FUSED_TOPK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(no_gpu_env(), **extra)
    return env


@pytest.mark.parametrize("interpret, fused_path, routes_line", [
    (None, "reference", "every call: reference"),  # a program without the interpreter runs the reference
    ("1", "fused", "prefill every layout: fused"),
])
def test_info_on_a_cpu_reports_what_the_users_process_runs(interpret, fused_path, routes_line):
    env = _user_env(**({"TRITON_INTERPRET": interpret} if interpret else {}))
    for args in (["info"], ["info", "--device", "cpu"]):
        p = subprocess.run([sys.executable, "-m", "indexer_topk", *args, "--json"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stderr
        pol = json.loads(p.stdout)["policy"]
        assert pol["fused_backend"] == fused_path and pol["describe"]["triton_interpret"] is bool(interpret)
    p = subprocess.run([sys.executable, "-m", "indexer_topk", "info"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0 and routes_line in p.stdout.splitlines(), p.stdout
    assert len(p.stdout.splitlines()) <= 25


H200_INFO = {"device": "NVIDIA H200", "arch": "sm_90", "runtime": "CUDA 12.8", "memory_gib": 139.8, "sms": 132}


def test_info_on_an_h200_names_the_table_and_its_routes_in_few_lines(cli, monkeypatch, capsys):
    """With an H200's probe: the shipped table in force, a line per mode and layout, SGLang's
    part only for the layout SGLang hands over on Hopper (FP8), at most 25 lines."""
    from indexer_topk import policy
    from indexer_topk.policy import PathPolicy, Probe

    h200 = PathPolicy(Probe(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0),
                            triton_version="3.6.0", sm_count=132, hopper_stream=True))
    monkeypatch.setattr(policy, "default_policy", lambda: h200)
    monkeypatch.setattr(cli, "_device_info", lambda device: dict(H200_INFO))
    assert cli.main(["info", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 25
    assert "routes table: nvidia-h200.json (NVIDIA H200 sm_90, 132 SMs, Triton 3.6, Hopper stream" in lines[4]
    assert lines[-len(h200.lines()):] == h200.lines()
    routes = [line for line in lines if line.startswith(("prefill", "decode", "capture", "every"))]
    assert {line.split(":")[0] for line in routes} == {
        "prefill aiter_mxfp4", "prefill sglang_mxfp4", "prefill sglang_fp8",
        "decode, capture aiter_mxfp4", "decode, capture sglang_mxfp4", "decode, capture sglang_fp8"}
    assert [line for line in routes if "in SGLang" in line] == [line for line in routes if "sglang_fp8" in line]
    assert not any(re.search(r"\d ms|\d vs \d", line) for line in lines)


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


def test_demo_with_nothing_run_fails_and_claims_no_agreement(cli, capsys):
    """AITER reads only aiter_mxfp4: on the FP8 layout nothing runs, and that is no pass."""
    rc = cli.main([*TINY_DEMO, "--backends", "aiter"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "unavailable" in out and "FAILED" in out and "nothing ran" in out
    assert "bitwise equal" not in out and "identical to legacy:" not in out


def test_demo_json_with_nothing_run_is_not_ok(cli, capsys):
    rc = cli.main([*TINY_DEMO, "--backends", "aiter", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["ok"] is False
    assert any("nothing ran" in f for f in doc["failures"]), doc["failures"]


def run_without(module, *argv, timeout=240):
    """The CLI in a fresh process in which ``import <module>`` fails, as when it is not installed."""
    code = (f"import sys; sys.modules[{module!r}] = None; from indexer_topk.cli import main; "
            f"sys.exit(main({list(argv)!r}))")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), TRITON_INTERPRET="1", **no_gpu_env())
    env.pop("SGLANG_DSV4_FP4_FUSED_TOPK", None)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_demo_without_triton_runs_the_reference_and_prints_its_footer():
    p = run_without("triton", "demo", *TINY_DEMO)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "Triton is not installed" in p.stdout
    assert "memory" in p.stdout and "score matrix" in p.stdout and "policy:" in p.stdout


def test_demo_and_check_without_numpy_say_which_package_is_missing():
    """Triton's interpreter imports numpy: without it, our Triton backends cannot run here,
    and say so by the package's name instead of a traceback."""
    p = run_without("numpy", "demo", *TINY_DEMO, "--backends", "legacy,fused", "--json")
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    results = {r["backend"]: r for r in doc["results"]}
    for b in ("legacy", "fused"):
        assert results[b]["status"] == "unavailable", results[b]
        assert "numpy" in results[b]["reason"] and results[b]["reason"].startswith("BackendUnavailable"), results[b]
    assert p.returncode == 1 and doc["ok"] is False  # nothing ran
    p = run_without("numpy", "check", "--device", "cpu", "--layout", "sglang_fp8", "--patterns", "equal",
                    "--context", "2200", "--rows", "1")
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    assert p.returncode == 1 and "numpy" in p.stdout and "nothing was compared" in p.stdout


def test_a_missing_dependency_of_the_command_is_one_line_naming_it():
    p = run_without("rich", "demo", *TINY_DEMO, "--backends", "reference")
    assert_one_line_error(p, 1, "'rich'", "pip install rich")


# --------------------------------------------------------------------------------------------
# The CPU demo's size guard: estimated before anything is built
# --------------------------------------------------------------------------------------------


class _Built(Exception):
    """Raised where the demo would build its batch: the guard has let the run through."""


@pytest.fixture
def no_build(monkeypatch):
    import indexer_topk.workload as workload

    def refuse(*args, **kwargs):
        raise _Built()

    monkeypatch.setattr(workload, "make_workload", refuse)


def _demo_guard(cli, argv, capsys):
    try:
        rc = cli.main(argv)
    except _Built:
        rc = "built"
    return rc, capsys.readouterr()


@pytest.mark.parametrize("argv", [["--rows", "100000"], ["--rows", "100000", "--context", "768K"],
                                  ["--context", "64M"], ["--rows", str(10**12)]])
def test_cpu_demo_too_large_is_refused_before_building_with_the_estimate(cli, no_build, argv, capsys):
    rc, captured = _demo_guard(cli, ["demo", "--device", "cpu", *argv], capsys)
    assert rc == 2, captured
    [line] = captured.err.strip().splitlines()
    for needle in ("estimated", "about", "memory", "--force", "--rows", "--context"):
        assert needle in line, (needle, line)
    assert "Traceback" not in captured.err and captured.out == ""


def test_cpu_demo_refusal_can_be_overridden(cli, no_build, capsys):
    rc, captured = _demo_guard(cli, ["demo", "--device", "cpu", "--rows", "100000", "--force"], capsys)
    assert rc == "built"  # past the guard
    assert "estimated" in captured.err and "warning" in captured.err  # still told what it costs


def test_cpu_demo_at_768k_is_warned_with_the_estimate(cli, no_build, capsys):
    rc, captured = _demo_guard(cli, ["demo", "--device", "cpu", "--context", "768K", "--json"], capsys)
    assert rc == "built"  # warned, not refused
    assert "warning" in captured.err and "estimated" in captured.err and "min" in captured.err
    assert captured.out == ""  # stdout stays for the JSON document


@pytest.mark.parametrize("argv", [[], TINY_DEMO[2:], ["--backends", "aiter"]])
def test_small_cpu_demo_is_neither_warned_nor_refused(cli, no_build, argv, capsys):
    rc, captured = _demo_guard(cli, ["demo", "--device", "cpu", *argv], capsys)
    assert rc == "built" and "warning" not in captured.err and captured.err.strip() == "", captured.err


def test_cpu_demo_counts_its_timed_calls(cli, no_build, capsys):
    """The estimate counts every call a kernel backend makes (warm-up and timed iterations): a
    small batch timed 100,000 times is refused, with the options that shrink it named."""
    rc, captured = _demo_guard(cli, ["demo", "--device", "cpu", "--backends", "fused", "--iters", "100000"], capsys)
    assert rc == 2 and "--iters" in captured.err and "100001 calls" in captured.err, captured.err
    rc, captured = _demo_guard(cli, ["demo", "--device", "cpu", "--backends", "fused", "--iters", "1"], capsys)
    assert rc == "built"


@pytest.mark.parametrize("argv", [["--rows", "100000", "--layout", "sglang_fp8", "--patterns", "random"],
                                  ["--context", "64M"]])
def test_cpu_check_too_large_is_refused_before_building(cli, no_build, argv, capsys):
    """``check`` builds a workload per layout and pattern and runs the reference over each: on a
    CPU the same guard as demo's refuses one estimated past the limits, before building any."""
    rc, captured = _demo_guard(cli, ["check", "--device", "cpu", *argv], capsys)
    assert rc == 2, captured
    assert "CPU check" in captured.err and "--force" in captured.err and "Traceback" not in captured.err
    rc, captured = _demo_guard(cli, ["check", "--device", "cpu", *argv, "--force"], capsys)
    assert rc == "built" and "warning" in captured.err


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
    rc = cli.main(["check", "--device", "cpu", "--backend", "aiter,legacy", "--layout", "aiter_mxfp4", "--patterns", "equal",
                   "--context", "2200", "--rows", "1"])
    out = capsys.readouterr().out
    assert "unavailable" in out and "No module named 'aiter'" in out
    # Nothing ran, so nothing passed: exit 1, saying why.
    assert rc == 1
    assert "FAILED" in out and "nothing was compared" in out and "OK" not in out


def test_check_json_with_nothing_run_is_not_ok(cli, monkeypatch, capsys):
    import indexer_topk

    def missing(*args, **kw):
        raise indexer_topk.BackendUnavailable("backend 'legacy' is not available: Triton is not installed")

    monkeypatch.setattr(indexer_topk, "indexer_topk", missing)
    rc = cli.main(["check", "--device", "cpu", "--backend", "legacy", "--layout", "sglang_fp8", "--patterns", "equal",
                   "--context", "2200", "--rows", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["ok"] is False and "nothing was compared" in doc["reason"]


def test_check_with_one_backend_unavailable_still_passes_on_the_others(cli, monkeypatch, capsys):
    """Some runs compared and none failed: a backend that cannot run here is listed, not failed."""
    import indexer_topk
    from indexer_topk.reference import reference_indexer_topk

    def aiter_missing(*args, backend, out=None, workspace=None, check_values=True, **kw):
        if backend == "aiter":
            raise indexer_topk.BackendUnavailable("backend 'aiter' is not available: No module named 'aiter'")
        return reference_indexer_topk(*args, **kw)

    monkeypatch.setattr(indexer_topk, "indexer_topk", aiter_missing)
    rc = cli.main(["check", "--device", "cpu", "--backend", "aiter,legacy", "--layout", "sglang_fp8", "--patterns", "equal",
                   "--context", "2200", "--rows", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: 1 run(s) compared" in out and "not checked (unavailable)" in out


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


@pytest.mark.parametrize("command", ["demo", "check"])
@pytest.mark.parametrize(
    "option, needles",
    [
        (["--device", "meta"], ("--device", "meta", "cpu", "cuda")),
        (["--device", "xpu"], ("--device", "xpu")),
        (["--device", "mps"], ("--device", "mps")),
        (["--device", "cuda:x"], ("--device", "cuda:x")),
        (["--device", "gpu"], ("--device", "gpu")),
        (["--seed", str(2**64)], ("--seed", str(2**64), "2**64")),
        (["--seed", "-1"], ("--seed", "-1")),
        (["--seed", "1e3"], ("--seed", "1e3")),
    ],
)
def test_unsupported_device_or_seed_is_a_usage_error(cli, command, option, needles, capsys):
    try:
        rc = cli.main([command, *option])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    for n in needles:
        assert n in captured.err, (n, captured.err)
    assert captured.out == ""


def test_the_largest_seed_runs(cli, capsys):
    assert cli.main([*TINY_DEMO, "--backends", "reference", "--seed", str(2**64 - 1)]) == 0


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


# ============================================================================================
# tune
# ============================================================================================


class FakeMix:
    """The serving mix's interface, returning synthetic records (no kernel runs here)."""

    def __init__(self, records):
        self.records, self.calls = records, []

    def default_shapes(self, smoke):
        return [types.SimpleNamespace(label=n) for n in (["smoke_prefill"] if smoke else ["prefill_1k", "decode_64"])]

    @staticmethod
    def SGLangPath(kit):  # noqa: N802 - the mix's class, whose instance times SGLang's path
        return ("sglang path from", kit)

    def run_mix(self, shapes, *, device, candidates, sglang, progress):
        self.calls.append({"shapes": [s.label for s in shapes], "candidates": candidates, "sglang": sglang})
        for i, shape in enumerate(shapes):
            progress(i, len(shapes), shape)
        return [dict(r) for r in self.records]


_UNTIMED = object()


def mix_record(kind="prefill", rows=1024, tokens=786432, sglang_ms=_UNTIMED, **cands):
    """A record as ``run_mix`` writes it; ``sglang_ms`` left out unless given (SGLang not timed),
    ``None`` where SGLang has no path."""
    rec = {"kind": kind, "layout": "sglang_fp8", "topk": 1024, "requests": 1, "rows_per_request": rows, "rows": rows,
           "context_tokens": tokens, "route": "fused", "timing": "eager" if kind == "prefill" else "graph",
           "ours_ms": 1.0, "host_us": 10.0, "matches_legacy": True, "sglang_overlap": None,
           "candidates": cands or {"fused": 1.0, "legacy": 2.0}}
    if sglang_ms is not _UNTIMED:
        rec["sglang_ms"] = sglang_ms
    return rec


@pytest.fixture
def tune(cli, monkeypatch):
    """``tune(args) -> (status, FakeMix)`` on a pretend H200 with a fake serving mix."""
    import torch

    from indexer_topk import policy
    from indexer_topk.policy import Probe

    h200 = Probe(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), triton_version="3.6.0",
                 sm_count=132, hopper_stream=True)
    monkeypatch.setattr(policy, "probe_environment", lambda env=None: h200)
    monkeypatch.setattr(cli, "_resolve_device", lambda name: torch.device("cuda"))

    def run(args, records=(mix_record(),)):
        mix = FakeMix(records)
        monkeypatch.setitem(sys.modules, "indexer_topk.bench.mix", mix)
        import indexer_topk.bench as bench

        monkeypatch.setattr(bench, "mix", mix, raising=False)
        return cli.main(["tune", *args]), mix

    return run


def test_tune_writes_a_table_the_policy_uses(tune, tmp_path, capsys):
    from indexer_topk import routes
    from indexer_topk.policy import PathPolicy, Probe

    out = tmp_path / "h200.json"
    status, mix = tune(["--out", str(out)], records=[mix_record(), mix_record(kind="decode", rows=8)])
    assert status == 0, capsys.readouterr()
    assert mix.calls == [{"shapes": ["prefill_1k", "decode_64"], "candidates": ("fused", "legacy"), "sglang": None}]
    table = routes.load_table(out)
    assert table.device.key() == ("nvidia", "sm_90", 132) and table.conditions == {"triton": "3.6", "hopper_stream": True}
    records = json.loads((tmp_path / "h200.records.json").read_text())
    assert records["env"]["sm_count"] == 132 and len(records["records"]) == 2
    assert {r["file"] for e in table.entries for r in e["record"]} == {str(tmp_path / "h200.records.json")}
    # SGLang's path was not timed: the table keeps it wherever SGLang has one
    assert {(e["mode"], e["backend"]) for e in table.entries} == {("prefill", "engine"), ("decode", "engine"),
                                                                  ("capture", "engine")}
    assert f"INDEXER_TOPK_ROUTES={out}" in capsys.readouterr().out
    p = PathPolicy(Probe(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), triton_version="3.6.0",
                         sm_count=132, hopper_stream=True, routes_file=str(out)))
    assert p.table.path == str(out)
    assert p.engine_route(engine_path=True, layout="sglang_fp8", topk=1024, rows=1024, c4_len=196608,
                          capturing=False) is None


def test_tune_shapes_smoke_and_progress(tune, tmp_path):
    status, mix = tune(["--out", str(tmp_path / "a.json"), "--smoke"])
    assert status == 0 and mix.calls[0]["shapes"] == ["smoke_prefill"]
    status, mix = tune(["--out", str(tmp_path / "k.json"), "--smoke", "--sglang-kit", "kit-dir"])
    assert status == 0 and mix.calls[0]["sglang"] == ("sglang path from", "kit-dir")
    status, mix = tune(["--out", str(tmp_path / "b.json"), "--shapes", "decode"])
    assert status == 0 and mix.calls[0]["shapes"] == ["decode_64"]


def test_tune_refuses_the_shipped_table_an_existing_file_and_bad_shapes(tune, tmp_path, capsys):
    from indexer_topk import routes

    shipped = routes.SHIPPED_DIR / "nvidia-h200.json"
    before = shipped.read_bytes()
    for target in (shipped, routes.SHIPPED_DIR / "mine.json"):
        status, mix = tune(["--out", str(target), "--force"])
        assert status == 2 and mix.calls == [] and "never writes" in capsys.readouterr().err
    assert shipped.read_bytes() == before and not (routes.SHIPPED_DIR / "mine.json").exists()
    out = tmp_path / "t.json"
    out.write_text("keep me")
    status, mix = tune(["--out", str(out)])
    assert status == 2 and mix.calls == [] and out.read_text() == "keep me" and "--force" in capsys.readouterr().err
    assert tune(["--out", str(out), "--force"])[0] == 0 and routes.load_table(out)
    status, mix = tune(["--out", str(tmp_path / "u.json"), "--shapes", "nothing_like_it"])
    assert status == 2 and "decode_64" in capsys.readouterr().err and not (tmp_path / "u.json").exists()
    assert tune(["--out", str(tmp_path)])[0] == 2  # a folder
    if hasattr(os, "mkfifo"):  # a pipe (or a device): renamed over, it would become a plain file
        fifo = tmp_path / "pipe.json"
        os.mkfifo(fifo)
        status, mix = tune(["--out", str(fifo), "--force"])
        assert status == 2 and mix.calls == [] and "not a regular file" in capsys.readouterr().err
        assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_tune_from_records(cli, tmp_path, capsys):
    env = {"gpu": "NVIDIA H200", "sm_count": 132, "arch": "sm_90", "triton": "3.6.0", "commit": "abc1234"}
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"env": env, "records": [mix_record(sglang_ms=9.0)]}))
    out = tmp_path / "t.json"
    assert cli.main(["tune", "--from-records", str(mix), "--out", str(out)]) == 0
    from indexer_topk import routes

    assert routes.load_table(out).lookup("sglang_fp8", "prefill", 1024, 1024, 196608) == ("fused", "fused")
    mix.write_text("{broken")
    assert cli.main(["tune", "--from-records", str(mix), "--out", str(tmp_path / "u.json")]) == 1
    assert "mix.json" in capsys.readouterr().err and not (tmp_path / "u.json").exists()


def test_tune_without_a_gpu_says_so(tmp_path):
    p = run_cli("tune", "--out", str(tmp_path / "t.json"), env_extra=no_gpu_env())
    assert_one_line_error(p, 1, "--from-records")
    assert not (tmp_path / "t.json").exists()


class _Unwritable:
    """A stdout whose writes fail as a full device's or a closed pipe's do (a failed write
    leaves nothing to flush: only the write reports the error)."""

    def __init__(self, exc):
        self.exc = exc

    def write(self, text):
        raise self.exc

    def flush(self):
        pass


@pytest.mark.parametrize("argv", [["info"], ["info", "--json"], ["--version"], ["--help"], ["check", "--help"],
                                  ["bench", "--help"]])
def test_output_that_cannot_be_written_is_one_line_and_status_1(cli, argv, monkeypatch, capsys):
    """Also --help and --version, whose write errors argparse itself drops (exit 0)."""
    import errno
    import sys

    monkeypatch.setattr(sys, "stdout", _Unwritable(OSError(errno.ENOSPC, "No space left on device")))
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip() == "indexer-topk: error: cannot write the output: No space left on device", err
    monkeypatch.setattr(sys, "stdout", _Unwritable(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == ""  # a reader that closed the pipe wants nothing more


def test_a_file_error_names_its_file(cli, monkeypatch, capsys):
    """Only a failed write to standard output reads "cannot write the output"; an error of a
    file (here one that cannot be made) names it."""
    def info(a, device):
        raise FileExistsError(17, "File exists", "/some/where/mix.json")

    monkeypatch.setattr(cli, "cmd_info", info)  # read when main builds its parser
    assert cli.main(["info"]) == 1
    err = capsys.readouterr().err
    assert "/some/where/mix.json" in err and "cannot write the output" not in err, err


def test_cpu_demo_warm_up_counts_only_when_it_times(cli, no_build, capsys):
    """A CPU demo times nothing by default (--iters 0), so it makes no warm-up call either: a
    large --warmup alone does not make it look long."""
    rc, captured = _demo_guard(cli, ["demo", "--device", "cpu", "--backends", "fused", "--warmup", "100000"], capsys)
    assert rc == "built", captured.err
