"""Session 18 (issue 10): NCHW batch norm's one-pass kernels at several bytes-in-flight settings, in one process.

    PYTHONPATH=. python3 tools/bn_s18_ab.py [--settings p1,p0,p2,b3p0,b3p1,p1s1] [--shapes 32x256x56x56,...]
                                            [--dtypes float32,bfloat16] [--ops fwd,bwd,relu_bwd] [--rounds 15]
                                            [--calls 10] [--small-calls 50] [--no-torch]

The question (docs/step_kernels.md, "Session 18"): on the H200 (4.2 TB/s copy) are bn_fwd1 / bn_bwd1's streaming
phases latency-bound -- too few bytes in flight an SM?  A setting is pP (ONEPASS_PREFETCH = P, MINIDNN_BN_PREFETCH:
the first pass asks L2 for the vectors P iterations ahead, and a block about to meet for its next tile's first ones --
bytes in flight without registers) with an optional bB prefix (ONEPASS_BPS = B blocks per SM, MINIDNN_BN_BPS: 3 gives
each block a smaller share of shared memory for the on-chip copy, more warps an SM) and an optional sS suffix
(ONEPASS_SYMM = S, MINIDNN_BN_SYMM, session 20: the symmetric meeting -- every block adds its tile's partials itself;
the same bits; the default since session 20; a setting without sS has it 0) and an optional lF[_B] suffix: the
rounds' share of L2 in hundredths, forward F and backward B (`_ROUND_SHARE_ONCHIP` / `_ROUND_SHARE_ONCHIP_BWD`,
MINIDNN_BN_L2_SHARE / _BWD: 0.5 both by default; B defaults to F) -- tuned on an H100 under the last-arriver meeting
(docs/step_kernels.md, session 6); with the symmetric meeting's cheaper rounds the best split into rounds may differ
(another split: other bits).
"p1" was the default from session 18 (run 7 adopted PREFETCH 1) to 19; the first setting is the A; every setting is
flipped in this process through bn_kernels.set_onepass, which makes the settled calls
settle again.  PREFETCH does not move the split (the same bits); BPS and the shares do (another grid or rounds).  Run 7
also timed UNROLL 6 and 8 (its settings were uU[pP]: "u4p1" is "p1" here); they lost and UNROLL is fixed at 4 since
session 19.

Timing: per (shape, dtype, op) one CUDA graph of `calls` back-to-back calls per setting, all captured first and kept
alive, then `rounds` rounds that replay each setting's graph once, the order rotated every round; median ms per call.
PyTorch (F.batch_norm training, + ReLU; backward = forward + grad captured together less the forward) beside, timed
once per (shape, dtype) by bn_nhwc_bench's Timer.  % = compulsory traffic (fwd 2e, bwd 3e, relu bwd 4e; e = x's
bytes) over the copy bandwidth measured in the same run.  ResNet-20's (128, 16, 32, 32) is the control: it may take
bn_cluster's kernels (then every setting is the same launch: the "routes" line under each row says so: the
one-pass launch's grid, dynamic shared memory and the driver's blocks per SM) and must not lose.
Expected run time on an H200: ~35-50 s a dtype with the five default settings (NVRTC ~1-3 s per kernel and setting:
3 kernels a setting and dtype); run float32 and bfloat16 as two commands.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bn_nhwc_bench import Timer, _dtype, copy_bandwidth, torch_bn_times  # noqa: E402

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402

SHAPES = "32x256x56x56,256x32x56x56,128x64x56x56,128x16x32x32"
OPS = {"fwd": (False, False, 2), "bwd": (False, True, 3), "relu_bwd": (True, True, 4)}


def parse_setting(s):
    """'p1' -> (2, 1, 0, None); 'b3p0' -> (3, 0, 0, None); 'p1s1' -> (2, 1, 1, None); 'p1s1l50_85' -> (2, 1, 1,
    (0.5, 0.85)): (blocks per SM, L2 prefetch distance, symmetric meeting, the rounds' L2 shares forward / backward or
    None for the module's)."""
    m = re.fullmatch(r"(?:b(\d+))?p(\d+)(?:s(\d+))?(?:l(\d+)(?:_(\d+))?)?", s)
    if m is None:
        raise SystemExit(f"bad setting {s!r}: expected [bB]pP[sS][lF[_B]] (e.g. p1, b3p0, p1s1, p1s1l50_85)")
    shares = None
    if m.group(4):
        f = int(m.group(4)) / 100
        shares = (f, int(m.group(5)) / 100 if m.group(5) else f)
    return int(m.group(1) or 2), int(m.group(2)), int(m.group(3) or 0), shares



def _route(call):
    p = getattr(call, "launch1", None)
    if p is None:
        return "2-launch"
    return f"grid {p.dims[0]} smem {p.dims[6]} occ {K._resident_per_sm(p.kernel, p.dims[6])}"


def capture(cp, fn, calls, keep):
    """A CUDA graph of ``calls`` calls of fn on a fresh stream (each call's outputs kept alive in ``keep``)."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        keep.append(fn())           # scratch is kept per stream: warm this one outside the capture
        s.synchronize()
        s.begin_capture()
        for _ in range(calls):
            keep.append(fn())
        g = s.end_capture()
    return g, s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="p1,p0,p2,b3p0,b3p1")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=10, help="calls per graph, tensors over 8 M values")
    ap.add_argument("--small-calls", type=int, default=50)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)
    settings = [(s, *parse_setting(s)) for s in args.settings.split(",") if s]
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            raise SystemExit(f"bad op {o!r}: one of {', '.join(OPS)}")
    cp = _dev.require_cupy()
    torch = F = None
    if not args.no_torch:
        try:
            import torch
            import torch.nn.functional as F
            torch.backends.cudnn.benchmark = True
        except ImportError:
            pass
    timer = Timer(cp, torch, 7, False)
    bw = copy_bandwidth(cp)
    dev = cp.cuda.Device()
    default = (K.ONEPASS_BPS, K.ONEPASS_PREFETCH, K.ONEPASS_SYMM)
    shares0 = (K._ROUND_SHARE_ONCHIP, K._ROUND_SHARE_ONCHIP_BWD)
    print(f"# device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, copy {bw:.0f} GB/s; "
          f"UNROLL {K.ONEPASS_UNROLL}, defaults BPS {default[0]} PREFETCH {default[1]} SYMM {default[2]}; "
          f"{args.rounds} rounds, order rotated")
    print("# ms per call (% of copy); ratio = first setting / this (> 1: faster than it); torch beside")
    head = f"{'shape':>14} {'dtype':>8} {'op':>8} | " + " | ".join(f"{s[0]:>16}" for s in settings) + \
        f" | {'torch':>8} | best"
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for shape_s in args.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        c = shape[1]
        calls = args.calls if np.prod(shape) > 8 * 2 ** 20 else args.small_calls
        for name in args.dtypes.split(","):
            dt = _dtype(name)
            x = (rng.standard_normal(shape) + 1).astype(dt)
            xg, dyg = cp.asarray(x), cp.asarray(x[::-1].copy())
            sg, bg = cp.ones(c, np.float32), cp.zeros(c, np.float32)
            rmg, rvg = cp.zeros(c, np.float32), cp.ones(c, np.float32)
            e = xg.nbytes
            tt = torch_bn_times(timer, torch, F, x, name, calls) if torch is not None else {}
            for op in ops:
                relu, backward, passes = OPS[op]
                graphs, keep, routes = [], [], []
                # the backward's inputs from the default forward (one compile, not one a setting)
                K.set_onepass(*default, shares=shares0)
                y, m, i = K.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, relu=relu)
                keep.append((y, m, i))
                for label, bps, pf, sy, shares in settings:
                    K.set_onepass(bps, pf, sy, shares0 if shares is None else shares)
                    if backward:
                        def fn(y=y, m=m, i=i):
                            return K.backward(xg, dyg, sg, m, i, y=y if relu else None)
                        call = K.backward_call(xg, dyg, sg, m, y if relu else None, False)
                    else:
                        def fn():
                            return K.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, relu=relu)
                        call = K.training_call(xg, sg, bg, 0.1, rmg, rvg, 1e-5, None, relu)
                    routes.append(_route(call))
                    graphs.append(capture(cp, fn, calls, keep))
                K.set_onepass(*default, shares=shares0)
                times = [[] for _ in settings]
                for r in range(args.rounds):
                    for j in range(len(settings)):
                        k = (j + r) % len(settings)
                        g, s = graphs[k]
                        a, b = cp.cuda.Event(), cp.cuda.Event()
                        a.record(s)
                        g.launch(s)
                        b.record(s)
                        b.synchronize()
                        times[k].append(cp.cuda.get_elapsed_time(a, b) / calls)
                med = [statistics.median(t) for t in times]
                nbytes = passes * e

                def cell(ms):
                    return f"{ms:8.4f} ({100 * nbytes / (ms * 1e-3) / 1e9 / bw:3.0f}%)"
                tms = tt.get(("relu" if relu else None, backward))
                best = min(range(len(settings)), key=lambda k: med[k])
                print(f"{shape_s:>14} {name:>8} {op:>8} | " + " | ".join(f"{cell(v):>16}" for v in med)
                      + f" | {(f'{tms:8.4f}' if tms else '       -')} | {settings[best][0]} "
                      f"{med[0] / med[best]:.3f}x", flush=True)
                print("#   routes: " + "; ".join(f"{s[0]}: {r_}" for s, r_ in zip(settings, routes)))
                del graphs, keep
    K.set_onepass(*default, shares=shares0)


if __name__ == "__main__":
    main()
