#!/usr/bin/env bash
# One device call: the select stage's ways side by side (row_select.py), the GPU tests named in
# TESTS while the anchor kit builds (in the background, or unpacked from KIT_BUILD_TGZ), then
# SGLang's topk_v2 on the same scores. Logs under $OUT; KIT_BUILD_OUT=1 / TCACHE_OUT=1 keep the
# kit's build and Triton's cache for the next call.
#
#   [SHAPES=128x65536,...] [TESTS="test/..."] bash benchmark/research/row_select.sh KIT [row_select.py options for the sweep]
#
# SHAPES (rows x keys a row) feeds both passes; SGLANG_WAYS / SGLANG_CONFIGS the second one's
# ways (`auto`: the one legacy_select picks per shape); SWEEP_S, TESTS_S, SGLANG_S their time.
set -u -o pipefail
export OUT=${OUT:-/tmp/row_select_out}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: row_select.sh KIT}" && pwd); shift
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
start_kit_build
shapes=()
[ -n "${SHAPES:-}" ] && shapes=(--shapes "$SHAPES")
timeout "${SWEEP_S:-300}" python3 benchmark/research/row_select.py --json "$OUT/row_select.json" "${shapes[@]}" "$@" \
  > "$OUT/row_select.log" 2>&1
stamp "sweep rc $?"
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider -rf $TESTS > "$OUT/gpu_tests.log" 2>&1
  stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
fi
wait "$BUILD"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
timeout "${SGLANG_S:-150}" python3 benchmark/research/row_select.py --sglang-kit "$KIT" --ways "${SGLANG_WAYS:-rows}" \
  --configs "${SGLANG_CONFIGS:-4096:8:2:128}" --patterns random "${shapes[@]}" --json "$OUT/row_select_sglang.json" \
  > "$OUT/row_select_sglang.log" 2>&1
stamp "beside topk_v2 rc $?"
[ -n "${TCACHE_OUT:-}" ] && tar czf "$OUT/tcache.tgz" -C "$TRITON_CACHE_DIR" .
grep -E "passed|failed|FAILED" "$OUT/gpu_tests.log" 2>/dev/null | tail -8
tail -30 "$OUT/row_select.log"; tail -16 "$OUT/row_select_sglang.log"
