#!/usr/bin/env bash
# Session 18: Nsight Compute on the kernels still under 70% of copy -- the 16-bit group-norm backward (gn_bwdp, and
# gn_bwds beside it) and the float32 NCHW batch norm (bn_fwd1 / bn_bwd1) on (32, 256, 56, 56); one launch each (the
# third call), clocks left alone.  Reports as text under $OUT.
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats"
prof() {  # name, kernel regex, env, arg
  env $3 timeout 150 ncu --clock-control none $S -k "regex:$2" --launch-skip 2 --launch-count 1 python3 tools/ncu_s18.py $4 > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Dynamic Shared|Warp Cycles Per Issued|No Eligible|One or More|Block Limit" $OUT/$1.txt | head -20
}
prof gn_bwdp "gn_bwdp" "" gn
prof gn_bwds "gn_bwds" "MINIDNN_GN_STASH16_BWD=1" gn
prof gn_fwds "gn_fwds" "" gn
prof bn_fwd1 "bn_fwd" "" bn
prof bn_bwd1 "bn_bwd" "" bn
