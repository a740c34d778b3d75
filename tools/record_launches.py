"""Record the step kernels' launches on a machine without a GPU, under a fake CuPy (NumPy arrays, kernels compiled
and run never): which kernel, with which NVRTC options, grid, block and packed argument bytes (array pointers read
as 0), for a fixed scenario of pooling, activation, softmax, cross-entropy, layer/group norm, bias and dropout calls
(each twice: the remembered-call path too).  Two trees' records compared = "the launches did not change"
--time
prints the host time per primitive call (the fake's allocation and launch are near free: the Python layers only).

    python tools/record_launches.py TREE OUT.json           # record TREE's launches (TREE: a checkout's root)
    python tools/record_launches.py --compare A.json B.json  # differing launches
    python tools/record_launches.py --time TREE              # µs per call, small shapes
"""
import contextlib
import ctypes
import json
import sys
import time
import types

import numpy as np


def _fake_cupy():
    fake = types.ModuleType("fakecp")

    class _Mem:
        def __init__(self, a):
            self.ptr, self.device_id = 0, 0

    class ndarray(np.ndarray):
        @property
        def data(self):
            m = self.__dict__.get("_m")
            if m is None:
                m = self.__dict__["_m"] = _Mem(self)
            return m

        def get(self):
            return np.asarray(self)

    def w(a):
        return a.view(ndarray)

    class _Dev(contextlib.nullcontext):
        attributes = {"MultiProcessorCount": 132}

        def __init__(self, d=0):
            super().__init__()

    class _K:
        def __init__(self, name, opts):
            self.kernel = types.SimpleNamespace(ptr=name + str(tuple(opts)))
            self.max_dynamic_shared_size_bytes = 0

    class RawModule:
        def __init__(self, code, options):
            self.options = options

        def get_function(self, name):
            return _K(name, self.options)

    fake.ndarray, fake.RawModule = ndarray, RawModule
    fake.empty = lambda shape, dtype=np.float32: w(np.empty(shape, dtype))
    fake.zeros = lambda shape, dtype=np.float32: w(np.zeros(shape, dtype))
    fake.asarray = lambda a: w(np.array(a, order="C"))
    fake.ascontiguousarray = lambda a, dtype=None: w(np.ascontiguousarray(a, dtype=dtype))
    fake.empty_like = lambda a: w(np.empty_like(np.asarray(a)))
    fake.broadcast_to = lambda a, s: w(np.broadcast_to(a, s))
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0), Device=_Dev,
                                      get_current_stream=lambda: types.SimpleNamespace(ptr=0),
                                      driver=types.SimpleNamespace(launchKernel=lambda *a: None))
    return fake


def _install(tree):
    sys.path.insert(0, tree)
    fakecp = _fake_cupy()
    from minidnn.backend import devices as D
    D._cupy = fakecp
    D._try_cupy = lambda: fakecp
    D.cuda_device_count = lambda: 1
    from minidnn.backend.cuda import launch as L
    return fakecp, L


def record(tree, path):
    fakecp, L = _install(tree)
    sizes = {}
    init = L._Buffer.__init__

    def buffer_init(self, layout, offsets):
        init(self, layout, offsets)
        sizes[ctypes.addressof(self.data)] = layout.size
    L._Buffer.__init__ = buffer_init
    out = []

    def go(fn, dims, stream, params_ptr):
        base = ctypes.c_void_p.from_address(params_ptr).value
        out.append((str(fn), list(dims), ctypes.string_at(base, sizes[base]).hex()))
    L._go = go
    rng = np.random.default_rng(0)

    def arr(*s, dt=np.float32):
        return fakecp.asarray(rng.standard_normal(s).astype(dt))

    def cl(a):
        return fakecp.asarray(np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
    import minidnn.backend as B
    from minidnn.backend.cuda import norm_kernels as NK
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        for rep in range(2):
            x = arr(4, 16, 9, 9, dt=dt)
            for xx in (x, cl(x)):
                for mode in ("max", "average_count_exclude_padding"):
                    desc = B.PoolingDescriptor(mode, 3, 1, 2)
                    r = B.pooling_forward(None, desc, xx, return_argmax=mode == "max")
                    y, a = r if mode == "max" else (r, None)
                    B.pooling_backward(None, desc, y, y, xx, argmax=a)
                for m in ("relu", "sigmoid", "elu"):
                    d = B.ActivationDescriptor(m, 0.5)
                    yy = B.activation_forward(None, d, xx)
                    B.activation_backward(None, d, yy, yy, xx)
            xs = arr(8, 10, dt=dt)
            t = fakecp.asarray(np.arange(8) % 10)
            for algo in ("log", "accurate"):
                ys = B.softmax_forward(None, algo, "instance", xs)
                B.softmax_backward(None, algo, "instance", ys, xs)
            for red in ("mean", "none", "sum"):
                loss, lse, den = B.softmax_cross_entropy_forward(None, xs, t, reduction=red, label_smoothing=0.1)
                g = fakecp.asarray(np.ones(loss.shape, dt))
                B.softmax_cross_entropy_backward(None, xs, t, g, lse, den, reduction=red, label_smoothing=0.1)
            for shape, G in (((2, 6, 5, 5), 3), ((2, 64, 3, 3), 1), ((3, 4), 2)):
                xn = arr(*shape, dt=dt)
                sc = arr(shape[1], dt=dt)
                for s_ in (sc, None):
                    yn, m, i = B.group_normalization_forward(None, xn, G, s_, s_, 1e-5)
                    B.group_normalization_backward(None, xn, xn, G, s_, m, i)
            for shape, k in (((4, 7), 1), ((2, 3, 4, 5), 2), ((3, 5), 2)):
                xn = arr(*shape, dt=dt)
                sc = arr(*shape[len(shape)-k:], dt=dt)
                yn, m, i = B.layer_normalization_forward(None, xn, sc, sc, k, 1e-5)
                B.layer_normalization_backward(None, xn, xn, sc, m, i, k)
            yb = arr(2, 6, 4, 4, dt=dt)
            b = arr(6, dt=dt)
            NK.bias_add(yb, b, 1)
            NK.bias_add(yb, b, 1, 0.5, 2.0, out=yb)
            NK.bias_grad(yb, 1)
            NK.bias_grad(yb.reshape(32, 6), 1)
    from minidnn.backend.cuda import dropout_philox as DP
    for dt in (np.float32, np.float64):
        for shape in ((4, 5), (3, 16, 7, 7)):
            xd = arr(*shape, dt=dt)
            st = fakecp.zeros((2,), np.uint64)
            tk = fakecp.zeros((1,), np.uint32)
            for rep in range(2):
                yd, kd = DP.dropout_forward(xd, 0.3, 1 / 0.7, st, tk)
                assert kd.dtype == np.bool_ and kd.shape == xd.shape and yd.shape == xd.shape
    json.dump(out, open(path, "w"))
    print(f"{len(out)} launches recorded")


def compare(a, b):
    ra, rb = json.load(open(a)), json.load(open(b))
    bad = [(i, x, y) for i, (x, y) in enumerate(zip(ra, rb)) if x != y]
    print(f"{len(ra)} / {len(rb)} launches, {len(bad)} differ")
    for i, x, y in bad[:10]:
        print(i, x[0][:100], "|", y[0][:100], "dims same:", x[1] == y[1], "args same:", x[2] == y[2])
    return 1 if bad or len(ra) != len(rb) else 0


def time_calls(tree):
    fakecp, L = _install(tree)
    L._go = lambda fn, dims, stream, params_ptr: None
    import minidnn.backend as B
    rng = np.random.default_rng(0)

    def arr(*s):
        return fakecp.asarray(rng.standard_normal(s).astype(np.float32))
    x = arr(4, 16, 8, 8)
    d = B.ActivationDescriptor("relu")
    mp = B.PoolingDescriptor("max", 2)
    gap = B.PoolingDescriptor("average_count_include_padding", 8, 0, 8)
    y, a = B.pooling_forward(None, mp, x, return_argmax=True)
    yg = B.pooling_forward(None, gap, x)
    xs = arr(128, 10)
    t = fakecp.asarray(np.arange(128) % 10)
    loss, lse, den = B.softmax_cross_entropy_forward(None, xs, t)
    g1 = fakecp.asarray(np.ones((), np.float32))
    xl = arr(16, 256)
    sc = arr(256)
    ym, mm, ii = B.layer_normalization_forward(None, xl, sc, sc, 1, 1e-5)
    ops = {
     "relu fwd": lambda: B.activation_forward(None, d, x),
     "relu bwd": lambda: B.activation_backward(None, d, x, x, x),
     "maxpool fwd": lambda: B.pooling_forward(None, mp, x, return_argmax=True),
     "maxpool bwd": lambda: B.pooling_backward(None, mp, y, y, x, argmax=a),
     "gap fwd": lambda: B.pooling_forward(None, gap, x),
     "gap bwd": lambda: B.pooling_backward(None, gap, yg, yg, x),
     "log_softmax fwd": lambda: B.softmax_forward(None, "log", "instance", xs, axis=1),
     "ce fwd": lambda: B.softmax_cross_entropy_forward(None, xs, t),
     "ce bwd": lambda: B.softmax_cross_entropy_backward(None, xs, t, g1, lse, den),
     "layer norm fwd": lambda: B.layer_normalization_forward(None, xl, sc, sc, 1, 1e-5),
     "layer norm bwd": lambda: B.layer_normalization_backward(None, xl, xl, sc, mm, ii, 1),
    }
    for name, f in ops.items():
        for _ in range(50):
            f()
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000):
                f()
            best = min(best, (time.perf_counter() - t0) / 2000)
        print(f"{name:18s} {best * 1e6:7.2f} us")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    elif sys.argv[1] == "--time":
        time_calls(sys.argv[2])
    else:
        record(sys.argv[1], sys.argv[2])
