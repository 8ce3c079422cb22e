#!/usr/bin/env bash
# One device call: the row select's selection ordered by bins (kernels/bins.py, ROWS_ORDER_BINS)
# against tl.sort's network (ROWS_ORDER_BINS=0) and 2,048 bins, on the select stage alone
# (row_select.py: graph replays, bits against the torch way's) at prefill-chunk and decode
# widths, then on whole decode steps of 256 rows (split_decode.py, where the row select
# serves), then the row select's GPU tests. Logs under $OUT, a table last.
#
#   bash benchmark/research/rows_order_round.sh
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
R="4096:8:2:128"
timeout 200 python3 benchmark/research/row_select.py --ways rows,torch --configs "$R:4096,$R:0,$R:2048" \
  --shapes 128x4096,1024x4096,8192x4096,256x8192,1024x16384,256x32768,1024x65536 --patterns random,increasing \
  --iters 20 --json "$OUT/row_select.json" > "$OUT/row_select.log" 2>&1
echo "== row_select rc $? at ${SECONDS}s"
timeout 130 python3 benchmark/research/split_decode.py --seed 0 --page-table-pad 0 --iters 50 \
  --shapes 256x32K,256x128K --configs "ROWS_ORDER_BINS=0" --out "$OUT/decode.json" > "$OUT/decode.log" 2>&1
echo "== decode rc $? at ${SECONDS}s"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider test/test_row_topk.py > "$OUT/gpu_tests.log" 2>&1
echo "== gpu tests rc $? at ${SECONDS}s"
echo "== table"
sed -n '/^ms per call/,$p' "$OUT/row_select.log"
sed -n '/^pattern /,$p' "$OUT/decode.log"
tail -n 3 "$OUT/gpu_tests.log"
exit 0
