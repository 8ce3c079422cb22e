"""Which versions this process runs: installed distributions and the source checkout."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def package_version(*dists: str) -> str:
    """The installed version of the first of ``dists`` that is installed; ``"installed
    (version unknown)"`` when only its module is found, ``"not installed"`` otherwise."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    for d in dists:
        try:
            return version(d)
        except PackageNotFoundError:
            continue
    for m in (d.replace("-", "_") for d in dists):
        try:
            if find_spec(m) is not None:
                return "installed (version unknown)"
        except (ImportError, ValueError):
            continue
    return "not installed"


def triton_version() -> str:
    """Triton's version, whether installed as ``triton`` or as ROCm's ``pytorch-triton-rocm``."""
    return package_version("triton", "pytorch-triton-rocm")


def source_revision() -> Optional[str]:
    """``git describe --always --dirty`` of the checkout this package runs from, if it is one."""
    import subprocess

    try:
        proc = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


__all__ = ["package_version", "source_revision", "triton_version"]


# The Triton release whose sm_90 lowering of ``tl.dot_scaled`` the Hopper stream's MXFP4 tile
# repeats step for step: later releases decode scale byte 0 as 2**-127 and make NaN another
# way, so their legacy tile's bits differ and the stream leaves them the plain-Triton kernel.
MX_STREAM_TRITON = "3.6."
