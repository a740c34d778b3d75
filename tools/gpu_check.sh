#!/usr/bin/env bash
# Everything a change needs from the GPU machine, in one call (device time is scarce):
#   the cuda half of every test table, then the benchmarks, logs under $OUT.
# Usage on the device machine (repo root):  bash tools/gpu_check.sh [pytest-args...]
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pytest -m cuda -p no:cacheprovider -q -rfE "$@" 2>&1 | tee "$OUT/pytest_cuda.log" | tail -40
rc=${PIPESTATUS[0]}
for b in ${BENCHES:-overhead conv_algorithms optim_step}; do
  if [ -f "bench/$b.py" ]; then
    echo "== bench/$b.py"; timeout 240 python3 "bench/$b.py" 2>&1 | tee "$OUT/bench_$b.log" | tail -30
  fi
done
exit $rc
