"""GPU A/B of batch norm's twin (docs/fusion.md, "Batch norm's forward writes relu(y) too") on the training forward
of one BN -> ReLU pair, per shape, in one process:

    old   the settled training call (bn_kernels.training_call: bn_fwdc / bn_fwd1 / bnc_fwd1) + the ReLU kernel
    new   the twin call (bn_kernels.twin_call): the same kernel writing relu(y) too, one launch
    torch F.relu(F.batch_norm(x, ..., training=True)) beside (where PyTorch is installed)

    PYTHONPATH=. python3 tools/bn_twin_ab.py [--dtypes float32,bfloat16] [--reps 20] [--rounds 15] [--cl]

Per shape and dtype: GPU time a pair (CUDA-graph replays of `reps` pairs, CUDA events, the median of `rounds`
alternated rounds) and eager wall time a pair (200 pairs, one synchronisation: the host's launch cost where the
shape is small), and a bitwise check that the twin equals the ReLU kernel's output.  Shapes: ResNet-20's and
MobileNet-small's batch-norm tensors at b128, and one large tensor."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SHAPES = [(128, 16, 32, 32), (128, 32, 16, 16), (128, 64, 8, 8),           # ResNet-20
          (128, 32, 16, 16), (128, 64, 8, 8), (128, 128, 4, 4),           # MobileNet-small (some repeat)
          (128, 64, 56, 56)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cl", action="store_true", help="channels-last x (bn_nhwc's kernels)")
    a = ap.parse_args()
    import cupy as cp

    import minidnn.backend as B
    from minidnn.backend.cuda import bn_kernels as K
    from minidnn.backend.cuda.storage import param_dtype
    try:
        import torch
        import torch.nn.functional as TF
    except ImportError:
        torch = None
    relu = B.ActivationDescriptor(B.ActivationMode.RELU)
    print(f"{'shape':>20} {'dtype':>9} | GPU us/pair old  new  torch | eager us/pair old  new  | route")
    for dname in a.dtypes.split(","):
        if dname == "bfloat16":
            import ml_dtypes
            dtype = np.dtype(ml_dtypes.bfloat16)
        else:
            dtype = np.dtype(dname)
        for shape in dict.fromkeys(SHAPES):
            c = shape[1]
            rng = np.random.default_rng(0)
            x = cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))
            if a.cl:
                x = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
            pd = param_dtype(dtype)
            sc, bi = cp.ones(c, pd), cp.zeros(c, pd)
            rm, rv, cnt = cp.zeros(c, pd), cp.ones(c, pd), cp.zeros(1, np.int64)
            plain = K.training_call(x, sc, bi, 0.1, rm, rv, 1e-5, None, False, cnt)
            twin = K.twin_call(x, sc, bi, 0.1, rm, rv, 1e-5, cnt)
            if not twin:
                print(f"{str(shape):>20} {dname:>9} | no twin on this route")
                continue

            def old():     # (every output returned: the graph's arrays stay alive, none reused within it)
                out = plain(x, None, sc, bi, rm, rv, cnt)
                return (*out, B.activation_forward(None, relu, out[0]))

            def new():
                return twin(x, None, sc, bi, rm, rv, cnt)
            r_old, r_new = old()[3], new()
            if r_new is None:
                print(f"{str(shape):>20} {dname:>9} | the twin call declined")
                continue
            r_new = r_new[3]
            same = np.array_equal(*(cp.asnumpy(cp.ascontiguousarray(r)).view(np.uint8) for r in (r_old, r_new)))
            runs = {"old": _graph(cp, old, a.reps), "new": _graph(cp, new, a.reps)}
            if torch is not None:
                xt = torch.as_tensor(cp.asnumpy(x).astype(np.float32), device="cuda")
                xt = xt.to(torch.bfloat16 if dname == "bfloat16" else getattr(torch, dname))
                if a.cl:
                    xt = xt.contiguous(memory_format=torch.channels_last)
                w, b = torch.ones(c, device="cuda"), torch.zeros(c, device="cuda")
                trm, trv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
                runs["torch"] = _torch_graph(torch, lambda: TF.relu(TF.batch_norm(xt, trm, trv, w, b, True)), a.reps)
            gpu = {k: [] for k in runs}
            for i in range(a.rounds):
                keys = list(runs)
                for k in keys[i % len(keys):] + keys[:i % len(keys)]:
                    gpu[k].append(runs[k]() / a.reps * 1e3)
            eager = {k: _eager(cp, f) for k, f in (("old", old), ("new", new))}
            route = getattr(twin.launch1.kernel, "name", "?") if hasattr(twin, "launch1") else "bnc_fwd1"
            tor = f"{statistics.median(gpu['torch']):5.1f}" if "torch" in gpu else "  -  "
            print(f"{str(shape):>20} {dname:>9} | {statistics.median(gpu['old']):15.1f} "
                  f"{statistics.median(gpu['new']):4.1f} {tor} | {eager['old']:17.1f} {eager['new']:4.1f}  | "
                  f"{route} {'bitwise' if same else 'DIFFERS'}")


def _graph(cp, fn, reps):
    """ms of one replay of a graph of ``reps`` calls of fn (compiled and warmed up first)."""
    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        keep = [fn() for _ in range(reps)]
        g = s.end_capture()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()

    def run(_keep=keep):
        g.launch(s)
        e0.record(s)
        g.launch(s)
        e1.record(s)
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1)
    return run


def _torch_graph(torch, fn, reps):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        keep = [fn() for _ in range(reps)]
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(_keep=keep):
        g.replay()
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1)
    return run


def _eager(cp, fn, n=200):
    """µs of wall time a call over n eager calls and one synchronisation (best of 3)."""
    best = float("inf")
    for _ in range(3):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        cp.cuda.Device().synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


if __name__ == "__main__":
    main()
