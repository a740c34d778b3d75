"""Host time per call of the layer-norm, group-norm, softmax / log-softmax and cross-entropy primitives (and the nn
calls above them) under tools/record_launches.py's fake CuPy: NumPy arrays, launches packed and never run, so a call
costs its Python alone (what back-to-back GPU timing measures wherever the host is slower than the kernel).  Shapes:
bench/kernels_gpu.py's large rows and the eager step's small ones ((128, 10) logits).

    python tools/norm_host_time.py TREE [--dtypes float32,bfloat16] [--only ln,gn,softmax,ce,nn] [--ab]

TREE: a checkout's root (time another tree by pointing at it: a before/after pair is two runs).  Columns: µs per
call (min of 7 rounds of N calls, CPU time of the process), and "kernel module" -- the kernel module's own call
(norm_kernels / softmax_kernels plan / loss_kernels) with the same arrays -- so "above" = call - kernel module is
the primitive's own layer.  --ab: the seen-call shortcut switched off and on in one process, alternated
(``normalization.SEEN_ON`` / ``softmax.SEEN_ON``; a tree without the switch times one column).
"""
# ruff: noqa: E402, E731  (the fake CuPy goes in before minidnn is imported; the cases are lambdas)
import argparse
import os
import sys
import time

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("tree")
ap.add_argument("--dtypes", default="float32,bfloat16")
ap.add_argument("--only", default="ln,gn,softmax,ce,nn")
ap.add_argument("--ab", action="store_true")
ap.add_argument("--calls", type=int, default=300)
a = ap.parse_args()
tree = os.path.abspath(a.tree)
sys.path.insert(0, os.path.join(tree, "tools"))
import record_launches as R

fakecp, L = R._install(tree)
L._go = lambda fn, dims, stream, params_ptr: None
R.numpy_fallback(fakecp)
_pool = {}
_np_empty = fakecp.empty


def _pooled_empty(shape, dtype=np.float32):
    """CuPy's memory pool stand-in: NumPy's allocation of a 64 MB array (mmap, page faults on first touch) costs
    ~15 µs a call, which a pooled cupy.empty does not; a fresh array object over a kept buffer per call."""
    k = (shape, dtype)
    b = _pool.get(k)
    if b is None:
        b = _pool[k] = _np_empty(shape, dtype)
    return b.view(fakecp.ndarray)


fakecp.empty = _pooled_empty
import ml_dtypes

import minidnn as mdn
import minidnn.backend as B
from minidnn.backend import normalization as _norm
from minidnn.backend import softmax as _sm
from minidnn.backend.cuda import loss_kernels as LK
from minidnn.backend.cuda import norm_kernels as NK
from minidnn.backend.cuda import softmax_kernels as SK

F = mdn.nn.functional
only = set(a.only.split(","))
switches = [m.SEEN_ON for m in (_norm, _sm) if hasattr(m, "SEEN_ON")]


def timed(f):
    for _ in range(20):
        f()
    best = 1e9
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(a.calls):
            f()
        best = min(best, (time.process_time() - t0) / a.calls)
    return best * 1e6


def arr(shape, dt):
    return fakecp.asarray(np.zeros(shape, np.float32).astype(dt)) if np.prod(shape) < 1 << 20 else \
        fakecp.empty(shape, dt)


def cases(dt):
    pdt = np.float32
    out = []
    if "ln" in only:
        for shape in ((16384, 1024), (128, 256)):
            x, dy = arr(shape, dt), arr(shape, dt)
            w, b = arr(shape[1:], pdt), arr(shape[1:], pdt)
            _, m, r = B.layer_normalization_forward(None, x, w, b, 1, 1e-5)
            out += [(f"layer norm fwd {shape}", lambda x=x, w=w, b=b: B.layer_normalization_forward(None, x, w, b, 1,
                                                                                                      1e-5),
                     lambda x=x, w=w, b=b: NK.layer_norm_forward(x, 1, w, b, 1e-5)),
                    (f"layer norm bwd {shape}",
                     lambda x=x, dy=dy, w=w, m=m, r=r: B.layer_normalization_backward(None, x, dy, w, m, r, 1),
                     lambda x=x, dy=dy, w=w, m=m, r=r: NK.layer_norm_backward(x, dy, 1, w, m, r))]
    if "gn" in only:
        for shape, g in (((128, 64, 56, 56), 32), ((2, 16, 8, 8), 4)):
            x, dy = arr(shape, dt), arr(shape, dt)
            w, b = arr(shape[1], pdt), arr(shape[1], pdt)
            _, m, r = B.group_normalization_forward(None, x, g, w, b, 1e-5)
            out += [(f"group norm G={g} fwd {shape}",
                     lambda x=x, w=w, b=b, g=g: B.group_normalization_forward(None, x, g, w, b, 1e-5),
                     lambda x=x, w=w, b=b, g=g: NK.group_norm_forward(x, g, w, b, 1e-5)),
                    (f"group norm G={g} bwd {shape}",
                     lambda x=x, dy=dy, w=w, m=m, r=r, g=g: B.group_normalization_backward(None, x, dy, g, w, m, r),
                     lambda x=x, dy=dy, w=w, m=m, r=r, g=g: NK.group_norm_backward(x, dy, g, w, m, r))]
    if "softmax" in only:
        for shape in ((16384, 1000), (128, 10)):
            x = arr(shape, dt)
            for algo in ("log", "accurate"):
                y = B.softmax_forward(None, algo, None, x, axis=1)
                pf, pb = SK.plan(x, (1,), algo.upper()), SK.plan(x, (1,), algo.upper(), True)
                out += [(f"{algo} softmax fwd {shape}", lambda x=x, algo=algo: B.softmax_forward(None, algo, None, x,
                                                                                                  axis=1),
                         lambda x=x, pf=pf: pf(x)),
                        (f"{algo} softmax bwd {shape}",
                         lambda x=x, y=y, algo=algo: B.softmax_backward(None, algo, None, y, x, axis=1),
                         lambda x=x, y=y, pb=pb: pb(y, x))]
    if "ce" in only:
        for shape, extra in (((16384, 1000), {}), ((128, 10), {}),
                             ((128, 10), dict(ignore_index=3, label_smoothing=0.1, reduction="sum", weight=True))):
            x = arr(shape, dt)
            t = fakecp.asarray(np.arange(shape[0]) % shape[1])
            kw = dict(extra)
            if kw.pop("weight", False):
                kw["weight"] = arr(shape[1], dt)
            loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, **kw)
            g = fakecp.asarray(np.ones(loss.shape, dt))
            lab = f"{shape}" + (" w,ii,ls,sum" if extra else "")
            ka = (kw.get("weight"), kw.get("ignore_index", -100), kw.get("label_smoothing", 0.0),
                  kw.get("reduction", "mean"))
            out += [(f"cross-entropy fwd {lab}", lambda x=x, t=t, kw=kw: B.softmax_cross_entropy_forward(None, x, t,
                                                                                                          **kw),
                     lambda x=x, t=t, ka=ka: LK.forward(x, t, *ka)),
                    (f"cross-entropy bwd {lab}",
                     lambda x=x, t=t, g=g, lse=lse, den=den, kw=kw: B.softmax_cross_entropy_backward(None, x, t, g,
                                                                                                      lse, den, **kw),
                     lambda x=x, t=t, g=g, lse=lse, den=den, ka=ka: LK.backward(x, t, ka[0], lse, den, g, *ka[1:]))]
    if "nn" in only:       # nn's calls; the layer below = the backend primitive with the same arrays
        from minidnn.nn._functions import loss as _loss
        from minidnn.nn._functions import norm as _nnorm
        mdt = {np.dtype(np.float32): mdn.float32}.get(np.dtype(dt), mdn.bfloat16)

        def cuda(shape, dtype=mdt):
            return mdn.zeros(*shape).to("cuda").to(dtype)

        def node_bwd(cls, y, gy):       # the node's first-order backward called directly: no engine, no leaf copy
            ctx = y.grad_fn

            def f():
                with mdn.no_grad():
                    cls.backward(ctx, gy)
            return f
        for shape, g in (((16384, 1024), 0), ((128, 256), 0), ((128, 64, 56, 56), 32), ((2, 16, 8, 8), 4)):
            xt, gy = cuda(shape).requires_grad_(), cuda(shape)
            pshape = shape[1:] if not g else shape[1:2]
            w, b = mdn.nn.Parameter(cuda(pshape)), mdn.nn.Parameter(cuda(pshape))
            if g:
                fwd = (lambda xt=xt, w=w, b=b, g=g: F.group_norm(xt, g, w, b))
                prim = (lambda xt=xt, w=w, b=b, g=g: B.group_normalization_forward(None, xt.data, g, w.data, b.data,
                                                                                   1e-5))
                y = fwd()
                m, r = y.grad_fn.stats
                primb = (lambda xt=xt, w=w, gy=gy, m=m, r=r, g=g: B.group_normalization_backward(
                    None, xt.data, gy.data, g, w.data, m, r))
                name = f"F.group_norm G={g}"
            else:
                fwd = (lambda xt=xt, w=w, b=b, n=shape[1]: F.layer_norm(xt, (n,), w, b))
                prim = (lambda xt=xt, w=w, b=b: B.layer_normalization_forward(None, xt.data, w.data, b.data, 1, 1e-5))
                y = fwd()
                m, r = y.grad_fn.stats
                primb = (lambda xt=xt, w=w, gy=gy, m=m, r=r: B.layer_normalization_backward(
                    None, xt.data, gy.data, w.data, m, r, 1))
                name = "F.layer_norm"
            out += [(f"{name} fwd {shape} {mdt}", fwd, prim),
                    (f"{name} node bwd {shape} {mdt}", node_bwd(_nnorm.NormWithSavedStats, y, gy), primb)]
        for shape in ((16384, 1000), (128, 10)):
            xt = cuda(shape).requires_grad_()
            t = mdn.zeros(shape[0], dtype=mdn.int64).to("cuda")
            loss = F.cross_entropy(xt, t)
            g1 = cuda(())
            lse, den = loss.grad_fn.fused[3:]
            out += [(f"F.cross_entropy fwd {shape} {mdt}", lambda xt=xt, t=t: F.cross_entropy(xt, t),
                     lambda xt=xt, t=t: B.softmax_cross_entropy_forward(None, xt.data, t.data)),
                    (f"F.cross_entropy node bwd {shape} {mdt}", node_bwd(_loss.CrossEntropy, loss, g1),
                     lambda xt=xt, t=t, g1=g1, lse=lse, den=den: B.softmax_cross_entropy_backward(
                         None, xt.data, t.data, g1.data, lse, den))]
            y = F.log_softmax(xt, 1)
            out += [(f"F.log_softmax fwd {shape} {mdt}", lambda xt=xt: F.log_softmax(xt, 1),
                     lambda xt=xt: B.softmax_forward(None, "log", None, xt.data, axis=1))]
    return out


def main():
    heads = ["off", "on"] if a.ab and switches else ["call"]
    print(f"{'case':46s} {'dtype':9s} " + " ".join(f"{h + ' us':>9s}" for h in heads)
          + f" {'kern mod':>9s} " + " ".join(f"{'above ' + h:>9s}" for h in heads), flush=True)
    for name in a.dtypes.split(","):
        dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        for label, call, kern in cases(dt):
            col = []
            for h in heads:
                for s in switches:
                    s[0] = h != "off"
                col.append(timed(call))
            km = timed(kern) if kern is not None else float("nan")
            print(f"{label:46s} {name:9s} " + " ".join(f"{c:9.2f}" for c in col) + f" {km:9.2f} "
                  + " ".join(f"{c - km:9.2f}" for c in col), flush=True)


main()
