#!/usr/bin/env bash
# One device call: the split select's finish shared by parts (in the package since fbfd3ff; the
# change was measured from benchmark/results/split_parts/finish_parts.diff, removed at its
# landing) against the package without it. BEFORE is a directory holding the package without it
# (python/ and the scripts split_decode.py imports, as in finish_ab.sh: dfb760c's, say). The
# build before on the serving mix's decode bytes, then this checkout under several settings in
# one process (split_decode.py --configs: parts a row, the gate's warps; bits compared with the
# shipped settings' outputs), then the split select's GPU tests.
#
#   git archive dfb760c python benchmark/research benchmark/decode_bench.py | tar -x -C .carry/before
#   BEFORE=.carry/before bash benchmark/research/parts_ab.sh          (logs under $OUT)
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"
SHAPES=${SHAPES:-1x128K,1x768K,8x768K,32x768K,64x128K}
CONFIGS=${CONFIGS:-"SPLIT_FINISH_PARTS=1;SPLIT_FINISH_PARTS=4;SPLIT_FINISH_PARTS=16;SPLIT_GATE_WARPS=8;SPLIT_GATE_WARPS=4"}
if [ -n "${BEFORE:-}" ]; then
  BUILDS="before=$BEFORE" TIMES_ONLY=1 SEED=0 PAD=0 SHAPES=$SHAPES AB_S=${AB_S:-110} bash benchmark/research/finish_ab.sh
fi
timeout ${NOW_S:-240} python3 benchmark/research/split_decode.py --shapes $SHAPES --seed 0 --page-table-pad 0 \
  --iters 20 --registers --configs "$CONFIGS" --out $OUT/parts_now.json > $OUT/parts_now.log 2>&1
echo "== now rc $?"; grep -E "^random|regs" $OUT/parts_now.log | tail -40
timeout ${TESTS_S:-200} python3 -m pytest -m gpu -q test/test_split_topk.py \
  -k "${TESTS:-(equals_torch_way_gpu and scores) or candidates_past_the_registers_gpu or ties_at_the_kth_key_gpu}" \
  > $OUT/gpu_tests_parts.log 2>&1
echo "== tests rc $?"; tail -4 $OUT/gpu_tests_parts.log
