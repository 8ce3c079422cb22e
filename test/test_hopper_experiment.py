"""The Hopper experiment's host side (benchmark/hopper_stream.py), which a CPU can check: its
kernel is Gluon for sm_90 and runs only on the device (``benchmark/hopper_probe.py``)."""

import inspect
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import hopper_probe  # noqa: E402
import hopper_stream  # noqa: E402


def test_every_build_names_real_arguments():
    # a misspelt knob would be swallowed by nothing (the call would raise on the device, minutes in)
    params = inspect.signature(hopper_stream.hopper_indexer_topk).parameters
    for name, kw in hopper_probe.BUILDS.items():
        unknown = sorted(set(kw) - set(params))
        assert not unknown, f"build {name}: {unknown}"


@pytest.mark.parametrize("groups, regs", [(2, 128), (3, 96)])
def test_launch_registers_fit_the_register_file(groups, regs):
    # 128 threads per warpgroup: selection, loader (padded to a warpgroup) and the score groups
    threads = 128 * (2 + groups)
    assert hopper_stream._launch_regs(groups) == regs
    assert regs % 8 == 0 and regs * threads <= 65536 < (regs + 8) * threads


@pytest.mark.parametrize("groups, stages", [(3, 4), (2, 3), (2, 0), (3, 5)])
def test_key_stages_must_return_to_one_warpgroup(groups, stages):
    # a stage shared by two warpgroups lets one pass its parity wait on the other's phase; the
    # check comes before any input is looked at
    with pytest.raises(ValueError, match="key_stages"):
        hopper_stream.hopper_indexer_topk(None, score_groups=groups, key_stages=stages)


def test_score_groups_outside_the_built_kernels_are_refused():
    with pytest.raises(ValueError, match="score_groups"):
        hopper_stream.hopper_indexer_topk(None, score_groups=4)


def test_profile_table_reports_shares_and_skips_absent_partitions():
    # a third row, as for an SM the grid did not use, must not dilute the means
    prof = torch.zeros(3, 5, 8, dtype=torch.int64)
    prof[:2, 0, :5] = torch.tensor([1000, 400, 200, 100, 3])  # selection: all, waits, cuts, ends, cuts
    prof[:2, 2, :5] = torch.tensor([1000, 50, 500, 100, 100])  # score 0
    prof[0, 2, 2] = 300  # programs are averaged: (300 + 500) / 2 = 400 cycles in the MMA
    table = hopper_stream.profile_table(prof).splitlines()
    assert len(table) == 2  # the loader and the other score groups recorded nothing
    assert table[0].startswith("select") and "wait tiles  40.0%" in table[0] and "cuts 3.0" in table[0]
    assert table[1].startswith("score 0") and "mma  40.0%" in table[1]
