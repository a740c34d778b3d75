"""A/B of the channel softmax kernels (softmax / log-softmax over dim 1 of NCHW, forward and backward) on the GPU:
softmax_kernels.COLS_V2 "0" (session 7's softmax_cols_fwd / _bwd) against "1" (session 22's softmax_cols2_fwd / _bwd),
PyTorch's torch.softmax / log_softmax(x, 1) and their backward beside, device time only (CUDA-graph replays, as
tools/row_ab.py), in one process.

    python tools/cols_ab.py [--ops smx,lsmx,smxbwd,lsmxbwd] [--dtypes float32,bfloat16] [--rounds 3] [--trials 5]
                            [--shapes 16x19x256x256,32x21x128x128,8x150x64x64] [--settings 0,1]

Settings (docs/step_kernels.md, "Session 22: channel softmax columns"), the first the reference of the ratio column:
  0        COLS_V2 off: the session-7 kernels (CREG 8/16/32 slots a thread, three passes past 32 classes)
  1        COLS_V2 on (the default): the class count compiled in up to COLS_CC_MAX, chunks of 8 beyond, two 16-bit
           columns a thread (PAIR) where inner is even
  1@B      "1" at B blocks an SM for every plan (COLS_MINB_SET: 65536 / (256 B) registers a thread; 4 -> 64,
           5 -> 48, 6 -> 40).  The default: 5 for one-column forwards of up to 24 compiled-in classes (float32,
           16-bit one column a thread), 4 elsewhere (float64 2) -- "1@4" the occupancy probe for those; at 5 the
           float32 SPLIT softmax forward builds without spills too, PAIR forwards, backwards and the SPLIT
           log-softmax spill 40-96 bytes (nvcc)
  1np      "1" with COLS_PAIR off (one 16-bit column a thread)
  1ns      "1" with COLS_SPLIT "0" (columns past COLS_CC_MAX in chunks of 8, read twice, one thread a column)
  1fill    "1" with COLS_SPLIT "fill" (also register-held columns split where few: (8, 21, 64, 64))
  1nx      "1" with COLS_FASTX off (16-bit forwards' exps by expf, not ex2.approx)
           flags combine, then @B: "1np@5", "1nsnp", "1npnx"
Method: per case (op, dtype, shape) `rounds` rounds; a round times every distinct setting and PyTorch in turn, the
order reversed every other round, each timing a fresh capture of `reps` calls of the backend primitive
(B.softmax_forward / softmax_backward, mode "channel", as bench/kernels_gpu.py's spatial cases) replayed `trials` times
(median).  A setting whose planned kernel (defines, grid) is an earlier one's is not timed again ("= 1").  Reported:
the median over rounds (ms a call, GB/s of the compulsory bytes -- x read and y written; the backward y and dy read,
dx written -- and % of the copy bandwidth measured in the same run), the spread (max/min - 1), the median of the
per-round ratios reference/setting (> 1: faster than the reference) and PyTorch/setting (> 1: faster than PyTorch).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the cases and the timer)

OPS = {"smx": ("channel softmax fwd", "accurate", False), "lsmx": ("channel log-softmax fwd", "log", False),
       "smxbwd": ("channel softmax bwd", "accurate", True), "lsmxbwd": ("channel log-softmax bwd", "log", True)}
SHAPES = "16x19x256x256,32x21x128x128,8x150x64x64"


def _sk():
    from minidnn.backend.cuda import softmax_kernels as sk
    return sk


_START = {}


def parse(setting):
    """(COLS_V2, COLS_PAIR, COLS_SPLIT, COLS_FASTX, COLS_MINB_SET) of a setting string ("0", "1", "1@5", "1np",
    "1nsnx@6", ...)."""
    m = re.fullmatch(r"1((?:np|ns|nx|fill)*)(?:@([1-8]))?", setting)
    if setting == "0":
        return False, True, "1", True, 0
    if m is None or ("ns" in m.group(1) and "fill" in m.group(1)):
        raise ValueError(f"cols_ab: setting {setting!r}: 0, or 1 with np / ns / nx / fill and @B (B blocks an SM, "
                         "1-8)")
    flags = m.group(1)
    split = "0" if "ns" in flags else "fill" if "fill" in flags else "1"
    return True, "np" not in flags, split, "nx" not in flags, int(m.group(2) or 0)


def _switch(setting):
    sk = _sk()
    if not _START:
        _START.update(v=(sk.COLS_V2, sk.COLS_PAIR, sk.COLS_SPLIT, sk.COLS_FASTX, sk.COLS_MINB_SET))
    sk.COLS_V2, sk.COLS_PAIR, sk.COLS_SPLIT, sk.COLS_FASTX, sk.COLS_MINB_SET = parse(setting)
    KG.forget_softmax()


def _restore():
    sk = _sk()
    if _START:
        sk.COLS_V2, sk.COLS_PAIR, sk.COLS_SPLIT, sk.COLS_FASTX, sk.COLS_MINB_SET = _START["v"]
    KG.forget_softmax()


def _spec(op, shape, dt):
    _, algo, backward = OPS[op]
    return _sk().launch_spec(backward, shape, (1,), algo.upper(), dt)


def precompile(ops, dtype_names, shapes, settings):
    """Every kernel the cases will plan, compiled into CuPy's disk cache by a process a core."""
    sk = _sk()
    specs = []
    try:
        for name in dtype_names:
            dt = sk._dtype_of(name)
            for op in ops:
                for shape in shapes:
                    for s in settings:
                        _switch(s)
                        specs.append(_spec(op, shape, dt))
    finally:
        _restore()
    return sk.precompile(specs)


def run_case(timer, cases, op, shape, dtype_name, bw, rounds, settings):
    def plan_of(s):
        _switch(s)
        sp = _spec(op, shape, cases.dt)
        return sp.name, sp.defines, sp.groups

    plans, distinct, same = KG.distinct_plans(settings, plan_of)
    _restore()
    label, algo, backward = OPS[op]
    row = next(r for r in cases.spatial(shape) if r[0] == label)
    _, _, (fn, tfn, nbytes), _ = row
    try:
        got, ratios, vs_torch, tgot = KG.alternate(timer, distinct, _switch, fn, tfn, rounds)
    finally:
        _restore()

    def kern(s):
        d = dict(x.split("=", 1) for x in plans[s][1])
        keys = ("CREG", "CC", "PAIR", "SPLIT", "SK", "CFX", "CMINB")
        return "[" + " ".join(f"{k}={d[k]}" for k in keys if k in d) + "]"

    print("\n".join(KG.ab_lines(f"{label:24s} {dtype_name:9s} {str(shape):18s}", settings, got, ratios, vs_torch,
                                 tgot, nbytes, bw, same, kern)))
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="smx,lsmx,smxbwd,lsmxbwd")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--settings", default="0,1",
                    help="the first the reference: 0, 1, 1@B, 1np, 1ns, 1nx, 1fill, 1np@B ...")
    ap.add_argument("--no-precompile", action="store_true")
    args = ap.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    ops = [o for o in args.ops.split(",") if o]
    for s in settings:
        try:
            parse(s)
        except ValueError as exc:
            ap.error(str(exc))
    if any(o not in OPS for o in ops):
        ap.error(f"--ops {args.ops!r}: of {', '.join(OPS)}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    if any(len(s) < 3 for s in shapes):
        ap.error(f"--shapes {args.shapes!r}: N x C x spatial dims (the softmax runs over dim 1)")
    start = KG.ab_start("cols_ab", args.trials, args.rounds, "settings and PyTorch alternated")
    if start is None:
        return 0
    cp, torch, timer, bw = start
    if not args.no_precompile:
        t0 = time.perf_counter()
        n = precompile(ops, args.dtypes.split(","), shapes, settings)
        print(f"precompiled {n} softmax kernels in {time.perf_counter() - t0:.1f} s")
    with KG.torch_stream(torch):
        for dtype_name in args.dtypes.split(","):
            cases = KG.Cases(cp, torch, dtype_name)
            for shape in shapes:
                for op in ops:
                    run_case(timer, cases, op, shape, dtype_name, bw, args.rounds, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
