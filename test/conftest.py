"""Test setup: without a GPU, Triton kernels run under the interpreter.

``TRITON_INTERPRET`` must be set before any kernel module imports triton, so it is set here,
at collection time. GPU-only tests carry the ``gpu`` marker and are skipped without a device.
"""

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_GPU else "cpu"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (marker gpu); run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def leaves_no_fake_installed():
    """After every test (and its monkeypatches), no fake AITER installation is left behind
    (see test/fake_aiter)."""
    yield
    import fake_aiter

    assert fake_aiter.leftovers() == []
