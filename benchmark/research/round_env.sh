# Sourced by the one-call device rounds: the package from the working tree, Triton's cache kept on
# the machine between calls, the GPU's name and clock in $OUT/gpu.txt, and the round's clock:
# `left` (seconds of TOTAL_S, 560 by default, still to go) and `limit S` (a step's limit S, cut to
# what is left).
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR" "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
TOTAL_S=${TOTAL_S:-560}
left() { echo $((TOTAL_S - SECONDS)); }
limit() {
  local l; l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}
# decode_run NAME LIMIT_S ARGS...: one split_decode.py run on the serving mix's bytes (seed 0, no
# spare page-table columns) under LIMIT_S cut to what is left, its records in $OUT/NAME.json and
# its output in $OUT/NAME.log; not run with under 40 s left
decode_run() {
  local name=$1 lim; lim=$(limit "$2"); shift 2
  [ "$lim" -lt 40 ] && { echo "== $name: not run, ${lim}s left"; return; }
  timeout "$lim" python3 benchmark/research/split_decode.py --seed 0 --page-table-pad 0 --out "$OUT/$name.json" \
    "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc $? at ${SECONDS}s"
}
