"""The Makefile's set-up of .venv, and which python its targets run, with stand-in tools: a fake
interpreter whose ``-m venv DIR`` makes a .venv of fake ``python``, ``pip`` and ``indexer-topk``
that only log how they were called."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

_FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$LOG"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  for tool in python pip indexer-topk; do
    printf '#!/bin/sh\\necho "%s $*" >> "$LOG"\\n' "$tool" > "$3/bin/$tool"
    chmod +x "$3/bin/$tool"
  done
fi
"""


@pytest.fixture
def checkout(tmp_path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    return tmp_path


def make(checkout, *args):
    env = dict(os.environ, LOG=str(checkout / "log"))
    env.pop("MAKEFLAGS", None)
    p = subprocess.run(["make", f"PYTHON={checkout / 'fake-python'}", *args], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    log = checkout / "log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return p.stdout, calls


def test_first_run_installs_once_and_a_touched_pyproject_installs_nothing(checkout):
    out, calls = make(checkout, "demo")
    assert "First run" in out
    assert calls[0].startswith("python -m venv")
    assert [c.split()[0] for c in calls[1:]] == ["pip", "pip", "pip", "indexer-topk"]

    later = time.time() + 10
    os.utime(checkout / "pyproject.toml", (later, later))
    out, calls = make(checkout, "demo")
    assert "First run" not in out and "updating" not in out
    assert calls == ["indexer-topk demo"]


def test_a_changed_pyproject_updates_the_venv_quietly(checkout):
    make(checkout, "demo")
    with open(checkout / "pyproject.toml", "a") as fh:
        fh.write("\n# a change\n")
    out, calls = make(checkout, "test")
    assert "First run" not in out and "updating" in out
    installs = [c for c in calls if c.startswith("pip ")]
    assert len(installs) == 3 and all(" -q " in c for c in installs)
    assert not any(c.startswith("python -m venv") for c in calls)
    assert calls[-1].startswith("python -m pytest") and " -n " in calls[-1]


def test_gpu_targets_run_the_venv_python_where_there_is_one(checkout):
    fake = str(checkout / "fake-python")
    for target, script in (("test-gpu", "-m pytest -m gpu"), ("bench", "benchmark/bench_indexer_topk.py")):
        out, _ = make(checkout, "-n", target)
        assert f"{fake} {script}" in out
    make(checkout, "demo")
    for target, script in (("test-gpu", "-m pytest -m gpu"), ("bench", "benchmark/bench_indexer_topk.py")):
        out, _ = make(checkout, "-n", target)
        assert f".venv/bin/python {script}" in out


def test_help_lists_the_targets(checkout):
    out, calls = make(checkout, "help")
    for target in ("demo", "test", "test-gpu", "bench", "clean"):
        assert f"make {target}" in out
    assert calls == []
