#!/usr/bin/env bash
# Session 19's closing device call(s): the cuda tests of the softmax stash rule (BWD_STASH 3 -> 1's stash where BSA
# does not fit) and of the suite-time helper's test files, then the mixed-precision step figures; PART=2 runs the
# fp32 / TF32 training-step table instead.  PyTorch beside, same run.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s19_final.sh   |   PART=2 OUT=$OUT bash tools/gpu_s19_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-110} CTIME=${CTIME:-300} TAIL=${TAIL:-45}
if [ "${PART:-1}" = 2 ]; then     # (with the stash rows' cuda test again, after its plan assertion learnt the rule)
  export PARTS="tests/backend/test_softmax_s17_rows.py -k stash~and~not~compile"
  export CMDS="python3 bench/train_step.py --steps 60 --pipelined 10"
else
  export PARTS="tests/backend/test_softmax_s17_rows.py -k stash~and~not~compile;;\
tests/backend/test_softmax_fwd_narrow.py tests/backend/test_dropout16_draw.py tests/backend/test_norm_colsum_vec.py -k not~compile;;\
tests/backend/test_ce_fwd_tail.py tests/backend/test_ce_lowp_logits.py -k not~compile"
  export CMDS="python3 bench/amp_step.py --steps 30 --pipelined 10 --modes fp32,bf16,fp32+cl,bf16+cl"
fi
exec bash tools/gpu_s9_parts.sh
