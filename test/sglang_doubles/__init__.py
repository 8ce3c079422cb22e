"""Test doubles for running SGLang's released DSv4 indexer code on a machine without a GPU.

``environment.open_sglang`` imports SGLang's sources (fetched by ``sglang_fetch``) with
import-only stubs for absent third-party packages (``imports``) and reference-backed doubles
of the GPU kernels (``kernels``); ``scene.build_scene`` assembles one C4 indexer call on
SGLang's real classes; ``policy.CountingPolicy`` is the real path policy, counting its routes.
"""

from .environment import SGLang, open_sglang
from .kernels import Calls, Patcher
from .policy import H200, H200_FUSED, MI355X_AITER, CountingPolicy
from .scene import Scene, SceneSpec, build_scene, rows_differing, same_selection

__all__ = [
    "Calls",
    "CountingPolicy",
    "H200",
    "H200_FUSED",
    "MI355X_AITER",
    "Patcher",
    "SGLang",
    "Scene",
    "SceneSpec",
    "build_scene",
    "open_sglang",
    "rows_differing",
    "same_selection",
]
