#!/usr/bin/env bash
# One device call: the decode settings that wait on a device, each an A/B against the shipped
# step in one process (split_decode.py: graph replays on the serving mix's bytes, device time per
# kernel, digests), in order of what they decide; logs under $OUT, a table last.
#
# Every step's kernels are compiled first, side by side (one process a step, --iters 1, one
# shared Triton cache), so that no timed step spends its limit compiling: in the round at
# ce98b63, run without that pass, three of six steps ran out of their limits while compiling.
#
# 1. The gate's sample, the finish's 8 warps and the gate ahead's 8 warps, at 1 and 8 requests of
#    128K and 768K: SPLIT_SAMPLE_SHORT=None samples 2,048 keys at every width (at 128K the
#    shipped step samples 1,024 since 86ccdf6, split_sample), SPLIT_SAMPLE=1024 samples 1,024 at
#    768K too. (At 8ba92ca, before the rule, this step compared SPLIT_SAMPLE=1024 and 512 against
#    2,048 everywhere: benchmark/results/scored_gate/decode_ab_8ba92ca_h100/.)
# 2. The one-row span floor of 512 (shipped: 256) at 8 x 128K.
# The first step is run twice, in two processes: one replay of a 25 us step reads up to 8 us apart
# between configs of one process while the kernels' device times agree to 0.1 us.
#
#   bash benchmark/research/decode_ab_round.sh                  (logs under $OUT)
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"; [ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
SD="python3 benchmark/research/split_decode.py --seed 0 --page-table-pad 0"

STEPS=(
  "sample|--shapes 1x128K,8x128K,1x768K,8x768K --configs SPLIT_SAMPLE_SHORT=None;SPLIT_SAMPLE=1024;SPLIT_WARPS=8;SCORED_GATE_WARPS=8"
  "span|--shapes 8x128K --configs SCORE_MIN_SPAN_ONE_ROW=512"
)

pids=()
for s in "${STEPS[@]}"; do  # the compile pass: every config's kernels, side by side
  name=${s%%|*}; args=${s#*|}
  # shellcheck disable=SC2086
  timeout 200 $SD --iters 1 ${args% --configs *} --configs "${args#* --configs }" --out "/tmp/warm_$name.json" \
    > "/tmp/warm_$name.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "== compile pass done at ${SECONDS}s"

for run in 1 2; do  # the second run repeats the first step only (a call's 600 s)
  for s in "${STEPS[@]}"; do
    name=${s%%|*}; args=${s#*|}
    [ "$run" = 2 ] && [ "$s" != "${STEPS[0]}" ] && continue
    # shellcheck disable=SC2086
    timeout 90 $SD --iters 50 ${args% --configs *} --configs "${args#* --configs }" --out "/tmp/${name}_$run.json" \
      > "$OUT/${name}_$run.log" 2>&1  # logs only: a call brings back 8 files
    echo "== $name run $run rc $? at ${SECONDS}s"
  done
done

echo "== table (graph ms and kernels, each step's two runs)"
for s in "${STEPS[@]}"; do
  name=${s%%|*}
  for run in 1 2; do
    [ -f "$OUT/${name}_$run.log" ] && { echo "-- $name run $run"; sed -n '/^pattern /,$p' "$OUT/${name}_$run.log"; }
  done
done
exit 0
