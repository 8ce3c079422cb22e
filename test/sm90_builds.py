"""Kernels compiled for sm_90 on any machine (no GPU needed), for the tests that read what the
compiler made of them: PTX, TTGIR layouts, registers.

A test hands :func:`compile_script` a Python body; it runs in a fresh process without
``TRITON_INTERPRET`` (the interpreter runs only the branches a call takes, and a process that
imported the kernels under it cannot compile them), the package from this checkout, with
``report`` bound to ``benchmark/research/compile_report.py``'s module (its ``_signature``,
``_compile`` and ``_report``). What the body prints is what the test reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPILE_REPORT = REPO / "benchmark" / "research" / "compile_report.py"

# sys.argv[1] is compile_report.py's path, so a body's own arguments start at sys.argv[2]
_PREAMBLE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("compile_report", sys.argv[1])
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)
"""


def compile_script(body: str, *args, timeout: int = 900) -> str:
    """The standard output of ``body`` (after the preamble that binds ``report``), run with
    ``args`` as ``sys.argv[2:]``; the assertion carries the script's stderr where it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO / "python")
    done = subprocess.run([sys.executable, "-c", _PREAMBLE + body, str(COMPILE_REPORT), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
