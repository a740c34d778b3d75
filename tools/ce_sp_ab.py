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
    return KG.ab_main("ce_sp_ab", __doc__, SETTINGS, OPS, run_case, argv, ops="fwd,bwd",
                      shapes="32x21x128x128,16x19x256x256", settings="read,cc,pair")


if __name__ == "__main__":
    sys.exit(main())
