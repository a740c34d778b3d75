"""A/B of round 13 of docs/host_overhead.md on a GPU: the conv fast path (nn._functions.conv FAST_PATH: a seen
signature runs the backend's settled calls) against the full path, switched in one process, alternated rounds.

    python tools/conv_fast_ab.py [--rounds 7] [--steps 30] [--models resnet20,mobilenet,lenet5]

1. Per layer at the benchmark shapes (ResNet-20 b128's three 3x3 stages, MobileNet-small's 1x1 and depthwise): µs of
   host (CPU) time per F.conv2d forward and per first-order backward (ConvForward.backward called directly, so the
   engine and the leaves' accumulation are not in it), min of the rounds; the GPU is synchronized between rounds
   only, so a launch's queueing is in the figure and the kernels' run time is not.
2. The eager training step of each model (SGD momentum, cross-entropy, fp32): median ms per step (wall, synchronized
   per round of ``--steps``), fast path on / off alternated.
"""
import argparse
import gc
import statistics
import time

import minidnn as mdn
import minidnn.models as M
import minidnn.nn.functional as F
from minidnn.nn._functions import conv as C

# name: (x shape, w shape, stride, padding, groups)
LAYERS = {"r20 16x32^2 3x3": ((128, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1),
          "r20 32x16^2 3x3": ((128, 32, 16, 16), (32, 32, 3, 3), 1, 1, 1),
          "r20 64x8^2 3x3": ((128, 64, 8, 8), (64, 64, 3, 3), 1, 1, 1),
          "mb 1x1 32->64 16^2": ((128, 32, 16, 16), (64, 32, 1, 1), 1, 0, 1),
          "mb dw 3x3 64 16^2": ((128, 64, 16, 16), (64, 1, 3, 3), 1, 1, 64)}
MODELS = {"resnet20": (lambda: M.resnet20(num_classes=10), (3, 32, 32), 128),
          "mobilenet": (lambda: M.MobileNetSmall(num_classes=10, in_channels=3), (3, 32, 32), 128),
          "lenet5": (lambda: M.LeNet5(num_classes=10, in_channels=1, input_size=32), (1, 32, 32), 64)}


def _cpu_us(fn, n):
    mdn.cuda.synchronize()
    gc.collect()
    t0 = time.process_time()
    for _ in range(n):
        fn()
    dt = time.process_time() - t0
    mdn.cuda.synchronize()
    return dt / n * 1e6


def layers(rounds, n=200):
    print(f"{'layer':22s} {'fwd off':>9s} {'fwd on':>9s} {'bwd off':>9s} {'bwd on':>9s}   (µs host CPU time, min)")
    for name, (xs, ws, st, pad, g) in LAYERS.items():
        x = mdn.randn(*xs, device="cuda").requires_grad_()
        w = mdn.randn(*ws, device="cuda").requires_grad_()
        gy = mdn.randn(*F.conv2d(x, w, None, st, pad, 1, g).shape, device="cuda")

        def fwd():
            return F.conv2d(x, w, None, st, pad, 1, g)

        ys = []

        def bwd():
            with mdn.no_grad():
                C.ConvForward.backward(ys.pop().grad_fn, gy)
        best = {}
        for _ in range(rounds):
            for on in (False, True):
                C.FAST_PATH[0] = on
                for _ in range(3):
                    fwd()
                best[("f", on)] = min(best.get(("f", on), 1e9), _cpu_us(fwd, n))
                ys[:] = [fwd() for _ in range(n)]
                best[("b", on)] = min(best.get(("b", on), 1e9), _cpu_us(bwd, n))
        C.FAST_PATH[0] = True
        print(f"{name:22s} {best['f', False]:9.1f} {best['f', True]:9.1f} {best['b', False]:9.1f} "
              f"{best['b', True]:9.1f}")


def steps(models, rounds, n, switch=C.FAST_PATH, label="fast path"):
    """The eager training step of each model, ``switch[0]`` off / on alternated (bn_fast_ab.py passes its own)."""
    for name in models:
        make, shape, batch = MODELS[name]
        mdn.manual_seed(0)
        model = make().to("cuda")
        opt = mdn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = mdn.randn(batch, *shape, device="cuda")
        y = mdn.randint(0, 10, (batch,), device="cuda")

        def step():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        times = {False: [], True: []}
        for _ in range(rounds):
            for on in (False, True):
                switch[0] = on
                for _ in range(3):
                    step()
                mdn.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    step()
                mdn.cuda.synchronize()
                times[on].append((time.perf_counter() - t0) / n * 1e3)
        switch[0] = True
        print(f"{name} b{batch} eager step: full path {statistics.median(times[False]):.3f} ms, {label} "
              f"{statistics.median(times[True]):.3f} ms (medians of {rounds} alternated rounds of {n} steps)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    layers(args.rounds)
    steps([m for m in args.models.split(",") if m], args.rounds, args.steps)
