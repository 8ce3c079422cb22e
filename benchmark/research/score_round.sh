#!/usr/bin/env bash
# One device call on legacy's score kernel at prefill shapes (benchmark/results/NOTES.md, next
# step 0s), then GPU tests in what is left of TOTAL_S (560 s):
#   1. score_rows.py: the shipped tile, the chunk's rows longest first (`:r`), four stages, at the
#      mix's 16K and 64K prefill shapes, each key matrix against the shipped tile's;
#   2. the gate ahead's prefetch again (SCORED_GATE_PREFETCH=1; as fast or slower when timed before
#      the strided slots), on the mix's decode bytes;
#   3. ncu_score.sh at 8192 x 16K and 1024 x 16K: where the kernel's warps wait;
#   4. TESTS (default: the split select's, legacy's and the gate ahead's GPU tests).
#
#   bash benchmark/research/score_round.sh   (logs under $OUT, tables last; Nsight Compute's reports
#   packed as $OUT/ncu_score.tgz)
set -u
OUT=${OUT:-/tmp/score_round}
source benchmark/research/round_env.sh  # PYTHONPATH, TRITON_CACHE_DIR, left, limit
timeout "$(limit 200)" python3 benchmark/research/score_rows.py --shapes 1024x16K,8192x16K,1024x64K,8192x64K \
  --tiles 2:4:3,2:4:3:r,2:4:4,2:4:3 --iters 30 --json "$OUT/score_rows.json" > "$OUT/score_rows.log" 2>&1
echo "== score_rows rc $? at ${SECONDS}s"
decode_run gate_prefetch 120 --shapes 1x128K,8x128K,8x768K,64x128K --configs "SCORED_GATE_PREFETCH=1" --iters 30
NCU_S=$(limit 90) SHAPES="8192x16K 1024x16K" bash benchmark/research/ncu_score.sh > "$OUT/ncu_score.log" 2>&1
echo "== ncu_score rc $? at ${SECONDS}s"
TESTS=${TESTS:-"--deselect test/test_split_topk.py::test_split_equals_torch_way_gpu test/test_split_topk.py test/test_scored_gate.py test/test_legacy.py"}
if [ "$(left)" -gt 40 ]; then
  # shellcheck disable=SC2086
  timeout "$(limit 600)" python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
  echo "== GPU tests rc $? at ${SECONDS}s: $(tail -1 "$OUT/gpu_tests.log")"
fi
# a call brings back eight files: Nsight Compute's per-shape reports go back packed
tar czf "$OUT/ncu_score.tgz" -C "$OUT" $(cd "$OUT" && ls ncu_score_*.txt) && rm -f "$OUT"/ncu_score_*.txt
cat "$OUT/ncu_score.log"
grep -v "^\[" "$OUT/gate_prefetch.log" | tail -12
cat "$OUT/score_rows.log"
