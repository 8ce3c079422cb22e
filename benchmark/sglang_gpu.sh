#!/usr/bin/env bash
# SGLang 0.5.23's own DSv4 indexer on the GPU, with our plugin loaded through its entry point and
# without it (test/sglang_doubles/run_cuda.py), in two processes: the routes the policy ships
# (arm "default") and our kernels forced onto every call they can serve (arm "ours").
#
#   bash benchmark/sglang_gpu.sh KIT SGLANG_TGZ [MSGSPEC_WHEEL]
#
# KIT: the SGLang CUDA anchor kit, already built (DeepGEMM in /tmp/dgsite, topk_v2 in its
# default build folder; benchmark/mix_session.sh builds both). SGLANG_TGZ: the Python sources of
# the sglang 0.5.23 wheel (as test/sglang_fetch.py unpacks them). MSGSPEC_WHEEL: msgspec for
# this Python, where it is not installed. Under $OUT (default /tmp/sglang_gpu): one JSON per
# arm and both arms' logs in sglang_gpu.log. Exit status 0 when both arms give identical selections in every case.
set -u -o pipefail
OUT=${OUT:-/tmp/sglang_gpu}
mkdir -p "$OUT"
: > "$OUT/sglang_gpu.log"
KIT=$(cd "${1:?usage: sglang_gpu.sh KIT SGLANG_TGZ [MSGSPEC_WHEEL]}" && pwd)
TGZ=${2:?usage: sglang_gpu.sh KIT SGLANG_TGZ [MSGSPEC_WHEEL]}
SRC=/tmp/sglang-src/sglang-0.5.23
mkdir -p "$SRC" /tmp/sglang-ep
tar xzf "$TGZ" -C "$SRC"
PATHS=("$SRC")
if [ -n "${3:-}" ] && ! python3 -c 'import msgspec' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sglang-src/msgspec "$3" && PATHS+=(/tmp/sglang-src/msgspec)
fi
# shellcheck disable=SC1091
[ -f /tmp/dgsite/dg_env.sh ] && source /tmp/dgsite/dg_env.sh
export PYTHONPATH=$PWD/python:$PWD/test:/tmp/sglang-ep${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
RC=0
for ARM in default ours; do
  if [ "$ARM" = ours ]; then
    export INDEXER_TOPK_FUSED_PREFILL=1 INDEXER_TOPK_FUSED_DECODE=1
  else
    unset INDEXER_TOPK_FUSED_PREFILL INDEXER_TOPK_FUSED_DECODE
  fi
  timeout "${ARM_S:-240}" python3 -m sglang_doubles.run_cuda "${PATHS[@]}" --kit "$KIT" --entry-point /tmp/sglang-ep \
    --commit "${COMMIT:-unknown}" --out "$OUT/sglang_gpu_$ARM.json" ${RUN_CUDA_ARGS:-} > "/tmp/sglang_gpu_$ARM.log" 2>&1
  rc=$?
  { echo "===== arm $ARM (rc $rc)"; cat "/tmp/sglang_gpu_$ARM.log"; } >> "$OUT/sglang_gpu.log"
  echo "arm $ARM rc $rc"
  [ "$rc" = 0 ] || { RC=1; tail -25 "/tmp/sglang_gpu_$ARM.log"; }
  grep -E "^SGLANG_GPU" "/tmp/sglang_gpu_$ARM.log" | sed "s/^/$ARM /"
done
exit $RC
