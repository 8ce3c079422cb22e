#!/usr/bin/env bash
# One device call: the split select's trim (candidates past the finishing program's registers)
# against the code before it, on the serving mix's decode bytes (seed 0, no spare page-table
# columns) and on split_decode.py's own (seed 1), each build in its own process on the same GPU;
# then the split select's GPU tests. PREV: a checkout of the code before (its python/ and the
# scripts split_decode.py imports), e.g. `git archive <rev> python benchmark/research/decode_probe.py
# benchmark/decode_bench.py | tar -x -C .carry/prev` plus this checkout's split_decode.py.
#
#   PREV=.carry/prev bash benchmark/research/trim_ab.sh      (logs under $OUT)
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"; [ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
PREV=${PREV:-.carry/prev}
SHAPES=${SHAPES:-32x768K,64x768K,8x768K,1x768K}
for seed_pad in "0 0" "1 1"; do
  set -- $seed_pad
  for build in prev new; do
    script=benchmark/research/split_decode.py; [ $build = prev ] && script=$PREV/benchmark/research/split_decode.py
    timeout ${AB_S:-100} python3 $script --shapes $SHAPES --seed $1 --page-table-pad $2 --iters 20 \
      --out $OUT/trim_ab_${build}_s$1.json > $OUT/trim_ab_${build}_s$1.log 2>&1
    echo "== $build seed $1 pad $2 rc $?"; grep -E "^random" $OUT/trim_ab_${build}_s$1.log | tail -4
  done
done
timeout ${PROF_S:-60} python3 benchmark/research/split_decode.py --profile --shapes 32x768K --seed 0 --page-table-pad 0 2>&1 | tail -1
timeout ${TEST_S:-200} python3 -m pytest -q -m gpu test/test_split_topk.py -p no:cacheprovider \
  -k "${TESTS:-candidates_past_the_registers_gpu or (ties_at_the_kth_key_gpu and 1024)}" > $OUT/gpu_tests_trim.log 2>&1
echo "gpu tests rc $?"; tail -3 $OUT/gpu_tests_trim.log
