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
