"""indexer-topk: exact streaming score + top-k for DeepSeek-V4's sparse-attention indexer."""

from .api import BACKENDS, indexer_topk, resolve_backend, workspace_size
from .contract import (
    HEAD_DIM,
    HEADS,
    PAGE_SIZE,
    SUPPORTED_TOPK,
    IndexerTopKResult,
    Layout,
    allocate_result,
)
from .errors import BackendUnavailable
from . import ops  # registers torch.ops.indexer_topk.*  # noqa: E402,F401
from .workload import Workload, make_workload

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "HEAD_DIM",
    "HEADS",
    "PAGE_SIZE",
    "SUPPORTED_TOPK",
    "IndexerTopKResult",
    "Layout",
    "Workload",
    "allocate_result",
    "indexer_topk",
    "make_workload",
    "resolve_backend",
    "workspace_size",
    "__version__",
]
