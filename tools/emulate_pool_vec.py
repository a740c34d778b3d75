"""NumPy emulation of the vectorized pooling kernels (pool_kernels.VEC_SOURCE) on a machine without a GPU.

Each kernel is replayed thread by thread (all threads at once, as NumPy index arrays): the same fast-divider index
math (bn_kernels._divider's (mul, shift), 32-bit), the same load guards (a 16-byte vector read only where the kernel
reads it, every read index checked to lie inside its array), the same per-window rules in the kernel's precision
(float32 for 4- and 2-byte data, results rounded to the storage dtype), and the same stores (every output element
written exactly once, checked).  The results are compared with the reference primitive (minidnn.backend pooling on
NumPy) in float64: max values and argmax taps exactly, averages and gradients to the dtype's rounding.

    python tools/emulate_pool_vec.py            # every case below; prints one line per case, exits 1 on a mismatch

tests/backend/test_pool_vec_emulation.py runs the same cases under pytest (CPU).
"""
from __future__ import annotations

import re
import sys
import types

import numpy as np

import minidnn.backend as B
from minidnn.backend.cuda import pool_kernels as PK
from minidnn.backend.cuda.bn_kernels import _divider


def fast_div(n, d):
    """The device's fast_div(n, mul, shr) for divisor d, on uint32 arrays."""
    mul, shr = (int(v) for v in _divider(d))
    n = np.asarray(n, dtype=np.uint64)
    hi = (n * np.uint64(mul)) >> np.uint64(32)
    return (((hi + n) & np.uint64(0xFFFFFFFF)) >> np.uint64(shr)).astype(np.int64)


def _ld(a):
    """LD(): storage -> the kernel's accumulation type (float32 for float32 / float16 / bfloat16)."""
    return np.asarray(a).astype(np.float32)


class Mem:
    """A flat array with checked reads and once-only writes."""

    def __init__(self, a=None, size=None, dtype=None):
        self.a = np.asarray(a).reshape(-1) if a is not None else np.zeros(size, dtype)
        self.written = np.zeros(self.a.size, np.int64)

    def read(self, idx):
        assert idx.size == 0 or (idx.min() >= 0 and idx.max() < self.a.size), "read outside the array"
        return self.a[idx]

    def write(self, idx, v):
        assert idx.size == 0 or (idx.min() >= 0 and idx.max() < self.a.size), "write outside the array"
        np.add.at(self.written, idx, 1)
        self.a[idx] = v


def _better(u, best):
    return (u > best) | (np.isnan(u) & ~np.isnan(best))


def rows_forward(x, geom, is_max, vin):
    """pool_fwd_rows on C-contiguous x (N, C, H, W) -> (y, argmax or None), channels-first arrays."""
    n, c, h, w = x.shape
    vw = 16 // x.itemsize
    (kh_, kw_), (oh_, ow_) = geom.window, geom.out_sizes
    total, segs = PK._rows_shape(geom, n, c, vw)
    t = np.arange(total, dtype=np.int64)
    r = fast_div(t, segs)
    ow0 = (t - r * segs) * vw
    nc = fast_div(r, oh_)
    oh = r - nc * oh_
    cnt = np.minimum(vw, ow_ - ow0)
    c0 = ow0 * kw_
    base = (nc * h + oh * kh_) * w + c0
    X = Mem(x)
    v = np.zeros((total, kh_, kw_ * vw), x.dtype)
    for kh in range(kh_):
        for e in range(kw_ * vw):
            ok = (c0 + (e // vw) * vw < w) if vin else (c0 + e < w)
            v[ok, kh, e] = X.read(base[ok] + kh * w + e)
    v = _ld(v)
    Y = Mem(size=n * c * oh_ * ow_, dtype=x.dtype)
    Arg = Mem(size=n * c * oh_ * ow_, dtype=PK.arg_dtype(geom))
    for j in range(vw):
        if is_max:
            best, arg = v[:, 0, j * kw_].copy(), np.zeros(total, np.int64)
            for kh in range(kh_):
                for kw in range(kw_):
                    if kh == 0 and kw == 0:
                        continue
                    u = v[:, kh, j * kw_ + kw]
                    b = _better(u, best)
                    best, arg = np.where(b, u, best), np.where(b, kh * kw_ + kw, arg)
        else:
            best = np.zeros(total, np.float32)
            for kh in range(kh_):
                for kw in range(kw_):
                    best = (best + v[:, kh, j * kw_ + kw]).astype(np.float32)
            best = (best / np.float32(kh_ * kw_)).astype(np.float32)
        m = j < cnt
        Y.write(r[m] * ow_ + ow0[m] + j, best[m].astype(x.dtype))
        if is_max:
            Arg.write(r[m] * ow_ + ow0[m] + j, arg[m])
    assert (Y.written == 1).all(), "an output written twice or never"
    shape = (n, c, oh_, ow_)
    return Y.a.reshape(shape), (Arg.a.reshape(shape) if is_max else None)


def rows_backward(dy, argmax, geom, x_shape, is_max, vdy, ov=0):
    """pool_bwd_rows: dx (N, C, H, W) C-contiguous from C-contiguous dy (and argmax); ``ov`` outputs a thread (0:
    VW, the kernel's default)."""
    n, c, h, w = x_shape
    vw = ov or 16 // dy.itemsize       # below, vw is the kernel's OV
    (kh_, kw_), (oh_, ow_) = geom.window, geom.out_sizes
    assert (oh_ * kh_, ow_ * kw_) == (h, w)
    total, segs = PK._rows_shape(geom, n, c, vw)
    t = np.arange(total, dtype=np.int64)
    r = fast_div(t, segs)
    ow0 = (t - r * segs) * vw
    nc = fast_div(r, oh_)
    oh = r - nc * oh_
    cnt = np.minimum(vw, ow_ - ow0)
    c0 = ow0 * kw_
    o = r * ow_ + ow0
    D, Am = Mem(dy), Mem(argmax if is_max else np.zeros(1, np.uint8))
    g = np.zeros((total, vw), np.float32)
    a = np.zeros((total, vw), np.int64)
    for j in range(vw):
        ok = j < cnt          # the chunked (vdy) and scalar reads cover the same elements: j < cnt
        g[ok, j] = _ld(D.read(o[ok] + j))
        if is_max:
            a[ok, j] = Am.read(o[ok] + j)
    DX = Mem(size=n * c * h * w, dtype=dy.dtype)
    base = (nc * h + oh * kh_) * w + c0
    for kh in range(kh_):
        for j in range(vw):
            q = (g[:, j] / np.float32(kh_ * kw_)).astype(np.float32)
            for kw in range(kw_):
                val = np.where(a[:, j] == kh * kw_ + kw, np.float32(0) + g[:, j], np.float32(0)) if is_max else \
                    np.float32(0) + q
                e = j * kw_ + kw
                ok = e < cnt * kw_
                DX.write(base[ok] + kh * w + e, val[ok].astype(dy.dtype))
    assert (DX.written == 1).all(), "a dx element written twice or never"
    return DX.a.reshape(x_shape)


def _window_count(s0, k, length, p, include):
    return (np.minimum(s0 + k, length + p) - s0) if include else (np.minimum(s0 + k, length) - np.maximum(s0, 0))


def clv_forward(x_nhwc, geom, is_max, include):
    """pool_fwd_clv on channels-last memory (N, H, W, C) -> (y, argmax) as (N, OH, OW, C) arrays."""
    n, h, w, c = x_nhwc.shape
    vw = 16 // x_nhwc.itemsize
    G = c // vw
    (kh_, kw_), (ph, pw), (sh, sw), (dh, dw) = geom.window, geom.padding, geom.stride, geom.dilation
    oh_, ow_ = geom.out_sizes
    total = n * oh_ * ow_ * G
    i = np.arange(total, dtype=np.int64)
    p = fast_div(i, G)
    g = i - p * G
    q = fast_div(p, ow_)
    ow = p - q * ow_
    p = fast_div(q, oh_)
    oh, nn = q - p * oh_, p
    h0, w0 = oh * sh - ph, ow * sw - pw
    X = Mem(x_nhwc)
    xb = nn * h * w * c + g * vw
    best = np.zeros((total, vw), np.float32)
    arg = np.full((total, vw), -1, np.int64)
    for kh in range(kh_):
        hh = h0 + kh * (dh if is_max else 1)
        for kw in range(kw_):
            ww = w0 + kw * (dw if is_max else 1)
            ok = (hh >= 0) & (hh < h) & (ww >= 0) & (ww < w)
            for e in range(vw):
                u = np.zeros(total, np.float32)
                u[ok] = _ld(X.read(xb[ok] + (hh[ok] * w + ww[ok]) * c + e))
                if is_max:
                    b = ok & ((arg[:, e] < 0) | _better(u, best[:, e]))
                    best[:, e] = np.where(b, u, best[:, e])
                    arg[:, e] = np.where(b, kh * kw_ + kw, arg[:, e])
                else:
                    best[:, e] = np.where(ok, best[:, e] + u, best[:, e]).astype(np.float32)
    if not is_max:
        cnt = (_window_count(h0, kh_, h, ph, include) * _window_count(w0, kw_, w, pw, include)).astype(np.float32)
        best = (best / cnt[:, None]).astype(np.float32)
    shape = (n, oh_, ow_, c)
    y = best.astype(x_nhwc.dtype).reshape(shape)        # thread i's vector is y's flat elements i*VW .. i*VW+VW-1
    return y, (arg.astype(PK.arg_dtype(geom)).reshape(shape) if is_max else None)


def clv_backward(dy_nhwc, arg_nhwc, geom, x_shape_nhwc, is_max, include, disj=0):
    """pool_bwd_clv (gather; ``disj``: the disjoint-window form, one window per position) on channels-last dy /
    argmax -> dx (N, H, W, C)."""
    n, h, w, c = x_shape_nhwc
    vw = 16 // dy_nhwc.itemsize
    G = c // vw
    (kh_, kw_), (ph, pw), (sh, sw), (dh, dw) = geom.window, geom.padding, geom.stride, geom.dilation
    oh_, ow_ = geom.out_sizes
    total = n * h * w * G
    i = np.arange(total, dtype=np.int64)
    p = fast_div(i, G)
    g = i - p * G
    q = fast_div(p, w)
    ww = p - q * w
    p = fast_div(q, h)
    hh, nn = q - p * h, p
    D = Mem(dy_nhwc)
    Am = Mem(arg_nhwc if is_max else np.zeros(1, np.uint8))
    base = nn * oh_ * ow_ * c + g * vw
    s = np.zeros((total, vw), np.float32)
    ddh, ddw = (dh, dw) if is_max else (1, 1)
    if disj:
        assert (sh, sw) == (kh_, kw_) and not any(geom.padding) and oh_ * kh_ >= h and ow_ * kw_ >= w
        oh, ow = hh // sh, ww // sw
        tap = (hh - oh * sh) * kw_ + (ww - ow * sw)
        o = base + (oh * ow_ + ow) * c
        cnt = (_window_count(oh * sh - ph, kh_, h, ph, include)
               * _window_count(ow * sw - pw, kw_, w, pw, include)).astype(np.float32)
        for e in range(vw):
            d = _ld(D.read(o + e)).astype(np.float32)
            if is_max:
                s[:, e] = np.where(Am.read(o + e) == tap, np.float32(0) + d, np.float32(0))
            else:
                s[:, e] = (np.float32(0) + d / cnt).astype(np.float32)
        return s.astype(dy_nhwc.dtype).reshape(x_shape_nhwc)
    for kh in range(kh_):
        th = hh + ph - kh * ddh
        okh = (th >= 0) & (th % sh == 0)
        oh = th // sh
        okh &= oh < oh_
        for kw in range(kw_):
            tw = ww + pw - kw * ddw
            ok = okh & (tw >= 0) & (tw % sw == 0)
            ow = tw // sw
            ok &= ow < ow_
            o = base + (oh * ow_ + ow) * c
            for e in range(vw):
                d = np.zeros(total, np.float32)
                d[ok] = _ld(D.read(o[ok] + e))
                if is_max:
                    a = np.full(total, -1, np.int64)
                    a[ok] = Am.read(o[ok] + e)
                    s[:, e] = np.where(ok & (a == kh * kw_ + kw), s[:, e] + d, s[:, e]).astype(np.float32)
                else:
                    cnt = (_window_count(oh * sh - ph, kh_, h, ph, include)
                           * _window_count(ow * sw - pw, kw_, w, pw, include)).astype(np.float32)
                    s[:, e] = np.where(ok, s[:, e] + d / np.where(ok, cnt, 1), s[:, e]).astype(np.float32)
    return s.astype(dy_nhwc.dtype).reshape(x_shape_nhwc)


# ---- replaying a launch (tools/record_launches.py's fake CuPy: the primitive's whole GPU path on the CPU) ----------

VEC_KERNELS = ("pool_fwd_rows", "pool_bwd_rows", "pool_fwd_clv", "pool_bwd_clv")


def parse_kernel(label):
    """The fake CuPy's kernel label, "name('-DA=1', ...)" -> (name, {macro: value})."""
    name, _, rest = label.partition("(")
    defs = dict(m.split("=", 1) for m in re.findall(r"'-D([^']*)'", rest))
    return name, defs


def replay(label, arrays, scalars):
    """Run one launch of a VEC_SOURCE kernel on the fake CuPy's (NumPy) arrays: ``arrays`` as passed to the prepared
    launch, ``scalars`` the packed scalar arguments in order.  Returns False for other kernels (not replayed)."""
    name, d = parse_kernel(label)
    if name not in VEC_KERNELS:
        return False
    is_max, include = d["IS_MAX"] == "1", d["INCLUDE_PAD"] == "1"
    if name in ("pool_fwd_rows", "pool_bwd_rows"):
        h, w, oh, ow = scalars[:4]
        kh, kw = int(d["KH"]), int(d["KW"])
        geom = types.SimpleNamespace(window=(kh, kw), out_sizes=(oh, ow), stride=(kh, kw), padding=(0, 0),
                                     dilation=(1, 1), spatial=(h, w))
        if name == "pool_fwd_rows":
            x, y, arg = (np.asarray(a) for a in arrays)
            assert x.flags.c_contiguous and y.flags.c_contiguous
            yv, av = rows_forward(x, geom, is_max, int(d["VIN"]))
            y[...] = yv
            if is_max:
                arg[...] = av
        else:
            dy, arg, dx = (np.asarray(a) for a in arrays)
            dx[...] = rows_backward(dy, arg if is_max else None, geom, dx.shape, is_max, int(d["VDY"]),
                                    int(d.get("OV", 0)))
        return True
    n, c, h, w, oh, ow, kh, kw, ph, pw, sh, sw, dh, dw = scalars[:14]
    geom = types.SimpleNamespace(window=(kh, kw), out_sizes=(oh, ow), stride=(sh, sw), padding=(ph, pw),
                                 dilation=(dh, dw), spatial=(h, w))
    if name == "pool_fwd_clv":
        x, y, arg = (np.asarray(a) for a in arrays)
        xm = np.moveaxis(x, 1, -1)                  # the channels-first view of channels-last memory -> (N, H, W, C)
        assert xm.flags.c_contiguous and y.shape == (n, oh, ow, c)
        yv, av = clv_forward(xm, geom, is_max, include)
        y[...] = yv
        if is_max:
            arg[...] = av
    else:
        dy, arg, dx = (np.asarray(a) for a in arrays)
        dym = np.moveaxis(dy, 1, -1)
        am = np.moveaxis(arg, 1, -1) if is_max else None
        assert dym.flags.c_contiguous and (am is None or am.flags.c_contiguous) and dx.shape == (n, h, w, c)
        dx[...] = clv_backward(dym, am, geom, dx.shape, is_max, include, int(d.get("DISJ", 0)))
    return True


# ---- the cases and the comparison with the reference --------------------------------------------------------------

def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}

# (x shape, window, padding, stride, ceil_mode, dilation)
ROWS_CASES = [((2, 3, 8, 8), 2, 0, 2, False, 1), ((2, 3, 56, 56), 2, 0, 2, False, 1),
              ((1, 2, 7, 9), 2, 0, 2, False, 1),       # floor mode drops the last row and column (forward)
              ((2, 2, 6, 10), 2, 0, 2, False, 1),      # W = 10: rows not 16-byte aligned (the scalar loads)
              ((2, 3, 9, 12), 3, 0, 3, False, 1), ((1, 3, 8, 6), (2, 1), 0, (2, 1), False, 1),
              ((3, 1, 4, 40), (1, 4), 0, (1, 4), False, 1), ((2, 5, 4, 36), 2, 0, 2, False, 1),
              ((1, 1, 2, 2), 2, 0, 2, False, 1)]
CL_CASES = [((2, 8, 8, 8), 2, 0, 2, False, 1), ((2, 16, 7, 9), 3, 1, 2, False, 1), ((1, 24, 6, 7), 3, 1, 2, True, 1),
            ((2, 8, 9, 9), 3, 1, 2, False, 2), ((1, 32, 5, 5), (2, 3), (1, 0), (1, 2), False, 1),
            ((2, 16, 6, 6), 2, 0, 2, True, 1),
            ((1, 8, 5, 7), 2, 0, 2, True, 1)]         # ceil mode: partial disjoint windows at the ends
MODES = ("max", "average_count_include_padding", "average_count_exclude_padding")


def nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def _reference(x64, desc, dy64):
    is_max = desc.mode.is_max
    out = B.pooling_forward(None, desc, x64, return_argmax=is_max)
    y, arg = out if is_max else (out, None)
    dx = B.pooling_backward(None, desc, y, dy64, x64, argmax=arg)
    return y, arg, dx


def _inputs(rng, shape, dt, ties):
    x = rng.standard_normal(shape).astype(np.float32)
    if ties:                                   # few distinct values: ties in most windows (first tap wins)
        x = np.round(x)
    return x.astype(dt), rng.standard_normal(shape).astype(dt)


def window_kw(window):
    return window if isinstance(window, int) else window[1]


def check_rows(shape, window, padding, stride, ceil_mode, dilation, mode, dtname, ties=False, seed=0):
    dt = _dtype(dtname)
    desc = B.PoolingDescriptor(mode, window, padding, stride, ceil_mode, dilation)
    geom = B.pooling._Geometry(desc, shape, "emulate")
    n, c = shape[:2]
    assert PK.rows_applies(geom, n, c, dt), (shape, window)
    rng = np.random.default_rng(seed)
    x, _ = _inputs(rng, shape, dt, ties)
    dy = rng.standard_normal(geom.y_shape).astype(dt)
    y_ref, arg_ref, dx_ref = _reference(x.astype(np.float64), desc, dy.astype(np.float64))
    is_max = desc.mode.is_max
    vin_choices = (0, 1) if shape[3] % (16 // dt.itemsize) == 0 else (0,)
    tol = TOL[dtname]
    for vin in vin_choices:
        y, arg = rows_forward(x, geom, is_max, vin)
        np.testing.assert_allclose(y.astype(np.float64), y_ref, rtol=tol, atol=tol)
        if is_max:
            np.testing.assert_array_equal(arg, arg_ref)
    if PK.rows_applies(geom, n, c, dt, exact=True):
        vw = 16 // dt.itemsize
        for vdy in (0, 1):
            for ov in {0, vw // window_kw(window) if vw % window_kw(window) == 0 else 0}:
                dx = rows_backward(dy, arg_ref.astype(PK.arg_dtype(geom)) if is_max else None, geom, shape, is_max,
                                   vdy, ov)
                np.testing.assert_allclose(dx.astype(np.float64), dx_ref, rtol=tol, atol=tol)


def check_clv(shape, window, padding, stride, ceil_mode, dilation, mode, dtname, ties=False, seed=0):
    dt = _dtype(dtname)
    if dilation != 1 and mode != "max":
        return
    desc = B.PoolingDescriptor(mode, window, padding, stride, ceil_mode, dilation)
    geom = B.pooling._Geometry(desc, shape, "emulate")
    n, c, h, w = shape
    assert PK.clv_applies(geom, c, dt, n * h * w), shape
    rng = np.random.default_rng(seed)
    x, _ = _inputs(rng, shape, dt, ties)
    dy = rng.standard_normal(geom.y_shape).astype(dt)
    y_ref, arg_ref, dx_ref = _reference(x.astype(np.float64), desc, dy.astype(np.float64))
    is_max = desc.mode.is_max
    include = mode == "average_count_include_padding"
    y, arg = clv_forward(nhwc(x), geom, is_max, include)
    tol = TOL[dtname]
    np.testing.assert_allclose(y.astype(np.float64), nhwc(y_ref), rtol=tol, atol=tol)
    if is_max:
        np.testing.assert_array_equal(arg, nhwc(arg_ref))
    for disj in (0, 1) if PK.is_disjoint(geom) else (0,):
        dx = clv_backward(nhwc(dy), nhwc(arg_ref).astype(PK.arg_dtype(geom)) if is_max else None, geom,
                          (n, h, w, c), is_max, include, disj)
        np.testing.assert_allclose(dx.astype(np.float64), nhwc(dx_ref), rtol=tol, atol=tol * 4)


def main():
    bad = 0
    for kind, cases, check in (("rows", ROWS_CASES, check_rows), ("clv", CL_CASES, check_clv)):
        for case in cases:
            for mode in MODES:
                for dtname in ("float32", "bfloat16", "float16"):
                    for ties in (False, True):
                        try:
                            check(*case, mode, dtname, ties)
                            status = "ok"
                        except AssertionError as exc:
                            bad += 1
                            status = f"MISMATCH {str(exc)[:300]}"
                        print(f"{kind} {case} {mode} {dtname} ties={ties}: {status}")
    print("all match" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
