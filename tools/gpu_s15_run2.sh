#!/usr/bin/env bash
# Session 15 run 2: the wide_reduce fix's cuda tests (CuPy 16-bit reductions through float32), then where the eager
# step's host time goes on the device host (cProfile of the amp_step steps: ResNet-20 fp32, MobileNet fp32 / bf16).
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
python3 -m pytest -q -x tests/test_tensor.py -k "16_bit or reduc or cumsum or sum" -p no:cacheprovider 2>&1 | tail -15
timeout 240 python3 tools/gpu_step_profile.py --models resnet20,mobilenet --modes fp32,bf16 --steps 30 --top 30 2>&1 | tee "$OUT/profile.txt" | tail -150
