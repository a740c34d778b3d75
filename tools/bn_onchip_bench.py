"""Batch norm's one-launch kernels with and without the on-chip copy, beside PyTorch (issue 10), per call on the GPU.

    PYTHONPATH=. python3 tools/bn_onchip_bench.py [--shapes 128x64x56x56,128x16x32x32,32x256x14x14]
                                                  [--dtypes float32,bfloat16] [--layouts nchw,nhwc]
                                                  [--shares 0.3,1.5] [--calls 50] [--large-calls 10] [--replays 7]
                                                  [--bwd-shares 0.85] [--nhwc-sweep] [--plans]
                                                  [--eager]

Per (shape, dtype, layout, op) one row, ms per call (GB/s of compulsory traffic, % of copy):
  onchip       the default: bn_kernels.bn_fwd1 / bn_bwd1 (NCHW) or bn_nhwc.bnc_fwd1 / bnc_bwd1 (channels-last) with the
               on-chip copy (MINIDNN_BN_ONCHIP=1), NCHW rounds sized by shared memory + _ROUND_SHARE_ONCHIP of L2;
  L2=<s>       NCHW only: the same with _ROUND_SHARE_ONCHIP = s (MINIDNN_BN_L2_SHARE), to choose the default;
  bL2=<s>      NCHW backward only: the backward's own share (_ROUND_SHARE_ONCHIP_BWD, MINIDNN_BN_L2_SHARE_BWD; 0.85
               gives the large float32 backward 3 rounds over the whole grid instead of 4 over 256 of 264 blocks);
  off          MINIDNN_BN_ONCHIP=0: the kernels before the copy (the A/B);
  --nhwc-sweep channels-last only, beside the default (one launch, 2 blocks per SM, UNROLL 4, the copy): "two" (the
               two-launch route), "bps1" (1 block per SM: twice the slots a block, 255 registers), "u2" (UNROLL 2 row
               groups in flight), "bps1u8" (1 block per SM, UNROLL 8) -- bn_nhwc's module settings, so one GPU run
               picks the cheapest;
  --plans      each NCHW row's one-pass launch as settled (grid, blocks per channel, rounds, slots, dynamic shared
               memory, the driver's blocks per SM): what the planner chose on this GPU;
  --eager      time back-to-back eager calls instead of a graph (host time shows on small tensors, as in
               bench/kernels_gpu.py);
  torch        F.batch_norm (+ F.relu, + z) on a tensor of the same layout, training; backward: forward + backward
               captured together less the forward.
Ops: fwd / bwd of batch norm, bn + ReLU ("relu"), bn + add + ReLU ("add"); compulsory traffic as bench/kernels_gpu.py
counts it (fwd 2e / 2e / 3e, bwd 3e / 4e / 5e, e = x's bytes).  Timing: a CUDA graph of `calls` back-to-back calls
(`large-calls` over 8 M values) replayed `replays` times, median (tools/bn_nhwc_bench.py's Timer); copy bandwidth
measured in the same run.  Expected run time on an H100: about 90 s (NVRTC compiles most of it).
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
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

SHAPES = "128x64x56x56,128x16x32x32,32x256x14x14"
OPS = {"fwd": (None, 2, False), "bwd": (None, 3, True), "relu fwd": ("relu", 2, False),
       "relu bwd": ("relu", 4, True), "add fwd": ("add", 3, False), "add bwd": ("add", 5, True)}


# (UNROLL 8 at 2 blocks per SM spills: 272 bytes in the fused backward, nvcc sm_90 -- left out)
NHWC_SWEEP = [("two", {"ROUTE": "two"}), ("bps1", {"BPS": 1}), ("u2", {"UNROLL": 2}),
              ("bps1u8", {"BPS": 1, "UNROLL": 8})]
_NHWC_DEFAULTS = {k: getattr(M, k) for k in ("ROUTE", "BPS", "UNROLL")}


def _setting(onchip, share, nhwc=None, bwd_share=None):
    """Switch the copy on/off, the NCHW round share and bn_nhwc's settings (``nhwc``: a dict over its defaults), and
    drop every settled call and bn_nhwc kernel made under other settings."""
    K.ONCHIP = M.ONCHIP = onchip
    K._ROUND_SHARE_ONCHIP = share
    K._ROUND_SHARE_ONCHIP_BWD = bwd_share
    for k, v in {**_NHWC_DEFAULTS, **(nhwc or {})}.items():
        setattr(M, k, v)
    K._calls.clear()
    K._plans.clear()
    M._calls.clear()
    M._kernels.clear()


def _plan_text(call, dev):
    """grid/per/rounds/ks/dyn/occupancy of an NCHW settled call's one-pass launch ("2-launch" where it has none)."""
    p = getattr(call, "launch1", None)
    if p is None:
        return "2-launch"
    grid, smem = p.dims[0], p.dims[6]
    occ = K._resident_per_sm(p.kernel, smem)
    return f"grid {grid} smem {smem} occ {occ}/SM"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--shares", default="0.3,1.5",
                    help="extra NCHW L2 shares beside the default 0.5 (large fp32 forward: 0.3 -> 3 rounds, 1.5 -> 1)")
    ap.add_argument("--bwd-shares", default="0.85",
                    help="NCHW backward-only L2 shares (large fp32 backward: 0.5 -> 4 rounds, 0.85 -> 3)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--large-calls", type=int, default=10)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--nhwc-sweep", action="store_true")
    ap.add_argument("--plans", action="store_true")
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args(argv)
    cp = _dev.require_cupy()
    try:
        import torch
        import torch.nn.functional as F
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = F = None
    timer = Timer(cp, torch, args.replays, args.eager)
    bw = copy_bandwidth(cp)
    default_share, default_bwd = K._ROUND_SHARE_ONCHIP, K._ROUND_SHARE_ONCHIP_BWD
    shares = [float(s) for s in args.shares.split(",") if s]
    dev = cp.cuda.Device()
    print(f"# device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, copy bandwidth {bw:.0f} GB/s; "
          f"smem per SM / block {M.smem_limits(dev.id)}; default L2 share {default_share}")
    print("# ms per call (GB/s of compulsory traffic, % of copy); vs torch = torch / onchip (> 1: ours faster)")
    variants = [("onchip", True, default_share, None)] + [(f"L2={s}", True, s, None) for s in shares] + \
        [(f"bL2={s}", True, default_share, None) for s in args.bwd_shares.split(",") if s] + \
        [("off", False, default_share, None)]
    if args.nhwc_sweep:
        variants += [(label, True, default_share, over) for label, over in NHWC_SWEEP]
    head = f"{'shape':>14} {'dtype':>8} {'lay':>4} {'op':>8} | " + " | ".join(f"{v[0]:>22}" for v in variants) + \
        f" | {'torch':>8} | vs torch"
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for shape_s in args.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        c = shape[1]
        calls = args.calls if np.prod(shape) <= 8 * 2 ** 20 else args.large_calls
        for name in args.dtypes.split(","):
            dt = _dtype(name)
            for layout in args.layouts.split(","):
                def put(a):
                    if layout == "nchw":
                        return cp.asarray(a)
                    return cp.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
                x = (rng.standard_normal(shape) + 1).astype(dt)
                xg, zg, dyg = put(x), put(rng.standard_normal(shape).astype(dt)), put(x[::-1].copy())
                sg, bg = cp.ones(c, np.float32), cp.zeros(c, np.float32)
                rmg, rvg = cp.zeros(c, np.float32), cp.ones(c, np.float32)
                e = xg.nbytes
                tt = torch_bn_times(timer, torch, F, x, name, calls, layout == "nhwc") if torch is not None else {}
                for op in args.ops.split(","):
                    kind, passes, backward = OPS[op]
                    z = zg if kind == "add" else None
                    relu = kind is not None
                    res = {}
                    for label, onchip, share, over in variants:
                        bwd_only = label.startswith("bL2=")
                        if (label.startswith(("L2=", "bL2=")) and layout != "nchw") \
                                or (over and layout != "nhwc") or (bwd_only and not backward):
                            continue
                        _setting(onchip, share, over, float(label[4:]) if bwd_only else default_bwd)
                        y, m, i = K.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=z, relu=relu)
                        if backward:
                            def fn():
                                return K.backward(xg, dyg, sg, m, i, y=y if relu else None, want_dz=kind == "add")
                        else:
                            def fn():
                                return K.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=z, relu=relu)
                        res[label] = timer.ours(fn, calls)
                        if args.plans and (label == "onchip" or bwd_only) and layout == "nchw":
                            call = K.backward_call(xg, dyg, sg, m, y if relu else None, kind == "add") if backward \
                                else K.training_call(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z, relu)
                            geo = K.onepass_plan(shape[0], c, int(np.prod(shape[2:])), dt.itemsize, backward, dev.id)
                            print(f"# plan {shape_s} {name} {op} {label}: {geo}; launch {_plan_text(call, dev.id)}")
                    _setting(True, default_share, bwd_share=default_bwd)
                    nbytes = passes * e

                    def cell(ms):
                        if ms is None:
                            return f"{'-':>22}"
                        gbs = nbytes / (ms * 1e-3) / 1e9
                        return f"{ms:8.4f} ({gbs:5.0f}, {100 * gbs / bw:3.0f}%)"
                    tms = tt.get((kind, backward))
                    ratio = f"{tms / res['onchip']:6.2f}x" if tms else "     -"
                    print(f"{shape_s:>14} {name:>8} {layout:>4} {op:>8} | "
                          + " | ".join(cell(res.get(v[0])) for v in variants)
                          + f" | {(f'{tms:8.4f}' if tms else '       -')} | {ratio}", flush=True)


if __name__ == "__main__":
    main()
