#!/usr/bin/env bash
# One device call: the legacy select stage's ways at prefill chunk sizes, side by side on the
# same key matrices (row_select.py, CUDA-graph replays, bits compared): the way legacy_select
# picks (`auto`), the row select and the split select in each of SPLIT_CONFIGS; then the GPU
# tests named in TESTS, and SGLang's topk_v2 on the same scores once the anchor kit is built.
#
#   bash benchmark/research/select_way.sh KIT
#
# SHAPES (rows x keys a row; keys = context tokens / 4), SPLIT_CONFIGS (WARPS:PROGRAMS_PER_SM),
# GRID_S, TESTS, TESTS_S; KIT_BUILD_OUT=1 packs the kit's build as $OUT/kit_build.tgz and
# TCACHE_OUT=1 Triton's cache as $OUT/tcache.tgz, for the next call (KIT_BUILD_TGZ, .carry/).
set -u -o pipefail
export OUT=${OUT:-/tmp/select_way}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: select_way.sh KIT}" && pwd)
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
start_kit_build
SHAPES=${SHAPES:-128x4096,128x16384,128x65536,128x196608,256x16384,256x65536,512x16384,512x65536,1024x4096,1024x16384,1024x65536,2048x16384,8192x16384}
timeout "${GRID_S:-200}" python3 benchmark/research/row_select.py --ways auto,rows,split \
  --split-configs "${SPLIT_CONFIGS:-16:4,8:4}" --shapes "$SHAPES" --patterns random,increasing \
  --json "$OUT/select_way.json" > "$OUT/select_way.log" 2>&1
stamp "select ways rc $?"
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider -rf $TESTS > "$OUT/gpu_tests.log" 2>&1
  stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
fi
wait "$BUILD"
stamp "SGLang's kernels built"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
timeout 100 python3 benchmark/research/row_select.py --ways auto --shapes "$SHAPES" --patterns random \
  --sglang-kit "$KIT" --json "$OUT/select_way_topk_v2.json" > "$OUT/select_way_topk_v2.log" 2>&1
stamp "beside topk_v2 rc $?"
[ -n "${TCACHE_OUT:-}" ] && tar czf "$OUT/tcache.tgz" -C "$TRITON_CACHE_DIR" .
ls -la "$OUT"
grep -E "passed|failed|FAILED" "$OUT/gpu_tests.log" 2>/dev/null | tail -8
sed -n '/^ms per call/,$p' "$OUT/select_way_topk_v2.log"
sed -n '/^ms per call/,$p' "$OUT/select_way.log"
