"""Layer norm, group norm and NCHW bias gradient on the GPU: the routed kernels (NK.ROUTE: ln_fwd3 for 16-bit
layer norm forward, v2 elsewhere) vs v1 (NK.V1 switched in-process) vs an alternative ("alt": ln_fwd3 with its
parameters in registers, route "v3", for 16-bit layer norm forward (routed: "v3s", shared memory), gn_bwd2 at three
blocks an SM, route "v2", for 16-bit group norm backward (routed: "v2m4", four), with run-time flags "v2rt" for
other dtypes), vs PyTorch, on more shapes
than bench/kernels_gpu.py, with %copy (compulsory traffic over time, against a 256 MiB device copy; the bench's
accounting: fwd reads x and writes y, bwd reads x and dy and writes dx, bias grad reads dy).  Timing as
bench/kernels_gpu.py: CUDA events around back-to-back calls (~10 ms), divided by the calls, the median of
--trials (the host runs ahead: kernel time on large tensors; a single call between two events, as before, added
the launch's host time and the idle GPU's clock ramp, which is why the old log disagreed with the bench).
Forward rows add "kern ms": the routed plan's prepared launch alone, back-to-back into preallocated outputs (no
validation, no allocation: the kernel's own time), "host us": the host time of one full primitive call (200
calls without a sync), and "host off": the same with the seen-call shortcut off (normalization.SEEN_ON, every call
validated: the host time before docs/host_overhead.md round 18).  Back-to-back timing reports max(kernel, host)
per call: where "host us" reaches "kern ms", the ms column (and bench/kernels_gpu.py) measures the Python call, not
the kernel.

    python3 tools/norm_v2_bench.py [--dtypes float32,bfloat16] [--trials 5] [--quick]

--quick: bench/kernels_gpu.py's large shapes only (LN (16384, 1024), GN G=32 (128, 64, 56, 56), no bias rows).
"""
import argparse
import statistics

import numpy as np

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend import normalization as _norm
from minidnn.backend.cuda import norm_kernels as NK

LN = [(16384, 1024), (2048, 256), (8192, 4096), (4096, 768), (32768, 512)]
GN = [((128, 64, 56, 56), 32), ((128, 16, 32, 32), 4), ((32, 256, 28, 28), 32), ((64, 128, 14, 14), 8)]
BIAS = [(128, 64, 56, 56), (128, 16, 32, 32), (32, 256, 14, 14)]


def timed(cp, fn, trials, sync=None):
    """ms per call: events around back-to-back calls (~10 ms of them), the median of ``trials``."""
    sync = sync or cp.cuda.Device().synchronize
    fn()
    sync()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    fn()
    e.record()
    e.synchronize()
    reps = int(min(200, max(3, 10.0 / max(cp.cuda.get_elapsed_time(s, e), 1e-3))))
    out = []
    for _ in range(trials):
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        out.append(cp.cuda.get_elapsed_time(s, e) / reps)
    return statistics.median(out)


def versions(cp, make, trials, alt=None):
    """[routed ms, v1 ms, alt ms or nan]: make() -> the call, built after the switch (plans cleared); ``alt``: a
    NK.ROUTE entry (key, version) timed as the third column."""
    r = []
    for v1, route in [(False, None), (True, None)] + ([(False, alt)] if alt else []):
        saved = dict(NK.ROUTE)
        NK.V1 = v1
        if route is not None:
            NK.ROUTE[route[0]] = route[1]
        NK._plans.clear()
        try:
            r.append(timed(cp, make(), trials))
        finally:
            NK.ROUTE.clear()
            NK.ROUTE.update(saved)
            NK.V1 = False
            NK._plans.clear()
    return r + [float("nan")] * (3 - len(r))


def kernel_and_host(cp, make, x, scale, bias, trials):
    """(kernel ms, host us, host us with the seen-call shortcut off) of a forward call (see the docstring): the plan
    the routed call built, launched into preallocated outputs; and perf_counter around 200 full calls (the GPU runs
    behind them), the shortcut on and off alternated."""
    import time
    NK._plans.clear()
    fn = make()
    y, m, r = fn()
    go, _ = next(v for k, v in NK._plans.items() if k[0] == "fwd")
    kern = timed(cp, lambda: go(x, x if scale is None else scale, x if bias is None else bias, y, m, r), trials)
    cp.cuda.Device().synchronize()
    best = {True: float("inf"), False: float("inf")}
    try:
        for _ in range(trials):
            for on in (True, False):
                _norm.SEEN_ON[0] = on
                fn()
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                for _ in range(200):
                    fn()
                best[on] = min(best[on], (time.perf_counter() - t0) / 200 * 1e6)
                cp.cuda.Device().synchronize()
    finally:
        _norm.SEEN_ON[0] = True
    NK._plans.clear()
    return kern, best[True], best[False]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the bench's large shapes only")
    a = ap.parse_args()
    ln_shapes, gn_shapes, bias_shapes = (LN[:1], GN[:1], []) if a.quick else (LN, GN, BIAS)
    cp = _dev.require_cupy()
    try:
        import torch
    except ImportError:
        torch = None
    buf = cp.empty(256 << 20, np.uint8)
    dst = cp.empty_like(buf)
    copy_gbs = 2 * buf.nbytes / timed(cp, lambda: dst.__setitem__(Ellipsis, buf), a.trials) / 1e6
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; routes {NK.ROUTE}")
    print(f"{'case':44s} {'dtype':9s} {'ms':>8s} {'%copy':>6s} {'v1 ms':>8s} {'alt ms':>8s} {'torch ms':>9s} "
          f"{'vs torch':>8s} {'kern ms':>8s} {'host us':>8s} {'host off':>8s}")
    for name in a.dtypes.split(","):
        if name == "bfloat16":
            import ml_dtypes
            dtype = np.dtype(ml_dtypes.bfloat16)
        else:
            dtype = np.dtype(name)
        tdt = getattr(torch, name) if torch is not None else None
        pdt = np.float64 if name == "float64" else np.float32
        rng = np.random.default_rng(0)

        def arr(shape):
            return cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))

        tsync = torch.cuda.synchronize if torch is not None else None

        def row(label, shape, traffic, make, tfn, alt=None, fwd_args=None):
            v2, v1, va = versions(cp, make, a.trials, alt)
            tt = timed(cp, tfn, a.trials, tsync) if tfn is not None else float("nan")
            kern, host, host_off = kernel_and_host(cp, make, *fwd_args, a.trials) if fwd_args else (float("nan"),) * 3
            pct = traffic / (v2 * 1e-3) / (copy_gbs * 1e9) * 100
            print(f"{label + ' ' + str(shape):44s} {name:9s} {v2:8.4f} {pct:5.0f}% {v1:8.4f} {va:8.4f} {tt:9.4f} "
                  f"{tt / v2:7.2f}x {kern:8.4f} {host:8.1f} {host_off:8.1f}", flush=True)

        for shape in ln_shapes:
            x, dy = arr(shape), arr(shape)
            w, b = cp.ones(shape[1], pdt), cp.zeros(shape[1], pdt)
            e = x.nbytes
            tf = tb = None
            if torch is not None:
                xt = torch.randn(shape, device="cuda", dtype=tdt, requires_grad=True)
                wt = torch.ones(shape[1], device="cuda", dtype=tdt, requires_grad=True)
                bt = torch.zeros(shape[1], device="cuda", dtype=tdt, requires_grad=True)
                yt = torch.nn.functional.layer_norm(xt, (shape[1],), wt, bt, 1e-5)
                dyt = torch.randn_like(yt)

                def tf(xt=xt, wt=wt, bt=bt, c=shape[1]):
                    return torch.nn.functional.layer_norm(xt, (c,), wt, bt, 1e-5)

                def tb(yt=yt, xt=xt, wt=wt, bt=bt, dyt=dyt):
                    return torch.autograd.grad(yt, (xt, wt, bt), dyt, retain_graph=True)
            row("layer norm fwd", shape, 2 * e,
                lambda x=x, w=w, b=b: lambda: B.layer_normalization_forward(None, x, w, b, 1, 1e-5), tf,
                alt=("ln_fwd16", "v3") if dtype.itemsize == 2 else None, fwd_args=(x, w, b))

            def mk_ln_bwd(x=x, dy=dy, w=w, b=b):
                _, m, r = B.layer_normalization_forward(None, x, w, b, 1, 1e-5)
                return lambda: B.layer_normalization_backward(None, x, dy, w, m, r, 1)
            row("layer norm bwd", shape, 3 * e, mk_ln_bwd, tb)
        for shape, g in gn_shapes:
            x, dy = arr(shape), arr(shape)
            w, b = cp.ones(shape[1], pdt), cp.zeros(shape[1], pdt)
            e = x.nbytes
            tf = tb = None
            if torch is not None:
                xt = torch.randn(shape, device="cuda", dtype=tdt, requires_grad=True)
                wt = torch.ones(shape[1], device="cuda", dtype=tdt, requires_grad=True)
                bt = torch.zeros(shape[1], device="cuda", dtype=tdt, requires_grad=True)
                yt = torch.nn.functional.group_norm(xt, g, wt, bt, 1e-5)
                dyt = torch.randn_like(yt)

                def tf(xt=xt, wt=wt, bt=bt, g=g):
                    return torch.nn.functional.group_norm(xt, g, wt, bt, 1e-5)

                def tb(yt=yt, xt=xt, wt=wt, bt=bt, dyt=dyt):
                    return torch.autograd.grad(yt, (xt, wt, bt), dyt, retain_graph=True)
            row(f"group norm G={g} fwd", shape, 2 * e,
                lambda x=x, w=w, b=b, g=g: lambda: B.group_normalization_forward(None, x, g, w, b, 1e-5), tf,
                fwd_args=(x, w, b))

            def mk_gn_bwd(x=x, dy=dy, w=w, b=b, g=g):
                _, m, r = B.group_normalization_forward(None, x, g, w, b, 1e-5)
                return lambda: B.group_normalization_backward(None, x, dy, g, w, m, r)
            row(f"group norm G={g} bwd", shape, 3 * e, mk_gn_bwd, tb,
                alt=("gn_bwd16", "v2") if dtype.itemsize == 2 else ("gn_bwd", "v2rt"))
        for shape in bias_shapes:
            dy = arr(shape)
            tfn = None
            if torch is not None:
                dyt = torch.randn(shape, device="cuda", dtype=tdt)

                def tfn(dyt=dyt):
                    return dyt.sum((0, 2, 3))
            row("bias grad (conv)", shape, dy.nbytes,
                lambda dy=dy: lambda: B.convolution_backward_bias(None, dy), tfn)


if __name__ == "__main__":
    main()
