#!/usr/bin/env bash
# One device call: the FP8 decode step with the gate ahead of the score kernel
# (INDEXER_TOPK_SCORED_GATE=1: the gate's sample scored from the cache, the score kernel
# gathering) against the shipped step, in
# one process on the serving mix's bytes (split_decode.py: graph replays, device time per kernel,
# output digests, bits against the shipped step; CONFIGS: other settings beside it). BEFORE
# (optional): a directory holding an earlier package (see finish_ab.sh), its step timed first on
# the same bytes in its own process. Then the GPU tests of the gate ahead and of the one-row
# score tile, and the Triton cache packed for a later call (TCACHE_OUT=1).
#
#   BEFORE=.carry/before bash benchmark/research/scored_gate_ab.sh          (logs under $OUT)
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"; [ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
SHAPES=${SHAPES:-1x128K,1x768K,8x128K,8x768K,32x128K,64x128K,64x768K}
if [ -n "${BEFORE:-}" ]; then
  BUILDS="before=$BEFORE" TIMES_ONLY=1 SEED=0 PAD=0 SHAPES=${BEFORE_SHAPES:-1x128K,8x128K,8x768K,64x128K} \
    AB_S=${BEFORE_S:-100} bash benchmark/research/finish_ab.sh > $OUT/before.txt 2>&1
  cat $OUT/before.txt
fi
timeout ${AB_S:-230} python3 benchmark/research/split_decode.py --shapes $SHAPES --seed 0 --page-table-pad 0 \
  --iters 20 --configs "${CONFIGS:-INDEXER_TOPK_SCORED_GATE=1}" \
  --out $OUT/scored_ab.json > $OUT/scored_ab.log 2>&1
echo "== the gate ahead against the shipped step, rc $?"
timeout ${TESTS_S:-170} python3 -m pytest -m gpu -q -p no:cacheprovider test/test_scored_gate.py \
  test/test_split_topk.py -k "${TESTS:-gate_ahead or one_row_tiles_give_the_same_bits_gpu}" \
  > $OUT/gpu_tests_scored.log 2>&1
echo "== tests rc $?"; tail -5 $OUT/gpu_tests_scored.log
[ -n "${TCACHE_OUT:-}" ] && tar czf $OUT/tcache.tgz -C "$TRITON_CACHE_DIR" . && ls -la $OUT/tcache.tgz
echo "== table"; sed -n '/^pattern /,$p' $OUT/scored_ab.log
