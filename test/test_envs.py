"""Typed environment flags (:mod:`indexer_topk.envs`): parsing, defaults, invalid values,
overrides, and the kill switch as the path policy's probe reads it."""

from __future__ import annotations

import logging

import pytest

from indexer_topk.envs import EnvBool, EnvInt, EnvStr, envs
from indexer_topk.policy import PathPolicy, probe_environment


@pytest.mark.parametrize("raw", ["false", "0", "off", "no", "FALSE", " Off ", "No"])
def test_kill_switch_spellings_disable(raw):
    assert envs.SGLANG_DSV4_FP4_FUSED_TOPK.get({"SGLANG_DSV4_FP4_FUSED_TOPK": raw}) is False
    assert probe_environment({"SGLANG_DSV4_FP4_FUSED_TOPK": raw}).fused_enabled is False


@pytest.mark.parametrize("env", [{}, {"SGLANG_DSV4_FP4_FUSED_TOPK": "true"}, {"SGLANG_DSV4_FP4_FUSED_TOPK": "1"},
                                 {"SGLANG_DSV4_FP4_FUSED_TOPK": "ON"}, {"SGLANG_DSV4_FP4_FUSED_TOPK": " yes"}])
def test_kill_switch_unset_or_true_enables(env, caplog):
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert envs.SGLANG_DSV4_FP4_FUSED_TOPK.get(env) is True
    assert not caplog.records


@pytest.mark.parametrize("raw", ["maybe", "disable", "n", "2", "truee", "enable", "", "  "])
def test_kill_switch_unreadable_value_fails_safe(raw, caplog):
    """A kill switch fails safe: a value it cannot read turns the fused path off (the proven
    path, SGLang's own inside SGLang), with one warning naming the variable and the value."""
    env = {"SGLANG_DSV4_FP4_FUSED_TOPK": raw, "TRITON_INTERPRET": "1"}
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert envs.SGLANG_DSV4_FP4_FUSED_TOPK.get(env) is False
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "SGLANG_DSV4_FP4_FUSED_TOPK" in message and repr(raw) in message and "off" in message
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="indexer_topk"):
        p = PathPolicy(probe_environment(env), logger=logging.getLogger("indexer_topk.test"))
    assert p.probe.fused_enabled is False
    # the path line only: the value was warned about above (once a process), and the line says why
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert p.route(layout="sglang_fp8", capturing=False) == "legacy"
    assert f"SGLANG_DSV4_FP4_FUSED_TOPK={raw!r} is not a recognised value" in p.reason



def test_an_unreadable_value_warns_once_a_process(caplog):
    """Flags read on every call (the replay's, the launches', the logits budget) would repeat
    their warning per call: each variable and value warns once; another value warns again."""
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        for _ in range(3):
            assert envs.INDEXER_TOPK_REPLAY.get({"INDEXER_TOPK_REPLAY": "maybe"}) is False
            assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get({"INDEXER_TOPK_LOGITS_BUDGET_MB": "lots"}) > 0
        assert len(caplog.records) == 2
        envs.INDEXER_TOPK_REPLAY.get({"INDEXER_TOPK_REPLAY": "perhaps"})
    assert len(caplog.records) == 3 and "'perhaps'" in caplog.records[-1].getMessage()

@pytest.mark.parametrize("raw", ["", " \t"])
def test_fail_safe_switch_set_but_empty_is_unreadable(raw, caplog):
    """Set but empty (``SGLANG_DSV4_FP4_FUSED_TOPK= cmd``) says nothing a switch can read: it
    means the fail-safe value, with the warning, not the default that turns the path on."""
    for field in (envs.SGLANG_DSV4_FP4_FUSED_TOPK, envs.INDEXER_TOPK_HOPPER_STREAM):
        assert field.invalid is False and field.default_value() is True
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="indexer_topk"):
            assert field.get({field.name: raw}) is False
        [record] = caplog.records
        assert field.name in record.getMessage() and repr(raw) in record.getMessage()
        assert not field.readable({field.name: raw})
        assert field.get({}) is True and field.readable({})
    # A field without a fail-safe value still reads empty as unset, silently.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert envs.INDEXER_TOPK_TRITON_ROCM.get({"INDEXER_TOPK_TRITON_ROCM": raw}) is False
        assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get({"INDEXER_TOPK_LOGITS_BUDGET_MB": raw}) == 2048
    assert not caplog.records


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
        "INDEXER_TOPK_FUSED_PREFILL": False,
        "INDEXER_TOPK_FUSED_DECODE": False,
        "INDEXER_TOPK_HOPPER_STREAM": True,
        "INDEXER_TOPK_REPLAY": True,
        "INDEXER_TOPK_DRIVER_LAUNCH": True,
        "INDEXER_TOPK_PDL": True,
        "INDEXER_TOPK_SCORED_GATE": True,
        "INDEXER_TOPK_ROUTES": None,
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
