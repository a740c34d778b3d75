"""Session 20: the NCHW global average pooling forward, two (GAP_UNROLL 1) against four (2) 16-byte vectors in
flight a thread, in one process -- per shape and dtype one CUDA graph of `calls` calls per setting, replayed in
rounds with the order alternated; medians; PyTorch's adaptive_avg_pool2d(x, 1) graphed beside.

    PYTHONPATH=. python3 tools/gap_ab.py [--shapes 32x256x56x56,256x32x56x56,128x64x56x56] [--dtypes bfloat16,float32]
                                        [--rounds 9] [--calls 20]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import minidnn.backend as B  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import pool_kernels as P  # noqa: E402


def _graph(cp, fn, calls, keep):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        keep.append(fn())
        s.synchronize()
        s.begin_capture()
        for _ in range(calls):
            keep.append(fn())
        g = s.end_capture()
    return g, s


def _time(cp, g, s, calls):
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(s)
    g.launch(s)
    b.record(s)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / calls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x256x56x56,256x32x56x56,128x64x56x56")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    cp = _dev.require_cupy()
    try:
        import torch
    except ImportError:
        torch = None
    before = P.GAP_UNROLL
    print("# ms per call (GB/s of x read); gu1/gu2 > 1: four vectors in flight faster; torch beside")
    for shape_s in args.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        for name in args.dtypes.split(","):
            dt = np.dtype(__import__("ml_dtypes").bfloat16) if name == "bfloat16" else np.dtype(name)
            x = cp.asarray(np.random.default_rng(0).standard_normal(shape).astype(dt))
            desc = B.PoolingDescriptor("average_count_include_padding", shape[2:], 0, shape[2:])
            keep, graphs = [], []
            for gu in (1, 2):
                P.GAP_UNROLL = gu
                graphs.append(_graph(cp, lambda: B.pooling_forward(None, desc, x), args.calls, keep))
            tg = None
            if torch is not None:
                xt = torch.as_tensor(cp.asnumpy(x).astype(np.float32), device="cuda").to(
                    torch.bfloat16 if name == "bfloat16" else getattr(torch, name))
                tg = _graph_torch(torch, lambda: torch.nn.functional.adaptive_avg_pool2d(xt, 1), args.calls, keep)
            times = [[], [], []]
            for r in range(args.rounds):
                order = (0, 1) if r % 2 == 0 else (1, 0)
                for k in order:
                    times[k].append(_time(cp, *graphs[k], args.calls))
                if tg is not None:
                    times[2].append(_time_torch(torch, tg, args.calls))
            med = [statistics.median(t) if t else float("nan") for t in times]
            gbs = [x.nbytes / (m * 1e-3) / 1e9 for m in med]
            print(f"{shape_s:>14} {name:>8} | gu1 {med[0]:.4f} ({gbs[0]:.0f}) | gu2 {med[1]:.4f} ({gbs[1]:.0f}) | "
                  f"gu1/gu2 {med[0] / med[1]:.3f} | torch {med[2]:.4f} ({gbs[2]:.0f}) | torch/gu2 "
                  f"{med[2] / med[1]:.3f}", flush=True)
            del keep, graphs
    P.GAP_UNROLL = before


def _graph_torch(torch, fn, calls, keep):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        keep.append(fn())
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            keep.append(fn())
    return g


def _time_torch(torch, g, calls):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / calls


if __name__ == "__main__":
    main()
