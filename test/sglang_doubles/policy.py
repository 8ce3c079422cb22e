"""The package's real path policy, counted, and the probes of the GPUs a test pretends to run on.

:class:`CountingPolicy` wraps a real :class:`indexer_topk.policy.PathPolicy` built from a
chosen :class:`indexer_topk.policy.Probe` (say, an H200 or a gfx950 with AITER's kernel), so
every routing rule -- prefill vs decode, capture, the kill switch, layout -- is the real one;
it counts the routes it gives. The backend a route names is served by ``"reference"`` at the
operator (see ``test_sglang_plugin.served``), because our Triton kernels would run under the
interpreter here and AITER is absent.
"""

from __future__ import annotations

from collections import Counter

from indexer_topk.policy import PathPolicy, Probe

H200 = Probe(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), triton_version="3.x")
MI355X_AITER = Probe(device="hip", device_name="AMD Instinct MI355X", gfx_arch="gfx950", triton_version="3.x",
                     aiter_symbol=True)


class CountingPolicy:
    """Delegates to a real policy and counts the routes it returns."""

    def __init__(self, probe: Probe):
        self.inner = PathPolicy(probe)
        self.routes = Counter()

    @property
    def probe(self):
        return self.inner.probe

    @property
    def fused_backend(self):
        return self.inner.fused_backend

    @property
    def reason(self):
        return self.inner.reason

    def route(self, **kwargs) -> str:
        name = self.inner.route(**kwargs)
        self.routes[name] += 1
        return name
