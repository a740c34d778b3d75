"""Session 7's filter-gradient A/B in ONE process: the implicit-GEMM filter gradient with the old one-level split-K
sum ("old": MINIDNN_WGRAD_SPLITK2's switch off) and the two-level sum ("new", SK2=1), beside PyTorch's
convolution_backward (weight only; cuDNN with cudnn.benchmark on), channels_last and NCHW, bf16 (minidnn writes the
float32 dw autocast's weights take, as in the training step) and float32 with TF32 on both sides.

GPU time alone: ``--reps`` calls captured in one CUDA graph (minidnn.cuda.CUDAGraph; torch.cuda.CUDAGraph), the graph
replayed and timed with events, µs per call, median of 3 windows (tools/conv_epilogue_bench.py's timers): the
numbers the training-step profile's kernel rows compare (run 2: /work/.device/2/seq.log).  Besides the times, the
grid [x, y, splits] of the launch and the largest |new - old| / max |old| (the two sums differ by reassociation only)
and |new - torch| / max |torch|.

Layers (batch 128, the two example models' rows of run 2): MobileNet-small's pointwise 16->32 32², 32->64 16²,
64->64 16², 64->128 8², its 3-channel 3x3 stem; ResNet-20's 3x3 16 32², 32 16², 64 8².

    PYTHONPATH=. python3 tools/conv_wgrad_s7.py [--reps 20] [--modes bf16,tf32] [--layouts NHWC,NCHW] [--only pw]

Device time: ~30 NVRTC compiles (3 tiles x 2 loaders x 2 maths x old/new) the first time, then ~1 s a row.
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
    from minidnn.backend.cuda import launch as L
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {L.sm_count()} SMs; "
          f"SPLITK2_MIN_SPLITS {K.SPLITK2_MIN_SPLITS}; µs per call (graph replay)")
    print(f"{'layer':24s} {'mode':5s} {'fmt':5s} {'grid':>14s} {'old':>8s} {'new':>8s} {'torch':>8s} "
          f"{'new/old':>8s} {'torch/new':>9s}  {'|new-old|':>9s} {'|new-th|':>9s}")
    rng = np.random.default_rng(0)
    for name, xs, ws, pad in LAYERS:
        if args.only and args.only not in name:
            continue
        for mode in args.modes.split(","):
            dt = "bfloat16" if mode == "bf16" else "float32"
            npdt = ml_dtypes.bfloat16 if mode == "bf16" else np.float32
            desc = ConvolutionDescriptor(pad, 1, 1, 1)
            p = make_problem("bench", xs, ws, desc, dt)
            x_h = rng.standard_normal(xs).astype(npdt)
            dy_h = rng.standard_normal(p.y_shape).astype(npdt)
            tf32 = mode == "tf32"
            for fmt in args.layouts.split(","):
                x, dy = cp.asarray(x_h), cp.asarray(dy_h)
                if fmt == "NHWC":
                    x = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
                    dy = cp.ascontiguousarray(dy.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
                out = cp.empty(p.w_shape, np.float32)
                odt = np.float32 if mode == "bf16" else None
                res, grid = {}, "?"
                for label, on in (("old", False), ("new", True)):
                    K.SPLITK2[0] = on
                    try:
                        def run():
                            K.implicit_backward_filter(p, x, dy, tf32, False, out=out, out_dtype=odt)
                        run()
                        cp.cuda.Device().synchronize()
                        res[label] = (_graph_timer(cp, run, args.reps), cp.asnumpy(out).astype(np.float64))
                    finally:
                        K.SPLITK2[0] = True
                rec = [k for k in K._plans if isinstance(k, tuple) and k[:2] == (2, p) and k[-1] == "splitk2"]
                if rec:
                    grid = "x".join(str(v) for v in K._plans[rec[-1]][0].dims[:3])
                t_torch, th = float("nan"), None
                if torch is not None:
                    tdt = torch.bfloat16 if mode == "bf16" else torch.float32
                    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
                    mf = torch.channels_last if fmt == "NHWC" else torch.contiguous_format
                    tx = torch.from_numpy(x_h.astype(np.float32)).to("cuda", tdt).contiguous(memory_format=mf)
                    tdy = torch.from_numpy(dy_h.astype(np.float32)).to("cuda", tdt).contiguous(memory_format=mf)
                    tw = torch.zeros(ws, device="cuda", dtype=tdt).contiguous(memory_format=mf)

                    def trun():
                        return torch.ops.aten.convolution_backward(tdy, tx, tw, None, [1, 1], [pad, pad], [1, 1],
                                                                   False, [0, 0], 1, [False, False, True])[2]
                    th = trun().double().cpu().numpy()
                    t_torch = _torch_graph_timer(torch, trun, args.reps)
                old, new = res["old"], res["new"]
                scale = np.abs(old[1]).max() + 1e-30
                d_old = np.abs(new[1] - old[1]).max() / scale
                d_th = np.abs(new[1] - th).max() / (np.abs(th).max() + 1e-30) if th is not None else float("nan")
                print(f"{name:24s} {mode:5s} {fmt:5s} {grid:>14s} {old[0]:8.1f} {new[0]:8.1f} {t_torch:8.1f} "
                      f"{new[0] / old[0]:8.2f} {t_torch / new[0]:9.2f}  {d_old:9.1e} {d_th:9.1e}", flush=True)


if __name__ == "__main__":
    main()
