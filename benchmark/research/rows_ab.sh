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
SIDES="base new${ALT:+ alt}"
side_path() { case $1 in base) echo "$BASE" ;; alt) echo "$ALT" ;; *) echo python ;; esac; }
source benchmark/research/ab_env.sh  # stamp, ab_decode, ab_rounds, ab_tests
rows() {  # side, label, iters
  PYTHONPATH=$(side_path "$1") timeout "${ROWS_S:-150}" python3 benchmark/research/row_select.py --ways rows \
    --shapes "$SHAPES" --configs "$CONFIGS" --patterns "$PATTERNS" --iters "$3" --json "$LOGS/rows_$1_$2.json" \
    > "$LOGS/rows_$1_$2.log" 2>&1
  stamp "rows $1 $2 rc $?"
}
ab_rounds rows ab_decode
ab_tests -n 8
tar czf "$OUT/rows_ab.tgz" -C "$LOGS" .
for f in "$LOGS"/rows_*_[12].log "$LOGS"/decode_*_[12].log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f")"
  grep -v "^\s*$" "$f" | tail -n "${TAIL:-10}" | cut -c1-150
done
