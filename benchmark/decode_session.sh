#!/usr/bin/env bash
# One device session for decode: the GPU decode tests, the per-kernel probe and the decode
# benchmark beside SGLang's own decode step, logs and JSON under $OUT (default /tmp/decode_out).
#
#   PYTHONPATH=python bash benchmark/decode_session.sh [KIT]
#
# KIT: the SGLang CUDA anchor kit (DeepGEMM sources and SGLang's topk_v2); when given, DeepGEMM
# is built from it first (about 80 s on an H200, in the background while the tests run) and
# decode_bench.py times SGLang's decode step beside ours. STEPS (default "tpb") picks the steps:
# p probe, t tests, b benchmark (run in that order). LAYOUTS (default all three) the benchmark's
# layouts; TESTS_K (default "decode") the GPU tests' -k expression, TESTS_TIMEOUT (default 240) their
# time limit in seconds.
set -u -o pipefail
OUT=${OUT:-/tmp/decode_out}
mkdir -p "$OUT"
KIT=${1:-}
STEPS=${STEPS:-tpb}
LAYOUTS=${LAYOUTS:-sglang_fp8,sglang_mxfp4,aiter_mxfp4}
SHAPES=${SHAPES:-8x768K,64x768K,256x128K,32x768Kx2}
TESTS_K=${TESTS_K:-decode}
export PYTHONPATH=${PYTHONPATH:-python}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

if [ -n "$KIT" ]; then
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} CC=/usr/bin/gcc CXX=/usr/bin/g++
  export PATH=$CUDA_HOME/bin:$PATH DG_SITE=/tmp/dgsite DG_JIT_CACHE_DIR=/tmp/dg_jit DG_SKIP_LARGE=1 PYTHON=python3
  export DG_LOG=$OUT/deepgemm_build.log MAX_JOBS=8
  ( bash "$KIT/build_and_test.sh" > "$OUT/deepgemm_build.out" 2>&1
    python3 "$KIT/sglang_topk_v2/bench_topk_v2.py" --shapes 8x196608 --topk 1024 > "$OUT/topk_v2_build.log" 2>&1
  ) &
  BUILD=$!
fi

if [[ $STEPS == *p* ]]; then
  stamp "probe"
  timeout 240 python3 benchmark/research/decode_probe.py --bits-layouts "" --variants legacy,fused_r1,plain_r1 \
    --out "$OUT/decode_probe.json" > "$OUT/decode_probe.log" 2>&1
  stamp "probe rc $?"
fi
if [[ $STEPS == *t* ]]; then  # before the benchmark: the tests run while DeepGEMM builds
  stamp "GPU tests -k '$TESTS_K'"
  timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -m gpu -q test/test_hopper_stream.py test/test_graph_capture.py test/test_fused.py \
    -k "$TESTS_K" > "$OUT/gpu_tests_decode.log" 2>&1
  stamp "tests rc $? ($(tail -1 "$OUT/gpu_tests_decode.log"))"
fi
if [[ $STEPS == *b* ]]; then
  SGL=()
  if [ -n "$KIT" ]; then
    wait "$BUILD"
    # shellcheck disable=SC1091
    [ -f /tmp/dgsite/dg_env.sh ] && source /tmp/dgsite/dg_env.sh && SGL=(--sglang-kit "$KIT")
  fi
  stamp "benchmark ${SGL[*]:-}"
  timeout 300 python3 benchmark/decode_bench.py --layouts "$LAYOUTS" --shapes "$SHAPES" --out-dir "$OUT" ${SGL[@]+"${SGL[@]}"} \
    > "$OUT/decode_bench.log" 2>&1
  stamp "benchmark rc $?"
fi
echo; grep -E "passed|failed" "$OUT/gpu_tests_decode.log" 2>/dev/null | tail -1
tail -12 "$OUT/decode_probe.log" 2>/dev/null
grep -E "^(layout|sglang|aiter)" "$OUT/decode_bench.log" 2>/dev/null
