"""NumPy emulation of conv_direct_source's dw_tile_forward (CPU only: `python3 tools/emulate_dw_tile.py`): the
launcher's tile_config and grid, the 16-byte-chunk staging of the halo tile into shared memory (vector loads only
where aligned and inside the row), the per-thread float4 window reads and compile-time tap selection, and the
epilogue (vector stores where aligned and whole, alpha/beta) -- index for index as written in the CUDA source, for
the forward and for stride-1 backward data through the launcher's flipped, channel-swapped kernel, against
float64 references of the backend."""
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minidnn.backend import (  # noqa: E402
    ConvolutionBwdDataAlgo,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    convolution_backward_data,
    convolution_forward,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402


def kernel(xbuf, xoff, wbuf, ybuf, yoff, H, W, P, Q, pad_h, pad_w, Cg, Kg, Kout, planes, sx, sy, KR, KS, ST, DL,
           cfg, itemsize, alpha, beta):
    """dw_tile_forward over its whole grid; buffers are flat, offsets in elements (16-byte-aligned base = 0)."""
    TX, TY, TZ, VH, pitch = cfg
    VW = K.TILE_VW
    LV = 16 // itemsize
    WIN = (VW - 1) * ST + (KS - 1) * DL + 1
    WIN4 = -(-WIN // 4)
    IRH = (VH - 1) * ST + (KR - 1) * DL + 1
    IH = (TY * VH - 1) * ST + (KR - 1) * DL + 1
    outvec = 4                       # OutVec: 16 bytes of float / 8 bytes of half = 4 elements
    grid = (-(-planes // TZ), -(-P // (TY * VH)), -(-Q // (TX * VW)))
    stats = dict(vec_loads=0, elem_chunks=0, vec_stores=0, scalar_stores=0)
    for bx, by, bz in itertools.product(*map(range, grid)):
        smem = np.full(TZ * IH * pitch, np.nan)
        p0, q0 = by * TY * VH, bz * TX * VW
        h_base, w_base = p0 * ST - pad_h, q0 * ST - pad_w
        ws = w_base & ~(LV - 1)
        nv = (w_base - ws + pitch + LV - 1) // LV
        assert ws <= w_base and ws % LV == 0 and ws + nv * LV >= w_base + pitch
        acc = np.zeros((TZ, TY, TX, VH, VW))
        for tz in range(TZ):
            z = bx * TZ + tz
            if z >= planes:
                continue
        for cc in range(Cg):
            for tz in range(TZ):                      # staging (each plane's TX*TY threads stride over its items)
                z = bx * TZ + tz
                if z >= planes:
                    continue
                n, k = divmod(z, Kout)
                c0 = (k // Kg) * Cg
                xp = xoff + n * sx[0] + (c0 + cc) * sx[1]
                vec_ok = (xp * itemsize) % 16 == 0 and sx[2] % LV == 0
                tile = tz * IH * pitch
                for i in range(IH * nv):
                    row, v = divmod(i, nv)
                    h, gw = h_base + row, ws + v * LV
                    col = gw - w_base
                    if not 0 <= h < H:
                        vals = [0.0] * LV
                    elif vec_ok and gw >= 0 and gw + LV <= W:
                        a = xp + h * sx[2] + gw
                        assert (a * itemsize) % 16 == 0, "unaligned 16-byte load"
                        vals = list(xbuf[a:a + LV])
                        stats["vec_loads"] += 1
                    else:
                        vals = [xbuf[xp + h * sx[2] + gw + e] if 0 <= gw + e < W else 0.0 for e in range(LV)]
                        stats["elem_chunks"] += 1
                    for e in range(LV):
                        if 0 <= col + e < pitch:
                            smem[tile + row * pitch + col + e] = vals[e]
            # __syncthreads()
            for tz, ty, tx in itertools.product(range(TZ), range(TY), range(TX)):
                z = bx * TZ + tz
                if z >= planes:
                    continue
                n, k = divmod(z, Kout)
                wr = wbuf[(k * Cg + cc) * KR * KS:(k * Cg + cc + 1) * KR * KS]
                base = tz * IH * pitch + ty * (VH * ST) * pitch + tx * (VW * ST)
                assert base % 4 == 0, "float4 window read unaligned"
                for ir in range(IRH):
                    lo = base + ir * pitch
                    assert ty * VH * ST + ir < IH and tx * VW * ST + 4 * WIN4 <= pitch, "window outside the tile"
                    xs = smem[lo:lo + 4 * WIN4]
                    assert not np.isnan(xs).any(), "read an unstaged shared element"
                    for i in range(VH):
                        d = ir - i * ST
                        if d < 0 or d % DL != 0 or d // DL >= KR:
                            continue
                        r = d // DL
                        for s in range(KS):
                            for j in range(VW):
                                acc[tz, ty, tx, i, j] += xs[j * ST + s * DL] * wr[r * KS + s]
            # __syncthreads()
        for tz, ty, tx in itertools.product(range(TZ), range(TY), range(TX)):      # epilogue
            z = bx * TZ + tz
            if z >= planes:
                continue
            n, k = divmod(z, Kout)
            yp = yoff + n * sy[0] + k * sy[1]
            q = q0 + tx * VW
            for i in range(VH):
                p = p0 + ty * VH + i
                if p >= P or q >= Q:
                    continue
                dst = yp + p * sy[2] + q
                o = alpha * acc[tz, ty, tx, i]
                if q + VW <= Q and dst % outvec == 0:
                    stats["vec_stores"] += 1
                    if beta != 0:
                        o = o + beta * ybuf[dst:dst + VW]
                    ybuf[dst:dst + VW] = o
                else:
                    for j in range(VW):
                        if q + j >= Q:
                            break
                        stats["scalar_stores"] += 1
                        ybuf[dst + j] = o[j] + (beta * ybuf[dst + j] if beta != 0 else 0.0)
    return stats


def padded(a, extra):
    """(flat buffer, offset, strides) of NCHW ``a`` stored at element offset ``extra`` of a bigger buffer."""
    buf = np.concatenate([np.full(extra, np.nan), a.ravel(), np.full(8, np.nan)])
    N, C, H, W = a.shape
    return buf, extra, (C * H * W, H * W, W, 1)


def run(N, C, H, W, Kc, R, S, pad, stride, dil, groups, direction, itemsize=4, offset=0, alpha=1.0, beta=0.0,
        seed=0, sms=132):
    rng = np.random.default_rng(seed)
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    p = make_problem("emu", (N, C, H, W), (Kc, C // groups, R, S), desc, "float32")
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    if direction == "forward":
        ref = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
        src, wk, Kg, in_hw, out_hw, pads, st = x, w, p.Kg, p.in_size, p.out_size, p.padding, stride
    else:
        assert stride == 1
        ref = convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
        w_t = w.reshape(groups, p.Kg, p.Cg, R, S).transpose(0, 2, 1, 3, 4).reshape(p.C, p.Kg, R, S)
        wk = np.ascontiguousarray(w_t[:, :, ::-1, ::-1])
        src, Kg, in_hw, out_hw, st = dy, p.Cg, p.out_size, p.in_size, 1
        pads = tuple(d * (r - 1) - q for d, r, q in zip(p.dilation, p.kernel, p.padding))
        assert min(pads) >= 0
    Kout = ref.shape[1]
    planes = ref.shape[0] * Kout
    cfg = K.tile_config(out_hw[0], out_hw[1], planes, R, S, st, dil, sms)
    assert cfg is not None
    xbuf, xoff, sx = padded(src, offset)
    prior = rng.standard_normal(ref.shape)
    ybuf, yoff, sy = padded(prior if beta != 0 else np.full(ref.shape, np.nan), offset)
    stats = kernel(xbuf, xoff, wk.ravel(), ybuf, yoff, *in_hw, *out_hw, *pads, wk.shape[1], Kg, Kout, planes, sx,
                   sy, R, S, st, dil, cfg, itemsize, alpha, beta)
    got = ybuf[yoff:yoff + ref.size].reshape(ref.shape)
    want = alpha * ref + (beta * prior if beta != 0 else 0)
    assert not np.isnan(got).any(), "unwritten outputs"
    assert np.isnan(ybuf[:yoff]).all() and np.isnan(ybuf[yoff + ref.size:]).all(), "wrote outside y"
    err = np.abs(got - want).max()
    assert err < 1e-9, err
    return cfg, stats


CASES = [
    # N, C, H, W, K, R, S, pad, stride, dil, groups
    (2, 8, 9, 11, 8, 3, 3, 1, 1, 1, 8),        # depthwise, ragged
    (1, 4, 16, 16, 4, 3, 3, 1, 1, 1, 4),       # aligned rows: 16-byte loads and vector stores
    (2, 6, 10, 9, 12, 3, 3, 1, 2, 1, 6),       # channel multiplier 2, stride 2
    (2, 8, 21, 37, 8, 3, 3, 1, 2, 1, 8),       # stride 2, wide
    (1, 16, 11, 12, 16, 5, 5, 2, 1, 2, 16),    # 5x5 dilation 2
    (1, 4, 9, 40, 4, 7, 7, 3, 1, 1, 4),        # 7x7 wide
    (2, 16, 8, 9, 16, 3, 3, 1, 1, 1, 4),       # groups of 4 channels
    (2, 4, 14, 14, 4, 3, 3, 0, 1, 1, 4),       # pad 0
    (1, 3, 12, 20, 3, 3, 3, 2, 1, 1, 3),       # pad 2
    (3, 2, 5, 5, 4, 5, 5, 2, 1, 1, 2),         # 5x5 on a 5x5 plane, multiplier 2
    (1, 2, 1, 13, 2, 1, 3, 0, 1, 1, 2),        # one row (VH = 1)
    (1, 2, 6, 150, 2, 3, 3, 1, 1, 1, 2),       # > 128 columns: several q tiles
    (1, 2, 70, 8, 2, 3, 3, 1, 1, 1, 2),        # many rows: several p tiles
    (2, 3, 7, 7, 3, 3, 3, 1, 2, 1, 3),         # stride 2, odd
    (1, 2, 56, 56, 2, 3, 3, 1, 1, 1, 2),       # the benchmark's 56x56 geometry (TX 14, TY 14)
]
# (case, sms): a tiny SM count keeps several planes per block (TZ > 1), the last block partly idle
TZ_CASES = [((4, 6, 14, 14, 6, 3, 3, 1, 1, 1, 6), 1), ((3, 5, 7, 9, 5, 3, 3, 1, 2, 1, 5), 1),
            ((2, 4, 6, 6, 8, 3, 3, 1, 1, 1, 4), 1)]


def main():
    n = 0
    total = dict(vec_loads=0, elem_chunks=0, vec_stores=0, scalar_stores=0)
    for case in CASES:
        stride = case[8]
        dirs = ["forward"] + (["backward_data"] if stride == 1 else [])
        for direction, itemsize, offset, (alpha, beta) in itertools.product(
                dirs, (4, 2), (0, 1), ((1.0, 0.0), (0.75, -0.5))):
            if offset and (alpha, beta) != (1.0, 0.0):
                continue
            cfg, stats = run(*case, direction, itemsize, offset, alpha, beta, seed=n)
            total = {k: v + stats[k] for k, v in total.items()}
            n += 1
        print(case, "TX, TY, TZ, VH, pitch =", cfg)
    for case, sms in TZ_CASES:
        dirs = ["forward"] + (["backward_data"] if case[8] == 1 else [])
        for direction, itemsize, (alpha, beta) in itertools.product(dirs, (4, 2), ((1.0, 0.0), (0.75, -0.5))):
            cfg, stats = run(*case, direction, itemsize, 0, alpha, beta, seed=n, sms=sms)
            assert cfg[2] > 1
            total = {k: v + stats[k] for k, v in total.items()}
            n += 1
        print(case, "sms", sms, "TX, TY, TZ, VH, pitch =", cfg)
    assert all(total.values()), total            # every load and store path was taken
    print(f"{n} configurations: dw_tile_forward index math matches float64; paths taken: {total}")


if __name__ == "__main__":
    main()
