"""Typed environment flags (:mod:`indexer_topk.envs`): parsing, defaults, invalid values,
overrides, and the kill switch as the path policy's probe reads it."""

from __future__ import annotations

import logging

import pytest

from indexer_topk.envs import EnvBool, EnvInt, EnvStr, envs
from indexer_topk.policy import probe_environment


@pytest.mark.parametrize("raw", ["false", "0", "off", "no", "FALSE", " Off ", "No"])
def test_kill_switch_spellings_disable(raw):
    assert envs.SGLANG_DSV4_FP4_FUSED_TOPK.get({"SGLANG_DSV4_FP4_FUSED_TOPK": raw}) is False
    assert probe_environment({"SGLANG_DSV4_FP4_FUSED_TOPK": raw}).fused_enabled is False


@pytest.mark.parametrize("env", [{}, {"SGLANG_DSV4_FP4_FUSED_TOPK": "true"}, {"SGLANG_DSV4_FP4_FUSED_TOPK": "1"},
                                 {"SGLANG_DSV4_FP4_FUSED_TOPK": "ON"}, {"SGLANG_DSV4_FP4_FUSED_TOPK": " yes"},
                                 {"SGLANG_DSV4_FP4_FUSED_TOPK": ""}])
def test_kill_switch_unset_or_true_enables(env, caplog):
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert envs.SGLANG_DSV4_FP4_FUSED_TOPK.get(env) is True
    assert not caplog.records


def test_kill_switch_garbage_warns_and_enables(caplog):
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert envs.SGLANG_DSV4_FP4_FUSED_TOPK.get({"SGLANG_DSV4_FP4_FUSED_TOPK": "maybe"}) is True
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "SGLANG_DSV4_FP4_FUSED_TOPK" in record.getMessage() and "'maybe'" in record.getMessage()


def test_env_field_truth_test_raises():
    with pytest.raises(TypeError, match=r"envs\.INDEXER_TOPK_TRITON_ROCM\.get\(\)"):
        bool(envs.INDEXER_TOPK_TRITON_ROCM)
    with pytest.raises(AttributeError):
        envs.INDEXER_TOPK_TRITON_ROCM = True


def test_env_override_sets_and_restores(monkeypatch):
    monkeypatch.setenv("INDEXER_TOPK_TRITON_ROCM", "off")
    with envs.INDEXER_TOPK_TRITON_ROCM.override(True):
        assert envs.INDEXER_TOPK_TRITON_ROCM.get() is True
        with envs.INDEXER_TOPK_TRITON_ROCM.override(None):
            assert not envs.INDEXER_TOPK_TRITON_ROCM.is_set()
            assert envs.INDEXER_TOPK_TRITON_ROCM.get() is False
    assert envs.INDEXER_TOPK_TRITON_ROCM.raw() == "off"
    monkeypatch.delenv("INDEXER_TOPK_TRITON_ROCM")
    with envs.INDEXER_TOPK_LOGITS_BUDGET_MB.override(64):
        assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get() == 64
    assert not envs.INDEXER_TOPK_LOGITS_BUDGET_MB.is_set()


def test_env_defaults_and_invalid_values(caplog):
    assert envs.snapshot({}) == {
        "SGLANG_DSV4_FP4_FUSED_TOPK": True,
        "INDEXER_TOPK_TRITON_ROCM": False,
        "INDEXER_TOPK_LOGITS_BUDGET_MB": 2048,
        "INDEXER_TOPK_LOG_LEVEL": None,
    }
    assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get({"INDEXER_TOPK_LOGITS_BUDGET_MB": " 512 "}) == 512
    assert envs.INDEXER_TOPK_LOG_LEVEL.get({"INDEXER_TOPK_LOG_LEVEL": "debug"}) == "DEBUG"
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get({"INDEXER_TOPK_LOGITS_BUDGET_MB": "2GB"}) == 2048
        assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get({"INDEXER_TOPK_LOGITS_BUDGET_MB": "0"}) == 2048
        assert envs.INDEXER_TOPK_LOG_LEVEL.get({"INDEXER_TOPK_LOG_LEVEL": "loud"}) is None
    assert len(caplog.records) == 3


def test_env_field_types_standalone():
    class Flags:
        A = EnvBool(lambda: True)
        B = EnvInt(3, max_value=5)
        C = EnvStr("x")

    assert Flags.A.name == "A" and Flags.A.get({}) is True and Flags.A.get({"A": "no"}) is False
    assert Flags.B.get({"B": "6"}) == 3 and Flags.B.get({"B": "5"}) == 5
    assert Flags.C.get({"C": "  raw value "}) == "raw value"
