"""bf16 autocast accuracy on digits (tests/amp/test_amp_training.py's ResNet-20 recipe) with autocast's float32
weight gradients on (the default: filter/linear/bias gradients written in float32 by the kernels) and off (each
weight gradient rounded to bf16 and cast back, PyTorch's numerics), over several seeds, in one process: does the
float32 path move accuracy?  Also fp32 for the baseline.  Needs a GPU.

    PYTHONPATH=. python3 tools/amp_accuracy_ab.py [--seeds 6]
"""
import argparse
import sys
import time

import numpy as np

sys.path.insert(0, "tests/amp")
import test_amp_training as T  # noqa: E402

import minidnn._amp_state as S  # noqa: E402
import minidnn.nn._functions.bias as _bias  # noqa: E402
import minidnn.nn._functions.conv as _conv  # noqa: E402
import minidnn.nn.functional as _functional  # noqa: E402

USERS = (S, _bias, _conv, _functional)      # every module that holds float32_grad_of by name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=6)
    args = ap.parse_args()
    seeds = range(args.seeds)
    real = S.float32_grad_of
    rows = {}
    for name, mode, fn in (("fp32", "fp32", real), ("bf16, float32 dw", "bf16", real),
                           ("bf16, bf16 dw", "bf16", lambda t: None)):
        for m in USERS:
            m.float32_grad_of = fn
        t0 = time.perf_counter()
        rows[name] = [T._accuracy(mode, "cuda", s) for s in seeds]
        print(f"{name:18s} mean {np.mean(rows[name]):6.2f}  per seed {' '.join(f'{a:5.1f}' for a in rows[name])}"
              f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    for m in USERS:
        m.float32_grad_of = real


if __name__ == "__main__":
    main()
