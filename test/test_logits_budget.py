"""``INDEXER_TOPK_LOGITS_BUDGET_MB``: the legacy path's score-matrix budget has a two-row
floor, and a budget below it says so once instead of passing for a bound."""

import logging

import pytest

from indexer_topk.backends import key_matrix, legacy
from indexer_topk.envs import envs

MIB = 1 << 20
WIDTH_768K = 768 * 1024 // 4  # C4 positions of a 768K-token row


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(key_matrix, "_BELOW_FLOOR_WARNED", set(), raising=False)


def _floor_warnings(caplog):
    return [r for r in caplog.records if "INDEXER_TOPK_LOGITS_BUDGET_MB" in r.getMessage()]


def test_budget_below_two_rows_warns_once_with_the_sizes(caplog):
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        with envs.INDEXER_TOPK_LOGITS_BUDGET_MB.override(1):
            assert legacy.chunk_rows(1024, WIDTH_768K) == 2
            assert legacy.chunk_rows(64, WIDTH_768K) == 2
            assert legacy.key_matrix_bytes(1024, WIDTH_768K // 64) == 2 * WIDTH_768K * 4  # 1.5 MiB
    [record] = _floor_warnings(caplog)  # the same case twice: one warning
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "1 MiB" in message and "1.5 MiB" in message and "two rows" in message
    # A distinct case (another budget below the floor) warns again, once.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert legacy.chunk_rows(8, 4 * MIB, budget_bytes=3 * MIB) == 2
        assert legacy.chunk_rows(8, 4 * MIB, budget_bytes=3 * MIB) == 2
    assert len(_floor_warnings(caplog)) == 1


@pytest.mark.parametrize("budget_bytes, width", [(2 * MIB, 65536), (2048 * MIB, WIDTH_768K), (8, 1)])
def test_budget_at_or_above_two_rows_is_silent(caplog, budget_bytes, width):
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        rows = legacy.chunk_rows(4096, width, budget_bytes)
    assert rows >= 2 and rows * width * 4 <= budget_bytes
    assert not _floor_warnings(caplog)


def test_one_row_call_is_not_warned_about_a_second_row(caplog):
    """One row rounds up to a pair of rows, which is what the floor is; a budget that holds
    both rows is a bound."""
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert legacy.chunk_rows(1, 1000, budget_bytes=8000) == 2
    assert not _floor_warnings(caplog)

