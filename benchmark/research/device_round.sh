#!/usr/bin/env bash
# One device call for what cc28fb2 changed without a GPU (benchmark/results/NOTES.md, section
# "The device round at dfb760c, the parts, the mix at fbfd3ff", and its next steps), each step
# under its own time limit:
#   1. research/finish_ab.sh: the split finish's bounds (this checkout) against fbfd3ff's package
#      (BEFORE), graph-replayed decode steps on the serving mix's bytes, digests compared;
#   2. research/ncu_decode.sh: Nsight Compute on legacy's decode step at 1 x 128K and 8 x 768K,
#      the finishing kernel's stalls by source line;
#   3. the split select's GPU tests that cover the parts (equal bits on scores, candidates past
#      the registers, ties at the k-th key).
# A call brings back at most eight files: the logs are packed into $OUT/round.tgz, and the
# summary printed last is also $OUT/round_summary.txt.
#
#   git archive fbfd3ff python benchmark/research benchmark/decode_bench.py | tar -x -C .carry/before
#   BEFORE=.carry/before bash benchmark/research/device_round.sh        (at most 550 s: 2 x 100 + 150 + 200)
set -u
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
OUT=${OUT:-/tmp/device_round}
export OUT
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
: "${BEFORE:?set BEFORE to the package before the change (see above)}"
LOGS=$(mktemp -d)
stamp() { echo "[$(date +%T)] $*"; }
{
  stamp "1 bounds: before=$BEFORE now=."
  OUT=$LOGS BUILDS="before=$BEFORE now=." TIMES_ONLY=1 SEED=0 PAD=0 SHAPES=${SHAPES:-1x128K,1x768K,8x768K,32x768K,64x128K} \
    AB_S=${AB_S:-100} bash benchmark/research/finish_ab.sh
  stamp "2 ncu decode"
  OUT=$LOGS SHAPES=${NCU_SHAPES:-"1x128K 8x768K"} NCU_S=${NCU_S:-35} timeout -k 10 "${NCU_ALL_S:-150}" \
    bash benchmark/research/ncu_decode.sh > "$LOGS/ncu_decode.log" 2>&1
  stamp "2 rc $?"
  grep -E "^==|_kernel \(|Duration|warp-stall samples" "$LOGS/ncu_decode.log" | head -30
  stamp "3 split select GPU tests"
  timeout -k 10 "${TESTS_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider test/test_split_topk.py \
    -k "${TESTS:-(equals_torch_way_gpu and scores) or candidates_past_the_registers_gpu or ties_at_the_kth_key_gpu}" \
    > "$LOGS/gpu_tests_split.log" 2>&1
  stamp "3 rc $? ($(tail -1 "$LOGS/gpu_tests_split.log"))"
} 2>&1 | tee "$LOGS/round_summary.txt"
cp "$LOGS/round_summary.txt" "$OUT/"
tar czf "$OUT/round.tgz" -C "$LOGS" .
