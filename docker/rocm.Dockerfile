# SGLang 0.5.23 (ROCm, MI350/MI355 gfx950) with indexer-topk installed: its SGLang plugin
# serves DeepSeek-V4's C4 indexer top-k with AITER's fused kernel when the image's AITER has
# it (see docs/sglang.md). Build from the repository root:
#
#   docker build -f docker/rocm.Dockerfile -t sglang-indexer-topk:rocm .
#
# To try an AITER commit that has flydsl_pa_mqa_topk_fp4_prefill, rebuild AITER at it:
#
#   docker build -f docker/rocm.Dockerfile --build-arg AITER_COMMIT_OVERRIDE=<sha> -t ... .
#
# SGLANG_IMAGE selects another official tag (e.g. a -mi30x one, with AITER_GPU_ARCHS=gfx942).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-rocm720-mi35x
FROM ${SGLANG_IMAGE}

ARG AITER_COMMIT_OVERRIDE=""
ARG AITER_REPO=https://github.com/ROCm/aiter.git
ARG AITER_GPU_ARCHS=gfx950

# Empty AITER_COMMIT_OVERRIDE keeps the image's AITER. Otherwise replace it with a JIT build
# of the commit, and fail here (not at serving time) if that commit lacks the fused kernel.
RUN if [ -n "${AITER_COMMIT_OVERRIDE}" ]; then \
      set -eux; \
      git clone "${AITER_REPO}" /opt/aiter-override; \
      cd /opt/aiter-override; \
      git checkout "${AITER_COMMIT_OVERRIDE}"; \
      git submodule sync; \
      git submodule update --init --recursive; \
      grep -rqw flydsl_pa_mqa_topk_fp4_prefill aiter/ops/flydsl \
        || { echo "AITER ${AITER_COMMIT_OVERRIDE} has no flydsl_pa_mqa_topk_fp4_prefill" >&2; exit 1; }; \
      python3 -m pip uninstall -y amd-aiter aiter || true; \
      GPU_ARCHS="${AITER_GPU_ARCHS}" PREBUILD_KERNELS=0 python3 setup.py develop; \
      cd /; \
      python3 -c "import importlib.util as u, sys; s = u.find_spec('aiter'); \
print('aiter from', s.origin); sys.exit(0 if s and s.origin.startswith('/opt/aiter-override') else 1)"; \
    fi

# Only what the package build reads; torch and triton come from the SGLang image.
WORKDIR /opt/indexer-topk
COPY pyproject.toml README.md LICENSE ./
COPY python ./python
RUN python3 -m pip install --no-cache-dir --no-deps . \
 && python3 -c "import importlib.metadata as m; \
assert any(ep.name == 'indexer_topk' for ep in m.entry_points(group='sglang.srt.plugins')), 'plugin entry point missing'; \
import indexer_topk.sglang_plugin"

WORKDIR /sgl-workspace
