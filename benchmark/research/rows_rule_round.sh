#!/usr/bin/env bash
# One device call after a mix (its Triton cache carried as .carry/tcache.tgz), each step under a
# limit of its own and all of them under TOTAL_S; logs under $OUT, a short table last:
# 1. where the row select's 32-bit sort starts paying, and whether the split select beats the
#    row select at a few hundred rows of 4,096-16,384 keys (decode 256 x 32K is such a shape);
# 2. the gate ahead of the score kernel below 768K, where the short sample now serves it
#    (split_decode.py on the mix's bytes: the shipped step against SCORED_GATE_MIN_WIDTH=0,
#    with 16 and 8 gate warps);
# 3. the GPU tests the mix does not run, while time is left.
#
#   bash benchmark/research/rows_rule_round.sh
#
# SHAPES / CONFIGS: row_select.py's --shapes and --configs; GATE_SHAPES: split_decode.py's.
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR" "$OUT"
[ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
SHAPES=${SHAPES:-256x4096,512x4096,768x4096,256x8192,512x16384}
CONFIGS=${CONFIGS:-4096:8:2:128:64,4096:8:2:128:32}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"

timeout "${ROWS_S:-200}" python3 benchmark/research/row_select.py --shapes "$SHAPES" --patterns random,increasing \
  --ways rows,split --configs "$CONFIGS" --json "$OUT/row_select.json" > "$OUT/row_select.log" 2>&1
echo "== row select rc $? at ${SECONDS}s"

G="SCORED_GATE_MIN_WIDTH=0"
timeout "${GATE_S:-150}" python3 benchmark/research/split_decode.py --shapes "${GATE_SHAPES:-1x128K,8x128K,1x256K,8x256K,32x256K}" \
  --seed 0 --page-table-pad 0 --iters 20 --configs "$G;$G,SCORED_GATE_WARPS=8" --out "$OUT/gate_ahead.json" \
  > "$OUT/gate_ahead.log" 2>&1
echo "== gate ahead rc $? at ${SECONDS}s"

TOTAL_S=${TOTAL_S:-560}
run_tests() {  # NAME LIMIT_S ARGS...: one group of GPU tests, its log $OUT/tests_NAME.log
  local name=$1 limit=$2 left=$((TOTAL_S - SECONDS))
  shift 2
  [ "$left" -lt 30 ] && { echo "== tests $name: not run, ${left}s left"; return; }
  [ "$left" -lt "$limit" ] && limit=$left
  timeout "$limit" python3 -m pytest -m gpu -q -p no:cacheprovider -rf "$@" > "$OUT/tests_$name.log" 2>&1
  echo "== tests $name rc $? at ${SECONDS}s: $(tail -1 "$OUT/tests_$name.log")"
}
run_tests capture "${TEST_S:-120}" test/test_graph_capture.py test/test_replay.py test/test_workspaces.py
run_tests rows "${TEST_S:-120}" test/test_row_topk.py
run_tests gate "${TEST_S:-120}" test/test_scored_gate.py
run_tests split "${TEST_S:-120}" test/test_split_topk.py -k "not equals_torch_way"

echo "== table"
sed -n '/^pattern /,$p' "$OUT/gate_ahead.log"
sed -n '/^ms per call/,$p' "$OUT/row_select.log"; tail -3 "$OUT/row_select.log"
exit 0
