#!/usr/bin/env bash
# Session 19: Nsight Compute on the log-softmax backward of long rows (slower than PyTorch off the table's shapes):
# bf16 (4096, 50257), bf16 (4096, 32000), and fp32 (4096, 32000) as the reference at 95% of copy; one launch each (the
# third call), clocks left alone.  Reports as text under $OUT.
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section InstructionStats"
prof() {  # name
  timeout 70 ncu --clock-control none $S -k "regex:softmax_rows_bwd" --launch-skip 2 --launch-count 1 python3 tools/ncu_s19.py $1 > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Dynamic Shared|Warp Cycles Per Issued|No Eligible|Issued Ipc|Executed Instructions  |Block Limit|L2 Hit|Stall" $OUT/$1.txt | head -24
}
prof bf16_50257
prof bf16_32000
prof fp32_32000
