#!/usr/bin/env bash
# One device session for the serving mix beside SGLang's path, logs and JSON under $OUT.
#
#   COMMIT=<rev> bash benchmark/mix_session.sh KIT
#
# KIT: the SGLang CUDA anchor kit. DeepGEMM and topk_v2 are built from it in the background
# (about three minutes on an H200) while the GPU tests named in TESTS run, or else a short pass
# over the mix compiles our kernels (TRITON_CACHE_DIR, seeded from .carry/tcache.tgz when
# present); then SGLang's NaN handling is checked and the mix runs beside SGLang's path.
# MIX_ARGS adds serving_mix.py options (--retune: the run's routes table, auto timed under it).
# SGLANG_TGZ (the sglang 0.5.23 wheel's Python sources, packed) also runs SGLang's own indexer
# code with and without our plugin (benchmark/sglang_gpu.sh; MSGSPEC_WHEEL for its msgspec).
# KIT_BUILD_TGZ: a tarball of an earlier session's built kit (DeepGEMM's site, its kernel cache
# and topk_v2's build), used instead of building; KIT_BUILD_OUT=1 writes this session's there.
# WARM_CMD: shell code run in this script's shell after the tests, while the kit still builds (its
# exports reach the mix). NO_MIX=1 skips the NaN check and the mix; TCACHE_OUT=1 writes Triton's
# cache to $OUT/tcache.tgz at the end (carry it as .carry/tcache.tgz to skip the compiles next time).
# Without a carried cache the compile pass defaults to 150 s. In one process the whole mix did
# not fit one device call (fbfd3ff: 28 of 33 shapes in 475 s), so a whole mix's compile pass now
# runs a process per group of shapes, side by side (compile_pass in kit_env.sh: WARM_GROUPS_MIX,
# or WARM_GROUPS); at 358479e the two halves of the mix timed in 122 s (decode) and 77 s
# (prefill) after a 150 s pass each. If it still runs out, run two calls of one session,
# MIX_ARGS="--retune --shapes prefill" then "--retune --shapes decode", joined by
# mix_reroute.py.
set -u -o pipefail
export OUT=${OUT:-/tmp/mix_out}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: mix_session.sh KIT}" && pwd)
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
start_kit_build
if [ -n "${TESTS:-}" ]; then  # the GPU tests (they compile most of the mix's kernels too)
  stamp "GPU tests: $TESTS"
  # shellcheck disable=SC2086
  timeout "${WARM_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
  stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
else
  warm=45
  if [ ! -f .carry/tcache.tgz ]; then
    warm=150
    stamp "no Triton cache carried (.carry/tcache.tgz): our kernels compile in this pass and the mix"
  fi
  compile_pass "${WARM_S:-$warm}"
fi
if [ -n "${WARM_CMD:-}" ]; then
  stamp "WARM_CMD: $WARM_CMD"
  eval "$WARM_CMD"
  stamp "WARM_CMD rc $?"
fi
wait "$BUILD"
stamp "SGLang's kernels built"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
if [ -n "${SGLANG_TGZ:-}" ]; then
  bash benchmark/sglang_gpu.sh "$KIT" "$SGLANG_TGZ" ${MSGSPEC_WHEEL:-} > "$OUT/sglang_gpu.out" 2>&1
  stamp "SGLang's own indexer rc $?"
fi
if [ -z "${NO_MIX:-}" ]; then
  timeout 60 python3 benchmark/research/sglang_nan.py "$KIT" > "$OUT/sglang_nan.log" 2>&1
  stamp "NaN check rc $?"
  # named for the card it ran on ({gpu}), whichever kind the call asked for
  timeout "${MIX_S:-400}" python3 benchmark/serving_mix.py --sglang-kit "$KIT" --commit "${COMMIT:-unknown}" \
    --out "$OUT/serving_mix_{gpu}.json" ${MIX_ARGS:-} > "$OUT/serving_mix.log" 2>&1
  stamp "mix rc $?"
fi
[ -n "${TCACHE_OUT:-}" ] && tar czf "$OUT/tcache.tgz" -C "$TRITON_CACHE_DIR" . && ls -la "$OUT"
grep -E "passed|failed" "$OUT/gpu_tests.log" 2>/dev/null | tail -3
cat "$OUT/sglang_gpu.out" 2>/dev/null
if [ -z "${NO_MIX:-}" ]; then
  cat "$OUT/sglang_nan.log"; grep -E "^retuned" "$OUT/serving_mix.log"; grep -E "^\||geometric" "$OUT/serving_mix.log" | tail -40
fi
