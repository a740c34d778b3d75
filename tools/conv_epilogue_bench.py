"""convolution_bias_activation_forward on the GPU: the fused implicit-GEMM epilogue (one launch, y written once)
against the composition it replaced (conv -> add z -> add bias -> activation: conv_epilogue.ENABLED off), the plain
convolution alone (the floor the fused call should sit on), and PyTorch (cuDNN) conv2d with bias + add z + relu,
eager, from one run.  CUDA events, median of 3 windows, µs per call (host dispatch included: what a training
step's forward pays).  Layers: ResNet-20's 3x3 layers at batch 128, ResNet-18's 64-channel 56² and 256-channel 14²
at batch 32, the 1x1 256 -> 64 at 56²; NCHW and NHWC; fp32, TF32, bf16; with and without the residual z.

    PYTHONPATH=. python3 tools/conv_epilogue_bench.py [--reps 50] [--math fp32,tf32,bf16] [--fmt NCHW,NHWC]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--math", default="fp32,tf32,bf16")
    ap.add_argument("--fmt", default="NCHW,NHWC")
    args = ap.parse_args()
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
