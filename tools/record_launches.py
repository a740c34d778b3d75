"""Record the step kernels' launches on a machine without a GPU, under a fake CuPy (NumPy arrays, kernels compiled
and run never): which kernel, with which NVRTC options, grid, block and packed argument bytes (array pointers read
as 0), for a fixed scenario of pooling, activation, softmax, cross-entropy, layer/group norm, bias and dropout calls
(each twice: the remembered-call path too).  Two trees' records compared = "the launches did not change"
--time
prints the host time per primitive call (the fake's allocation and launch are near free: the Python layers only).
--conv records / times the convolution primitives' GPU path instead (the implicit-GEMM and direct kernels, the
NCHW staging copies; a copy made by CuPy is recorded as "cupy/cublas"): every conv layer of LeNet-5, ResNet-20 and
MobileNet-small at the benchmark's batch sizes through F.conv2d forward and backward, plus primitive calls over
layouts, dtypes, strides, groups and modes; --time --conv gives µs per primitive call and per conv layer step.

    python tools/record_launches.py TREE OUT.json           # record TREE's launches (TREE: a checkout's root)
    python tools/record_launches.py --compare A.json B.json  # differing launches
    python tools/record_launches.py --time TREE              # µs per call, small shapes
    python tools/record_launches.py --conv TREE OUT.json     # the convolutions' launches
    python tools/record_launches.py --time --conv TREE       # µs per convolution call
    python tools/record_launches.py --count-conv TREE        # conv launches per training step of each model
"""
import contextlib
import ctypes
import functools
import json
import math
import sys
import time
import types
import weakref

import numpy as np


def _fake_cupy():
    fake = types.ModuleType("fakecp")

    class _Mem:         # the array's real address: distinct arrays differ (the staging's reuse keys on it)
        device_id = 0

        def __init__(self, a):
            self.a = weakref.ref(a)

        @functools.cached_property
        def ptr(self):      # read when asked (~1 us): device_of reads only the device
            return self.a().__array_interface__["data"][0]

        def __add__(self, offset):      # CuPy's MemoryPointer arithmetic: (the array, a byte offset)
            return _Off(self.a(), offset)

        @property
        def mem(self):      # CuPy's pool memory object: the raw block at the root of every array's base chain
            a = self.a()    # (each array and view on it holds it, directly or through the arrays it views)
            while (b := _np_base(a)) is not None:
                a = b
            return a

    class _Off:
        def __init__(self, a, offset):
            self.a, self.offset = a, offset

    _np_base = np.ndarray.base.__get__

    class _Block:       # cupy.cuda.alloc's pointer: a raw block (a fake array owning its memory), 512-byte aligned
        def __init__(self, nbytes):
            self.raw = np.ndarray.__new__(ndarray, (nbytes + 512,), np.uint8)
            self.offset = -self.raw.ctypes.data % 512

    class ndarray(np.ndarray):
        def __new__(cls, shape, dtype=float, memptr=None, strides=None):    # cupy.ndarray(shape, dtype, memptr=,
            if isinstance(memptr, _Block):      # strides=): on cupy.cuda.alloc's block, which the array holds as a
                a = np.ndarray.__new__(cls, shape, dtype, buffer=memptr.raw, offset=memptr.offset,  # CuPy array holds
                                       strides=strides)                                             # its memptr:
                a.__dict__["_own"] = True       # its ``base`` reads None, as CuPy's (autograd's leaf-gradient steal
                return a                        # and _grad_dest read it; a view of it still has the block as base)
            a, off = (memptr.a(), 0) if isinstance(memptr, _Mem) else (memptr.a, memptr.offset)
            return np.ndarray.__new__(cls, shape, dtype, buffer=np.asarray(a).reshape(-1).view(np.uint8), offset=off,
                                      strides=strides)

        @property
        def base(self):
            return None if self.__dict__.get("_own") else _np_base(self)

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

    def memory_pointer(mem, offset):    # cupy.cuda.MemoryPointer(mem, offset) on a raw block (``_Mem.mem``)
        b = _Block.__new__(_Block)
        b.raw, b.offset = mem, -mem.ctypes.data % 512 + offset
        return b

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

    ndarray.__module__ = "cupy._core.core"    # what conv_register's GPU test reads of an array's type
    fake.ndarray, fake.RawModule = ndarray, RawModule
    fake.moveaxis = lambda a, source, destination: w(np.moveaxis(a, source, destination))
    fake.lib = np.lib           # the reference convolution (CuPy's own kernels, not recorded) computes in NumPy
    def empty(shape, dtype=np.float32):        # 512-byte aligned, as CuPy's memory pool's blocks
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = math.prod(shape) * dtype.itemsize
        # the raw block is a fake array owning its memory, so that views of the result (a transposed channels-last
        # allocation) have it as their base, as CuPy's views have the allocated array: one view of a block that
        # nothing else refers to, as _grad_dest expects of a sole view (a NumPy raw block stopped NumPy's collapse
        # of the base chain at the returned array: base.base was not None for any view of it)
        raw = np.ndarray.__new__(ndarray, (n + 512,), np.uint8)
        return np.ndarray.__new__(ndarray, shape, dtype, buffer=raw, offset=-raw.ctypes.data % 512)

    def zeros(shape, dtype=np.float32):
        a = empty(shape, dtype)
        np.asarray(a)[...] = 0       # (not the counted ndarray.fill: cupy.zeros is a memset)
        return a
    fake.empty, fake.zeros = empty, zeros
    fake.asarray = lambda a: w(np.array(a, order="C"))
    fake.ascontiguousarray = lambda a, dtype=None: w(np.ascontiguousarray(a, dtype=dtype))
    fake.empty_like = lambda a: w(np.empty_like(np.asarray(a)))
    fake.broadcast_to = lambda a, s: w(np.broadcast_to(a, s))
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0), Device=_Dev, alloc=_Block,
                                      MemoryPointer=memory_pointer,
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
    from minidnn.backend.cuda import cublas
    from minidnn.backend.cuda import launch as L

    def gemm(a, b, tf32=False, *args, **kwargs):      # a reference algorithm's cuBLAS product, in NumPy: one launch
        L.count_launches(1)
        return fakecp.asarray(np.matmul(a, b))
    cublas.gemm = gemm

    class LtCall:       # cublasLt's prepared product, in NumPy (its epilogues: BIAS, BGRADB): one launch
        def __init__(self, *args):
            self.epilogue, self.algo = args[13], 1
            self.batch = args[14] if len(args) > 14 else None
            self.alpha, self.beta = types.SimpleNamespace(value=1.0), types.SimpleNamespace(value=0.0)

        def run(self, a, b, out, vec, stream):
            if self.batch is not None or a.ndim != 2 or b.ndim != 2:
                return      # conv_pointwise's products, given the arrays' pointers only: counted, not done
            wide = a.itemsize == 2 and out.dtype == np.float32
            a_, b_ = (np.asarray(a, np.float32), np.asarray(b, np.float32)) if wide else (np.asarray(a), np.asarray(b))
            c = np.matmul(a_, b_)
            if self.epilogue == cublas._EPI_BIAS:
                c = c + np.asarray(vec)
            elif self.epilogue == cublas._EPI_BGRADB:
                np.asarray(vec)[...] = a_.sum(axis=1)
            np.asarray(out)[...] = c
    cublas._LtCall = LtCall
    cublas._load_lt = lambda: None
    cublas._lt_state = lambda cp: (0, None, cublas.__dict__.setdefault("_fake_lt_calls", {}))
    return fakecp, L


def record_to(L, recs):
    """Launches through ``L`` (launch.py, installed by ``_install``) are appended to ``recs`` as [kernel, grid and
    block dims] instead of running; launches counted by CuPy/cuBLAS primitives (``count_launches``) as
    ["cupy/cublas", []] each -- the recorder the fake-GPU launch tests share."""
    L._go = lambda fn, dims, stream, params_ptr: recs.append([str(fn), list(dims)])
    L.count_launches = lambda n=1: recs.extend([["cupy/cublas", []]] * n)


def numpy_fallback(fakecp):
    """CuPy functions the fake lacks (the reference algorithms', cupy.pad, ...) run as NumPy's, their array results
    viewed as fake arrays."""
    def fallback(name):
        f = getattr(np, name)
        if not callable(f):
            return f

        def g(*a, **k):
            r = f(*a, **k)
            return r.view(fakecp.ndarray) if isinstance(r, np.ndarray) else r
        return g
    fakecp.__getattr__ = fallback


def _zero_pointers(fakecp, L):
    """Launches record their array arguments as null pointers (addresses differ from run to run)."""
    zero = types.SimpleNamespace(ptr=0, device_id=0)

    def nulled(a):
        if not isinstance(a, fakecp.ndarray):
            return a
        v = a.view(fakecp.ndarray)
        v.__dict__["_m"] = zero
        return v
    prepared_call, launch = L.Prepared.__call__, L.launch
    L.Prepared.__call__ = lambda self, *arrays, stream=None: prepared_call(self, *map(nulled, arrays), stream=stream)
    L.launch = lambda kernel, grid, block, args, *rest, **kw: launch(kernel, grid, block, [nulled(a) for a in args],
                                                                     *rest, **kw)


def record_packed(L, out, other="cupy/cublas"):
    """From now on every kernel launch appends [kernel, grid, its packed argument bytes as hex] to ``out``, and
    every CuPy/cuBLAS operation (``launch.count_launches``) appends [other, [], ""]; argument buffers made before
    this call (warm-ups) are sized too.  Returns ``out``.  The tests' launch-record scripts and fake_gpu_step use it."""
    import gc
    sizes = {}
    init = L._Buffer.__init__

    def buffer_init(self, layout, offsets):
        init(self, layout, offsets)
        sizes[ctypes.addressof(self.data)] = layout.size
    L._Buffer.__init__ = buffer_init
    for obj in gc.get_objects():
        if type(obj) is L._Buffer:
            sizes[ctypes.addressof(obj.data)] = obj.struct.size

    def go(fn, dims, stream, params_ptr):
        base = ctypes.c_void_p.from_address(params_ptr).value
        out.append([str(fn), list(dims), ctypes.string_at(base, sizes[base]).hex()])
    L._go = go
    L.count_launches = lambda n=1: out.extend([[other, [], ""]] * n)
    return out


def record(tree, path):
    fakecp, L = _install(tree)
    _zero_pointers(fakecp, L)
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
            for reserve in DP.RESERVES:     # every reserve kind's forward and backward
                for rep in range(2):
                    yd, kd = DP.dropout_forward(xd, 0.3, 1 / 0.7, st, tk, reserve)
                    assert kd.shape == xd.shape and yd.shape == xd.shape
                    assert (getattr(kd, "dtype", None) == np.bool_) == (reserve == "mask")
                    DP.dropout_backward(yd, kd, 1 / 0.7)
    json.dump(out, open(path, "w"))
    print(f"{len(out)} launches recorded")


def compare(a, b):
    """Position by position; where the counts differ, the two records aligned (difflib) and what was removed or added,
    by kernel: e.g. the staging copies a shared staging no longer makes, every other launch byte-identical."""
    ra, rb = json.load(open(a)), json.load(open(b))
    bad = [(i, x, y) for i, (x, y) in enumerate(zip(ra, rb)) if x != y]
    print(f"{len(ra)} / {len(rb)} launches, {len(bad)} differ")
    if len(ra) != len(rb):
        import difflib
        ta, tb = [json.dumps(x) for x in ra], [json.dumps(x) for x in rb]
        sm = difflib.SequenceMatcher(a=ta, b=tb, autojunk=False)
        gone, new = {}, {}
        for op, i1, i2, j1, j2 in sm.get_opcodes():
            for x in ra[i1:i2] if op != "equal" else ():
                gone[x[0][:60]] = gone.get(x[0][:60], 0) + 1
            for x in rb[j1:j2] if op != "equal" else ():
                new[x[0][:60]] = new.get(x[0][:60], 0) + 1
        same = sum(i2 - i1 for op, i1, i2, _, _ in sm.get_opcodes() if op == "equal")
        print(f"aligned: {same} identical; only in {a}: {gone}; only in {b}: {new}")
        return 1
    for i, x, y in bad[:10]:
        print(i, x[0][:100], "|", y[0][:100], "dims same:", x[1] == y[1], "args same:", x[2] == y[2])
    return 1 if bad else 0


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


# ---- the convolutions' GPU path (--conv) -----------------------------------------------------------------------

def conv_layers(batch_scale=1):
    """[(model, layer name, input shape, weight shape, stride, padding, dilation, groups, needs dx)] of every Conv2d of
    the benchmark's models (bench/train_step.py's batch sizes), read from a CPU forward of one image."""
    import minidnn as mdn
    import minidnn.models as M
    from minidnn.nn import Conv2d
    configs = (("lenet5", M.LeNet5(10, 1, 32), (1, 32, 32), 64), ("resnet20", M.resnet20(10), (3, 32, 32), 128),
               ("mobilenet", M.MobileNetSmall(10, 3), (3, 32, 32), 128))
    layers = []
    for name, model, shape, batch in configs:
        seen = []
        for lname, m in model.named_modules():
            if isinstance(m, Conv2d):
                m.register_forward_pre_hook(lambda mod, inp, lname=lname: seen.append((lname, mod, inp[0].shape)))
        with mdn.no_grad():
            model(mdn.zeros((1, *shape)))
        for i, (lname, m, xs) in enumerate(seen):
            layers.append((name, lname, (batch * batch_scale, *xs[1:]), tuple(m.weight.shape), m.stride, m.padding,
                           m.dilation, m.groups, i > 0))     # the first conv's input (the images) needs no grad
    return layers


def _conv_step(fakecp, layer, dtype=np.float32, channels_last=False):
    """One conv layer's forward and first-order backward through F.conv2d (what a training step runs)."""
    from minidnn.nn import functional as F
    from minidnn.tensor import Tensor
    _, _, xs, ws, stride, padding, dilation, groups, needs_dx = layer
    xa = fakecp.empty(xs, dtype=dtype)
    if channels_last:
        n, c, h, w_ = xs
        xa = fakecp.empty((n, h, w_, c), dtype=dtype).transpose(0, 3, 1, 2)
    x = Tensor._from_array(xa)
    x.requires_grad = needs_dx
    w = Tensor._from_array(fakecp.zeros(ws, dtype=dtype))
    w.requires_grad = True
    y = F.conv2d(x, w, None, stride, padding, dilation, groups)
    y.backward(Tensor._from_array(fakecp.empty(y.shape, dtype=dtype) if not channels_last else
                                  fakecp.empty((y.shape[0], *y.shape[2:], y.shape[1]), dtype=dtype)
                                  .transpose(0, 3, 1, 2)))
    return y


def _conv_primitives(fakecp, B):
    """Primitive calls over layouts, dtypes, strides, groups, 1-D, CONVOLUTION mode and blending, each direction."""
    import ml_dtypes
    cases = [((128, 16, 32, 32), (16, 16, 3, 3), (1, 1), (1, 1), 1, np.float32, "NCHW"),
             ((128, 16, 32, 32), (32, 16, 3, 3), (1, 1), (2, 2), 1, np.float32, "NCHW"),
             ((128, 16, 32, 32), (16, 16, 3, 3), (1, 1), (1, 1), 1, np.float32, "NHWC"),
             ((64, 32, 16, 16), (64, 32, 1, 1), (0, 0), (1, 1), 1, ml_dtypes.bfloat16, "NCHW"),
             ((64, 64, 16, 16), (64, 16, 3, 3), (1, 1), (1, 1), 4, np.float32, "NCHW"),
             ((32, 16, 16, 16), (16, 16, 3, 3), (1, 1), (1, 1), 1, np.float16, "NCHW"),
             ((8, 6, 12, 12), (16, 6, 5, 5), (0, 0), (1, 1), 1, np.float32, "NCHW"),
             ((128, 32, 16, 16), (32, 1, 3, 3), (1, 1), (1, 1), 32, np.float32, "NCHW"),
             ((64, 16, 4096), (32, 16, 9), (4,), (1,), 1, np.float32, "NCHW")]
    for xs, ws, pad, stride, groups, dt, fmt in cases:
        nd = len(xs) - 2
        for mode in ("cross_correlation", "convolution"):
            desc = B.ConvolutionDescriptor(pad, stride, (1,) * nd, groups, mode=mode)
            x, w = fakecp.zeros(xs, dtype=dt), fakecp.zeros(ws, dtype=dt)
            if fmt == "NHWC":
                x = fakecp.zeros((xs[0], *xs[2:], xs[1]), dtype=dt)
            for _ in range(2):
                y = B.convolution_forward(None, x, w, desc, format=fmt)
                B.convolution_backward_data(None, w, y, desc, x.shape, format=fmt)
                B.convolution_backward_filter(None, x, y, desc, w.shape, format=fmt)
                B.convolution_forward(None, x, w, desc, alpha=0.5, beta=0.25, y=y, format=fmt)


def _filter_copies_as_one(out):
    """Record the filter's transposing copy for the VEC loader as one "filter copy" entry, whoever makes it (CuPy's
    strided copy up to round 6, the staging's transpose kernel since round 7: the same bits), so that two trees'
    records line up."""
    from minidnn.backend.cuda import conv_igemm as K
    call = getattr(K, "_Call", None)
    for owner, name in ((K, "_filter_copy"), (K, "_krsc_filter"), (K, "_crsk_filter"), (call, "_filter")):
        f = getattr(owner, name, None)
        if f is None:
            continue

        def marked(*args, _f=f):
            n = len(out)
            r = _f(*args)
            if len(out) > n:
                del out[n:]
                out.append(("filter copy", [], ""))
            return r
        setattr(owner, name, marked)


def record_conv(tree, path):
    """The convolutions' launches: every conv layer of the three models through F.conv2d forward + backward (NCHW
    and channels-last, fp32; each twice), then _conv_primitives."""
    fakecp, L = _install(tree)
    _zero_pointers(fakecp, L)
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
    L.count_launches = lambda n=1: out.extend([("cupy/cublas", [], "")] * n)
    _filter_copies_as_one(out)
    import minidnn.backend as B
    for layer in conv_layers():
        for cl in (False, True):
            for _ in range(2):
                _conv_step(fakecp, layer, channels_last=cl)
    _conv_primitives(fakecp, B)
    json.dump(out, open(path, "w"))
    print(f"{len(out)} launches recorded")


def count_conv(tree):
    """Convolution launches per training step of each model (the F.conv2d forward and backward of its conv layers,
    NCHW fp32, the benchmark's batch sizes), staged operands and filter copies apart."""
    fakecp, L = _install(tree)
    names = []
    L._go = lambda fn, dims, stream, params_ptr: names.append(str(fn).split("(")[0])
    L.count_launches = lambda n=1: names.extend(["cupy/cublas"] * n)
    per_model = {}
    for layer in conv_layers():
        _conv_step(fakecp, layer)                   # settle the plans; then count one step
        names.clear()
        _conv_step(fakecp, layer)
        tally = per_model.setdefault(layer[0], {})
        for n in names:
            tally[n] = tally.get(n, 0) + 1
    for model, tally in per_model.items():
        print(f"{model:10s} {sum(tally.values()):4d} conv launches per step: "
              + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))


def time_conv(tree):
    """µs of host time per convolution primitive call (and per F.conv2d forward + backward) on the GPU path, under
    the fake CuPy: small shapes with the staging's size rule set to 0, so the staged path runs without the fake's
    large allocations (the Python layers are those of ResNet-20's staged layers)."""
    fakecp, L = _install(tree)
    L._go = lambda fn, dims, stream, params_ptr: None
    import minidnn.backend as B
    from minidnn.backend.cuda import conv_igemm as K
    K.STAGE_MIN_MACS = 0
    x, w = fakecp.zeros((4, 16, 8, 8)), fakecp.zeros((16, 16, 3, 3))
    desc = B.ConvolutionDescriptor((1, 1))
    y = B.convolution_forward(None, x, w, desc)
    xd, wd = fakecp.zeros((4, 32, 8, 8)), fakecp.zeros((32, 1, 3, 3))
    dd = B.ConvolutionDescriptor((1, 1), groups=32)
    layer = ("t", "t", (4, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1, True)
    ops = {
        "forward (staged)": lambda: B.convolution_forward(None, x, w, desc),
        "backward data (staged)": lambda: B.convolution_backward_data(None, w, y, desc, x.shape),
        "backward filter (staged)": lambda: B.convolution_backward_filter(None, x, y, desc, w.shape),
        "depthwise forward": lambda: B.convolution_forward(None, xd, wd, dd),
        "F.conv2d fwd+bwd (staged)": lambda: _conv_step(fakecp, layer),
    }
    for name, f in ops.items():
        for _ in range(50):
            f()
        best = 1e9
        n = 400 if name.startswith("F.") else 2000
        for _ in range(7):      # CPU time of the process: a shared machine's waits for a core left out
            t0 = time.process_time()
            for _ in range(n):
                f()
            best = min(best, (time.process_time() - t0) / n)
        print(f"{name:28s} {best * 1e6:7.2f} us")


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[0] == "--compare":
        sys.exit(compare(argv[1], argv[2]))
    elif argv[0] == "--count-conv":
        count_conv(argv[1])
    elif argv[:2] == ["--time", "--conv"]:
        time_conv(argv[2])
    elif argv[0] == "--time":
        time_calls(argv[1])
    elif argv[0] == "--conv":
        record_conv(argv[1], argv[2])
    else:
        record(argv[0], argv[1])
