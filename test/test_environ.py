"""The environment reads of every call (indexer_topk.environ) against ``os.environ.get``."""

import os

import pytest

from indexer_topk import environ
from indexer_topk.envs import envs
from indexer_topk.environ import Snapshot, Var

NAME = "INDEXER_TOPK_TEST_ENVIRON_VAR"
# values a shell can set: empty, spaces, non-ASCII, and bytes that are not UTF-8 (surrogate-escaped)
VALUES = ["1", "", " 0 ", "träge", "a=b", os.fsdecode(b"\xff\xfe")]


@pytest.fixture
def var(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    return Var(NAME)


def test_reads_as_os_environ(var, monkeypatch):
    assert environ._USABLE  # CPython's os.environ: the direct reads are what this test covers
    assert var.get() is None
    for value in VALUES + VALUES[::-1]:
        monkeypatch.setenv(NAME, value)
        assert var.get() == os.environ.get(NAME) == value
    os.environ[NAME] = "x"
    assert var.get() == "x"
    del os.environ[NAME]
    assert var.get() is None
    os.environ[NAME] = "y"
    assert os.environ.pop(NAME) == "y" and var.get() is None


def test_snapshot_holds_until_a_value_changes(var, monkeypatch):
    monkeypatch.setenv(NAME, "1")
    snap = Snapshot([(NAME, "1"), ("INDEXER_TOPK_TEST_ENVIRON_UNSET", None)])
    assert snap.holds()
    for value in ("0", "", " 1", "1 "):
        monkeypatch.setenv(NAME, value)
        assert not snap.holds(), value
    monkeypatch.setenv(NAME, "1")
    assert snap.holds()
    monkeypatch.setenv("INDEXER_TOPK_TEST_ENVIRON_UNSET", "")  # set but empty is not unset
    assert not snap.holds()
    monkeypatch.delenv("INDEXER_TOPK_TEST_ENVIRON_UNSET")
    monkeypatch.delenv(NAME)
    assert not snap.holds()
    for value in VALUES:
        monkeypatch.setenv(NAME, value)
        assert Snapshot([(NAME, value)]).holds() and Snapshot([(NAME, None)]).holds() is False


def test_a_replaced_os_environ_is_read_as_it_is(var, monkeypatch):
    """A test (or a host) that swaps ``os.environ`` for another mapping is read through that
    mapping, not through the store found at import."""
    monkeypatch.setenv(NAME, "from the real environ")
    snap = Snapshot([(NAME, "from the real environ")])
    assert var.get() == "from the real environ" and snap.holds()
    monkeypatch.setattr(os, "environ", {NAME: "replaced"})
    assert var.get() == "replaced"
    assert not snap.holds()
    assert Snapshot([(NAME, "replaced")]).holds()
    assert envs.INDEXER_TOPK_REPLAY.get() is True  # unset in the replacing mapping: the default
    os.environ["INDEXER_TOPK_REPLAY"] = "off"
    assert envs.INDEXER_TOPK_REPLAY.get() is False


def test_flags_read_through_the_store(monkeypatch):
    for raw, value in (("0", False), ("yes", True), ("", False), ("maybe", False), ("ON", True)):
        monkeypatch.setenv("INDEXER_TOPK_REPLAY", raw)
        assert envs.INDEXER_TOPK_REPLAY.get() is value, raw
    monkeypatch.delenv("INDEXER_TOPK_REPLAY")
    assert envs.INDEXER_TOPK_REPLAY.get() is True
