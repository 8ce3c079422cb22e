# SGLang 0.5.23 (CUDA) with indexer-topk installed: its SGLang plugin serves DeepSeek-V4's
# C4 indexer top-k with the fused operator (see docs/sglang.md). Build from the repository root:
#
#   docker build -f docker/cuda.Dockerfile -t sglang-indexer-topk:cuda .
#
# SGLANG_IMAGE selects another official tag (e.g. the -cu130 or -runtime variant).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23
FROM ${SGLANG_IMAGE}

# Only what the package build reads; torch and triton come from the SGLang image.
WORKDIR /opt/indexer-topk
COPY pyproject.toml README.md LICENSE ./
COPY python ./python
RUN python3 -m pip install --no-cache-dir --no-deps . \
 && python3 -c "import importlib.metadata as m; \
assert any(ep.name == 'indexer_topk' for ep in m.entry_points(group='sglang.srt.plugins')), 'plugin entry point missing'; \
import indexer_topk.sglang_plugin"

WORKDIR /sgl-workspace
