"""Cross-entropy with spatial targets and softmax over the channel dim on the GPU, PyTorch beside (one process).

    python3 tools/spatial_ce_gpu.py [--dtypes float32,bfloat16] [--trials 5] [--shapes 32x21x128x128,...]
                                    [--sp-cc "0,0;32,24"]

Logits (N, C, H, W) against class indices (N, H, W) -- a segmentation loss, `F.cross_entropy(x, t)` on a
PyTorch-style model -- and `softmax` / `log_softmax(x, dim=1)`: the loss kernels' and softmax kernels' inner > 1
paths (backend/cuda/loss_kernels.py, softmax_kernels.py SOURCE_COLS).  Timing, traffic and % of copy as
bench/kernels_gpu.py (its Timer and copy measurement): every input read once, every output written once.
--sp-cc: an A/B of loss_kernels.SP_CC (the class count compiled in up to these C, forward,backward; "0,0": read at
run time) and, as an optional third field, SP_PAIR (1 / 0: two positions a thread or one): each setting's
cross-entropy rows in turn, the channel softmax rows once.
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
    ap.add_argument("--sp-cc", default="", help='loss_kernels.SP_CC settings to A/B, e.g. "0,0;32,24"')
    args = ap.parse_args(argv)
    from minidnn.backend.cuda import loss_kernels as lk
    settings = [tuple(int(v) for v in s.split(",")) for s in args.sp_cc.split(";") if s] or [lk.SP_CC]
    settings = [s if len(s) == 3 else s + (int(lk.SP_PAIR),) for s in settings]
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
            for k, setting in enumerate(settings):
                lk.SP_CC, lk.SP_PAIR = setting[:2], bool(setting[2])
                lk._plans.clear()
                for name, shp, (fn, tfn, nbytes), _ in cases.spatial(shape):      # bench/kernels_gpu.py's cases
                    if k and not name.startswith("spatial ce"):
                        continue
                    ms = timer.cupy(fn)
                    tms = timer.torch_(tfn) if tfn is not None else float("nan")
                    pct = nbytes / (ms * 1e-3) / 1e9 / bw * 100
                    label = name + (" " + ",".join(map(str, setting)) if len(settings) > 1 and "ce" in name else "")
                    print(f"{label:26s} {dtype_name:9s} {str(shp):20s} {nbytes / 1e6:7.1f} {ms:8.4f} {pct:5.0f}% "
                          f"{tms:9.4f} {tms / ms:7.2f}x")
                    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
