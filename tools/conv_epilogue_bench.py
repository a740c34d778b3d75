"""convolution_bias_activation_forward on the GPU: the fused implicit-GEMM epilogue (one launch, y written once)
against the composition it replaced (conv -> add z -> add bias -> activation: conv_epilogue.ENABLED off), the plain
convolution alone (the floor the fused call should sit on), and PyTorch (cuDNN) conv2d with bias + add z + relu,
eager, from one run.  CUDA events, median of 3 windows, µs per call (host dispatch included: what a training
step's forward pays).  Layers: ResNet-20's 3x3 layers at batch 128, ResNet-18's 64-channel 56² and 256-channel 14²
at batch 32, the 1x1 256 -> 64 at 56²; NCHW and NHWC; fp32, TF32, bf16; with and without the residual z.

    PYTHONPATH=. python3 tools/conv_epilogue_bench.py [--reps 50] [--math fp32,tf32,bf16] [--fmt NCHW,NHWC]

--bn times the batch-norm fusions instead, on ResNet-20's 3x3 layers and MobileNet's 1x1 layers at batch 128:
"stats" = convolution_bias_activation_forward(identity, stats=(sum, sumsq)) (one launch) vs its composition (conv,
then the sums) vs the plain convolution vs PyTorch's F.conv2d + torch.var_mean over (N, H, W); "bnrelu" =
scale_bias_activation_convolution_forward(relu, stats=...) (one launch) vs its composition (scale/shift, relu,
conv, sums) vs PyTorch's relu(addcmul(shift, x, scale)) + F.conv2d + var_mean.

    PYTHONPATH=. python3 tools/conv_epilogue_bench.py --bn [--reps 50] [--math fp32,tf32,bf16] [--fmt NCHW,NHWC]

--bn prints two groups of columns: "host incl." as above (back-to-back eager calls: the larger of host and GPU
time per call), and "graph": the same forms' GPU time alone, ``reps`` calls captured in one CUDA graph
(minidnn.cuda.CUDAGraph; torch.cuda.CUDAGraph for PyTorch), the graph replayed and timed with events, µs per call
(nan where a form cannot be captured).  The gap between the two is host time per call.
"""
import argparse
import statistics

import numpy as np

# name, x shape (channels-first), w shape, padding
LAYERS = [("r20 16->16 32² N128", (128, 16, 32, 32), (16, 16, 3, 3), 1),
          ("r20 32->32 16² N128", (128, 32, 16, 16), (32, 32, 3, 3), 1),
          ("r20 64->64 8² N128", (128, 64, 8, 8), (64, 64, 3, 3), 1),
          ("r18 64->64 56² N32", (32, 64, 56, 56), (64, 64, 3, 3), 1),
          ("r18 256->256 14² N32", (32, 256, 14, 14), (256, 256, 3, 3), 1),
          ("1x1 256->64 56² N32", (32, 256, 56, 56), (64, 256, 1, 1), 0)]


BN_LAYERS = [("r20 16->16 32² N128", (128, 16, 32, 32), (16, 16, 3, 3), 1),
             ("r20 32->32 16² N128", (128, 32, 16, 16), (32, 32, 3, 3), 1),
             ("r20 64->64 8² N128", (128, 64, 8, 8), (64, 64, 3, 3), 1),
             ("mbv1 1x1 64->128 16² N128", (128, 64, 16, 16), (128, 64, 1, 1), 0),
             ("mbv1 1x1 256->256 4² N128", (128, 256, 4, 4), (256, 256, 1, 1), 0)]


def _timer(cp, fn, reps):
    fn()
    cp.cuda.Device().synchronize()
    windows = []
    for _ in range(3):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        windows.append(cp.cuda.get_elapsed_time(start, stop) / reps * 1000)
    return statistics.median(windows)


def _graph_timer(cp, fn, reps):
    """µs per call of ``fn`` on the GPU alone: ``reps`` calls captured in one minidnn CUDA graph (after warm-up
    calls on the capture's side stream: kernels compiled, scratch buffers made), replayed; median of 3 windows.
    nan where the capture fails (a call that synchronises or a library call that refuses capture)."""
    import minidnn.cuda as mc
    try:
        side = mc.Stream()
        side.wait_stream(mc.current_stream())
        with mc.stream(side):
            for _ in range(3):
                fn()
        mc.current_stream().wait_stream(side)
        g = mc.CUDAGraph()
        with mc.graph(g, stream=side):          # the warmed-up stream: its scratch buffers exist already
            for _ in range(reps):
                fn()
    except Exception as e:      # noqa: BLE001 -- reported, the column reads nan
        print(f"    (graph capture failed: {type(e).__name__}: {str(e)[:120]})")
        return float("nan")
    g.replay()
    cp.cuda.Device().synchronize()
    windows = []
    for _ in range(3):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        windows.append(cp.cuda.get_elapsed_time(start, stop) / reps * 1000)
    g.reset()
    return statistics.median(windows)


def _torch_graph_timer(torch, fn, reps):
    """The same for PyTorch: ``reps`` calls of ``fn`` in one torch.cuda.CUDAGraph, replayed, µs per call."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            for _ in range(reps):
                fn()
    except Exception as e:      # noqa: BLE001
        print(f"    (torch graph capture failed: {type(e).__name__}: {str(e)[:120]})")
        return float("nan")
    g.replay()
    torch.cuda.synchronize()
    windows = []
    for _ in range(3):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        windows.append(start.elapsed_time(stop) / reps * 1000)
    return statistics.median(windows)


def bench_bn(args):
    """The batch-norm fusions (module docstring): us per call, fused / composition / plain conv / PyTorch."""
    import cupy as cp
    import ml_dtypes

    import minidnn.backend as B
    from minidnn.backend.cuda import conv_epilogue as E
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    dtypes = {"fp32": np.float32, "tf32": np.float32, "bf16": ml_dtypes.bfloat16}
    relu, ident = B.ActivationDescriptor("relu"), B.ActivationDescriptor("identity")
    print(f"{'':45s}| {'host incl. (back-to-back eager calls)':^35s} | {'graph (GPU time alone)':^35s} |")
    print(f"{'layer':26s} {'fmt':4s} {'math':4s} {'form':6s} | {'fused':>8s} {'compos.':>8s} {'conv':>8s} "
          f"{'torch':>8s} | {'fused':>8s} {'compos.':>8s} {'conv':>8s} {'torch':>8s} | fused/torch host, graph"
          "   (us per call)")
    for math in args.math.split(","):
        mt = B.MathType.TENSOR_OP if math == "tf32" else B.MathType.DEFAULT
        if torch is not None:
            torch.backends.cudnn.allow_tf32 = math == "tf32"
        h = B.Handle("cuda", math_type=mt)
        dt = dtypes[math]
        for fmt in args.fmt.split(","):
            for name, xs, ws, pad in BN_LAYERS:
                rng = np.random.default_rng(0)
                desc = B.ConvolutionDescriptor(pad, math_type=mt)
                x = rng.standard_normal(xs).astype(np.float32)
                w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
                sc = rng.uniform(0.5, 1.5, xs[1]).astype(np.float32)
                sh = rng.standard_normal(xs[1]).astype(np.float32)
                if fmt == "NHWC":
                    xm = np.moveaxis(x, 1, -1)
                    wm = cp.ascontiguousarray(cp.asarray(np.moveaxis(w, 1, -1).astype(dt))).transpose(0, 3, 1, 2)
                else:
                    xm, wm = x, cp.asarray(w.astype(dt))
                xd = cp.asarray(np.ascontiguousarray(xm).astype(dt))
                scd, shd = cp.asarray(sc), cp.asarray(sh)
                K = ws[0]
                stats = (cp.empty(K, cp.float32), cp.empty(K, cp.float32))
                forms = {
                    "stats": (lambda: B.convolution_bias_activation_forward(h, xd, wm, desc, None, None, 1.0, 0.0,
                                                                            None, ident, format=fmt, stats=stats),
                              lambda: B.fused_reason(h, xd, wm, desc, None, None, 1.0, 0.0, None, ident, format=fmt,
                                                     stats=stats)),
                    "bnrelu": (lambda: B.scale_bias_activation_convolution_forward(h, xd, scd, shd, relu, wm, desc,
                                                                                   format=fmt, stats=stats),
                               lambda: B.scale_bias_activation_convolution_reason(h, xd, scd, shd, relu, wm, desc,
                                                                                  format=fmt, stats=stats)),
                }
                def conv():
                    return B.convolution_forward(h, xd, wm, desc, format=fmt)
                t_conv = _timer(cp, conv, args.reps)
                g_conv = _graph_timer(cp, conv, args.reps)
                for form, (fused, reason) in forms.items():
                    why = reason()
                    t_fused = _timer(cp, fused, args.reps)
                    g_fused = _graph_timer(cp, fused, args.reps)
                    E.ENABLED[0] = False
                    try:
                        t_comp = _timer(cp, fused, args.reps)
                        g_comp = _graph_timer(cp, fused, args.reps)
                    finally:
                        E.ENABLED[0] = True
                    t_torch = g_torch = float("nan")
                    if torch is not None:
                        tdt = torch.bfloat16 if math == "bf16" else torch.float32
                        mf = torch.channels_last if fmt == "NHWC" else torch.contiguous_format
                        tx = torch.tensor(x, device="cuda", dtype=tdt).to(memory_format=mf)
                        tw = torch.tensor(w, device="cuda", dtype=tdt).to(memory_format=mf)
                        tsc = torch.tensor(sc, device="cuda", dtype=tdt).view(1, -1, 1, 1)
                        tsh = torch.tensor(sh, device="cuda", dtype=tdt).view(1, -1, 1, 1)
                        F = torch.nn.functional

                        def tfn(form=form):
                            xin = torch.relu(torch.addcmul(tsh, tx, tsc)) if form == "bnrelu" else tx
                            t = F.conv2d(xin, tw, padding=pad)
                            return torch.var_mean(t, dim=(0, 2, 3), unbiased=False)
                        t_torch = _timer(cp, tfn, args.reps)
                        g_torch = _torch_graph_timer(torch, tfn, args.reps)
                    print(f"{name:26s} {fmt:4s} {math:4s} {form:6s} | {t_fused:8.1f} {t_comp:8.1f} {t_conv:8.1f} "
                          f"{t_torch:8.1f} | {g_fused:8.1f} {g_comp:8.1f} {g_conv:8.1f} {g_torch:8.1f} | "
                          f"{t_fused / t_torch:5.2f}x {g_fused / g_torch:5.2f}x"
                          + ("" if why is None else f"   (composition: {why})"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--math", default="fp32,tf32,bf16")
    ap.add_argument("--fmt", default="NCHW,NHWC")
    ap.add_argument("--bn", action="store_true", help="the batch-norm fusions (statistics, bn-apply prologue)")
    args = ap.parse_args()
    if args.bn:
        return bench_bn(args)
    import cupy as cp
    import ml_dtypes

    import minidnn.backend as B
    from minidnn.backend.cuda import conv_epilogue as E
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    dtypes = {"fp32": np.float32, "tf32": np.float32, "bf16": ml_dtypes.bfloat16}
    act = B.ActivationDescriptor("relu")
    print(f"{'layer':22s} {'fmt':4s} {'math':4s} {'z':1s} | {'fused':>8s} {'compos.':>8s} {'conv':>8s} "
          f"{'torch':>8s} | fused/comp fused/torch   (us per call)")
    for math in args.math.split(","):
        mt = B.MathType.TENSOR_OP if math == "tf32" else B.MathType.DEFAULT
        if torch is not None:
            torch.backends.cudnn.allow_tf32 = math == "tf32"
        h = B.Handle("cuda", math_type=mt)
        for fmt in args.fmt.split(","):
            for name, xs, ws, pad in LAYERS:
                rng = np.random.default_rng(0)
                dt = dtypes[math]
                desc = B.ConvolutionDescriptor(pad, math_type=mt)
                x = rng.standard_normal(xs).astype(np.float32)
                w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
                b = rng.standard_normal(ws[0]).astype(np.float32)
                ys = (xs[0], ws[0], (xs[2] + 2 * pad - ws[2]) + 1, (xs[3] + 2 * pad - ws[3]) + 1)
                z = rng.standard_normal(ys).astype(np.float32)
                if fmt == "NHWC":
                    xm, zm = np.moveaxis(x, 1, -1), np.moveaxis(z, 1, -1)
                    wm = cp.ascontiguousarray(cp.asarray(np.moveaxis(w, 1, -1).astype(dt))).transpose(0, 3, 1, 2)
                else:
                    xm, zm, wm = x, z, cp.asarray(w.astype(dt))
                xd, zd, bd = (cp.asarray(np.ascontiguousarray(a).astype(dt)) for a in (xm, zm, b))
                for with_z in (False, True):
                    zz = zd if with_z else None

                    def fused():
                        return B.convolution_bias_activation_forward(h, xd, wm, desc, None, zz, 1.0, 1.0, bd, act,
                                                                     format=fmt)
                    why = B.fused_reason(h, xd, wm, desc, None, zz, 1.0, 1.0, bd, act, format=fmt)
                    t_fused = _timer(cp, fused, args.reps)
                    E.ENABLED[0] = False
                    t_comp = _timer(cp, fused, args.reps)
                    E.ENABLED[0] = True
                    t_conv = _timer(cp, lambda: B.convolution_forward(h, xd, wm, desc, format=fmt), args.reps)
                    t_torch = float("nan")
                    if torch is not None:
                        tdt = torch.bfloat16 if math == "bf16" else torch.float32
                        mf = torch.channels_last if fmt == "NHWC" else torch.contiguous_format
                        tx = torch.tensor(x, device="cuda", dtype=tdt).to(memory_format=mf)
                        tw = torch.tensor(w, device="cuda", dtype=tdt).to(memory_format=mf)
                        tb = torch.tensor(b, device="cuda", dtype=tdt)
                        tz = torch.tensor(z, device="cuda", dtype=tdt).to(memory_format=mf)
                        F = torch.nn.functional

                        def tfn():
                            t = F.conv2d(tx, tw, tb, padding=pad)
                            if with_z:
                                t = t.add_(tz)
                            return t.relu_()
                        t_torch = _timer(cp, tfn, args.reps)
                    print(f"{name:22s} {fmt:4s} {math:4s} {int(with_z):1d} | {t_fused:8.1f} {t_comp:8.1f} "
                          f"{t_conv:8.1f} {t_torch:8.1f} | {t_fused / t_comp:9.2f}x {t_fused / t_torch:9.2f}x"
                          + ("" if why is None else f"   (composition: {why})"))


if __name__ == "__main__":
    main()
