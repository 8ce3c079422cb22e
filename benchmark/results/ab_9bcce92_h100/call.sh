#!/usr/bin/env bash
# A/B: row select (base 10adefd vs new: unordered pool from 32K/64K), split decode (base/new/alt,
# SCORED_GATE_STRIDED=1), split select prefill shapes (new vs alt: exclusive_sum in the gathering's
# dense blocks and the trim). Logs packed to $OUT/callA.tgz, tables last.
set -u
export TRITON_CACHE_DIR=/tmp/tcache
T0=$(date +%s); L=/tmp/callA; mkdir -p $L
cap() { local l=$(( 575 - ($(date +%s) - T0) )); [ $l -lt $1 ] && echo $l || echo $1; }
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
pp() { case $1 in base) echo .carry/base/python ;; alt) echo .carry/alt/python ;; *) echo python ;; esac; }
RSH=1024x16384,1024x32768,1024x65536
RCF=4096:8:2:128:pos:b32,4096:8:2:128:pos:b32:s32768,4096:8:2:128:pos:b32:s65536
DSH=1x128K,8x128K,8x768K,64x128K,256x32K,32x768Kx2
SSH=128x65536,128x196608,64x65536
rows() { PYTHONPATH=$(pp $1) timeout $(cap 140) python3 benchmark/research/row_select.py --ways rows --shapes $RSH --configs $RCF \
  --patterns random,increasing --iters $3 --json $L/rows_$1_$2.json > $L/rows_$1_$2.log 2>&1; stamp "rows $1 $2 rc $?"; }
dec() { PYTHONPATH=$(pp $1) timeout $(cap 140) python3 benchmark/research/split_decode.py --shapes $DSH --configs "SCORED_GATE_STRIDED=1;SCORED_GATE_WARPS=8" \
  --iters $3 --out $L/decode_$1_$2.json > $L/decode_$1_$2.log 2>&1; stamp "decode $1 $2 rc $?"; }
spl() { PYTHONPATH=$(pp $1) timeout $(cap 90) python3 benchmark/research/row_select.py --ways split --split-configs 16:4 --shapes $SSH \
  --patterns random,increasing --iters $3 --json $L/split_$1_$2.json > $L/split_$1_$2.log 2>&1; stamp "split $1 $2 rc $?"; }
PYTHONPATH=python timeout 170 python3 benchmark/research/score_rows.py --shapes 1024x16K,8192x16K,1024x64K,8192x64K \
  --tiles 2:4:3,4:8:3,4:4:3,2:8:3,2:4:4,4:8:4 --iters 20 --json $L/score_rows.json > $L/score_rows.log 2>&1; stamp "score_rows rc $?"
(PYTHONPATH=python timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu test/test_legacy.py -k gpu_wide > $L/gpu_wide.log 2>&1; stamp "gpu_wide rc $? $(tail -1 $L/gpu_wide.log)") &
(rows base warm 1) & (rows new warm 1) & (dec base warm 1; ) & (dec new warm 1; spl new warm 1) & (dec alt warm 1; spl alt warm 1) &
wait
left() { echo $(( 540 - ($(date +%s) - T0) )); }
for run in 1 2; do
  for s in base new; do [ $(left) -gt 60 ] && rows $s $run 30; done
  for s in base new alt; do [ $(left) -gt 60 ] && dec $s $run 30; done
  for s in new alt; do [ $(left) -gt 40 ] && spl $s $run 30; done
done
tar czf $OUT/callA.tgz -C $L .
for f in $L/rows_*_[12].log $L/decode_*_[12].log $L/split_*_[12].log; do echo "== $(basename $f)"; grep -v "^\s*$" $f | tail -n 14 | cut -c1-160; done
echo "== score_rows"; cat $L/score_rows.log
