#!/usr/bin/env bash
# One device call after a mix (its Triton cache carried as .carry/tcache.tgz): where the row
# select's 32-bit sort starts paying, whether the split select beats the row select at a few
# hundred rows of 4,096-16,384 keys (decode 256 x 32K is such a shape), then the GPU tests the
# mix does not run, each under a limit of its own; logs under $OUT, a short table last.
#
#   bash benchmark/research/rows_rule_round.sh
#
# SHAPES / CONFIGS: row_select.py's --shapes and --configs; TEST_S: each test group's limit.
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR" "$OUT"
[ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
SHAPES=${SHAPES:-256x4096,512x4096,768x4096,256x8192,512x16384}
CONFIGS=${CONFIGS:-4096:8:2:128:64,4096:8:2:128:32}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"

timeout "${ROWS_S:-200}" python3 benchmark/research/row_select.py --shapes "$SHAPES" --patterns random,increasing \
  --ways rows,split --configs "$CONFIGS" --json "$OUT/row_select.json" > "$OUT/row_select.log" 2>&1
echo "== row select rc $? at ${SECONDS}s"

run_tests() {  # NAME LIMIT_S ARGS...: one group of GPU tests, its log $OUT/tests_NAME.log
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m pytest -m gpu -q -p no:cacheprovider -rf "$@" > "$OUT/tests_$name.log" 2>&1
  echo "== tests $name rc $? at ${SECONDS}s: $(tail -1 "$OUT/tests_$name.log")"
}
run_tests capture "${TEST_S:-120}" test/test_graph_capture.py test/test_replay.py test/test_workspaces.py
run_tests rows "${TEST_S:-120}" test/test_row_topk.py
run_tests gate "${TEST_S:-120}" test/test_scored_gate.py
run_tests split "${TEST_S:-120}" test/test_split_topk.py -k "not equals_torch_way"

echo "== table"
sed -n '/^ms per call/,$p' "$OUT/row_select.log"; tail -3 "$OUT/row_select.log"
exit 0
