#!/usr/bin/env bash
# Session 25, run 6 (the closing device call): bn_cluster's and norm_gncl's partials exchanged by remote stores (as
# softmax_cluster's since run 3) -- their cuda tests (and the cluster softmax's after the header change); norm_gncl
# bitwise against the remote-load build it replaced (tools/gncl_exchange_ab.py, with the old module at $GNCL_OLD);
# and the kernel table's batch norm / group norm rows at HEAD and at the tree before (../.snap_old: 012dd2b), beside
# PyTorch.
# (On the device, commands 3 and 5 failed: gpu_s9_parts runs `timeout CMD`, which takes no subshell; run 7 timed
# the old tree from the command line instead -- bench/kernels_gpu.py in each tree, alternated.)
#   From clean archives of HEAD (.snap) and 012dd2b (.snap_old):  OUT=$OUT GNCL_OLD=... bash tools/gpu_s25_run6.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-110} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_bn_cluster.py;;\
tests/backend/test_bn_dx_nhwc.py tests/backend/test_bn_twin.py tests/backend/test_twin_nhwc.py tests/nn/test_twin_nhwc_cuda.py;;\
tests/backend/test_norm_s17_gncl.py tests/backend/test_norm_s18_gn16.py tests/backend/test_norm_s18_gn16b.py tests/backend/test_softmax_cluster.py"
K="python3 bench/kernels_gpu.py --timing graph"
export CMDS="python3 tools/gncl_exchange_ab.py $GNCL_OLD 2>&1 | grep -v -i warn | tail -40;;\
$K --only bn --sizes large,large2 --dtypes float32,bfloat16 2>&1 | grep -E 'bn |batch norm|kernel' | cut -c1-150;;\
(cd ../.snap_old && $K --only bn --sizes large,large2 --dtypes float32,bfloat16 2>&1 | grep -E 'bn |batch norm|kernel' | cut -c1-150);;\
$K --only gn --sizes large2 --dtypes float32 2>&1 | grep -E 'group norm|kernel' | cut -c1-150;;\
(cd ../.snap_old && $K --only gn --sizes large2 --dtypes float32 2>&1 | grep -E 'group norm|kernel' | cut -c1-150)"
exec bash tools/gpu_s9_parts.sh
