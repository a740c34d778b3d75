"""Channels-last batch norm per call on the GPU: bn_nhwc's two routes beside bn_kernels' older channels-last kernels
and PyTorch's channels-last batch norm (issues 10 and 12).

    PYTHONPATH=. python3 tools/bn_nhwc_bench.py [--shapes 128x16x32x32,128x64x56x56] [--dtypes float32,bfloat16]
                                                [--calls 50] [--large-calls 10] [--replays 7] [--eager]

Per (shape, dtype, op) one row:
  new-1, new-2   bn_nhwc with ROUTE "one" (one launch per direction) and "two" (statistics/gradient + elementwise);
  old            bn_kernels with bn_nhwc switched off (its one-pass or two-launch channels-last kernels, as it routes);
  torch          F.batch_norm on a channels_last tensor, training (backward: torch.autograd.grad of that op alone);
each as ms per call: a CUDA graph of `calls` back-to-back calls (`large-calls` for tensors over 8 M values)
replayed `replays` times, median over calls -- device time without the host's launch cost (--eager: CUDA events
around eager loops instead).  GB/s and %copy: the op's compulsory traffic (forward: read x [and z], write y;
backward: read x, dy [and y], write dx [and dz]) over the time, against the device-to-device copy bandwidth measured
in the same run.  "fused" rows are bn + add + ReLU (no PyTorch counterpart in one op).
PyTorch is imported here only (the yardstick).  Expected run time on an H200: about 2 minutes (NVRTC compiles most).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

SHAPES = "128x16x32x32,128x32x16x16,128x64x8x8,128x64x56x56"


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _cl(cp, a):
    perm = (0, *range(2, a.ndim), 1)
    back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return cp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)


class Timer:
    def __init__(self, cp, torch, replays, eager):
        self.cp, self.torch, self.replays, self.eager = cp, torch, replays, eager

    def ours(self, fn, calls):
        cp = self.cp
        fn()
        cp.cuda.Device().synchronize()
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            fn()                                    # scratch buffers are kept per stream: warm this one
            s.synchronize()
            if not self.eager:
                g, capturing = None, False
                try:
                    s.begin_capture()
                    capturing = True
                    for _ in range(calls):
                        fn()
                    capturing = False
                    g = s.end_capture()
                except Exception as e:              # noqa: BLE001 -- report and fall back to eager timing
                    print(f"  (capture failed: {type(e).__name__}: {e}; eager)", file=sys.stderr)
                    if capturing:
                        try:
                            s.end_capture()
                        except Exception:           # noqa: BLE001
                            pass
                    g = None
            else:
                g = None
            times = []
            for _ in range(self.replays):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(s)
                if g is not None:
                    g.launch(s)
                else:
                    for _ in range(calls):
                        fn()
                b.record(s)
                b.synchronize()
                times.append(cp.cuda.get_elapsed_time(a, b) / calls)
        return statistics.median(times)

    def torch_op(self, fn, calls):
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = None
        if not self.eager:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(calls):
                        fn()
            except Exception as e:                  # noqa: BLE001
                print(f"  (torch capture failed: {type(e).__name__}: {e}; eager)", file=sys.stderr)
                g = None
                torch.cuda.synchronize()
        times = []
        for _ in range(self.replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            if g is not None:
                g.replay()
            else:
                for _ in range(calls):
                    fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / calls)
        return statistics.median(times)


def torch_bn_times(timer, torch, F, x, name, calls, channels_last=False, device="cuda"):
    """PyTorch's training batch norm on ``x`` (NumPy, NCHW values) as bn_onchip_bench / bn_cluster_bench time it:
    {(kind, backward): ms} for kind None (plain), "relu" and "add" (+ z, then ReLU); backward = the forward and
    torch.autograd.grad of it captured together, less the forward."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    c = x.shape[1]
    xt = torch.from_numpy(x.astype(np.float32)).to(device, getattr(torch, name)).contiguous(
        memory_format=fmt).requires_grad_()
    zt = torch.randn_like(xt).contiguous(memory_format=fmt)
    dyt = torch.randn_like(xt).contiguous(memory_format=fmt)
    wt = torch.ones(c, device=device, requires_grad=True)
    bt = torch.zeros(c, device=device, requires_grad=True)
    rmt, rvt = torch.zeros(c, device=device), torch.ones(c, device=device)

    def fwd(kind, xx, w, b):
        v = F.batch_norm(xx, rmt, rvt, w, b, True, 0.1, 1e-5)
        if kind == "add":
            v = v + zt
        return F.relu(v) if kind else v
    out = {}
    for kind in (None, "relu", "add"):
        f_ms = timer.torch_op(lambda: fwd(kind, xt.detach(), wt.detach(), bt.detach()), calls)
        both = timer.torch_op(lambda: torch.autograd.grad(fwd(kind, xt, wt, bt), (xt, wt, bt), dyt), calls)
        out[(kind, False)], out[(kind, True)] = f_ms, both - f_ms
    return out


def copy_bandwidth(cp):
    n = 256 * 2 ** 20
    a, b = cp.ones(n, np.uint8), cp.empty(n, np.uint8)
    t = []
    for _ in range(5):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        b.data.copy_from_device_async(a.data, n)
        e1.record()
        e1.synchronize()
        t.append(cp.cuda.get_elapsed_time(e0, e1))
    return 2 * n / (min(t) * 1e-3) / 1e9


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--large-calls", type=int, default=10)
    ap.add_argument("--replays", type=int, default=7)
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
    dev = cp.cuda.Device()
    print(f"# device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, copy bandwidth {bw:.0f} GB/s, "
          f"{'eager' if args.eager else 'CUDA graph'} timing; ms per call (GB/s of compulsory traffic, % of copy)")
    head = (f"{'shape':>16} {'dtype':>8} {'op':>9} | {'new-1':>22} | {'new-2':>22} | {'old':>8} | {'torch':>8} | "
            "best/torch")
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for shape_s in args.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        c = shape[1]
        calls = args.calls if np.prod(shape) <= 8 * 2 ** 20 else args.large_calls
        for name in args.dtypes.split(","):
            dt = _dtype(name)
            x = (rng.standard_normal(shape) + 1).astype(dt)
            xg, zg, dyg = _cl(cp, x), _cl(cp, rng.standard_normal(shape).astype(dt)), _cl(cp, x[::-1].copy())
            sg, bg = cp.ones(c, np.float32), cp.zeros(c, np.float32)
            rmg, rvg, cnt = cp.zeros(c, np.float32), cp.ones(c, np.float32), cp.zeros((1,), np.int64)
            e = xg.nbytes
            y, m, i = M.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, counter=cnt)
            yf, mf, i_f = M.forward_training(xg, sg, bg, 0.1, None, None, 1e-5, z=zg, relu=True)
            ops = {
                "fwd": (2 * e, lambda mod: mod.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, counter=cnt)),
                "bwd": (3 * e, lambda mod: mod.backward(xg, dyg, sg, m, i)),
                "fused fwd": (3 * e, lambda mod: mod.forward_training(xg, sg, bg, 0.1, None, None, 1e-5, z=zg,
                                                                      relu=True)),
                "fused bwd": (5 * e, lambda mod: mod.backward(xg, dyg, sg, mf, i_f, y=yf, want_dz=True)),
            }
            tt = {}
            if torch is not None:
                tdt = getattr(torch, name)
                xt = torch.from_numpy(x.astype(np.float32)).to("cuda", tdt).contiguous(
                    memory_format=torch.channels_last).requires_grad_()
                wt = torch.ones(c, device="cuda", requires_grad=True)
                bt = torch.zeros(c, device="cuda", requires_grad=True)
                rmt, rvt = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
                dyt = torch.randn_like(xt).contiguous(memory_format=torch.channels_last)
                tt["fwd"] = timer.torch_op(lambda: F.batch_norm(xt.detach(), rmt, rvt, wt.detach(), bt.detach(),
                                                                True, 0.1, 1e-5), calls)
                # backward: PyTorch cannot capture a backward of a graph recorded outside the capture, so forward +
                # backward are captured together and the forward's time is taken off
                both = timer.torch_op(lambda: torch.autograd.grad(F.batch_norm(xt, rmt, rvt, wt, bt, True, 0.1, 1e-5),
                                                                  (xt, wt, bt), dyt), calls)
                tt["bwd"] = both - tt["fwd"]
            for op, (nbytes, call) in ops.items():
                res = {}
                for label, route, enabled, mod in (("new-1", "one", True, M), ("new-2", "two", True, M),
                                                   ("old", M.ROUTE, False, K)):
                    saved = M.ROUTE, M.ENABLED
                    M.ROUTE, M.ENABLED = route, enabled
                    try:
                        res[label] = timer.ours(lambda: call(mod), calls)
                    finally:
                        M.ROUTE, M.ENABLED = saved

                def cell(ms):
                    gbs = nbytes / (ms * 1e-3) / 1e9
                    return f"{ms:8.4f} ({gbs:5.0f}, {100 * gbs / bw:3.0f}%)"
                tms = tt.get(op)
                best = min(res["new-1"], res["new-2"])
                ratio = f"{best / tms:6.2f}x" if tms else "     -"
                print(f"{shape_s:>16} {name:>8} {op:>9} | {cell(res['new-1'])} | {cell(res['new-2'])} | "
                      f"{res['old']:8.4f} | {(f'{tms:8.4f}' if tms else '       -')} | {ratio}", flush=True)


if __name__ == "__main__":
    main()
