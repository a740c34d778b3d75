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

from conv_fast_ab import _cpu_us, steps  # tools/: the same timer, models and step A/B

import minidnn as mdn
import minidnn.nn.functional as F
from minidnn.backend.cuda import act_kernels as AK
from minidnn.backend.cuda import bn_kernels as K
from minidnn.nn._functions import norm as N

SHAPES = [(128, 16, 32, 32), (128, 64, 8, 8), (128, 32, 32, 32), (128, 128, 8, 8)]


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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--models", default="resnet20,mobilenet")
    args = ap.parse_args()
    calls(args.rounds)
    steps([m for m in args.models.split(",") if m], args.rounds, args.steps, N.FAST, "remembered")
