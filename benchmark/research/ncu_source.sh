# Sourced by the ncu_*.sh scripts: where one kernel launch's warps stall, by source line.
#
# SAMPLING: this ncu's option for a warp sample every 2^(5 + N) cycles at N = ${NCU_INTERVAL:-0}
# (--warp-sampling-interval in current releases, --sampling-interval before; empty where it has
# neither): a launch of 10-20 us on one SM took 14 samples at the default interval (dfb760c).
NCU_HELP=$(ncu --help 2>/dev/null)
SAMPLING=""
if grep -q -- "--warp-sampling-interval" <<< "$NCU_HELP"; then SAMPLING="--warp-sampling-interval ${NCU_INTERVAL:-0}"
elif grep -qE -- "(^|[[:space:]])--sampling-interval" <<< "$NCU_HELP"; then SAMPLING="--sampling-interval ${NCU_INTERVAL:-0}"; fi

# source_view KERNEL_REGEX SKIP REGIONS OUTFILE COMMAND...: profile launch SKIP + 1 of the
# kernels matching KERNEL_REGEX while COMMAND runs (warp states and source counters), then sum its
# warp samples by source line and by function of the kernel module REGIONS
# (research/ncu_source_summary.py) into OUTFILE; prints its head. Returns ncu's or the summary's
# status; the report and its CSV export are removed (KEEP_CSV=1: the export kept beside OUTFILE, gzipped).
source_view() {
  local regex=$1 skip=$2 regions=$3 outfile=$4 rc
  shift 4
  local rep="$OUT/source_view"
  # shellcheck disable=SC2086
  timeout -k 10 "${NCU_S:-90}" ncu --clock-control none -k "regex:$regex" --launch-skip "$skip" --launch-count 1 \
    $SAMPLING --section WarpStateStats --section SourceCounters --import-source yes -f -o "$rep" "$@" > /dev/null 2>&1 \
    && ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass > "$rep.csv" \
    && python3 benchmark/research/ncu_source_summary.py "$rep.csv" --regions "$regions" > "$outfile" \
    && head -40 "$outfile"
  rc=$?
  [ -n "${KEEP_CSV:-}" ] && [ -f "$rep.csv" ] && gzip -c "$rep.csv" > "${outfile%.txt}.csv.gz"
  rm -f "$rep.ncu-rep" "$rep.csv"
  return $rc
}

# summary_view KERNEL_REGEX SKIP OUTFILE COMMAND...: launch SKIP + 1 of the kernels matching
# KERNEL_REGEX while COMMAND runs, under the sections every ncu_*.sh reads (speed of light,
# occupancy, launch, warp states, instructions; NCU_SECTIONS adds more, e.g. "MemoryWorkloadAnalysis"),
# its report in OUTFILE; prints ncu's status and the report's key lines.
summary_view() {
  local regex=$1 skip=$2 outfile=$3 rc extra=() s
  shift 3
  for s in ${NCU_SECTIONS:-}; do extra+=(--section "$s"); done
  timeout -k 10 "${NCU_S:-90}" ncu --clock-control none -k "regex:$regex" --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats \
    ${extra[@]+"${extra[@]}"} "$@" > "$outfile" 2>&1
  rc=$?
  echo "== $(basename "$outfile") rc $rc"
  grep -E "Duration|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Local|Executed Instructions|Issue Slots Busy|Executed Ipc A" \
    "$outfile" | head -16
  return $rc
}
