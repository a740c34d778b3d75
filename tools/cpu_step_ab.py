"""In-process A/B of the CPU LeNet-5 training step (bench/cpu.py's lenet rows) with one of the backend's switches off
and on, in alternated blocks (the 2-core machine is shared and noisy: alternating is what makes the two comparable).

    PYTHONPATH=. python3 tools/cpu_step_ab.py --switch pairs [--batch 64] [--threads 2] [--blocks 40] [--steps 10]

Switches: ``pairs`` (pooling_cpu._PAIRS_ENABLED: the 2x2 / stride 2 max-pool form); ``im2col`` (on:
conv_cpu._ROW_SHIFT_MIN_COLS_BYTES as it is, no row shift; off: the session-7 rule, the row shift above 4 MiB of
cols); ``stacked`` (conv_cpu._STACKED_BLOCKS: a filter gradient's inner-axis blocks as one stacked product);
``gemm`` (conv_cpu._STACKED_GEMM: _gemm's small-kernel blocks as one stacked product); ``parts``
(conv_cpu._STACKED_PARTS: a split part's im2col forward as one gather and one stacked product a 2 MiB group);
``round2`` (both of the last two).
Prints, for "off" and "on", the min / q25 / median of the per-step times over all blocks, and the ratio of the
medians.
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn as mdn
from minidnn.backend import conv_cpu, pooling_cpu


def _pairs(on):
    pooling_cpu._PAIRS_ENABLED[0] = on


_ROW_SHIFT = conv_cpu._ROW_SHIFT_MIN_COLS_BYTES


def _im2col(on):
    conv_cpu._ROW_SHIFT_MIN_COLS_BYTES = _ROW_SHIFT if on else conv_cpu._SMALL_COLS_BYTES


def _stacked(on):
    conv_cpu._STACKED_BLOCKS[0] = on


def _gemm_blocks(on):
    conv_cpu._STACKED_GEMM[0] = on


def _parts(on):
    conv_cpu._STACKED_PARTS[0] = on


def _round2(on):
    _gemm_blocks(on)
    _parts(on)


SWITCHES = {"pairs": _pairs, "im2col": _im2col, "stacked": _stacked, "gemm": _gemm_blocks, "parts": _parts,
            "round2": _round2}


def main(argv=None):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cpu_lenet_profile import make_step

    ap = argparse.ArgumentParser()
    ap.add_argument("--switch", default="pairs", choices=sorted(SWITCHES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    mdn.set_num_threads(args.threads)
    switch = SWITCHES[args.switch]
    step = make_step(args.batch)
    times = {False: [], True: []}
    for i in range(args.blocks):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            switch(on)
            step()                                    # one step after the switch, untimed
            for _ in range(args.steps):
                t0 = time.perf_counter()
                step()
                times[on].append(time.perf_counter() - t0)
    switch(True)
    for on in (False, True):
        t = sorted(times[on])
        print(f"{args.switch} {'on ' if on else 'off'} batch {args.batch}, {args.threads} threads: min / q25 / median "
              f"{t[0] * 1e3:.3f} / {t[len(t) // 4] * 1e3:.3f} / {statistics.median(t) * 1e3:.3f} ms")
    print(f"median on / off: {statistics.median(times[True]) / statistics.median(times[False]):.3f}")


if __name__ == "__main__":
    main()
