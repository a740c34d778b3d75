"""Activation and pooling kernels on more shapes than bench/kernels_gpu.py, PyTorch beside, and the launch choices the
act kernels leave open (issue 10: >= 70% of copy bandwidth and faster than PyTorch on large tensors).

    python tools/act_pool_sweep.py [--part sweep,shapes,ab] [--dtypes float32,bfloat16] [--trials 5]

sweep   act_kernels.CONFIG / CONFIG16 (16-bit data) (vectors per thread UNROLL, grid cap blocks_per_sm (0: one
        block per tile), HINT: 1 streaming loads, 2 streaming stores, 3 both) on ReLU forward/backward and GELU
        forward of (128, 64, 56, 56): the row to make each default (the 16-bit rows have extra hint candidates).
shapes  ReLU, max and average pooling 2x2/2 (and max 3x3/2 pad 1), forward and backward, NCHW and channels-last, on
        CNN activation shapes (odd sizes included), minidnn beside PyTorch (channels_last memory for NHWC rows).
ab      the vector pooling kernels against the previous ones (pool_kernels.V1 flipped in-process) on the large shape,
        and the backward alone under pool_kernels.VEC_BWD on (one dx vector a row per thread) and off.
Times: CUDA events around back-to-back calls, median of trials (bench/kernels_gpu.py's Timer); GB/s and %copy from
the op's compulsory traffic (bench/kernels_gpu.py's accounting: every input read once, every output written once,
the argmax at 1 byte per output) against the device copy bandwidth measured in the same run.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import minidnn.backend as B  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402


def _bench_module():
    spec = importlib.util.spec_from_file_location("kernels_gpu", ROOT / "bench" / "kernels_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Ctx:
    def __init__(self, cp, torch, timer, bw):
        self.cp, self.torch, self.timer, self.bw = cp, torch, timer, bw

    def row(self, name, dtype, shape, nbytes, fn, tfn=None):
        ms = self.timer.cupy(fn)
        tms = self.timer.torch_(tfn) if tfn is not None and self.torch is not None else None
        gbs = nbytes / (ms * 1e-3) / 1e9
        pct = 100 * gbs / self.bw
        tcol = f"{tms:9.4f} {tms / ms:7.2f}x" if tms is not None else " " * 18
        verdict = ("ok" if pct >= 70 and (tms is None or ms < tms) else
                   " ".join(([] if pct >= 70 else ["<70%"]) + ([] if tms is None or ms < tms else ["slower"])))
        print(f"{name:40s} {dtype:9s} {str(shape):20s} {nbytes / 1e6:7.1f} {ms:9.4f} {gbs:6.0f} {pct:5.0f}% {tcol} "
              f"{verdict}", flush=True)
        return ms


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _arrays(ctx, shape, dtname, cl=False):
    cp = ctx.cp
    dt = _dtype(dtname)
    x = cp.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    if dtname == "bfloat16":            # the top 16 bits of the float32 draw (bench/kernels_gpu.py's way)
        try:
            x = (x.view(np.uint32) >> 16).astype(np.uint16).view(dt)
        except Exception:
            x = cp.asarray(cp.asnumpy(x).astype(dt))
    else:
        x = x.astype(dt)
    if cl:
        x = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    xt = None
    if ctx.torch is not None:
        torch = ctx.torch
        xt = torch.randn(shape, device="cuda", dtype=getattr(torch, dtname))
        if cl:
            xt = xt.contiguous(memory_format=torch.channels_last)
    return x, xt


def _fresh():
    from minidnn.backend import activation, pooling
    from minidnn.backend.cuda import act_kernels, pool_kernels
    pooling._SEEN.clear()
    pool_kernels._plans.clear()
    activation._SEEN.clear()
    act_kernels._plans.clear()


def relu_rows(ctx, shape, dtname, cl=False, label="", mode="relu"):
    torch = ctx.torch
    desc = B.ActivationDescriptor(mode)
    x, xt = _arrays(ctx, shape, dtname, cl)
    dy, dyt = _arrays(ctx, shape, dtname, cl)
    e = x.size * x.itemsize
    tf = tb = None
    if torch is not None:
        f = torch.relu if mode == "relu" else torch.nn.functional.gelu

        def tf():
            return f(xt)
        if mode == "relu":
            def tb():
                return torch.ops.aten.threshold_backward(dyt, xt, 0.0)
    ctx.row(f"{mode} fwd{label}", dtname, shape, 2 * e, lambda: B.activation_forward(None, desc, x), tf)
    if mode == "relu":
        ctx.row(f"{mode} bwd{label}", dtname, shape, 3 * e, lambda: B.activation_backward(None, desc, None, dy, x), tb)


def pool_rows(ctx, shape, dtname, mode, window=2, padding=0, stride=2, cl=False, label="", fwd=True):
    torch = ctx.torch
    desc = B.PoolingDescriptor(mode, window, padding, stride)
    is_max = mode == "max"
    x, xt = _arrays(ctx, shape, dtname, cl)
    out = B.pooling_forward(None, desc, x, return_argmax=is_max)
    y, am = out if is_max else (out, None)
    dy = y                              # y's memory order (channels-last stays channels-last): the values do not matter
    tf = tb = None
    if torch is not None:
        F = torch.nn.functional
        xt.requires_grad_(True)

        def tf():
            return F.max_pool2d(xt, window, stride, padding) if is_max else F.avg_pool2d(xt, window, stride, padding)
        yt = tf()
        dyt = torch.randn_like(yt)

        def tb():
            return torch.autograd.grad(yt, xt, dyt, retain_graph=True)
    e, o = x.size * x.itemsize, y.size * y.itemsize
    extra = y.size if is_max else 0
    name = f"{'max' if is_max else 'avg'} pool {window}x{window}/{stride}" + (f" p{padding}" if padding else "") + \
        (" NHWC" if cl else "") + label
    if fwd:
        ctx.row(f"{name} fwd", dtname, shape, e + o + extra, lambda: B.pooling_forward(None, desc, x,
                                                                                       return_argmax=is_max), tf)
    ctx.row(f"{name} bwd", dtname, shape, o + extra + e, lambda: B.pooling_backward(None, desc, y, dy, x,
                                                                                    argmax=am), tb)


SWEEP = [  # (unroll, blocks_per_sm, hint)
    (1, 8, 0), (1, 0, 0), (2, 0, 0), (4, 0, 0), (4, 0, 1), (4, 0, 2), (4, 0, 3)]
SWEEP16 = [  # 16-bit: one or two vectors per thread with the streaming hints (the round-3 sweep's near-ties)
    (1, 8, 0), (1, 0, 0), (1, 0, 1), (1, 0, 2), (1, 0, 3), (2, 0, 0), (2, 0, 1), (2, 0, 2), (2, 0, 3), (4, 0, 0)]
SHAPES = [(128, 64, 56, 56), (128, 16, 32, 32), (64, 128, 28, 28), (32, 256, 14, 14), (128, 64, 55, 55),
          (256, 96, 27, 27), (64, 64, 112, 112)]


def part_sweep(ctx, dtypes):
    from minidnn.backend.cuda import act_kernels as AK
    print("act_kernels.CONFIG / CONFIG16 sweep (unroll, blocks_per_sm, hint); first row: the previous kernel "
          "(MINIDNN_ACT_V1); the default of each: " f"{AK.CONFIG} / {AK.CONFIG16}")
    for dtname in dtypes:
        cfg = AK.config(_dtype(dtname))
        saved = dict(cfg)
        for unroll, bps, hint in (SWEEP16 if cfg is AK.CONFIG16 else SWEEP):
            cfg.update(unroll=unroll, blocks_per_sm=bps, hint=hint)
            _fresh()
            label = f" u{unroll} b{bps} h{hint}"
            relu_rows(ctx, (128, 64, 56, 56), dtname, label=label)
            relu_rows(ctx, (128, 64, 56, 56), dtname, label=label, mode="gelu")
        cfg.update(saved)
    _fresh()


def part_shapes(ctx, dtypes):
    for dtname in dtypes:
        for shape in SHAPES:
            for cl in (False, True):
                if not cl:
                    relu_rows(ctx, shape, dtname)
                pool_rows(ctx, shape, dtname, "max", cl=cl)
                pool_rows(ctx, shape, dtname, "average_count_include_padding", cl=cl)
            if shape[2] >= 28:
                for cl in (False, True):
                    pool_rows(ctx, shape, dtname, "max", 3, 1, 2, cl=cl)
            ctx.cp.get_default_memory_pool().free_all_blocks()


def part_ab(ctx, dtypes):
    from minidnn.backend.cuda import pool_kernels as PK
    saved = PK.VEC_BWD
    for dtname in dtypes:
        for v1, vec_bwd in ((True, 0), (False, 0), (False, 1)):
            PK.V1, PK.VEC_BWD = v1, bool(vec_bwd)
            _fresh()
            print(f"pool_kernels.V1 = {v1}, VEC_BWD = {vec_bwd} ({'previous kernels' if v1 else 'vector kernels'})")
            for cl in (False, True):
                for mode in ("max", "average_count_include_padding"):
                    pool_rows(ctx, (128, 64, 56, 56), dtname, mode, cl=cl, label=f" vb{vec_bwd}" if vec_bwd else "",
                              fwd=not vec_bwd)
    PK.V1, PK.VEC_BWD = False, saved
    _fresh()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="sweep,shapes,ab")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args(argv)
    if not _dev.cuda_is_available():
        print("act_pool_sweep: no CUDA GPU with CuPy here; nothing to measure")
        return 0
    cp = _dev.require_cupy()
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    bench = _bench_module()
    timer = bench.Timer(cp, torch, args.trials)
    bw = bench.copy_bandwidth(cp, timer)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; copy bandwidth {bw:.0f} GB/s; "
          f"PyTorch {torch.__version__ if torch else 'absent'}")
    print(f"{'kernel':40s} {'dtype':9s} {'shape':20s} {'MB':>7s} {'ms':>9s} {'GB/s':>6s} {'%copy':>6s} "
          f"{'torch ms':>9s} {'vs torch':>8s} target")
    ctx = Ctx(cp, torch, timer, bw)
    dtypes = args.dtypes.split(",")
    for part in args.part.split(","):
        {"sweep": part_sweep, "shapes": part_shapes, "ab": part_ab}[part](ctx, dtypes)
    print("vs torch: PyTorch's time / minidnn's (> 1: minidnn faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
