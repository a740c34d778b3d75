"""Session 7 A/B of the NHWC depthwise kernels (conv_dw_nhwc): V1 (session 5, MINIDNN_DW_NHWC_V2=0) vs V2 vs
PyTorch channels_last (cuDNN, benchmark on), forward / backward data / filter gradient, in one process.

Default: MobileNet-small's four depthwise layers (3x3: C16 s1 32^2, C32 s2 32^2, C64 s1 16^2, C64 s2 16^2) at
batch 128, bf16 and fp32.  ``--large`` adds tools/dw_nhwc_bench.py's layers (the kernels must not lose there).
``--alt`` adds a third minidnn candidate, "v2-3": V2 with FWD_MIN_BLOCKS_PER_SM = 3 (smaller forward tiles on
the stride-1 layers too).  ``--plan`` prints each candidate's grids and tiles without a GPU.

Two numbers per candidate, µs per call:
  kern   device kernel time per call (torch.profiler / CUPTI: every kernel the call launched, summed; PyTorch's
         filter gradient is two kernels, ours one)
  queue  CUDA-event time of 20 back-to-back calls queued behind a 3 ms spin kernel, / 20 (device time with the
         launch gaps, no host time)

    python3 tools/dw_nhwc_s7.py [--dtypes bf16,fp32] [--large] [--alt] [--plan]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dw_nhwc_bench import torch_calls  # noqa: E402

from minidnn.backend import ConvolutionDescriptor  # noqa: E402
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_dw_nhwc as D  # noqa: E402

# name, N, C, size, kernel, pad, stride
MOBILENET = [
    ("mb C16 s1 32^2", 128, 16, 32, 3, 1, 1),
    ("mb C32 s2 32^2", 128, 32, 32, 3, 1, 2),
    ("mb C64 s1 16^2", 128, 64, 16, 3, 1, 1),
    ("mb C64 s2 16^2", 128, 64, 16, 3, 1, 2),
]
DIRS = ("fwd", "dgrad", "wgrad")


class Candidate:
    """A conv_dw_nhwc setting: V2 on/off and FWD_MIN_BLOCKS_PER_SM, applied around each call's planning."""

    def __init__(self, name, v2, fwd_min=None):
        self.name, self.v2, self.fwd_min = name, v2, fwd_min

    def __enter__(self):
        self.saved = (D.V2[0], D.FWD_MIN_BLOCKS_PER_SM)
        D.V2[0] = self.v2
        if self.fwd_min is not None:
            D.FWD_MIN_BLOCKS_PER_SM = self.fwd_min
            D._fwd_plans.clear(), D._dgrad_plans.clear()          # plans are not keyed by the knob
        return self

    def __exit__(self, *exc):
        if self.fwd_min is not None:
            D._fwd_plans.clear(), D._dgrad_plans.clear()
        D.V2[0], D.FWD_MIN_BLOCKS_PER_SM = self.saved


def candidates(alt):
    c = [Candidate("v1", False), Candidate("v2", True)]
    if alt:
        c.append(Candidate("v2-3", True, 3.0))
    return c


def _problem(N, C, size, k, pad, st, dt):
    desc = ConvolutionDescriptor(pad, st, 1, C)
    return make_problem("bench", (N, C, size, size), (C, 1, k, k), desc, dt)


def plan(layers, dtypes, alt, sms=132):
    """Each candidate's tiles and grids (CPU only)."""
    for dt in dtypes:
        isz = 2 if dt == "bfloat16" else 4
        for name, N, C, size, k, pad, st in layers:
            p = _problem(N, C, size, k, pad, st, dt)
            (P, Q), cv = p.out_size, D.vector(isz, k * k)
            for cand in candidates(alt):
                with cand:
                    vh, vq = D.gather_tile("forward", cv, st, N, C, P, Q, sms, cand.v2)
                    g = D.grid_config(C, cv, N * -(-P // vh) * -(-Q // vq))
                    _, wq = D.tile("backward_filter", cv, st)
                    w = D.wgrad_config(C, cv, N * P * -(-Q // wq), sms, cand.v2)
                print(f"{dt:8s} {name:24s} {cand.name:5s} fwd {vh}x{vq}x{cv} grid {g[2] * g[3]:5d} x ({g[0]},{g[1]})"
                      f"  wgrad grid ({w[2]},{w[3]}) x ({w[0]},{w[1]}) items/split {w[4]} group {w[5]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--alt", action="store_true")
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dtypes = [{"bf16": "bfloat16", "fp32": "float32"}[d] for d in args.dtypes.split(",")]
    layers = list(MOBILENET)
    if args.large:
        from dw_nhwc_bench import LAYERS
        layers += LAYERS
    if args.plan:
        plan(layers, dtypes, args.alt)
        return
    run(layers, dtypes, args.alt, args.reps)


def run(layers, dtypes, alt, reps):
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    from minidnn.backend.cuda import conv_igemm as K

    spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long cycles) {
        long long t0 = clock64(); while (clock64() - t0 < cycles) { } }''', "spin")
    clock_hz = cp.cuda.Device().attributes.get("ClockRate", 1_980_000) * 1000     # kHz; H100 SXM boost if absent

    def queued(fn):
        fn()
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        spin((1,), (1,), (np.int64(clock_hz * 3e-3),))
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b) * 1e3 / reps

    def kernel_time(fn, calls=10):
        for _ in range(3):
            fn()
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            cp.cuda.Device().synchronize()
            torch.cuda.synchronize()
        t = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                and "spin" not in e.name)
        return t / calls

    torch.backends.cudnn.benchmark = True
    cands = candidates(alt)
    head = "".join(f" {c.name + ' kern':>10s} {'queue':>6s}" for c in cands)
    print(f"{'layer':24s} {'dtype':8s} {'dir':5s}{head} {'torch kern':>10s} {'queue':>6s}   (µs per call)")
    for dt in dtypes:
        cdt = cp.float32 if dt == "float32" else __import__("ml_dtypes").bfloat16
        tdt = torch.bfloat16 if dt == "bfloat16" else torch.float32
        for name, N, C, size, k, pad, st in layers:
            p = _problem(N, C, size, k, pad, st, dt)
            rng = np.random.default_rng(0)

            def nhwc(shape):
                n, c, h, w = shape
                return cp.asarray(rng.standard_normal((n, h, w, c)).astype(cdt)).transpose(0, 3, 1, 2)
            x, dy = nhwc(p.x_shape), nhwc(p.y_shape)
            w = cp.asarray(rng.standard_normal(p.w_shape).astype(cdt))
            ours = {"fwd": lambda: K.direct_forward(p, x, w), "dgrad": lambda: K.direct_backward_data(p, w, dy),
                    "wgrad": lambda: K.direct_backward_filter(p, x, dy)}
            theirs = torch_calls(torch, N, C, size, k, pad, st, tdt)
            for d in DIRS:
                row = ""
                for cand in cands:
                    with cand:
                        row += f" {kernel_time(ours[d]):10.1f} {queued(ours[d]):6.1f}"
                row += f" {kernel_time(theirs[d]):10.1f} {queued(theirs[d]):6.1f}"
                print(f"{name:24s} {dt:8s} {d:5s}{row}", flush=True)


if __name__ == "__main__":
    main()
