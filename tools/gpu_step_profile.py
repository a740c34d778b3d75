"""Where a real GPU host spends an eager training step: bench/amp_step.py's minidnn step (model, mode) timed plain
and under cProfile on the device, the profile's top functions by own time and the share of the step in each part
of the framework (CuPy / launch layer / nn / engine / optimizer / amp).  The fake CuPy (tools/fake_gpu_step.py)
shows our Python; this shows it with CuPy's and the driver's host costs on the host that runs the benchmarks.

    python tools/gpu_step_profile.py [--models mobilenet,resnet20] [--modes fp32,bf16] [--steps 30] [--top 25]
"""
# ruff: noqa: E402
import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from amp_step import minidnn_step

import minidnn as mdn

PARTS = (("cupy", ("cupy/", "cupy_backends")), ("launch", ("backend/cuda/launch.py",)),
         ("backend", ("minidnn/backend/",)), ("engine", ("minidnn/autograd.py", "minidnn/tensor.py")),
         ("nn", ("minidnn/nn/",)), ("optim", ("minidnn/optim/",)), ("amp", ("_amp_state", "minidnn/amp/")))


def part_of(path):
    for name, keys in PARTS:
        if any(k in path for k in keys):
            return name
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mobilenet,resnet20")
    ap.add_argument("--modes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    for model in a.models.split(","):
        for mode in a.modes.split(","):
            step = minidnn_step(model, mode, "cuda")
            for _ in range(10):
                step()
            mdn.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(a.steps):
                step()
            mdn.cuda.synchronize()
            plain = (time.perf_counter() - t) / a.steps * 1e3
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.steps):
                step()
            mdn.cuda.synchronize()
            prof.disable()
            st = pstats.Stats(prof)
            total = sum(v[2] for v in st.stats.values())
            parts = {}
            for (path, _line, _fn), v in st.stats.items():
                parts[part_of(path)] = parts.get(part_of(path), 0.0) + v[2]
            print(f"\n== {model} {mode}: {plain:.2f} ms/step plain, {total / a.steps * 1e3:.2f} ms/step of own time "
                  "under cProfile; by part (% of the profiled time): "
                  + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
            st.sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
