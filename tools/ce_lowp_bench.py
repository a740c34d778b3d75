"""GPU timing of cross-entropy on 16-bit logits (session 11): the widened kernels (loss_kernels XSTORAGE: the 16-bit
logits read as float32, dlogits rounded at the store) against today's cast path (astype to float32, the float32
kernels, dlogits astype back) and PyTorch's autocast cross_entropy, forward + backward, per call (ms):
  - "kernels": CUDA-event time of back-to-back calls (device time, host hidden where it is shorter);
  - "host": wall time of the Python calls with a synchronize only at the end, divided by the calls (the host cost
    when it is the longer one: small shapes).

    python tools/ce_lowp_bench.py [--dtype bf16|fp16] [--reps 200] [--shapes 128x10,16384x1000,4096x32000]
"""
import argparse
import time

import numpy as np

import minidnn as mdn
import minidnn.backend as B
import minidnn.nn.functional as F
from minidnn.backend import devices as _dev
from minidnn.nn._functions import loss as _loss


def _time(fn, reps, cp):
    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    host = (time.perf_counter() - t0) / reps * 1e3
    return cp.cuda.get_elapsed_time(start, end) / reps, host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--shapes", default="128x10,2048x1000,16384x1000,4096x32000")
    a = ap.parse_args()
    cp = _dev.require_cupy()
    import ml_dtypes
    dtype = np.dtype(ml_dtypes.bfloat16) if a.dtype == "bf16" else np.dtype(np.float16)
    mdt = mdn.bfloat16 if a.dtype == "bf16" else mdn.float16
    try:
        import torch
        torch_ok = torch.cuda.is_available()
    except ImportError:
        torch_ok = False
    print(f"{'shape':>12} {'path':>26} {'kernels ms':>11} {'host ms':>9}")
    for s in a.shapes.split(","):
        n, c = map(int, s.split("x"))
        rng = np.random.default_rng(0)
        x = cp.asarray((rng.standard_normal((n, c)) * 3).astype(np.float32).astype(dtype))
        t = cp.asarray(rng.integers(0, c, n))
        g = cp.ones((), np.float32)

        def widened():
            loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, widen=True)
            B.softmax_cross_entropy_backward(None, x, t, g, lse, den, widen=True)

        def cast():
            x32 = x.astype(np.float32)
            loss, lse, den = B.softmax_cross_entropy_forward(None, x32, t)
            B.softmax_cross_entropy_backward(None, x32, t, g, lse, den).astype(dtype)

        xt = mdn.Tensor._from_array(x).requires_grad_()
        tt = mdn.Tensor._from_array(t)

        def nn_step(on):
            def step():
                _loss.WIDEN_ON[0] = on
                xt.grad = None
                with mdn.autocast("cuda", dtype=mdt):
                    loss = F.cross_entropy(xt, tt)
                loss.backward()
                _loss.WIDEN_ON[0] = True
            return step
        rows = [("primitive widened", widened), ("primitive cast+fp32+cast", cast),
                ("nn autocast widened", nn_step(True)), ("nn autocast cast", nn_step(False))]
        if torch_ok:
            tx = torch.as_tensor(x.astype(np.float32).get(), device="cuda").to(
                torch.bfloat16 if a.dtype == "bf16" else torch.float16).requires_grad_()
            tt_ = torch.as_tensor(t.get(), device="cuda")

            def torch_step():
                tx.grad = None
                with torch.autocast("cuda", dtype=tx.dtype):
                    loss = torch.nn.functional.cross_entropy(tx, tt_)
                loss.backward()
            rows.append(("torch autocast", torch_step))
        for name, fn in rows:
            k, h = _time(fn, a.reps, cp)
            print(f"{s:>12} {name:>26} {k:11.4f} {h:9.4f}")


if __name__ == "__main__":
    main()
