"""Device-kernel time per step by kernel name for bench/amp_step.py's mixed-precision steps, minidnn beside
PyTorch (issue 12: where a bf16 / channels-last step's GPU time goes).

    PYTHONPATH=. python3 tools/amp_kernels.py [--models resnet20] [--modes bf16,bf16+cl] [--top 20]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from amp_step import minidnn_step, torch_step  # noqa: E402
from profile_step import print_table, step_kernel_times  # noqa: E402
from train_step import set_math, torch_models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet20")
    ap.add_argument("--modes", default="bf16,bf16+cl")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    set_math(False)
    ns = torch_models()
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            print_table(f"{name} {mode} minidnn", step_kernel_times(minidnn_step(name, mode, "cuda")), args.top)
            print_table(f"{name} {mode} torch", step_kernel_times(torch_step(name, mode, "cuda", ns)), args.top)


if __name__ == "__main__":
    main()
