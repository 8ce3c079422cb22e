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
# the fused kernel opted in for prefill (INDEXER_TOPK_FUSED_PREFILL=1): it then serves FP8 in SGLang
H200_FUSED = Probe(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), triton_version="3.x",
                   fused_prefill=True)
MI355X_AITER = Probe(device="hip", device_name="AMD Instinct MI355X", gfx_arch="gfx950", triton_version="3.x",
                     aiter_symbol=True)


class CountingPolicy:
    """Delegates to a real policy and counts the routes it returns."""

    def __init__(self, probe: Probe):
        self.inner = PathPolicy(probe)
        self.routes = Counter()
        self.warmed = []

    def __getattr__(self, name):  # everything not counted below is the real policy's
        return getattr(self.inner, name)

    @property
    def probe(self):
        return self.inner.probe

    @property
    def fused_backend(self):
        return self.inner.fused_backend

    @property
    def reason(self):
        return self.inner.reason

    @property
    def decode_backend(self):
        return self.inner.decode_backend

    def route(self, **kwargs) -> str:
        name = self.inner.route(**kwargs)
        self.routes[name] += 1
        return name

    def engine_route(self, *, engine_path: bool, **kwargs):
        """The real answer; a call's question (it names the forward mode) is counted under the
        route it stands on (``route``'s name), the warm-up's questions are not."""
        if "forward_mode" in kwargs:
            self.routes[self.inner.route(**kwargs)] += 1
        return self.inner.engine_route(engine_path=engine_path, **kwargs)

    def warm_up(self, layout, topk: int, device=None) -> float:
        """Recorded, not run: no kernel compiles here."""
        self.warmed.append((str(layout), topk))
        return 0.0
