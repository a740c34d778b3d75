"""Cross-entropy with spatial targets and softmax over the channel dim on the GPU, PyTorch beside (one process).

    python3 tools/spatial_ce_gpu.py [--dtypes float32,bfloat16] [--trials 5] [--shapes 32x21x128x128,...]

Logits (N, C, H, W) against class indices (N, H, W) -- a segmentation loss, `F.cross_entropy(x, t)` on a
PyTorch-style model -- and `softmax` / `log_softmax(x, dim=1)`: the loss kernels' and softmax kernels' inner > 1
paths (backend/cuda/loss_kernels.py, softmax_kernels.py SOURCE_COLS).  Timing, traffic and % of copy as
bench/kernels_gpu.py (its Timer and copy measurement): every input read once, every output written once.
Eager timing (host cost in): an A/B of settings belongs to tools/ce_sp_ab.py / cols_ab.py (graph replays in
alternated rounds -- session 22 runs 3-4 had this script's one-pass figures move 1.0-1.6x with the settings' order).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels_gpu as K  # noqa: E402

SHAPES = [(32, 21, 128, 128), (16, 19, 256, 256), (8, 150, 64, 64), (64, 10, 64, 64)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--shapes", default="", help="NxCxHxW,... (default: the segmentation shapes above)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    gpu = K.open_gpu(args.trials, "spatial_ce_gpu")
    if gpu is None:
        return 0
    cp, torch, timer, bw = gpu
    print(f"copy bandwidth {bw:.0f} GB/s")
    head = (f"{'kernel':26s} {'dtype':9s} {'shape':20s} {'MB':>7s} {'ms':>8s} {'%copy':>6s} {'torch ms':>9s} "
            f"{'vs torch':>8s}")
    print(head)
    print("-" * len(head))
    for dtype_name in args.dtypes.split(","):
        cases = K.Cases(cp, torch, dtype_name)
        for shape in shapes:
            for name, shp, (fn, tfn, nbytes), _ in cases.spatial(shape):      # bench/kernels_gpu.py's cases
                ms = timer.cupy(fn)
                tms = timer.torch_(tfn) if tfn is not None else float("nan")
                pct = nbytes / (ms * 1e-3) / 1e9 / bw * 100
                print(f"{name:26s} {dtype_name:9s} {str(shp):20s} {nbytes / 1e6:7.1f} {ms:8.4f} {pct:5.0f}% "
                      f"{tms:9.4f} {tms / ms:7.2f}x")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
