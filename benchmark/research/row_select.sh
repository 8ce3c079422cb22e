#!/usr/bin/env bash
# One device call: the select stage's ways side by side (row_select.py), then beside SGLang's
# topk_v2 once the anchor kit is built (in the background meanwhile, or unpacked from
# KIT_BUILD_TGZ). Logs under $OUT; KIT_BUILD_OUT=1 / TCACHE_OUT=1 keep the kit's build and
# Triton's cache for the next call.
#
#   bash benchmark/research/row_select.sh KIT [row_select.py options for the sweep]
set -u -o pipefail
export OUT=${OUT:-/tmp/row_select_out}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: row_select.sh KIT}" && pwd); shift
export PYTHONPATH=${PYTHONPATH:-python} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} CC=/usr/bin/gcc CXX=/usr/bin/g++
export PATH=$CUDA_HOME/bin:$PATH DG_SITE=/tmp/dgsite DG_JIT_CACHE_DIR=/tmp/dg_jit DG_SKIP_LARGE=1 PYTHON=python3
export DG_LOG=/tmp/deepgemm_build.log MAX_JOBS=8
mkdir -p "$TRITON_CACHE_DIR"
[ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
[ -n "${KIT_BUILD_TGZ:-}" ] && [ -f "$KIT_BUILD_TGZ" ] && tar xzf "$KIT_BUILD_TGZ" -C /tmp
( if ! { [ -f /tmp/dgsite/dg_env.sh ] && ( source /tmp/dgsite/dg_env.sh && python3 -c 'import deep_gemm' ) 2>/dev/null; }; then
    bash "$KIT/build_and_test.sh" > /tmp/deepgemm_build.out 2>&1 || cp /tmp/deepgemm_build.out "$OUT/"
  fi
  python3 "$KIT/sglang_topk_v2/bench_topk_v2.py" --shapes 8x196608 --topk 1024 > /tmp/topk_v2_build.log 2>&1 ||
    cp /tmp/topk_v2_build.log "$OUT/"
  [ -n "${KIT_BUILD_OUT:-}" ] && tar czf "$OUT/kit_build.tgz" -C /tmp dgsite dg_jit sgl_topk_v2_build ) &
BUILD=$!
timeout "${SWEEP_S:-300}" python3 benchmark/research/row_select.py --json "$OUT/row_select.json" "$@" > "$OUT/row_select.log" 2>&1
echo "sweep rc $?"
wait "$BUILD"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
timeout "${SGLANG_S:-150}" python3 benchmark/research/row_select.py --sglang-kit "$KIT" --ways "${SGLANG_WAYS:-rows}" \
  --configs "${SGLANG_CONFIGS:-4096:8:2:128}" --patterns random --json "$OUT/row_select_sglang.json" > "$OUT/row_select_sglang.log" 2>&1
echo "beside topk_v2 rc $?"
[ -n "${TCACHE_OUT:-}" ] && tar czf "$OUT/tcache.tgz" -C "$TRITON_CACHE_DIR" .
tail -30 "$OUT/row_select.log"; tail -12 "$OUT/row_select_sglang.log"
