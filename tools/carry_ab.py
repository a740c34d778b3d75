"""A/B of round 12 of docs/host_overhead.md on a GPU: backward data reading the forward's KRSC filter copy (WKRSC=1,
backend.convolution_filter_carry) against its own CRSK copy (nchw_to_nhwc + the VEC kernel).

    python tools/carry_ab.py [--steps 30] [--rounds 5]

1. Per staged ResNet-20 b128 layer shape, fp32 strict and TF32: ms of GPU time per convolution_backward_data call
   (CUDA events around 100 calls, best of 5), carried and not, with dy NCHW (staged) and NHWC (the kernel and the
   filter copy alone), and whether the two dx are bitwise equal.
2. The eager ResNet-20 b128 training step (SGD momentum, cross-entropy), nn's CARRY_FILTER switched on/off in the
   same process, alternated rounds: median ms per step (wall, synchronized per round of ``--steps``) and launches
   per step (launch.launch_count).
"""
import argparse
import statistics
import time

import cupy as cp
import numpy as np

import minidnn as mdn
import minidnn.backend as B
import minidnn.models as M
from minidnn.backend.convolution import convolution_filter_carry
from minidnn.backend.cuda import launch as L
from minidnn.nn._functions import conv as C

# (N, C, H, W, K, stride): the 3x3 layers of ResNet-20 at batch 128 whose forward copies the filter
LAYERS = [(128, 16, 32, 32, 16, 1), (128, 16, 32, 32, 32, 2), (128, 32, 16, 16, 32, 1), (128, 32, 16, 16, 64, 2),
          (128, 64, 8, 8, 64, 1)]


def _bits(a):
    return cp.ascontiguousarray(a).view(cp.uint32)


def _gpu_ms(f, reps=100, best_of=5):
    f()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    best = float("inf")
    for _ in range(best_of):
        start.record()
        for _ in range(reps):
            f()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / reps)
    return best


def layers():
    print("backward data, ms of GPU time per call (best of 5 x 100):  carried / own CRSK copy, bitwise equal")
    for tf32 in (False, True):
        mdn.backends.cudnn.allow_tf32 = tf32
        for n, c, h, w, k, s in LAYERS:
            rng = np.random.default_rng(0)
            x = cp.asarray(rng.standard_normal((n, c, h, w)).astype(np.float32))
            wt = cp.asarray(rng.standard_normal((k, c, 3, 3)).astype(np.float32))
            desc = B.ConvolutionDescriptor((1, 1), (s, s))
            hd = B.handle.configured_default_handle(x)
            y = B.convolution_forward(hd, x, wt, desc)
            dy = cp.asarray(rng.standard_normal(y.shape).astype(np.float32))
            carry = convolution_filter_carry()
            with carry:
                B.convolution_forward(hd, x, wt, desc)
            row = []
            for name, g, fmt, xs in (("NCHW dy", dy, None, x.shape),
                                     ("NHWC dy", cp.ascontiguousarray(dy.transpose(0, 2, 3, 1)), "NHWC",
                                      (n, h, w, c))):
                def own():
                    return B.convolution_backward_data(hd, wt, g, desc, xs, format=fmt)

                def carried():
                    with carry:
                        return B.convolution_backward_data(hd, wt, g, desc, xs, format=fmt)
                same = bool(cp.array_equal(_bits(own()), _bits(carried())))
                t_c, t_o = _gpu_ms(carried), _gpu_ms(own)
                row.append(f"{name} {t_c:.4f} / {t_o:.4f} {'equal' if same else 'DIFFER'}")
            print(f"  {'tf32' if tf32 else 'fp32'} x ({n},{c},{h},{w}) k {k} stride {s}: " + ";  ".join(row))
    mdn.backends.cudnn.allow_tf32 = False


def step_ab(steps, rounds):
    mdn.manual_seed(0)
    m = M.resnet20(num_classes=10).to("cuda")
    opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = mdn.randn(128, 3, 32, 32).to("cuda")
    y = mdn.randint(0, 10, (128,)).to("cuda")
    F = mdn.nn.functional

    def step():
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    times, counts = {True: [], False: []}, {}
    for on in (True, False):
        C.CARRY_FILTER[0] = on
        for _ in range(3):
            step()
    cp.cuda.Device().synchronize()
    for _ in range(rounds):
        for on in (False, True):
            C.CARRY_FILTER[0] = on
            n0 = L.launch_count()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            cp.cuda.Device().synchronize()
            times[on].append((time.perf_counter() - t0) / steps * 1e3)
            counts[on] = (L.launch_count() - n0) / steps
    C.CARRY_FILTER[0] = True
    for on in (False, True):
        med = statistics.median(times[on])
        print(f"ResNet-20 b128 eager SGD step, carry {'on ' if on else 'off'}: median {med:.3f} ms"
              f" (rounds {', '.join(f'{t:.2f}' for t in times[on])}), {counts[on]:.0f} launches per step")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    layers()
    step_ab(a.steps, a.rounds)
