"""Batch norm's cluster kernels (bn_cluster.py: bn_fwdc / bn_bwdc) beside the one-pass kernels they replace
(bn_kernels bn_fwd1 / bn_bwd1 with the on-chip copy) and PyTorch, per call on the GPU, NCHW (issue 10).

    PYTHONPATH=. python3 tools/bn_cluster_bench.py [--shapes 128x64x56x56,...] [--dtypes float32,bfloat16]
                                                   [--force 8,16] [--nt 256] [--calls 50] [--large-calls 10]
                                                   [--replays 7] [--plans]

Columns, ms per call (GB/s of compulsory traffic, % of copy bandwidth measured in the same run):
  cluster   the default plan (MINIDNN_BN_CLUSTER=1);  CL=<n>  the cluster size forced (--force);
  onepass   the cluster kernels off (bn_fwd1 / bn_bwd1, as before);
  torch     F.batch_norm (+ ReLU, + z) training; backward = forward + backward captured together less the forward.
Ops and compulsory traffic as tools/bn_onchip_bench.py (fwd 2e / 2e / 3e, bwd 3e / 4e / 5e; e = x's bytes); timing:
a CUDA graph of `calls` back-to-back calls replayed `replays` times, median.  --plans prints each row's cluster
plan (CL, slots, shared memory).  --nt reruns the cluster column with that many threads a block.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bn_nhwc_bench import Timer, _dtype, copy_bandwidth, torch_bn_times  # noqa: E402

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_cluster as BC  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

SHAPES = "128x64x56x56,256x16x32x32,128x16x32x32,128x32x16x16,128x64x8x8,128x128x8x8"
OPS = {"fwd": (None, 2, False), "bwd": (None, 3, True), "relu fwd": ("relu", 2, False),
       "relu bwd": ("relu", 4, True), "add fwd": ("add", 3, False), "add bwd": ("add", 5, True)}
_NT = BC.NT


def _setting(enabled, force=None, nt=None):
    BC.ENABLED, BC.FORCE_CL = enabled, force
    BC.NT = nt or _NT
    BC._kernels.clear()
    K._calls.clear()
    K._plans.clear()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--force", default="")
    ap.add_argument("--nt", type=int, default=0)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--large-calls", type=int, default=10)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--plans", action="store_true")
    args = ap.parse_args(argv)
    cp = _dev.require_cupy()
    try:
        import torch
        import torch.nn.functional as F
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = F = None
    timer = Timer(cp, torch, args.replays, False)
    bw = copy_bandwidth(cp)
    dev = cp.cuda.Device()
    print(f"# device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, copy bandwidth {bw:.0f} GB/s; "
          f"smem per SM / block {M.smem_limits(dev.id)}; NT {_NT}")
    variants = [("cluster", True, None, None)] + [(f"CL={f}", True, int(f), None) for f in args.force.split(",") if f]
    if args.nt:
        variants.append((f"NT={args.nt}", True, None, args.nt))
    variants.append(("onepass", False, None, None))
    head = f"{'shape':>14} {'dtype':>8} {'op':>8} | " + " | ".join(f"{v[0]:>22}" for v in variants) + \
        f" | {'torch':>8} | vs torch | vs onepass"
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for shape_s in args.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        c, inner = shape[1], int(np.prod(shape[2:]))
        calls = args.calls if np.prod(shape) <= 8 * 2 ** 20 else args.large_calls
        for name in args.dtypes.split(","):
            dt = _dtype(name)
            x = (rng.standard_normal(shape) + 1).astype(dt)
            xg, zg, dyg = cp.asarray(x), cp.asarray(rng.standard_normal(shape).astype(dt)), cp.asarray(x[::-1].copy())
            sg, bg = cp.ones(c, np.float32), cp.zeros(c, np.float32)
            rmg, rvg = cp.zeros(c, np.float32), cp.ones(c, np.float32)
            e = xg.nbytes
            tt = torch_bn_times(timer, torch, F, x, name, calls) if torch is not None else {}
            if args.plans:
                for bwd in (False, True):
                    p = BC.plan(shape[0], c, inner, dt.itemsize, bwd, 132, M.smem_limits(dev.id))
                    print(f"# plan {shape_s} {name} {'bwd' if bwd else 'fwd'}: (CL, slots, smem) {p}")
            for op in args.ops.split(","):
                kind, passes, backward = OPS[op]
                z = zg if kind == "add" else None
                relu = kind is not None
                res = {}
                for label, enabled, force, nt in variants:
                    _setting(enabled, force, nt)
                    if force and BC.plan(shape[0], c, inner, dt.itemsize, backward, 132, M.smem_limits(dev.id),
                                         force=force) is None:
                        continue
                    y, m, i = K.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=z, relu=relu)
                    if backward:
                        def fn():
                            return K.backward(xg, dyg, sg, m, i, y=y if relu else None, want_dz=kind == "add")
                    else:
                        def fn():
                            return K.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=z, relu=relu)
                    res[label] = timer.ours(fn, calls)
                _setting(True)
                nbytes = passes * e

                def cell(ms):
                    if ms is None:
                        return f"{'-':>22}"
                    gbs = nbytes / (ms * 1e-3) / 1e9
                    return f"{ms:8.4f} ({gbs:5.0f}, {100 * gbs / bw:3.0f}%)"
                tms = tt.get((kind, backward))
                ratio = f"{tms / res['cluster']:6.2f}x" if tms else "     -"
                vs1 = f"{res['onepass'] / res['cluster']:6.2f}x"
                print(f"{shape_s:>14} {name:>8} {op:>8} | " + " | ".join(cell(res.get(v[0])) for v in variants)
                      + f" | {(f'{tms:8.4f}' if tms else '       -')} | {ratio} | {vs1}", flush=True)


if __name__ == "__main__":
    main()
