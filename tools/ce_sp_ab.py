"""A/B of the spatial cross-entropy kernels (logits (N, C, H, W), targets (N, H, W): loss_kernels.SOURCE_SPATIAL) on
the GPU, PyTorch's F.cross_entropy forward and backward beside, device time only (CUDA-graph replays in alternated
rounds, as tools/cols_ab.py), in one process.

    python tools/ce_sp_ab.py [--ops fwd,bwd] [--dtypes float32,bfloat16] [--rounds 3] [--trials 5]
                             [--shapes 32x21x128x128,16x19x256x256] [--settings read,cc,pair]

Settings (loss_kernels.SP_CC / SP_PAIR), the first the reference of the ratio column:
  read   SP_CC (0, 0): the class count read at run time, U classes at a time, one position a thread
  cc     SP_CC (32, 24): the class count compiled in, one position a thread
  pair   SP_CC (32, 24) and SP_PAIR: two adjacent positions a thread where inner is even (the default)
  rt0    pair with SP_RT off: past SP_CC (C read at run time) the masked batches of session 22 (session 23's A/B)
  nosplit  the default but SP_SPLIT off: one thread a position where few positions have many classes
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the cases and the timer)

SETTINGS = {"read": ((0, 0), False, True, True), "cc": ((32, 24), False, True, True),
            "pair": ((32, 24), True, True, True), "rt0": ((32, 24), True, False, True),
            "nosplit": ((32, 24), True, True, False)}
OPS = {"fwd": "spatial ce fwd", "bwd": "spatial ce bwd"}


def _switch(setting):
    from minidnn.backend.cuda import loss_kernels as lk
    lk.SP_CC, lk.SP_PAIR, lk.SP_RT, lk.SP_SPLIT = SETTINGS[setting]
    KG.forget_softmax()


def run_case(timer, cases, op, shape, dtype_name, bw, rounds, settings):
    label = OPS[op]
    _, _, (fn, tfn, nbytes), _ = next(r for r in cases.spatial(shape) if r[0] == label)
    got, ratios, vs_torch, tgot = KG.alternate(timer, settings, _switch, fn, tfn, rounds)
    _switch("pair")
    print("\n".join(KG.ab_lines(f"{label:15s} {dtype_name:9s} {str(shape):18s}", settings, got, ratios, vs_torch,
                                 tgot, nbytes, bw)))
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="fwd,bwd")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default="32x21x128x128,16x19x256x256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--settings", default="read,cc,pair")
    args = ap.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    ops = [o for o in args.ops.split(",") if o]
    if any(s not in SETTINGS for s in settings) or any(o not in OPS for o in ops):
        ap.error(f"--settings of {', '.join(SETTINGS)}; --ops of {', '.join(OPS)}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    start = KG.ab_start("ce_sp_ab", args.trials, args.rounds, "settings and PyTorch alternated")
    if start is None:
        return 0
    cp, torch, timer, bw = start
    with KG.torch_stream(torch):
        for dtype_name in args.dtypes.split(","):
            cases = KG.Cases(cp, torch, dtype_name)
            for shape in shapes:
                for op in ops:
                    run_case(timer, cases, op, shape, dtype_name, bw, args.rounds, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
