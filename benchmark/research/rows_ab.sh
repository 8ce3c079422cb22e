#!/usr/bin/env bash
# One device call: the select kernels of an earlier package (BASE) against this checkout's, on
# one machine, with no anchor kit to build: the legacy select stage (row_select.py) and the
# split select's decode step (split_decode.py), each side timed twice, alternating, after both
# sides compiled their kernels side by side.
#
#   BASE=.carry/base/python bash benchmark/research/rows_ab.sh
#
# BASE: e.g. `git archive <commit> python | tar x -C .carry/base` gives .carry/base/python. ALT: a
# third package folder (a variant of the checkout), timed as the side "alt" beside the two.
# SHAPES, CONFIGS, PATTERNS: row_select.py's (default: the plugin's position order, 32 bins);
# DECODE_SHAPES, DECODE_CONFIGS: split_decode.py's --shapes ("" skips it) and --configs. TESTS: pytest arguments run after the timings
# (`-n 8`; the checkout's package), given what is left of TOTAL_S (default 540) seconds. Logs come
# back packed as $OUT/rows_ab.tgz, the tests' as $OUT/gpu_tests.log; the tables are printed last.
set -u -o pipefail
export OUT=${OUT:-/tmp/rows_ab}
mkdir -p "$OUT"
BASE=${BASE:?BASE: the earlier package folder}
SHAPES=${SHAPES:-1024x4096,8192x4096,1024x16384,1024x65536}
CONFIGS=${CONFIGS:-4096:8:2:128:pos:b32}
PATTERNS=${PATTERNS:-random,increasing}
DECODE_SHAPES=${DECODE_SHAPES-1x768K,8x768K,64x128K}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
LOGS=/tmp/rows_ab_logs
mkdir -p "$LOGS"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
SIDES="base new${ALT:+ alt}"
side_path() { case $1 in base) echo "$BASE" ;; alt) echo "$ALT" ;; *) echo python ;; esac; }
rows() {  # side, label, iters
  PYTHONPATH=$(side_path "$1") timeout "${ROWS_S:-150}" python3 benchmark/research/row_select.py --ways rows \
    --shapes "$SHAPES" --configs "$CONFIGS" --patterns "$PATTERNS" --iters "$3" --json "$LOGS/rows_$1_$2.json" \
    > "$LOGS/rows_$1_$2.log" 2>&1
  stamp "rows $1 $2 rc $?"
}
decode() {  # side, label, iters
  [ -z "$DECODE_SHAPES" ] && return
  PYTHONPATH=$(side_path "$1") timeout "${DECODE_S:-100}" python3 benchmark/research/split_decode.py \
    --shapes "$DECODE_SHAPES" --configs "${DECODE_CONFIGS:-}" --iters "$3" --out "$LOGS/decode_$1_$2.json" > "$LOGS/decode_$1_$2.log" 2>&1
  stamp "decode $1 $2 rc $?"
}
# compiles: both sides at once (their timings, of two processes sharing the GPU, are not used)
for side in $SIDES; do (rows "$side" warm 1; decode "$side" warm 1) & done
wait
for run in 1 2; do
  for side in $SIDES; do rows "$side" "$run" 30; done
  for side in $SIDES; do decode "$side" "$run" 30; done
done
if [ -n "${TESTS:-}" ]; then
  left=$(( ${TOTAL_S:-540} - ($(date +%s) - T0) ))
  if [ "$left" -gt 30 ]; then  # (timeout 0 would mean none)
    stamp "GPU tests, ${left}s: $TESTS"
    # shellcheck disable=SC2086
    PYTHONPATH=python timeout "$left" python3 -m pytest -q -n 8 -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
    stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
  else
    stamp "GPU tests skipped: ${left}s left of TOTAL_S"
  fi
fi
tar czf "$OUT/rows_ab.tgz" -C "$LOGS" .
for f in "$LOGS"/rows_*_[12].log "$LOGS"/decode_*_[12].log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f")"
  grep -v "^\s*$" "$f" | tail -n "${TAIL:-10}" | cut -c1-150
done
