"""Fetch SGLang's released source from the package index and cache it, unpacked, in the repo.

The SGLang integration test runs SGLang's own code, so it needs the release's Python sources,
not an installation: ``pip download sglang==<version> --no-deps`` fetches the wheel and its
``sglang/`` tree is unpacked into ``.sglang-src/`` at the repository root (ignored by git),
where later runs find it without the network. ``msgspec``, which SGLang uses to declare
structs at import time, is fetched the same way when it is not installed. Test processes run
side by side (pytest-xdist), so a fetch holds a lock on the cache directory: one process
downloads, the others wait and find it cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List

SGLANG_VERSION = "0.5.23"
REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".sglang-src"
_DONE = ".complete"
# The released wheels are per CPython version but their Python sources are identical; when
# no wheel matches this interpreter, take the cp311 one.
_FALLBACK_WHEEL = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                   "--platform", "manylinux_2_34_x86_64"]


class SourceUnavailable(RuntimeError):
    """The wheel could not be downloaded (typically: no network); the message says why."""


def _pip_download(requirement: str, dest: Path, extra: List[str]) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--disable-pip-version-check",
           "-q", "-d", str(dest), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SourceUnavailable(f"`pip download {requirement} --no-deps` failed: {' | '.join(tail)}")
    return wheels[0]


def _download_wheel(requirement: str, dest: Path) -> Path:
    try:
        return _pip_download(requirement, dest, [])
    except SourceUnavailable as first:
        try:
            return _pip_download(requirement, dest, _FALLBACK_WHEEL)
        except SourceUnavailable:
            raise first from None


def _unpack(wheel: Path, target: Path, keep) -> None:
    """Unpack the members ``keep(name)`` accepts into ``target``, atomically."""
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp, members=[m for m in zf.namelist() if keep(m)])
        (tmp / _DONE).write_text(wheel.name + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _cached(target: Path) -> bool:
    return (target / _DONE).is_file()


@contextlib.contextmanager
def _locked(cache_dir: Path):
    """Hold an exclusive lock on ``cache_dir`` (released when the holder exits, even killed)."""
    with open(cache_dir / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch_sglang_source(version: str = SGLANG_VERSION, cache_dir: Path = CACHE_DIR) -> List[Path]:
    """Directories to put on ``sys.path`` so ``import sglang`` finds the release's sources.

    Downloads at most once per cache directory; raises :class:`SourceUnavailable` when a
    needed wheel cannot be downloaded.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir):
        return _fetch(version, cache_dir)


def _fetch(version: str, cache_dir: Path) -> List[Path]:
    paths = []
    src = cache_dir / f"sglang-{version}"
    if not _cached(src):
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            wheel = _download_wheel(f"sglang=={version}", Path(tmp))
            # Sources and metadata only: the compiled extensions are not imported by the test.
            _unpack(wheel, src, lambda m: not m.endswith((".so", ".pyd")))
    paths.append(src)
    if importlib.util.find_spec("msgspec") is None:
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        deps = cache_dir / f"msgspec-{tag}"
        if not _cached(deps):
            with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
                _unpack(_pip_download("msgspec", Path(tmp), []), deps, lambda m: True)
        paths.append(deps)
    return paths


def pack_for_gpu(src: Path, target: Path) -> Path:
    """Write ``target`` (.tgz): the release's Python sources, its JIT kernel sources (SGLang
    checks they exist at import) and its metadata, without the diffusion server, tests and
    benchmarks. About 11 MB against 88 MB unpacked, so it travels to a GPU machine that cannot
    download it (``benchmark/sglang_gpu.sh`` unpacks it)."""
    import tarfile

    skip = ("sglang/multimodal_gen/", "sglang/test/", "sglang/benchmark/")
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(src.rglob("*")):
            name = path.relative_to(src).as_posix()
            if not path.is_file() or name.startswith(skip) or name.endswith((".so", ".pyd")):
                continue
            if name.endswith(".py") or name.startswith(("sglang/kernels/jit/", f"sglang-{SGLANG_VERSION}.dist-info/")):
                tar.add(path, arcname=name)
    return target


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Fetch SGLang's release sources; print the paths to import them from.")
    parser.add_argument("--pack", type=Path, help="also write its sources for a GPU machine to this .tgz")
    args = parser.parse_args()
    paths = fetch_sglang_source()
    for path in paths:
        print(path)
    if args.pack is not None:
        print(pack_for_gpu(paths[0], args.pack))
