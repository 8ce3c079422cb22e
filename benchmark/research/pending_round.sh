#!/usr/bin/env bash
# One device call for the measurements that waited on a device, each under its own time limit,
# in order of what they decide; logs under $OUT, a short table last.
#
# 1. Topk 2048 at 8 x 768K, the shipped step (the gate ahead of the score kernel) against the
#    four kernels (INDEXER_TOPK_SCORED_GATE=0; split_decode.py: graph replays on the mix's bytes,
#    device time per kernel, digests).
# 2. The GPU tests of decode capture and of the gate ahead, the default decode step at 768K.
# 3. The host path (host_breakdown.py) in an earlier package's tree (HOST_BEFORE: this tree's
#    script copied there, so that both are timed one way; it puts its own tree's package first)
#    and in this one, each in its own process, back to back.
# 4. What a budgeted key matrix costs a captured decode step at 64 and 256 x 768K
#    (INDEXER_TOPK_LOGITS_BUDGET_MB), with whatever time is left of TOTAL_S.
#
#   HOST_BEFORE=.carry/host_before bash benchmark/research/pending_round.sh
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"
TOTAL_S=${TOTAL_S:-580}
HOST_CASES=${HOST_CASES:-sglang_fp8:128:16K:auto,sglang_fp8:1024:256K:auto}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt

timeout ${T2048_S:-150} python3 benchmark/research/split_decode.py --shapes 8x768K --topk 2048 --seed 0 \
  --page-table-pad 0 --iters 50 --configs "INDEXER_TOPK_SCORED_GATE=0" --out $OUT/topk2048.json > $OUT/topk2048.log 2>&1
echo "== topk 2048 rc $? at ${SECONDS}s"

timeout ${TESTS_S:-240} python3 -m pytest -m gpu -q -p no:cacheprovider test/test_graph_capture.py \
  test/test_scored_gate.py > $OUT/gpu_tests.log 2>&1
echo "== tests rc $? at ${SECONDS}s"; tail -3 $OUT/gpu_tests.log

if [ -n "${HOST_BEFORE:-}" ]; then
  cp benchmark/research/host_breakdown.py "$HOST_BEFORE/benchmark/research/host_breakdown.py"
  (cd "$HOST_BEFORE" && timeout ${HOST_S:-70} python3 benchmark/research/host_breakdown.py --cases $HOST_CASES) \
    > $OUT/host_before.log 2>&1
  echo "== host before rc $? at ${SECONDS}s"
fi
timeout ${HOST_S:-70} python3 benchmark/research/host_breakdown.py --cases $HOST_CASES > $OUT/host_after.log 2>&1
echo "== host rc $? at ${SECONDS}s"

LEFT=$((TOTAL_S - SECONDS))
if [ $LEFT -gt 60 ]; then
  timeout $LEFT python3 benchmark/research/split_decode.py --shapes 64x768K,256x768K --seed 0 --page-table-pad 0 \
    --iters 10 --configs "INDEXER_TOPK_LOGITS_BUDGET_MB=16;INDEXER_TOPK_LOGITS_BUDGET_MB=48" \
    --out $OUT/budget.json > $OUT/budget.log 2>&1
  echo "== budget rc $? at ${SECONDS}s"
fi

echo "== table"
sed -n '/^pattern /,$p' $OUT/topk2048.log
for f in host_before host_after; do [ -f $OUT/$f.log ] && { echo "-- $f"; grep -v "^ *$" $OUT/$f.log | tail -6; }; done
[ -f $OUT/budget.log ] && sed -n '/^pattern /,$p' $OUT/budget.log
exit 0
