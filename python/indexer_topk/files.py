"""Writing a file so that a reader sees the old one or the new one, never a part."""

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


__all__ = ["write_atomically"]
