"""The fields every benchmark and stress record carries about the machine and the versions."""

from __future__ import annotations

import datetime as _dt
import re

import torch

from ..versions import source_revision, triton_version

ENV_KEYS = ("gpu", "device", "torch_version", "triton_version", "indexer_topk_version", "source_revision", "timestamp")


def device_name(device) -> str:
    """The GPU's name (``"NVIDIA H200"``), or ``"cpu"``."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def gpu_slug(name: str) -> str:
    """File-name form of a device name: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "device"


def environment(device) -> dict:
    """The :data:`ENV_KEYS` fields, in that order: ``gpu``, ``device``, ``torch_version``,
    ``triton_version``, ``indexer_topk_version``, ``source_revision`` (git, when run from a
    checkout) and ``timestamp`` (UTC, ISO 8601)."""
    from .. import __version__

    return {
        "gpu": device_name(device),
        "device": str(torch.device(device)),
        "torch_version": torch.__version__,
        "triton_version": triton_version(),
        "indexer_topk_version": __version__,
        "source_revision": source_revision(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


__all__ = ["ENV_KEYS", "device_name", "environment", "gpu_slug"]
