"""The chunked-stream experiment (benchmark/research/chunked_stream.py) stays exact: bitwise equal to the
legacy path under plans that force many chunks, cuts every block, and several row steps."""

import sys
from pathlib import Path

import pytest

from kernel_cases import Case, assert_bitwise, build, run_legacy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark" / "research"))
import chunked_stream  # noqa: E402


@pytest.mark.parametrize("pattern", ["random", "increasing"])
def test_chunked_stream_equals_legacy(pattern, device):
    case = Case(f"stream-{pattern}", "sglang_fp8", pattern, context_tokens=(9000, 300, 2000),
                rows_per_request=(3, 2, 2), topk=32)
    wl = build(case, device)
    expected = run_legacy(wl)
    # 8 rows per step, 192-position chunks (12 of them), a cut every block of 32
    small = dict(budget=8 * (192 * 4 + 64 * 8 + 16), block=32)
    plan = chunked_stream.plan_stream(wl.rows, 32, **small)
    assert plan.chunk == 192 and plan.rows_per_step == 8
    assert_bitwise(chunked_stream.stream_indexer_topk(wl.inputs(), **small), expected, f"{pattern} small plan")
    # two rows per step: four steps, each with its own first and last chunk
    two = dict(budget=1 << 14, block=16, rows_per_step=2)
    assert_bitwise(chunked_stream.stream_indexer_topk(wl.inputs(), **two), expected, f"{pattern} two rows per step")


def test_chunk_order_is_a_permutation():
    for n in (1, 2, 3, 10, 48, 97):
        assert sorted(chunked_stream.chunk_order(n)) == list(range(n))
