# Sourced by the one-call A/B rounds (rows_ab.sh, score_ab.sh) once they have set SIDES, side_path
# (a side's package folder), LOGS and OUT: the round's clock, the split select's decode step as a
# step, the round's order of steps, and the GPU tests in what is left of the call. A step is a
# function STEP SIDE LABEL ITERS that writes its logs under LOGS.
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

# ab_decode SIDE LABEL ITERS: split_decode.py on DECODE_SHAPES ("" skips it) with DECODE_CONFIGS
# and DECODE_ARGS (more of its options), under DECODE_S (100) seconds
ab_decode() {
  [ -z "$DECODE_SHAPES" ] && return
  # shellcheck disable=SC2086
  PYTHONPATH=$(side_path "$1") timeout "${DECODE_S:-100}" python3 benchmark/research/split_decode.py ${DECODE_ARGS:-} \
    --shapes "$DECODE_SHAPES" --configs "${DECODE_CONFIGS:-}" --iters "$3" --out "$LOGS/decode_$1_$2.json" \
    > "$LOGS/decode_$1_$2.log" 2>&1
  stamp "decode $1 $2 rc $?"
}

# ab_rounds STEP...: every side's steps at once, one iteration each (the compiles; those timings,
# of processes sharing the GPU, are not used), then two runs that take each step over the sides in
# turn, 30 iterations a timing
ab_rounds() {
  local side run step
  for side in $SIDES; do (for step in "$@"; do "$step" "$side" warm 1; done) & done
  wait
  for run in 1 2; do
    for step in "$@"; do
      for side in $SIDES; do "$step" "$side" "$run" 30; done
    done
  done
}

# ab_tests PYTEST_ARGS...: pytest on TESTS (this checkout's package) in what is left of TOTAL_S
# (540) seconds, its log $OUT/gpu_tests.log; nothing without TESTS
ab_tests() {
  [ -z "${TESTS:-}" ] && return
  local left=$(( ${TOTAL_S:-540} - ($(date +%s) - T0) ))
  if [ "$left" -le 30 ]; then  # (timeout 0 would mean none)
    stamp "GPU tests not run: ${left}s left of TOTAL_S"
    return
  fi
  stamp "GPU tests, ${left}s: $TESTS"
  # shellcheck disable=SC2086
  PYTHONPATH=python timeout "$left" python3 -m pytest -q -p no:cacheprovider "$@" $TESTS > "$OUT/gpu_tests.log" 2>&1
  stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
}
