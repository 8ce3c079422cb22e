"""Files the package and its scripts write: written so that a reader sees the old one or the new
one, never a part, and named in them without the writing machine's folders."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, IO


def write_atomically(path, write: Callable[[IO], object], *, binary: bool = False) -> Path:
    """``write(f)`` into a temporary file beside ``path`` (text, UTF-8, or ``binary``), then
    rename it over ``path``; the temporary file is removed if anything fails."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent))
    os.close(fd)  # a unique name; written through Path.open
    tmp = Path(name)
    try:
        with tmp.open("wb") if binary else tmp.open("w", encoding="utf-8") as f:
            write(f)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def relative_name(path, root) -> str:
    """``path`` as a committed file names it: relative to ``root`` (a repository) where it lies
    inside it, else its file name alone."""
    p, r = Path(path).resolve(), Path(root).resolve()
    return str(p.relative_to(r)) if p.is_relative_to(r) else p.name


__all__ = ["relative_name", "write_atomically"]
