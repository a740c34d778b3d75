"""Host time of one small matrix product on the GPU, by layer of the call (issue 10: LeNet's eager step is host-bound,
and its 9 products a step cost ~30 µs each under cProfile in session 6's run 2).

    python tools/gemm_host.py [--calls 100]

For LeNet's linear shapes (batch 64), µs of host wall time per call (the fastest of 15 bursts of back-to-back calls,
short enough that the launch queue never fills):
  minidnn gemm      backend/cuda/cublas.gemm: output allocation, layout checks, one cublasGemmEx (ctypes)
  minidnn lt        backend/cuda/cublas.lt_product: the same through a prepared cublasLt call; "+bias" with the
                    bias epilogue, "+sums" the filter gradient's product g^T x with the row sums (db) epilogue
  raw GemmEx        the same cublasGemmEx call alone, its arguments prepared once
  cupy.empty        the output allocation alone
  raw LtMatmul      cublasLtMatmul with descriptors and an algorithm chosen once (heuristic), no epilogue
  raw Lt bias       the same with CUBLASLT_EPILOGUE_BIAS (bias add fused into the product)
  torch mm / linear torch.mm and torch.nn.functional.linear (the yardstick)
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from minidnn.backend.cuda import cublas as C  # noqa: E402

vp, ci, sz, u64, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64


def per_call(fn, calls, rounds=15):
    """Host µs per call: the fastest of ``rounds`` bursts of ``calls`` calls, each burst short enough that the
    launch queue never fills (so the GPU's own time does not show), synchronised between bursts."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t)
    cp.cuda.Device().synchronize()
    return best / calls * 1e6


def lt_lib():
    names = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]
    with open("/proc/self/maps") as f:
        names += sorted({ln.split()[-1] for ln in f if "libcublasLt.so" in ln})
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    raise RuntimeError("no cublasLt")


class Lt:
    """One cublasLt product c (M, N) = a (M, K) @ w^T (w (N, K), the linear layer's weight), row-major, float32."""

    def __init__(self, lib, a, w, out, bias=None, compute=68):
        self.lib = lib
        M, K = a.shape
        N = w.shape[0]
        h = vp()
        assert lib.cublasLtCreate(ctypes.byref(h)) == 0
        self.h = h
        d = vp()
        assert lib.cublasLtMatmulDescCreate(ctypes.byref(d), ci(compute), ci(0)) == 0
        # column-major view: out^T (N, M) = w (N, K) [= w^T col-major (K, N) with TRANSA=T] @ a^T (K, M)
        ta = ci(1)
        assert lib.cublasLtMatmulDescSetAttribute(d, 3, ctypes.byref(ta), 4) == 0
        if bias is not None:
            ep = ci(4)
            assert lib.cublasLtMatmulDescSetAttribute(d, 7, ctypes.byref(ep), 4) == 0
            bp = vp(bias.data.ptr)
            assert lib.cublasLtMatmulDescSetAttribute(d, 8, ctypes.byref(bp), 8) == 0
        self.d = d

        def layout(rows, cols, ld):
            lay = vp()
            assert lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), ci(0), u64(rows), u64(cols), i64(ld)) == 0
            return lay
        self.la = layout(K, N, K)       # w seen column-major: (K, N), ld K; TRANSA gives (N, K)
        self.lb = layout(K, M, K)       # a^T col-major (K, M)
        self.lc = layout(N, M, N)
        pref = vp()
        assert lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
        ws = sz(C._WORKSPACE_BYTES)
        assert lib.cublasLtMatmulPreferenceSetAttribute(pref, 1, ctypes.byref(ws), 8) == 0
        res = (ctypes.c_ubyte * 96 * 4)()
        n = ci()
        st = lib.cublasLtMatmulAlgoGetHeuristic(h, d, self.la, self.lb, self.lc, self.lc, pref, 4, res, ctypes.byref(n))
        assert st == 0 and n.value > 0, (st, n.value)
        self.algo = ctypes.addressof(res[0])
        self.res = res
        self.ws = cp.empty(C._WORKSPACE_BYTES, np.uint8)
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.args = None
        self.a, self.w, self.out = a, w, out

    def __call__(self):
        s = cp.cuda.get_current_stream().ptr
        st = self.lib.cublasLtMatmul(self.h, self.d, ctypes.byref(self.alpha), vp(self.w.data.ptr), self.la,
                                     vp(self.a.data.ptr), self.lb, ctypes.byref(self.beta), vp(self.out.data.ptr),
                                     self.lc, vp(self.out.data.ptr), self.lc, vp(self.algo), vp(self.ws.data.ptr),
                                     sz(C._WORKSPACE_BYTES), vp(s))
        assert st == 0, st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    lib = C._load()
    lt = lt_lib()
    try:
        import torch
    except ImportError:
        torch = None
    print(f"{'shape (M,K)x(N,K)^T':24s} {'minidnn':>8s} {'lt':>6s} {'lt+bias':>8s} {'lt+sums':>8s} "
          f"{'rawGemmEx':>10s} {'cp.empty':>9s} {'rawLt':>7s} "
          f"{'Lt+bias':>8s} {'torch mm':>9s} {'torch lin':>10s}   (µs host per call)")
    for M, K, N in [(64, 400, 120), (64, 120, 84), (64, 84, 10), (128, 64, 10)]:
        rs = np.random.default_rng(0)
        a = cp.asarray(rs.standard_normal((M, K), dtype=np.float32))
        w = cp.asarray(rs.standard_normal((N, K), dtype=np.float32))
        b = cp.asarray(rs.standard_normal(N, dtype=np.float32))
        wt = w.T
        ours = per_call(lambda: C.gemm(a, wt), args.calls)
        g = cp.asarray(rs.standard_normal((M, N), dtype=np.float32))
        checks = [float(cp.abs(C.lt_product(a, wt) - C.gemm(a, wt)).max()),
                  float(cp.abs(C.lt_product(a, wt, bias=b) - C.gemm(a, wt) - b).max())]
        r = C.lt_product(g.T, a, row_sums=True)
        checks += [float(cp.abs(r[0] - C.gemm(g.T, a)).max()), float(cp.abs(r[1] - g.sum(0)).max())]
        ours_lt = per_call(lambda: C.lt_product(a, wt), args.calls)
        ours_ltb = per_call(lambda: C.lt_product(a, wt, bias=b), args.calls)
        ours_lts = per_call(lambda: C.lt_product(g.T, a, row_sums=True), args.calls)
        out = cp.empty((M, N), np.float32)
        h = C._bind(lib, cp)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        opb, ldb = C._layout(wt)
        opa, lda = C._layout(a)
        raw_args = (h, opb, opa, N, M, K, ctypes.byref(alpha), wt.data.ptr, 0, ldb, a.data.ptr, 0, lda,
                    ctypes.byref(beta), out.data.ptr, 0, N, 68, -1)
        raw = per_call(lambda: lib.cublasGemmEx(*raw_args), args.calls)
        emp = per_call(lambda: cp.empty((M, N), np.float32), args.calls)
        L = Lt(lt, a, w, out)
        ref = C.gemm(a, wt)
        L()
        err = float(cp.abs(out - ref).max())
        lt_t = per_call(L, args.calls)
        LB = Lt(lt, a, w, out, bias=b)
        LB()
        errb = float(cp.abs(out - (ref + b)).max())
        ltb = per_call(LB, args.calls)
        tm = tl = float("nan")
        if torch is not None:
            ta, tw, tb = (torch.as_tensor(v, device="cuda") for v in (a, w, b))
            tm = per_call(lambda: torch.mm(ta, tw.t()), args.calls)
            tl = per_call(lambda: torch.nn.functional.linear(ta, tw, tb), args.calls)
        print(f"({M},{K})x({N},{K})^T{'':6s} {ours:8.1f} {ours_lt:6.1f} {ours_ltb:8.1f} {ours_lts:8.1f} "
              f"{raw:10.1f} {emp:9.1f} {lt_t:7.1f} {ltb:8.1f} {tm:9.1f} "
              f"{tl:10.1f}   Lt err {err:.1e} bias err {errb:.1e} ours vs gemm {max(checks):.1e}")


if __name__ == "__main__":
    main()
