"""Eager host cost of the 1x1 cublasLt route (conv_pointwise) in MobileNet-small's bf16 channels-last step: the
route on / off (conv_pointwise.ENABLED, part of conv_igemm's call keys) alternated in one process, ms per step
(wall, synchronized per round of --steps), min and median of --rounds.

    PYTHONPATH=. python3 tools/pw_eager_ab.py [--rounds 7] [--steps 30] [--modes bf16+cl]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from amp_step import minidnn_step  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend.cuda import conv_pointwise as PW  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--modes", default="bf16+cl")
    args = ap.parse_args()
    for mode in args.modes.split(","):
        step = minidnn_step("mobilenet", mode, "cuda")
        res = {True: [], False: []}
        for _ in range(args.rounds):
            for on in (True, False):
                PW.ENABLED[0] = on
                for _ in range(3):
                    step()
                mdn.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(args.steps):
                    step()
                mdn.cuda.synchronize()
                res[on].append((time.perf_counter() - t) / args.steps * 1e3)
        PW.ENABLED[0] = True
        print(f"mobilenet {mode} eager ms/step: 1x1 cublasLt route on {min(res[True]):.3f} / "
              f"{statistics.median(res[True]):.3f}, off {min(res[False]):.3f} / {statistics.median(res[False]):.3f} "
              "(min / median)")


if __name__ == "__main__":
    main()
