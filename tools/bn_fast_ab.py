"""A/B of round 14 of docs/host_overhead.md on a GPU: nn's remembered batch-norm calls (nn._functions.norm FAST: a
seen training signature runs the kernels' settled calls and records its nodes directly) against the full path,
switched in one process, alternated rounds.

    python tools/bn_fast_ab.py [--rounds 7] [--steps 30] [--models resnet20,mobilenet]

1. Per call at the benchmark shapes: µs of host (CPU) time of a BatchNorm2d training forward, the fused ReLU after it
   (BatchNormReLU's recording) and after a residual add (BatchNormAddReLU's), and each backward form called on its
   node directly (the plain, BN+ReLU and BN+add+ReLU backward; no engine), min of the rounds; the GPU is synchronized
   between rounds only, so the kernels' run time is not in the figures.  The kernel modules' own calls
   (bn_kernels.forward_training / backward, the ReLU plan) are timed beside them: "above the kernel module" is the
   difference.
2. The eager training step of each model (SGD momentum, cross-entropy, fp32): median ms per step (wall, synchronized
   per round of ``--steps``), remembered calls on / off alternated.
"""
import argparse
import gc
import statistics
import time

import minidnn as mdn
import minidnn.models as M
import minidnn.nn.functional as F
from minidnn.backend.cuda import act_kernels as AK
from minidnn.backend.cuda import bn_kernels as K
from minidnn.nn._functions import norm as N

SHAPES = [(128, 16, 32, 32), (128, 64, 8, 8), (128, 32, 32, 32), (128, 128, 8, 8)]
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


def calls(rounds, n=200):
    names = ["bn fwd", "relu(bn)", "relu(bn+z)", "bwd plain", "bwd relu", "bwd add", "kernel fwd", "kernel bwd",
             "kernel relu"]
    for shape in SHAPES:
        bn = mdn.nn.BatchNorm2d(shape[1]).to("cuda")
        x = mdn.randn(*shape).to("cuda").requires_grad_()
        z = mdn.randn(*shape).to("cuda").requires_grad_()
        g = mdn.randn(*shape).to("cuda")
        best = {}
        for _ in range(rounds):
            for on in (False, True):
                N.FAST[0] = on
                for _ in range(3):          # remembered (on) / settled backward forms
                    for form in range(3):
                        y = bn(x)
                        (F.relu(y), F.relu(y + z), y)[form].backward(g)
                y = bn(x)
                a = y + z
                nodes = {"bwd plain": y.grad_fn, "bwd relu": F.relu(y).grad_fn, "bwd add": F.relu(a).grad_fn}
                stats = y.grad_fn.stats
                plan = AK.plan("RELU", 0.0, y.data)
                fns = {"bn fwd": lambda: bn(x), "relu(bn)": lambda: F.relu(y), "relu(bn+z)": lambda: F.relu(a),
                       "kernel fwd": lambda: K.forward_training(x.data, bn.weight.data, bn.bias.data, 0.1,
                                                                bn.running_mean.data, bn.running_var.data, 1e-5,
                                                                counter=bn.num_batches_tracked.data),
                       "kernel bwd": lambda: K.backward(x.data, g.data, bn.weight.data, stats[0], stats[1]),
                       "kernel relu": lambda: plan(y.data)}
                for k, node in nodes.items():
                    def bwd(node=node):
                        with mdn.no_grad():
                            node.backward(g)
                    fns[k] = bwd
                for k in names:
                    fns[k]()
                    best[(k, on)] = min(best.get((k, on), 1e9), _cpu_us(fns[k], n))
        N.FAST[0] = True
        print(f"{str(shape):18s} " + "  ".join(f"{k} {best[(k, False)]:.1f}->{best[(k, True)]:.1f}" for k in names)
              + "   (µs host CPU time, full -> remembered, min)")


def steps(models, rounds, n):
    for name in models:
        make, shape, batch = MODELS[name]
        mdn.manual_seed(0)
        model = make().to("cuda")
        opt = mdn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = mdn.randn(batch, *shape).to("cuda")
        y = mdn.randint(0, 10, (batch,)).to("cuda")

        def step():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        times = {False: [], True: []}
        for _ in range(rounds):
            for on in (False, True):
                N.FAST[0] = on
                for _ in range(3):
                    step()
                mdn.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    step()
                mdn.cuda.synchronize()
                times[on].append((time.perf_counter() - t0) / n * 1e3)
        N.FAST[0] = True
        print(f"{name} b{batch} eager step: full path {statistics.median(times[False]):.3f} ms, remembered "
              f"{statistics.median(times[True]):.3f} ms (medians of {rounds} alternated rounds of {n} steps)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--models", default="resnet20,mobilenet")
    args = ap.parse_args()
    calls(args.rounds)
    steps([m for m in args.models.split(",") if m], args.rounds, args.steps)
