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
