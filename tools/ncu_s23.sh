#!/usr/bin/env bash
# The rows session 23 left under 70% of copy in Nsight Compute (tools/ncu_s23.py): where the channels-last batch-norm
# kernels and the many-class spatial cross-entropy's bfloat16 forward spend their time (stalls, bytes in flight,
# occupancy, issue).  One launch each (the third call), clocks left alone; reports as text under $OUT.  ~2 min on a
# fresh H200 (not yet run: session 23 had no device time left).   OUT=$OUT bash tools/ncu_s23.sh
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section InstructionStats"
prof() {  # case kernel-regex
  timeout 90 ncu --clock-control none $S -k "regex:$2" --launch-skip 2 --launch-count 1 python3 tools/ncu_s23.py $1 > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Issued Ipc|Executed Instructions  |Block Limit|L2 Hit|Stall" $OUT/$1.txt | head -24
}
prof bncl_bwd bnc_bwd1
prof bncl_fwd bnc_fwd1
prof ce171_bf16 ce_sp_fwd
prof ce150_bf16 ce_sp_fwd
