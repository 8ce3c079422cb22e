#!/usr/bin/env bash
# One device call for the changes not yet measured on a GPU (benchmark/results/NOTES.md, section
# "A tolerance from the terms a score is summed from", and its next steps), each step under its
# own time limit, logs under $OUT:
#   1. the GPU test of rows whose heads cancel (the tolerance from a score's terms on the MMAs);
#   2. research/waves_ab.py: legacy's score spans in whole waves against the shipped spans;
#   3. research/ncu_decode.sh: Nsight Compute on legacy's decode step at 1 x 128K.
#
#   bash benchmark/research/device_round.sh        (at most 530 s: 150 + 200 + 180)
set -u
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
OUT=${OUT:-/tmp/device_round}
export OUT
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
stamp() { echo "[$(date +%T)] $*"; }
stamp "1 cancelling rows"
timeout -k 10 "${TEST_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider test/test_compare.py > "$OUT/gpu_tests_compare.log" 2>&1
stamp "1 rc $? ($(tail -1 "$OUT/gpu_tests_compare.log"))"
stamp "2 whole waves"
timeout -k 10 "${WAVES_S:-200}" python3 benchmark/research/waves_ab.py --out "$OUT/waves_ab.json" > "$OUT/waves_ab.log" 2>&1
stamp "2 rc $?"
stamp "3 ncu decode"
SHAPES=${NCU_SHAPES:-1x128K} timeout -k 10 "${NCU_ALL_S:-180}" bash benchmark/research/ncu_decode.sh \
  > "$OUT/ncu_decode.log" 2>&1
stamp "3 rc $?"
grep -E "passed|failed|Error" "$OUT/gpu_tests_compare.log" | tail -3
grep -E "^\|" "$OUT/waves_ab.log"
grep -E "^==|_kernel|Duration" "$OUT/ncu_decode.log" | head -24
