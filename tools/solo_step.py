"""minidnn's eager training steps in a process that never imports PyTorch (issue 10's eager rows: is minidnn's
step time in bench/train_step.py disturbed by PyTorch living in the same process, e.g. its idle OpenMP threads?).

    python tools/solo_step.py [--models lenet5,resnet20,mobilenet] [--steps 60] [--rounds 5] [--tf32]

The same step as bench/train_step.py (make_step), timed the same way (paired_medians over the models), median ms.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.modules["torch"] = None          # train_step's `import torch` fails: PyTorch is never loaded here
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from train_step import CONFIGS, make_step, paired_medians, set_math  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tf32", action="store_true")
    args = ap.parse_args()
    set_math(args.tf32)
    names = args.models.split(",")
    runs = []
    for name in names:
        ctor, shape, batch = CONFIGS[name]
        step, _, _ = make_step(mdn, vars(minidnn.models), ctor, shape, batch, "cuda")
        runs.append((step, mdn.cuda.synchronize))
    meds = paired_medians(runs, args.steps, rounds=args.rounds)
    print(f"minidnn alone (no PyTorch in the process), {'TF32' if args.tf32 else 'strict fp32'}, median of "
          f"{args.steps} steps: " + ", ".join(f"{n} {m:.2f} ms" for n, m in zip(names, meds)))


if __name__ == "__main__":
    main()
