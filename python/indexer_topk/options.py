"""Command-line values shared by ``indexer-topk`` and the benchmark: token counts with K/M
suffixes, comma lists, the names a list may hold, and workload seeds."""

from __future__ import annotations

import argparse
import re
from typing import Callable, Sequence

from .contract import Layout

K = 1024
MAX_TOKENS = 4 * 2**31 - 4  # raw tokens whose C4 positions all fit an int32 index
LAYOUTS = tuple(x.value for x in Layout)


def parse_tokens(text) -> int:
    """Token count from ``"65536"``, ``"64K"``, ``"768k"`` or ``"1M"`` (K = 1024, M = 1024**2).

    An ``int`` is returned as it is; anything else that is not a positive count of at most
    :data:`MAX_TOKENS` raises ``ValueError``.
    """
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a token count (e.g. 65536, 64K, 768K, 1M)")
    n = int(m.group(1)) * {"": 1, "k": K, "m": K * K}[m.group(2).lower()]
    if n <= 0:
        raise ValueError(f"token count must be positive, got {text!r}")
    if n > MAX_TOKENS:
        raise ValueError(f"token count {text!r} is past {format_tokens(MAX_TOKENS)}: a C4 position (tokens // 4) is an int32")
    return n


def format_tokens(n: int) -> str:
    """Inverse of :func:`parse_tokens` where exact: 786432 -> ``"768K"``, 1048576 -> ``"1M"``."""
    if n % (K * K) == 0:
        return f"{n // (K * K)}M"
    if n % K == 0:
        return f"{n // K}K"
    return str(n)


def parse_list(text: str, convert: Callable = str, *, name: str = "value") -> list:
    """Comma-separated list; each item through ``convert``; ``ValueError`` naming ``name``."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{name}: empty list")
    out = []
    for x in items:
        try:
            out.append(convert(x))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return out


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    """A :func:`parse_list` converter accepting only ``choices``."""

    def convert(x):
        if x not in choices:
            raise ValueError(f"unknown value {x!r}; expected one of {', '.join(choices)}")
        return x

    return convert


def parse_seed(text) -> int:
    """A workload seed: an integer from 0 to 2**64 - 1 (torch's generators take 64-bit seeds).

    Anything else raises ``ValueError``.
    """
    try:
        value = int(str(text).strip(), 10)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 2**64:
        raise ValueError(f"expected an integer from 0 to 2**64 - 1, got {str(text)!r}")
    return value


def argparse_type(convert: Callable, name: str) -> Callable[[str], object]:
    """``convert`` as an argparse ``type``: its ``ValueError`` message becomes the usage error."""

    def parse(text: str):
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in some messages
    return parse


__all__ = ["K", "LAYOUTS", "argparse_type", "format_tokens", "one_of", "parse_list", "parse_seed", "parse_tokens"]
