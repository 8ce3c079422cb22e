#!/usr/bin/env bash
# One device call for the signature's guard: host time per call before it and with it, on one
# GPU host in one call, then the replay and capture GPU tests.
#
#   BEFORE=.carry/before bash benchmark/research/guard_round.sh
#
# BEFORE: a tree of the package before the guard (`git archive 5b77830 python benchmark/research`
# unpacked there). host_breakdown.py runs in that tree and in this one in turn (before, now, now,
# before; the first run also compiles the cases' kernels), each run timing the out operator and the
# Python API alternately; then `pytest -m gpu` on the replay and capture tests. Logs under $OUT.
set -u -o pipefail
export OUT=${OUT:-/tmp/guard_out} PYTHONPATH=python
mkdir -p "$OUT"
BEFORE=${BEFORE:?a tree of the package before the guard}
CASES=${CASES:-sglang_fp8:128:16K:auto,sglang_fp8:1024:16K:auto}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
n=0
for t in before now now before; do
  n=$((n + 1))
  d=.
  [ "$t" = before ] && d=$BEFORE
  limit=70
  [ "$n" = 1 ] && limit=${COMPILE_S:-150}
  (cd "$d" && timeout "$limit" python3 benchmark/research/host_breakdown.py --cases "$CASES") \
    > "$OUT/host_${n}_$t.log" 2>&1
  stamp "host_breakdown $t rc $?"
done
TESTS=${TESTS:-test/test_replay.py test/test_graph_capture.py}
# shellcheck disable=SC2086
timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
for f in "$OUT"/host_*.log; do echo "== $(basename "$f")"; grep -vE "^ *$" "$f" | tail -6; done
