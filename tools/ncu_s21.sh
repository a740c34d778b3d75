#!/usr/bin/env bash
# Session 21's kernels under 70% of copy in Nsight Compute (tools/ncu_s21.py): where the spatial cross-entropy
# forward, the channel log-softmax forward and the cluster softmax forward spend their time (bytes in flight,
# stalls, occupancy, issue).  One launch each (the third call), clocks left alone; reports as text under $OUT.
# ~2 min on a fresh H200.   OUT=$OUT bash tools/ncu_s21.sh
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section InstructionStats"
prof() {  # case kernel-regex
  timeout 70 ncu --clock-control none $S -k "regex:$2" --launch-skip 2 --launch-count 1 python3 tools/ncu_s21.py $1 > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Issued Ipc|Executed Instructions  |Block Limit|L2 Hit|Stall" $OUT/$1.txt | head -24
}
prof ce_f32 ce_sp_fwd
prof ce_bf16 ce_sp_fwd
prof cols_softmax softmax_cols_fwd
prof cols_log softmax_cols_fwd
prof cluster_f32 smx_fwdc
