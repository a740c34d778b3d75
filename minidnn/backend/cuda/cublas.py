"""Matrix products through cuBLAS called directly (ctypes), so that they can run inside CUDA-graph capture.

Shape legend (row-major, as NumPy/CuPy index them):  a (M, K) or (B, M, K)   b (K, N) or (B, K, N)   c = a @ b

Why not ``cupy.matmul``: CuPy 14 refuses cuBLAS calls while a stream is being captured.  Calling cublasGemmEx /
cublasGemmStridedBatchedEx works under capture once the handle is bound to the current stream and given a
workspace (cublasSetStream, then cublasSetWorkspace, in that order: setting the stream resets the workspace).  The
handle is our own, one per thread and device, so nothing else rebinds it: the two calls are made only when the
current stream changed since its last product (host time: a product is one ctypes call most of the time).  No kernel
of ours here: cuBLAS picks its own tiling; this file only maps row-major operands onto its column-major interface:

    c^T (N, M) = b^T (N, K) @ a^T (K, M)      a row-major C-contiguous (M, K) block *is* a column-major (K, M)
                                               one with leading dimension K; an F-ordered (transposed) view is
                                               the same matrix with the transpose flag set.
The math type is explicit: CUBLAS_COMPUTE_32F (strict fp32), _32F_FAST_TF32 (tensor cores, TF32) for float32,
_64F for float64, fp32 accumulation for float16/bfloat16 data; complex64/complex128 (the FFT convolutions'
frequency-domain products) with 32F/64F compute.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import launch as _launch

__all__ = ["supports", "gemm", "lt_product"]

_OP_N, _OP_T = 0, 1
_DATA = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2, np.dtype(np.complex64): 4,
         np.dtype(np.complex128): 5}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_GEMM_DEFAULT = -1
_WORKSPACE_BYTES = 32 << 20

_lib = None
_local = threading.local()     # .handles: device id -> [cuBLAS handle, its workspace (CuPy array), bound stream]


def _load():
    global _lib
    if _lib is not None:
        return _lib
    names = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    try:       # the exact file CuPy loaded, if the soname lookup fails
        with open("/proc/self/maps") as f:
            names += sorted({line.split()[-1] for line in f if "libcublas.so" in line and "Lt" not in line})
    except OSError:
        pass
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise RuntimeError("minidnn: could not load libcublas for graph-capturable matrix products")
    vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, sz]
    lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
    ll = ctypes.c_longlong
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll,
                                               i, i, i]
    _lib = lib
    return lib


def _data_type(dtype):
    t = _DATA.get(dtype, False)
    if t is False:                 # (dtype.name is a slow property: looked up once per dtype)
        t = _DATA[dtype] = 14 if dtype.name == "bfloat16" else None      # CUDA_R_16BF
    return t


def supports(a, b) -> bool:
    """Whether ``gemm`` takes these operands: 2-D @ 2-D or equal-batch 3-D @ 3-D, one floating dtype cuBLAS knows,
    every operand in a BLAS layout (C- or F-ordered last two axes)."""
    if a.dtype != b.dtype or _data_type(a.dtype) is None:
        return False
    if not ((a.ndim == b.ndim == 2) or (a.ndim == b.ndim == 3 and a.shape[0] == b.shape[0])):
        return False
    return _layout(a) is not None and _layout(b) is not None and a.shape[-1] == b.shape[-2]


def _layout(m):
    """(transpose flag, leading dimension) of a row-major matrix operand seen column-major, or None."""
    r, c = m.shape[-2:]
    s0, s1 = m.strides[-2] // m.itemsize, m.strides[-1] // m.itemsize
    if m.strides[-2] % m.itemsize or m.strides[-1] % m.itemsize:
        return None
    if s1 == 1 and s0 >= max(c, 1):
        return _OP_N, max(s0, 1)
    if s0 == 1 and s1 >= max(r, 1):
        return _OP_T, max(s1, 1)
    return None


def _bind(lib, cp):
    """This thread's handle of the current device, bound to the current stream and to its workspace."""
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    dev = cp.cuda.runtime.getDevice()
    entry = handles.get(dev)
    if entry is None:
        h = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        entry = handles[dev] = [h.value, cp.empty(_WORKSPACE_BYTES, dtype=np.uint8), None]
    stream = cp.cuda.get_current_stream().ptr
    if entry[2] != stream:
        _check(lib.cublasSetStream_v2(entry[0], stream), "cublasSetStream")
        _check(lib.cublasSetWorkspace_v2(entry[0], entry[1].data.ptr, _WORKSPACE_BYTES), "cublasSetWorkspace")
        entry[2] = stream
    return entry[0]


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"minidnn: {what} failed with cuBLAS status {status}")


def gemm(a, b, tf32=False, out_dtype=None):
    """a @ b for operands ``supports`` accepts, on the current stream (capturable); ``out_dtype`` float32 with
    float16/bfloat16 operands: the float32 sums written unrounded (C in CUDA_R_32F; autocast's weight gradients)."""
    cp = _launch.cupy()
    lib = _load()
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batched = a.ndim == 3
    wide = out_dtype is not None and np.dtype(out_dtype) != a.dtype
    if wide and (np.dtype(out_dtype) != np.float32 or a.itemsize != 2):
        raise ValueError(f"gemm: a {np.dtype(out_dtype)} product of {a.dtype} operands (only float32 of float16/"
                         "bfloat16)")
    out = cp.empty(((a.shape[0],) if batched else ()) + (M, N), dtype=out_dtype if wide else a.dtype)
    if out.size == 0:
        return out
    if K == 0:
        out.fill(0)
        return out
    dtype = a.dtype
    if dtype in (np.float64, np.complex128):
        compute, scalar = _COMPUTE_64F, ctypes.c_double
    else:
        compute = _COMPUTE_32F_FAST_TF32 if (tf32 and dtype == np.float32) else _COMPUTE_32F
        scalar = ctypes.c_float
    if dtype.kind == "c":       # complex products (the FFT convolutions): alpha, beta as (real, imaginary) pairs
        alpha, beta = (scalar * 2)(1.0, 0.0), (scalar * 2)(0.0, 0.0)
    else:
        alpha, beta = scalar(1.0), scalar(0.0)
    op_b, ld_b = _layout(b)       # first gemm operand: b^T
    op_a, ld_a = _layout(a)       # second: a^T
    dt = _data_type(dtype)
    ct = _data_type(out.dtype) if wide else dt
    handle = _bind(lib, cp)
    if not batched:
        _check(lib.cublasGemmEx(handle, op_b, op_a, N, M, K, ctypes.byref(alpha), b.data.ptr, dt, ld_b,
                                a.data.ptr, dt, ld_a, ctypes.byref(beta), out.data.ptr, ct, N, compute,
                                _GEMM_DEFAULT), "cublasGemmEx")
    else:
        item = a.itemsize
        _check(lib.cublasGemmStridedBatchedEx(
            handle, op_b, op_a, N, M, K, ctypes.byref(alpha), b.data.ptr, dt, ld_b, b.strides[0] // item,
            a.data.ptr, dt, ld_a, a.strides[0] // item, ctypes.byref(beta), out.data.ptr, ct, N, M * N,
            a.shape[0], compute, _GEMM_DEFAULT), "cublasGemmStridedBatchedEx")
    _launch.count_launches()
    return out


# ---- cublasLt: a seen product signature as one prepared call, with the bias epilogues ----------------------------
# A linear layer's forward is a product plus a bias add, and its backward's filter product plus the bias's column sum:
# cublasLt does each pair in one launch (epilogue BIAS: each row of c gets bias; BGRADB: the row sums of a, which for
# dw = g^T x are db).  A product signature (shapes, strides, dtypes, alignment, math, epilogue, device) is prepared
# once -- descriptors, layouts and the heuristic's first algorithm -- and later calls are one cublasLtMatmul through
# ctypes with the pointers and the current stream (capturable: the workspace is ours).  Where cublasLt offers no
# algorithm the signature remembers None and callers take gemm (+ their own bias kernels).  Switch: LT[0] = False, or
# MINIDNN_CUBLASLT=0 in the environment at import.
#   column-major view, as gemm's:  c^T (N, M) = op(b)^T (N, K) @ op(a)^T (K, M);  BIAS: length N, added along M;
#   BGRADB (Lt's B is our a): length M, the sum over K of a's rows.
LT = [__import__("os").environ.get("MINIDNN_CUBLASLT", "1") != "0"]
_EPI_DEFAULT, _EPI_BIAS, _EPI_BGRADB = 1, 4, 512
_lt_lib = None


def _load_lt():
    global _lt_lib
    if _lt_lib is not None:
        return _lt_lib
    names = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]
    try:
        with open("/proc/self/maps") as f:
            names += sorted({line.split()[-1] for line in f if "libcublasLt.so" in line})
    except OSError:
        pass
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise RuntimeError("minidnn: could not load libcublasLt")
    vp, i, sz, pv = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
    lib.cublasLtCreate.argtypes = [pv]
    lib.cublasLtMatmulDescCreate.argtypes = [pv, i, i]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [pv, i, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
    lib.cublasLtMatrixLayoutSetAttribute.argtypes = [vp, i, vp, sz]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [pv]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, i, vp, ctypes.POINTER(i)]
    lib.cublasLtMatmul.argtypes = [vp] * 14 + [sz, vp]
    _lt_lib = lib
    return lib


class _LtCall:
    """One prepared cublasLt product (per thread and device: its descriptor holds the bias pointer of the last
    call).  ``run(a, b, out, vec, stream)``: the row-major operands, c, the bias or row-sum vector (None without an
    epilogue), the stream's pointer."""
    __slots__ = ("lib", "handle", "desc", "la", "lb", "lc", "algo", "ws", "alpha", "beta", "vec", "keep", "out_dtype",
                 "matmul", "ptrs")

    def __init__(self, lib, handle, ws, M, N, K, op_b, ld_b, op_a, ld_a, dt, ct, compute, epilogue, batch=None,
                 align=None):
        vp, i = ctypes.c_void_p, ctypes.c_int
        self.lib, self.handle, self.ws, self.vec = lib, handle, ws, None
        d = vp()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(d), compute,
                                            1 if compute == _COMPUTE_64F else 0), "cublasLtMatmulDescCreate")
        for attr, value in ((3, op_b), (4, op_a), (7, epilogue)):      # TRANSA, TRANSB, EPILOGUE
            v = i(value)
            _check(lib.cublasLtMatmulDescSetAttribute(d, attr, ctypes.byref(v), 4), "cublasLtMatmulDescSetAttribute")
        self.desc = d.value

        def layout(rows, cols, ld, t):
            lay = vp()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), t, rows, cols, ld), "cublasLtMatrixLayoutCreate")
            return lay.value
        self.la = layout(N, K, ld_b, dt) if op_b == _OP_N else layout(K, N, ld_b, dt)
        self.lb = layout(K, M, ld_a, dt) if op_a == _OP_N else layout(M, K, ld_a, dt)
        self.lc = layout(N, M, N, ct)
        if batch is not None:           # (count, a's, b's, c's batch strides in elements; 0: the same matrix each)
            count, sa, sb, sc = batch
            for lay, stride in ((self.la, sb), (self.lb, sa), (self.lc, sc)):
                n, st = ctypes.c_int32(count), ctypes.c_int64(stride)
                _check(lib.cublasLtMatrixLayoutSetAttribute(lay, 5, ctypes.byref(n), 4), "cublasLt batch count")
                _check(lib.cublasLtMatrixLayoutSetAttribute(lay, 6, ctypes.byref(st), 8), "cublasLt batch stride")
        pref = vp()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        wsb = ctypes.c_size_t(_WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, 1, ctypes.byref(wsb), 8), "cublasLtMatmulPreference")
        if align is not None:           # the pointers' promised alignment (bytes; cublasLt assumes 256 without it)
            for attr in (5, 6, 7, 8):   # MIN_ALIGNMENT_A/B/C/D_BYTES
                v = ctypes.c_uint32(align)
                _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4),
                       "cublasLtMatmulPreference alignment")
        self.keep = (ctypes.c_ubyte * 96)()           # cublasLtMatmulHeuristicResult_t: the algo is its first 64 bytes
        found = i(0)
        st = lib.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, self.la, self.lb, self.lc, self.lc, pref, 1,
                                                self.keep, ctypes.byref(found))
        self.algo = ctypes.addressof(self.keep) if st == 0 and found.value > 0 else None
        scalar = ctypes.c_double if compute == _COMPUTE_64F else ctypes.c_float
        self.alpha, self.beta = scalar(1.0), scalar(0.0)
        # what every call passes unchanged, read once: alpha's and beta's addresses (their values may be rewritten
        # in place: conv_pointwise), the workspace's pointer (the state's array, alive as long as this call)
        self.matmul = lib.cublasLtMatmul
        self.ptrs = (ctypes.addressof(self.alpha), ctypes.addressof(self.beta), ws.data.ptr)

    def run(self, a, b, out, vec, stream):
        vec = 0 if vec is None else vec.data.ptr
        if vec != self.vec:
            v = ctypes.c_void_p(vec)
            _check(self.lib.cublasLtMatmulDescSetAttribute(self.desc, 8, ctypes.byref(v), 8),
                   "cublasLtMatmulDesc bias")
            self.vec = vec
        c = out.data.ptr
        lc = self.lc
        pa, pb, ws = self.ptrs
        st = self.matmul(self.handle, self.desc, pa, b.data.ptr, self.la, a.data.ptr, self.lb, pb, c, lc, c, lc,
                         self.algo, ws, _WORKSPACE_BYTES, stream)
        if st:
            _check(st, "cublasLtMatmul")


def _lt_state(cp):
    """This thread's (cublasLt handle, workspace, prepared calls) of the current device."""
    states = getattr(_local, "lt", None)
    if states is None:
        states = _local.lt = {}
    dev = cp.cuda.runtime.getDevice()
    st = states.get(dev)
    if st is None:
        lib = _load_lt()
        h = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
        st = states[dev] = (h.value, cp.empty(_WORKSPACE_BYTES, dtype=np.uint8), {})
    return st


def lt_product(a, b, out=None, out_dtype=None, tf32=False, bias=None, row_sums=None):
    """a (M, K) @ b (K, N) in one cublasLt call, or None where it cannot (the caller's other path; nothing ran):
    ``bias`` (N,) added to every row of the result (c's dtype); ``row_sums`` True or an (M,) array: also the sums of
    a's rows over K, written there (a fresh array for True) -- returned as (c, sums).  ``out``: a C-contiguous (M, N)
    array to write (beta 0); ``out_dtype`` float32 with float16/bfloat16 operands as ``gemm``.  2-D operands that
    ``supports`` takes, K >= 1, 16-byte aligned pointers or not (their own signature).  A signature's checks and
    preparation run once (``_lt_prepare``); later calls look it up by what the checks read."""
    if not LT[0]:
        return None
    cp = _launch._cp or _launch.cupy()
    ptrs = a.data.ptr | b.data.ptr      # (each vector's key written out: ~9 calls a LeNet step)
    ko = kb = kr = None
    if out is not None:
        ptrs |= out.data.ptr
        ko = (out.shape, out.strides, out.dtype)
    if bias is not None:
        ptrs |= bias.data.ptr
        kb = (bias.shape, bias.strides, bias.dtype)
    if row_sums is not None:
        if row_sums is True:
            kr = True
        else:
            ptrs |= row_sums.data.ptr
            kr = (row_sums.shape, row_sums.strides, row_sums.dtype)
    key = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, out_dtype, bool(tf32), ko, kb, kr,
           not ptrs & 15)
    handle, ws, calls = _lt_state(cp)
    call = calls.get(key, False)
    if call is False:
        if len(calls) >= 1024:
            calls.clear()
        call = calls[key] = _lt_prepare(a, b, out, out_dtype, tf32, bias, row_sums, handle, ws)
    if call is None:
        return None
    if out is None:
        out = cp.empty((a.shape[0], b.shape[1]), dtype=call.out_dtype)
    sums = cp.empty((a.shape[0],), dtype=call.out_dtype) if row_sums is True else row_sums
    call.run(a, b, out, bias if bias is not None else sums, cp.cuda.get_current_stream().ptr)
    _launch.count_launches()
    return out if row_sums is None else (out, sums)


def _lt_prepare(a, b, out, out_dtype, tf32, bias, row_sums, handle, ws, batch=None, strict=False, align=None):
    """The prepared call of a signature ``lt_product`` takes, or None.  ``batch`` (count, a's, b's, out's batch
    strides in elements): a strided-batched product of ``count`` (a, b, out) triples, a, b, out describing the first
    (conv_pointwise's NCHW 1x1 convolutions; no epilogue).  ``strict``: CUBLAS_COMPUTE_32F whatever ``tf32`` says.
    ``align``: the bytes every pointer of later calls is a multiple of (the heuristic then picks an algorithm that
    needs no more; default: cublasLt's 256)."""
    if a.ndim != 2 or b.ndim != 2 or (bias is not None and row_sums is not None) or not supports(a, b):
        return None
    M, K = a.shape
    N = b.shape[1]
    dtype = a.dtype
    ct_dtype = dtype if out_dtype is None else np.dtype(out_dtype)
    if M == 0 or N == 0 or K == 0 or (ct_dtype != dtype and (ct_dtype != np.float32 or a.itemsize != 2)) \
            or dtype.kind == "c":
        return None
    for v, shape in ((out, (M, N)), (bias, (N,)), (row_sums, (M,))):
        if v is not None and v is not True and (v.shape != shape or v.dtype != ct_dtype or not v.flags.c_contiguous):
            return None
    epilogue = _EPI_BIAS if bias is not None else _EPI_BGRADB if row_sums is not None else _EPI_DEFAULT
    op_b, ld_b = _layout(b)
    op_a, ld_a = _layout(a)
    compute = _COMPUTE_64F if dtype == np.float64 else \
        _COMPUTE_32F_FAST_TF32 if (tf32 and dtype == np.float32 and not strict) else _COMPUTE_32F
    if batch is not None and epilogue != _EPI_DEFAULT:
        return None
    call = _LtCall(_load_lt(), handle, ws, M, N, K, op_b, ld_b, op_a, ld_a, _data_type(dtype), _data_type(ct_dtype),
                   compute, epilogue, batch, align)
    if call.algo is None:
        return None
    call.out_dtype = ct_dtype
    return call
