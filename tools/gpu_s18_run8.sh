#!/usr/bin/env bash
# Session 18, device call 8: the group-norm stash's lean kernel text (helper GN16C: bitwise cuda tests, A/B) and
# batch norm with the L2 prefetch on by default (its cuda tests, the kernel table's batch-norm rows on the three
# large size sets, PyTorch beside).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_run8.sh
# (ran at 762cb10; the "lean" setting became the only text afterwards -- bee2f0f -- so drop it to re-run)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-120} CTIME=${CTIME:-150} TAIL=${TAIL:-80}
export PARTS="tests/backend/test_norm_s18_gn16c.py;;tests/backend/test_bn_kernels.py;;tests/backend/test_bn_s18_unroll.py"
export CMDS="python3 tools/norm_s17_ab.py --rows big,ragged --dtypes bfloat16,float16 --ln '' --rounds 3 --settings stash,stash2,lean;;\
python3 bench/kernels_gpu.py --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph --only bn"
exec bash tools/gpu_s9_parts.sh
