#!/usr/bin/env bash
# One device call: the select stage's ways side by side (row_select.py), then beside SGLang's
# topk_v2 once the anchor kit is built (in the background meanwhile, or unpacked from
# KIT_BUILD_TGZ). Logs under $OUT; KIT_BUILD_OUT=1 / TCACHE_OUT=1 keep the kit's build and
# Triton's cache for the next call.
#
#   bash benchmark/research/row_select.sh KIT [row_select.py options for the sweep]
set -u -o pipefail
export OUT=${OUT:-/tmp/row_select_out}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: row_select.sh KIT}" && pwd); shift
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
start_kit_build
timeout "${SWEEP_S:-300}" python3 benchmark/research/row_select.py --json "$OUT/row_select.json" "$@" > "$OUT/row_select.log" 2>&1
echo "sweep rc $?"
wait "$BUILD"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
timeout "${SGLANG_S:-150}" python3 benchmark/research/row_select.py --sglang-kit "$KIT" --ways "${SGLANG_WAYS:-rows}" \
  --configs "${SGLANG_CONFIGS:-4096:8:2:128}" --patterns random --json "$OUT/row_select_sglang.json" > "$OUT/row_select_sglang.log" 2>&1
echo "beside topk_v2 rc $?"
[ -n "${TCACHE_OUT:-}" ] && tar czf "$OUT/tcache.tgz" -C "$TRITON_CACHE_DIR" .
tail -30 "$OUT/row_select.log"; tail -12 "$OUT/row_select_sglang.log"
