#!/usr/bin/env bash
# One device session for the serving mix beside SGLang's path, logs and JSON under $OUT.
#
#   COMMIT=<rev> bash benchmark/mix_session.sh KIT
#
# KIT: the SGLang CUDA anchor kit. DeepGEMM and topk_v2 are built from it in the background
# (about three minutes on an H200) while the GPU tests named in TESTS run, or else a short pass
# over the mix compiles our kernels (TRITON_CACHE_DIR, seeded from .carry/tcache.tgz when
# present); then SGLang's NaN handling is checked and the mix runs beside SGLang's path.
# MIX_ARGS adds serving_mix.py options (--retune: the run's routes table, auto timed under it).
set -u -o pipefail
OUT=${OUT:-/tmp/mix_out}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: mix_session.sh KIT}" && pwd)
export PYTHONPATH=${PYTHONPATH:-python} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} CC=/usr/bin/gcc CXX=/usr/bin/g++
export PATH=$CUDA_HOME/bin:$PATH DG_SITE=/tmp/dgsite DG_JIT_CACHE_DIR=/tmp/dg_jit DG_SKIP_LARGE=1 PYTHON=python3
export DG_LOG=$OUT/deepgemm_build.log MAX_JOBS=8
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p "$TRITON_CACHE_DIR"
[ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
( bash "$KIT/build_and_test.sh" > "$OUT/deepgemm_build.out" 2>&1
  python3 "$KIT/sglang_topk_v2/bench_topk_v2.py" --shapes 8x196608 --topk 1024 > "$OUT/topk_v2_build.log" 2>&1 ) &
BUILD=$!
if [ -n "${TESTS:-}" ]; then  # the GPU tests (they compile most of the mix's kernels too)
  stamp "GPU tests: $TESTS"
  # shellcheck disable=SC2086
  timeout "${WARM_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
  stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
else
  stamp "compile pass"
  timeout "${WARM_S:-200}" python3 benchmark/serving_mix.py --iters 1 --host-calls 1 --candidates fused,legacy \
    --out /tmp/warm.json ${MIX_ARGS:-} > "$OUT/warm.log" 2>&1
  stamp "compile pass rc $?"
fi
wait "$BUILD"
stamp "SGLang's kernels built"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
timeout 60 python3 benchmark/research/sglang_nan.py "$KIT" > "$OUT/sglang_nan.log" 2>&1
stamp "NaN check rc $?"
timeout "${MIX_S:-400}" python3 benchmark/serving_mix.py --sglang-kit "$KIT" --commit "${COMMIT:-unknown}" \
  --out "$OUT/serving_mix_nvidia-h200.json" ${MIX_ARGS:-} > "$OUT/serving_mix.log" 2>&1
stamp "mix rc $?"
grep -E "passed|failed" "$OUT/gpu_tests.log" 2>/dev/null | tail -3
cat "$OUT/sglang_nan.log"; grep -E "^retuned" "$OUT/serving_mix.log"; grep -E "^\||geometric" "$OUT/serving_mix.log" | tail -40
