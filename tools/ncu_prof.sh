#!/usr/bin/env bash
# Nsight Compute on one launch (the third call) of each case of a driver script: where a kernel spends its time
# (bytes in flight, stalls, occupancy, issue), clocks left alone; each report as text under $OUT, its key lines
# printed.  Used by tools/ncu_s21.sh and tools/ncu_s23.sh.
#   OUT=$OUT bash tools/ncu_prof.sh DRIVER.py CASE:KERNEL-REGEX [CASE:KERNEL-REGEX ...]
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section InstructionStats"
driver=$1; shift
for spec in "$@"; do
  c=${spec%%:*}; k=${spec#*:}
  timeout ${NCU_TIME:-90} ncu --clock-control none $S -k "regex:$k" --launch-skip 2 --launch-count 1 python3 $driver $c > $OUT/$c.txt 2>&1
  echo "== $c rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Issued Ipc|Executed Instructions  |Block Limit|L2 Hit|Stall" $OUT/$c.txt | head -24
done
