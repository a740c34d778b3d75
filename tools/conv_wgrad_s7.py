"""Session 7's convolution A/B in ONE process: the implicit-GEMM filter gradient with the old one-level split-K sum
("old": MINIDNN_WGRAD_SPLITK2 and MINIDNN_CONV_1X1_GEMM's switches off) and the two-level sum ("sk2", SK2=1), and
for the 1x1 layers on NHWC data the cublasLt product ("gemm", conv_pointwise) in all three directions, beside
PyTorch (conv2d / convolution_backward; cuDNN with cudnn.benchmark on), channels_last and NCHW, bf16 (minidnn
writes the float32 dw autocast's weights take, as in the training step) and float32 with TF32 on both sides.

GPU time alone: ``--reps`` calls captured in one CUDA graph (minidnn.cuda.CUDAGraph; torch.cuda.CUDAGraph), the graph
replayed and timed with events, µs per call, median of 3 windows (tools/conv_epilogue_bench.py's timers): the
numbers the training-step profile's kernel rows compare (run 2: /work/.device/2/seq.log).  Besides the times: the
filter gradient's grid [x, y, splits], "best/old" (our best variant over the old kernel), "torch/best" (> 1: ours
faster), the largest |variant - old| / max |old| (reassociation only) and |variant - torch| / max |torch|.

Layers (batch 128, the two example models' rows of run 2): MobileNet-small's pointwise 16->32 32², 32->64 16²,
64->64 16², 64->128 8², its 3-channel 3x3 stem; ResNet-20's 3x3 16 32², 32 16², 64 8².

    PYTHONPATH=. python3 tools/conv_wgrad_s7.py [--reps 20] [--modes bf16,tf32] [--layouts NHWC,NCHW] [--only pw]

Device time: ~40 NVRTC compiles the first time (tiles x loaders x maths x old/new), then ~1 s a row.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# name, x shape (channels-first), w shape, padding
LAYERS = [("mbs pw 16->32 32²", (128, 16, 32, 32), (32, 16, 1, 1), 0),
          ("mbs pw 32->64 16²", (128, 32, 16, 16), (64, 32, 1, 1), 0),
          ("mbs pw 64->64 16²", (128, 64, 16, 16), (64, 64, 1, 1), 0),
          ("mbs pw 64->128 8²", (128, 64, 8, 8), (128, 64, 1, 1), 0),
          ("mbs stem 3->16 3x3 32²", (128, 3, 32, 32), (16, 3, 3, 3), 1),
          ("r20 3x3 16 32²", (128, 16, 32, 32), (16, 16, 3, 3), 1),
          ("r20 3x3 32 16²", (128, 32, 16, 16), (32, 32, 3, 3), 1),
          ("r20 3x3 64 8²", (128, 64, 8, 8), (64, 64, 3, 3), 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--modes", default="bf16,tf32")
    ap.add_argument("--layouts", default="NHWC,NCHW")
    ap.add_argument("--only", default="", help="substring of the layer names to keep")
    args = ap.parse_args()
    import cupy as cp
    import ml_dtypes
    from conv_epilogue_bench import _graph_timer, _torch_graph_timer

    from minidnn.backend import ConvolutionDescriptor
    from minidnn.backend.conv_problem import make_problem
    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.backend.cuda import conv_pointwise as PW
    from minidnn.backend.cuda import launch as L
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {L.sm_count()} SMs; "
          f"SPLITK2_MIN_SPLITS {K.SPLITK2_MIN_SPLITS}; µs per call (graph replay)")
    print("old = the implicit-GEMM kernel as before (one-level split-K); sk2 = the kernel with the two-level split-K; "
          "gemm = the 1x1 cublasLt product (NHWC only); torch = cuDNN/cuBLAS via aten.convolution_backward / conv2d")
    print(f"{'layer':24s} {'dir':5s} {'mode':5s} {'fmt':5s} {'grid':>12s} {'old':>7s} {'sk2':>7s} {'gemm':>7s} "
          f"{'torch':>7s} {'best/old':>8s} {'torch/best':>10s}  {'|d| max':>8s} {'|ours-th|':>9s}")
    rng = np.random.default_rng(0)
    variants = {"old": (False, False), "sk2": (True, False), "gemm": (True, True)}
    for name, xs, ws, pad in LAYERS:
        if args.only and args.only not in name:
            continue
        pointwise = ws[2:] == (1, 1)
        for mode in args.modes.split(","):
            dt = "bfloat16" if mode == "bf16" else "float32"
            npdt = ml_dtypes.bfloat16 if mode == "bf16" else np.float32
            desc = ConvolutionDescriptor(pad, 1, 1, 1)
            p = make_problem("bench", xs, ws, desc, dt)
            x_h = rng.standard_normal(xs).astype(npdt)
            dy_h = rng.standard_normal(p.y_shape).astype(npdt)
            w_h = (rng.standard_normal(ws) * 0.1).astype(npdt)
            tf32 = mode == "tf32"
            for fmt in args.layouts.split(","):
                def dev(a):
                    a = cp.asarray(a)
                    return cp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if fmt == "NHWC" else a
                x, dy, w = dev(x_h), dev(dy_h), cp.asarray(w_h)
                for direction in ("wgrad",) + (("fwd", "dgrad") if pointwise else ()):
                    if direction == "wgrad":
                        out = cp.empty(p.w_shape, np.float32 if mode == "bf16" else npdt)
                        odt = np.float32 if mode == "bf16" else None

                        def run():
                            K.implicit_backward_filter(p, x, dy, tf32, False, out=out, out_dtype=odt)
                    elif direction == "fwd":
                        out = dev(np.zeros(p.y_shape, npdt))

                        def run():
                            K.implicit_forward(p, x, w, tf32, False, out=out)
                    else:
                        out = dev(np.zeros(p.x_shape, npdt))

                        def run():
                            K.implicit_backward_data(p, w, dy, tf32, False, out=out)
                    res = {}
                    for label, (sk2, gemm) in variants.items():
                        if label == "sk2" and direction != "wgrad" or label == "gemm" and not (pointwise and
                                                                                            fmt == "NHWC"):
                            continue
                        K.SPLITK2[0], PW.ENABLED[0] = sk2, gemm
                        try:
                            run()
                            cp.cuda.Device().synchronize()
                            res[label] = (_graph_timer(cp, run, args.reps), cp.asnumpy(out).astype(np.float64))
                        finally:
                            K.SPLITK2[0], PW.ENABLED[0] = True, True
                    grid = "-"
                    rec = [k for k in K._plans if isinstance(k, tuple) and k[:2] == (2, p) and k[-1] == "splitk2"]
                    if direction == "wgrad" and rec:
                        grid = "x".join(str(v) for v in K._plans[rec[-1]][0].dims[:3])
                    t_torch, th = float("nan"), None
                    if torch is not None:
                        tdt = torch.bfloat16 if mode == "bf16" else torch.float32
                        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
                        mf = torch.channels_last if fmt == "NHWC" else torch.contiguous_format

                        def tt(a):
                            return torch.from_numpy(a.astype(np.float32)).to("cuda", tdt).contiguous(memory_format=mf)
                        tx, tdy, tw = tt(x_h), tt(dy_h), tt(w_h)

                        def trun():
                            if direction == "fwd":
                                return torch.nn.functional.conv2d(tx, tw, None, 1, pad)
                            mask = [direction == "dgrad", direction == "wgrad", False]   # (input, weight, bias)
                            r = torch.ops.aten.convolution_backward(tdy, tx, tw, None, [1, 1], [pad, pad], [1, 1],
                                                                    False, [0, 0], 1, mask)
                            return r[0] if direction == "dgrad" else r[1]
                        th = trun().double().cpu().numpy()
                        t_torch = _torch_graph_timer(torch, trun, args.reps)
                    old = res["old"]
                    best = min(v[0] for v in res.values())
                    scale = np.abs(old[1]).max() + 1e-30
                    d_max = max(np.abs(v[1] - old[1]).max() for v in res.values()) / scale
                    d_th = max(np.abs(v[1] - th).max() for v in res.values()) / (np.abs(th).max() + 1e-30) \
                        if th is not None else float("nan")
                    cols = " ".join(f"{res[k][0]:7.1f}" if k in res else f"{'-':>7s}" for k in variants)
                    print(f"{name:24s} {direction:5s} {mode:5s} {fmt:5s} {grid:>12s} {cols} {t_torch:7.1f} "
                          f"{best / old[0]:8.2f} {t_torch / best:10.2f}  {d_max:8.1e} {d_th:9.1e}", flush=True)

if __name__ == "__main__":
    main()
