#!/usr/bin/env bash
# Session 22, REVIEW22's mends to the spatial cross-entropy and the NaN tests: the widened pair build's 4-byte x rule
# (the cast off it), __ldg loads in sp_ld, SpPos's unsigned i, the grid-stride walk test, widened pairs, NaN before
# the first finite class, the row tests' whole NaN chunks; then tools/ce_sp_ab.py (cc against pair: __ldg's figure).
#   ~3 min on a fresh H200.  From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_sp3.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-240} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_ce_spatial.py;;tests/backend/test_nan_rescale.py tests/backend/test_ce_lowp_logits_cuda.py"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings cc,pair"
exec bash tools/gpu_s9_parts.sh
