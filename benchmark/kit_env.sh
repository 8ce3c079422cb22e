# Sourced by the device-session scripts that time SGLang's path beside ours (mix_session.sh,
# research/row_select.sh, research/split_round.sh), with KIT (the SGLang CUDA anchor kit's
# folder) and OUT set: the environment its builds and our kernels run in, stamp (a line with the
# seconds since the session's start), Triton's cache seeded from .carry/tcache.tgz, an earlier
# session's build unpacked from KIT_BUILD_TGZ, and start_kit_build, which builds
# DeepGEMM (unless importable) and topk_v2 in the background (about three minutes on an H200),
# sets BUILD to its process, copies a failed build's log to $OUT and, with KIT_BUILD_OUT=1,
# packs the build as $OUT/kit_build.tgz for the next session.
T0=${T0:-$(date +%s)}  # the session's start, for stamp's elapsed seconds
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONPATH=${PYTHONPATH:-python} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} CC=/usr/bin/gcc CXX=/usr/bin/g++
export PATH=$CUDA_HOME/bin:$PATH DG_SITE=/tmp/dgsite DG_JIT_CACHE_DIR=/tmp/dg_jit DG_SKIP_LARGE=1 PYTHON=python3
export DG_LOG=/tmp/deepgemm_build.log MAX_JOBS=8  # $OUT keeps few files: the build logs stay unless a build fails
mkdir -p "$TRITON_CACHE_DIR"
[ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
if [ -n "${KIT_BUILD_TGZ:-}" ] && [ -f "$KIT_BUILD_TGZ" ]; then
  tar xzf "$KIT_BUILD_TGZ" -C /tmp && echo "kit build unpacked from $KIT_BUILD_TGZ"
fi

start_kit_build() {
  ( if ! { [ -f /tmp/dgsite/dg_env.sh ] && ( source /tmp/dgsite/dg_env.sh && python3 -c 'import deep_gemm' ) 2>/dev/null; }; then
      bash "$KIT/build_and_test.sh" > /tmp/deepgemm_build.out 2>&1 || cp /tmp/deepgemm_build.out "$DG_LOG" "$OUT/"
    fi
    python3 "$KIT/sglang_topk_v2/bench_topk_v2.py" --shapes 8x196608 --topk 1024 > /tmp/topk_v2_build.log 2>&1 ||
      cp /tmp/topk_v2_build.log "$OUT/"
    [ -n "${KIT_BUILD_OUT:-}" ] && tar czf "$OUT/kit_build.tgz" -C /tmp dgsite dg_jit sgl_topk_v2_build ) &
  BUILD=$!
}

# The compile pass of a whole uncached mix, a process for each ';'-separated group of shapes
# (serving_mix.py --shapes: label substrings), so that the kernel classes compile side by side
# on the host's cores; a shape in two groups only compiles twice. WARM_GROUPS: other groups.
WARM_GROUPS_MIX="prefill 128 x,prefill 1024 x 16K,prefill 1024 x 64K,prefill 8192 x 16K,prefill 8192 x 64K"
WARM_GROUPS_MIX+=";prefill 1024 x 256K,prefill 1024 x 768K,prefill 8192 x 256K,prefill 8192 x 768K"
WARM_GROUPS_MIX+=";decode 1 x,decode 8 x,decode 32 x;decode 64 x,decode 256 x;mxfp4;topk 512"

# compile_pass LIMIT_S: serving_mix.py once over the shapes (MIX_ARGS) with one call each, so that
# Triton compiles our kernels before anything is timed; with groups (WARM_GROUPS, or
# WARM_GROUPS_MIX for a whole mix when no Triton cache is carried) a process per group, side by
# side. Its log is $OUT/warm.log.
compile_pass() {
  local limit=$1 groups=${WARM_GROUPS:-} i group pids=()
  if [ -z "$groups" ] && [ ! -f .carry/tcache.tgz ] && [[ " ${MIX_ARGS:-} " != *" --shapes "* ]]; then
    groups=$WARM_GROUPS_MIX
  fi
  IFS=';' read -ra group <<< "$groups"
  [ ${#group[@]} -eq 0 ] && group=("")  # one process over MIX_ARGS's shapes
  stamp "compile pass, ${#group[@]} process(es): ${groups:-the shapes of MIX_ARGS}"
  for i in "${!group[@]}"; do
    # shellcheck disable=SC2086
    timeout "$limit" python3 benchmark/serving_mix.py --iters 1 --host-calls 1 --candidates fused,legacy \
      --out "/tmp/warm_$i.json" ${MIX_ARGS:-} ${group[$i]:+--shapes "${group[$i]}"} > "/tmp/warm_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!group[@]}"; do
    wait "${pids[$i]}"
    echo "== ${group[$i]:-MIX_ARGS}: rc $?"
    tail -12 "/tmp/warm_$i.log"
  done > "$OUT/warm.log"  # one file: a call brings back few
  stamp "compile pass done ($(grep -c ': rc 0$' "$OUT/warm.log") of ${#group[@]} finished)"
}
