"""A/B of the channels-last batch-norm one-launch kernels' occupancy (bn_nhwc.BPS blocks an SM, UNROLL / UNROLL_F row
groups in flight a thread and array) on the GPU, PyTorch's channels_last batch norm beside, device time only (CUDA-graph
replays in alternated rounds, bench/kernels_gpu.alternate), in one process.  Session 24's question: Nsight Compute
(run 1) had bnc_fwd1 / bnc_bwd1 at 25% occupancy (two 256-thread blocks an SM: 90-94 registers, 98 KB of the on-chip
copy a block), 0.23 eligible warps a scheduler, 72% of stalls on the loads -- do more, smaller threads (the same bytes
in flight an SM, the same on-chip copy split over more blocks) stream faster?

    python tools/bn_cl_occ_ab.py [--ops bn,add] [--dtypes float32,bfloat16] [--rounds 3] [--trials 5]
                                 [--shapes 32x256x56x56,128x64x56x56] [--settings bps2,b2u2,bps3,bps4]

Settings (BPS, UNROLL, UNROLL_F), the first the reference of the ratio column:
  bps2   (2, 4, 8): the default
  b2u2   (2, 2, 4): the default's blocks with half the groups in flight (the unroll alone)
  bps3   (3, 2, 4): three blocks an SM (80 registers)
  bps4   (4, 2, 4): four blocks an SM (64 registers; nvcc: float32's ReLU backwards spill 8 bytes, bfloat16 104-180)
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the cases and the timer)

SETTINGS = {"bps2": (2, 4, 8), "b2u2": (2, 2, 4), "bps3": (3, 2, 4), "bps4": (4, 2, 4)}
OPS = {"bn": "bn", "add": "bn_add_activation"}


_START = []     # the module's own (BPS, UNROLL, UNROLL_F), put back after each case


def _switch(setting):
    from minidnn.backend.cuda import bn_kernels, bn_nhwc
    if not _START:
        _START.append((bn_nhwc.BPS, bn_nhwc.UNROLL, bn_nhwc.UNROLL_F))
    bn_nhwc.BPS, bn_nhwc.UNROLL, bn_nhwc.UNROLL_F = SETTINGS[setting] if setting else _START[0]
    bn_nhwc._kernels.clear()          # (its key holds neither BPS nor UNROLL: the -D flags do)
    bn_nhwc._calls.clear()
    bn_kernels._calls.clear()


def run_case(timer, cases, op, shape, dtype_name, bw, rounds, settings):
    _switch(settings[0])
    for label, _, (fn, tfn, nbytes), _ in cases.bn(shape, OPS[op], layout="nhwc"):
        got, ratios, vs_torch, tgot = KG.alternate(timer, settings, _switch, fn, tfn, rounds)
        print("\n".join(KG.ab_lines(f"{label:30s} {dtype_name:9s} {str(shape):17s}", settings, got, ratios, vs_torch,
                                     tgot, nbytes, bw)))
        sys.stdout.flush()
    _switch(None)


def main(argv=None):
    return KG.ab_main("bn_cl_occ_ab", __doc__, SETTINGS, OPS, run_case, argv, ops="bn,add",
                      shapes="32x256x56x56,128x64x56x56", settings="bps2,b2u2,bps3,bps4")


if __name__ == "__main__":
    sys.exit(main())
