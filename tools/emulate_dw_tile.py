"""NumPy emulation of conv_direct_source's dw_tile_forward and dw_tile_backward_filter (CPU only:
`python3 tools/emulate_dw_tile.py`; tests/backend/test_dw_tile_emulation.py runs a subset in the normal suite).

dw_tile_forward: the launcher's tile_config and grid, the 16-byte-chunk staging of the halo tile into shared memory
(vector loads only where aligned and inside the row), the per-thread float4 window reads and compile-time tap
selection, and the epilogue (vector stores where aligned and whole, alpha/beta) -- index for index as written in
the CUDA source, for the forward and for stride-1 backward data with FLIP=1 (the convolution's own filter read
flipped and channel-swapped), against float64 references of the backend.

dw_tile_backward_filter: the launcher's wgrad_config and grid, the 1-D block's slice/thread decode, the work-item
decode per split and step, the dy loads (vector where aligned and whole), the same staging and window reads, the
tap accumulation, the warp butterflies and per-warp rows, and the split partials with the ticket of each filter
row -- blocks run in a shuffled order and the last to draw a row's ticket adds the splits in split order.  This
one accumulates in float32 (as the GPU does) so that two block orders giving the same bits is a real check."""
import itertools
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minidnn.backend import (  # noqa: E402
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402


def stage(smem, tile, xbuf, xp, H, W, sxh, IH, pitch, h_base, w_base, LV, itemsize, stats):
    """stage_tile: the IH x pitch tile of the plane at xp, corner (h_base, w_base), zero outside the image."""
    ws = w_base & ~(LV - 1)
    nv = (w_base - ws + pitch + LV - 1) // LV
    assert ws <= w_base and ws % LV == 0 and ws + nv * LV >= w_base + pitch
    vec_ok = (xp * itemsize) % 16 == 0 and sxh % LV == 0
    for i in range(IH * nv):
        row, v = divmod(i, nv)
        h, gw = h_base + row, ws + v * LV
        col = gw - w_base
        if not 0 <= h < H:
            vals = [0.0] * LV
        elif vec_ok and gw >= 0 and gw + LV <= W:
            a = xp + h * sxh + gw
            assert (a * itemsize) % 16 == 0, "unaligned 16-byte load"
            vals = list(xbuf[a:a + LV])
            stats["vec_loads"] += 1
        else:
            vals = [xbuf[xp + h * sxh + gw + e] if 0 <= gw + e < W else 0.0 for e in range(LV)]
            stats["elem_chunks"] += 1
        for e in range(LV):
            if 0 <= col + e < pitch:
                smem[tile + row * pitch + col + e] = vals[e]


def kernel(xbuf, xoff, wbuf, ybuf, yoff, H, W, P, Q, pad_h, pad_w, Cg, Kg, Kout, planes, sx, sy, KR, KS, ST, DL,
           cfg, itemsize, alpha, beta, flip=False):
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
        acc = np.zeros((TZ, TY, TX, VH, VW))
        for cc in range(Cg):
            for tz in range(TZ):                      # staging (each plane's TX*TY threads stride over its items)
                z = bx * TZ + tz
                if z >= planes:
                    continue
                n, k = divmod(z, Kout)
                c0 = (k // Kg) * Cg
                stage(smem, tz * IH * pitch, xbuf, xoff + n * sx[0] + (c0 + cc) * sx[1], H, W, sx[2], IH, pitch,
                      h_base, w_base, LV, itemsize, stats)
            # __syncthreads()
            for tz, ty, tx in itertools.product(range(TZ), range(TY), range(TX)):
                z = bx * TZ + tz
                if z >= planes:
                    continue
                n, k = divmod(z, Kout)
                if flip:        # FLIP=1: w[c0 + cc][k % Kg][R-1-r][S-1-s] of the convolution's own filter
                    c0 = (k // Kg) * Cg
                    wk = ((c0 + cc) * Kg + (k - (k // Kg) * Kg)) * KR * KS
                    wr = wbuf[wk:wk + KR * KS][::-1]
                else:
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
    assert K.direct_supports(p) is None, K.direct_supports(p)        # a problem the direct kernels are given
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    if direction == "forward":
        ref = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
        src, wk, Kg, in_hw, out_hw, pads, st = x, w, p.Kg, p.in_size, p.out_size, p.padding, stride
    else:
        assert stride == 1
        ref = convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
        wk = w          # FLIP=1: the convolution's own filter; channels summed per output: Kc * Cg / C = Kg
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
    flip = direction != "forward"
    cg = wk.shape[0] * Kg // Kout if flip else wk.shape[1]        # as conv_igemm._tile_plan passes it
    stats = kernel(xbuf, xoff, wk.ravel(), ybuf, yoff, *in_hw, *out_hw, *pads, cg, Kg, Kout, planes, sx,
                   sy, R, S, st, dil, cfg, itemsize, alpha, beta, flip)
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
] + [
    # dense convolutions of one input channel (groups 1, C 1): depthwise with channel multiplier K
    (2, 1, 32, 32, 6, 5, 5, 0, 1, 1, 1),       # LeNet-5's conv1 (5x5, 32x32 -> 28x28, K 6)
    (2, 1, 13, 11, 16, 3, 3, 1, 1, 1, 1),      # K 16 3x3, ragged
    (3, 1, 9, 10, 1, 3, 3, 1, 1, 1, 1),        # K 1
    (2, 1, 12, 19, 6, 5, 5, 2, 1, 1, 1),       # 5x5 pad 2 ("same"), ragged
    (2, 1, 15, 17, 6, 3, 3, 1, 2, 1, 1),       # stride 2
    (1, 1, 16, 16, 4, 5, 5, 2, 2, 1, 1),       # 5x5 stride 2 pad 2, aligned rows
] + [
    # dense convolutions of 2..8 input channels (groups 1: Cg = C, Kg = K, every plane sums all C input planes)
    (2, 3, 13, 11, 16, 3, 3, 1, 1, 1, 1),      # a 3-channel stem (ResNet-20 / MobileNet-small), ragged
    (2, 6, 14, 14, 16, 5, 5, 0, 1, 1, 1),      # LeNet-5's conv2 (6 -> 16, 5x5, 14x14 -> 10x10)
    (1, 8, 9, 10, 32, 3, 3, 1, 1, 1, 1),       # C 8, K 32: both limits
    (2, 3, 15, 17, 8, 3, 3, 1, 2, 1, 1),       # stride 2, ragged
    (2, 4, 12, 19, 6, 5, 5, 2, 1, 1, 1),       # 5x5 pad 2
    (1, 2, 16, 16, 5, 3, 3, 0, 1, 1, 1),       # C 2, pad 0, aligned rows
]
DENSE_C1 = CASES[-12:-6]
DENSE_CG = CASES[-6:]
# (case, sms): a tiny SM count keeps several planes per block (TZ > 1), the last block partly idle
TZ_CASES = [((4, 6, 14, 14, 6, 3, 3, 1, 1, 1, 6), 1), ((3, 5, 7, 9, 5, 3, 3, 1, 2, 1, 5), 1),
            ((2, 4, 6, 6, 8, 3, 3, 1, 1, 1, 4), 1)]


def dgrad_kernel(wbuf, dybuf, dyoff, dxbuf, dxoff, H, W, P, Q, pad_h, pad_w, Cg, Kg, C, planes, sx, sy, KR, KS, ST,
                 DL, cfg, itemsize, alpha, beta):
    """dw_tile_backward_data (gather form, any stride) over its whole grid, index for index: the residue-class
    tap selection with compile-time offsets, the staging of the dy tile, the register window, the epilogue."""
    TX, TY, TZ, DVH, DVW, pitch = cfg
    assert DVH % ST == 0 and DVW % ST == 0
    PHM, PWM = pad_h % ST, pad_w % ST
    LV = 16 // itemsize
    EMIN, EMAX = (PHM - (KR - 1) * DL) // ST, (PHM + DVH - 1) // ST          # Python's // floors: DG_FLOORDIV
    FMIN, FMAX = (PWM - (KS - 1) * DL) // ST, (PWM + DVW - 1) // ST
    IRH, IRW = EMAX - EMIN + 1, FMAX - FMIN + 1
    assert (IRH, IRW) == K.dgrad_window(KR, KS, ST, DL, (pad_h, pad_w), DVH, DVW)
    IH = (TY - 1) * (DVH // ST) + IRH
    assert pitch >= (TX - 1) * (DVW // ST) + IRW
    # the compile-time tap lists: (i, r, e) rows and (j, s, f) columns that land
    rows = [(i, r, (PHM + i - r * DL) // ST - EMIN) for i in range(DVH) for r in range(KR)
            if (PHM + i - r * DL) % ST == 0]
    cols = [(j, s, (PWM + j - s * DL) // ST - FMIN) for j in range(DVW) for s in range(KS)
            if (PWM + j - s * DL) % ST == 0]
    assert all(0 <= e < IRH for _, _, e in rows) and all(0 <= f < IRW for _, _, f in cols)
    grid = (-(-planes // TZ), -(-H // (TY * DVH)), -(-W // (TX * DVW)))
    stats = dict(vec_loads=0, elem_chunks=0, vec_stores=0, scalar_stores=0)
    for bx, by, bz in itertools.product(*map(range, grid)):
        h0, w0 = by * TY * DVH, bz * TX * DVW
        p_base, q_base = h0 // ST + pad_h // ST + EMIN, w0 // ST + pad_w // ST + FMIN
        acc = np.zeros((TZ, TY, TX, DVH, DVW))
        for kk in range(Kg):
            smem = np.full(TZ * IH * pitch, np.nan)
            for tz in range(TZ):
                z = bx * TZ + tz
                if z >= planes:
                    continue
                n, c = divmod(z, C)
                k = (c // Cg) * Kg + kk
                stage(smem, tz * IH * pitch, dybuf, dyoff + n * sy[0] + k * sy[1], P, Q, sy[2], IH, pitch,
                      p_base, q_base, LV, itemsize, stats)
            # __syncthreads()
            for tz, ty, tx in itertools.product(range(TZ), range(TY), range(TX)):
                z = bx * TZ + tz
                if z >= planes:
                    continue
                n, c = divmod(z, C)
                grp, cl = divmod(c, Cg)
                k = grp * Kg + kk
                wr = wbuf[(k * Cg + cl) * KR * KS:(k * Cg + cl + 1) * KR * KS]
                base = tz * IH * pitch + ty * (DVH // ST) * pitch + tx * (DVW // ST)
                assert ty * (DVH // ST) + IRH <= IH and tx * (DVW // ST) + IRW <= pitch, "window outside the tile"
                win = np.array([smem[base + e * pitch:base + e * pitch + IRW] for e in range(IRH)])
                for i, r, e in rows:
                    for j, s_, f in cols:
                        assert not np.isnan(win[e, f]), "read an unstaged shared element"
                        acc[tz, ty, tx, i, j] += win[e, f] * wr[r * KS + s_]
            # __syncthreads()
        for tz, ty, tx in itertools.product(range(TZ), range(TY), range(TX)):      # epilogue
            z = bx * TZ + tz
            if z >= planes:
                continue
            n, c = divmod(z, C)
            xp = dxoff + n * sx[0] + c * sx[1]
            wq = w0 + tx * DVW
            for i in range(DVH):
                h = h0 + ty * DVH + i
                if h >= H or wq >= W:
                    continue
                dst = xp + h * sx[2] + wq
                o = alpha * acc[tz, ty, tx, i]
                if DVW == 4 and wq + DVW <= W and dst % 4 == 0:
                    stats["vec_stores"] += 1
                    if beta != 0:
                        o = o + beta * dxbuf[dst:dst + DVW]
                    dxbuf[dst:dst + DVW] = o
                else:
                    for j in range(DVW):
                        if wq + j >= W:
                            break
                        stats["scalar_stores"] += 1
                        dxbuf[dst + j] = o[j] + (beta * dxbuf[dst + j] if beta != 0 else 0.0)
    return stats


def run_dgrad(N, C, H, W, Kc, R, S, pad, stride, dil, groups, itemsize=4, offset=0, alpha=1.0, beta=0.0, seed=0,
              sms=132):
    """One backward data through the emulated dw_tile_backward_data against the float64 reference."""
    rng = np.random.default_rng(seed)
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    p = make_problem("emu", (N, C, H, W), (Kc, C // groups, R, S), desc, "float32")
    assert K.direct_supports(p) is None, K.direct_supports(p)
    w, dy = (rng.standard_normal(s) for s in (p.w_shape, p.y_shape))
    ref = convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
    cfg = K.dgrad_config(H, W, N * C, R, S, stride, dil, p.padding, sms)
    assert cfg is not None
    dybuf, dyoff, sy = padded(dy, offset)
    prior = rng.standard_normal(ref.shape)
    dxbuf, dxoff, sx = padded(prior if beta != 0 else np.full(ref.shape, np.nan), offset)
    stats = dgrad_kernel(w.ravel(), dybuf, dyoff, dxbuf, dxoff, H, W, *p.out_size, *p.padding, p.Cg, p.Kg, C,
                         N * C, sx, sy, R, S, stride, dil, cfg, itemsize, alpha, beta)
    got = dxbuf[dxoff:dxoff + ref.size].reshape(ref.shape)
    want = alpha * ref + (beta * prior if beta != 0 else 0)
    assert not np.isnan(got).any(), "unwritten outputs"
    assert np.isnan(dxbuf[:dxoff]).all() and np.isnan(dxbuf[dxoff + ref.size:]).all(), "wrote outside dx"
    err = np.abs(got - want).max()
    assert err < 1e-9, err
    return cfg, stats


# N, C, H, W, K, R, S, pad, stride, dil, groups
DGRAD_CASES = [
    (2, 4, 16, 16, 4, 3, 3, 1, 2, 1, 4),       # the bench's s2 geometry in small: aligned rows, vector stores
    (2, 3, 9, 11, 3, 3, 3, 1, 2, 1, 3),        # odd sizes, stride 2
    (1, 2, 12, 12, 2, 3, 3, 0, 2, 1, 2),       # pad 0
    (1, 2, 13, 10, 2, 3, 3, 2, 2, 1, 2),       # pad 2
    (1, 2, 15, 17, 2, 5, 5, 2, 2, 1, 2),       # 5x5 stride 2
    (1, 2, 14, 13, 2, 5, 5, 3, 2, 1, 2),       # 5x5 pad 3
    (1, 2, 13, 14, 2, 3, 3, 1, 3, 1, 2),       # stride 3 (DVW = 3: scalar stores)
    (1, 2, 17, 16, 2, 5, 5, 2, 3, 1, 2),       # 5x5 stride 3 pad 2
    (1, 2, 11, 12, 2, 3, 3, 0, 3, 1, 2),       # stride 3 pad 0
    (1, 2, 12, 13, 2, 3, 3, 2, 2, 2, 2),       # stride 2 dilation 2 (odd classes get no tap)
    (1, 2, 16, 17, 2, 3, 3, 3, 3, 2, 2),       # stride 3 dilation 2 pad 3
    (1, 2, 18, 16, 2, 7, 7, 3, 2, 1, 2),       # 7x7 stride 2
    (1, 2, 16, 16, 2, 3, 3, 1, 4, 1, 2),       # stride 4
    (2, 3, 10, 9, 6, 3, 3, 1, 2, 1, 3),        # channel multiplier 2
    (2, 8, 9, 10, 8, 3, 3, 1, 2, 1, 2),        # groups of 4 channels
    (2, 3, 15, 17, 8, 3, 3, 1, 2, 1, 1),       # dense C 3 (K 8 summed per plane)
    (2, 1, 16, 16, 4, 5, 5, 2, 2, 1, 1),       # dense C 1 5x5 stride 2 pad 2
    (1, 2, 6, 150, 2, 3, 3, 1, 2, 1, 2),       # > 128 columns: several w tiles
    (1, 1, 300, 8, 1, 3, 3, 1, 2, 1, 1),       # many rows: several h tiles
    (1, 2, 56, 56, 2, 3, 3, 1, 2, 1, 2),       # the benchmark's 56x56 stride-2 geometry (TX 14, TY 14)
    (1, 2, 1, 13, 2, 1, 3, 0, 2, 1, 2),        # one row (H 1)
    (1, 2, 9, 9, 2, 1, 1, 1, 1, 1, 2),         # stride 1, 1x1 pad 1 (pad > dil*(R-1): FLIP declines)
    (2, 3, 8, 11, 3, 3, 3, 3, 1, 1, 3),        # stride 1, 3x3 pad 3 (likewise)
]
# (case, sms): a tiny SM count keeps several planes per block (TZ > 1), the last block partly idle
DGRAD_TZ_CASES = [((3, 5, 7, 9, 5, 3, 3, 1, 2, 1, 5), 1), ((2, 3, 8, 8, 6, 3, 3, 1, 2, 1, 3), 1)]


def dgrad_main():
    n = 0
    total = dict(vec_loads=0, elem_chunks=0, vec_stores=0, scalar_stores=0)
    for case, sms in [(c, 132) for c in DGRAD_CASES] + DGRAD_TZ_CASES:
        for itemsize, offset, (alpha, beta) in itertools.product((4, 2), (0, 1), ((1.0, 0.0), (0.75, -0.5))):
            if offset and (alpha, beta) != (1.0, 0.0):
                continue
            cfg, stats = run_dgrad(*case, itemsize, offset, alpha, beta, seed=n, sms=sms)
            if sms == 1:
                assert cfg[2] > 1
            total = {k: v + stats[k] for k, v in total.items()}
            n += 1
        print(case, "sms", sms, "TX, TY, TZ, DVH, DVW, pitch =", cfg)
    assert all(total.values()), total
    print(f"{n} configurations: dw_tile_backward_data index math matches float64; paths taken: {total}")
    return n


F32 = np.float32


def wgrad_kernel(xbuf, xoff, dybuf, dyoff, dwbuf, H, W, P, Q, pad_h, pad_w, Cg, Kg, K_, N, sx, sy, KR, KS, ST, DL,
                 cfg, itemsize, alpha, beta, order_seed):
    """dw_tile_backward_filter over its whole grid (blocks in a shuffled order); float32 arithmetic throughout."""
    TX, TY, TZ, VH, pitch, NT, splits, per_split = cfg
    VW, LV, RS = K.TILE_VW, 16 // itemsize, KR * KS
    WIN4 = -(-((VW - 1) * ST + (KS - 1) * DL + 1) // 4)
    IRH = (VH - 1) * ST + (KR - 1) * DL + 1
    IH = (TY * VH - 1) * ST + (KR - 1) * DL + 1
    tiles_q = -(-Q // (TX * VW))
    tiles = -(-P // (TY * VH)) * tiles_q
    items = N * tiles
    rows = K_ * Cg
    assert NT % 32 == 0 and TX * TY * TZ <= NT <= 256 and splits <= 65535
    assert (splits - 1) * per_split < items <= splits * per_split, "a split without work, or items left over"
    partial = np.full(rows * splits * RS, np.nan, dtype=F32)
    tickets = np.zeros(rows, dtype=np.int64)
    stats = dict(vec_loads=0, elem_chunks=0, vec_dy=0, elem_dy=0, last_reduces=0)
    covered = np.zeros((rows, items), dtype=np.int64)
    blocks = list(itertools.product(range(rows), range(splits)))
    np.random.default_rng(order_seed).shuffle(blocks)
    plane_thr = TX * TY
    for kc, split in blocks:
        k = kc // Cg
        c = (k // Kg) * Cg + (kc - k * Cg)
        begin, end = split * per_split, min(items, split * per_split + per_split)
        acc = np.zeros((NT, RS), dtype=F32)
        for it0 in range(begin, end, TZ):
            smem = np.full(TZ * IH * pitch, np.nan)
            d = np.zeros((NT, VH, VW), dtype=F32)
            live = {}
            for tid in range(NT):                      # dy loads, then each slice's staging (its pt < plane_thr)
                z, pt = divmod(tid, plane_thr)
                ty, tx = divmod(pt, TX)
                it = it0 + z
                if not (z < TZ and it < end):
                    continue
                n, t = divmod(it, tiles)
                tp, tq = divmod(t, tiles_q)
                p0, q0 = tp * TY * VH, tq * TX * VW
                live[tid] = (z, ty, tx, n, p0, q0)
                covered[kc, it] += pt == 0
                q = q0 + tx * VW
                for i in range(VH):
                    p = p0 + ty * VH + i
                    if p >= P or q >= Q:
                        continue
                    src = dyoff + n * sy[0] + k * sy[1] + p * sy[2] + q
                    if q + VW <= Q and src % 4 == 0:               # OutVec: 4 elements (16 / 8 bytes)
                        d[tid, i] = dybuf[src:src + VW]
                        stats["vec_dy"] += 1
                    else:
                        d[tid, i] = [dybuf[src + j] if q + j < Q else 0.0 for j in range(VW)]
                        stats["elem_dy"] += 1
                if pt == 0:                                        # the slice's threads share one staging
                    stage(smem, z * IH * pitch, xbuf, xoff + n * sx[0] + c * sx[1], H, W, sx[2], IH, pitch,
                          p0 * ST - pad_h, q0 * ST - pad_w, LV, itemsize, stats)
            # __syncthreads()
            for tid, (z, ty, tx, n, p0, q0) in live.items():
                base = z * IH * pitch + ty * (VH * ST) * pitch + tx * (VW * ST)
                assert base % 4 == 0, "float4 window read unaligned"
                assert ty * VH * ST + IRH <= IH and tx * VW * ST + 4 * WIN4 <= pitch, "window outside the tile"
                for ir in range(IRH):
                    xs = smem[base + ir * pitch:base + ir * pitch + 4 * WIN4]
                    assert not np.isnan(xs).any(), "read an unstaged shared element"
                    xs = xs.astype(F32)
                    for i in range(VH):
                        dd = ir - i * ST
                        if dd < 0 or dd % DL != 0 or dd // DL >= KR:
                            continue
                        r = dd // DL
                        for s_ in range(KS):
                            for j in range(VW):
                                a = acc[tid, r * KS + s_]
                                acc[tid, r * KS + s_] = F32(np.float64(d[tid, i, j]) * np.float64(xs[j * ST + s_ * DL])
                                                            + np.float64(a))         # fmaf
            # __syncthreads()
        red = np.zeros((NT // 32, RS), dtype=F32)
        for w_ in range(NT // 32):                                 # xor butterflies over full warps
            v = acc[32 * w_:32 * w_ + 32].copy()
            for o in (16, 8, 4, 2, 1):
                v = (v + v[np.arange(32) ^ o]).astype(F32)
            assert (v == v[0]).all()
            red[w_] = v[0]
        total = np.zeros(RS, dtype=F32)
        for w_ in range(NT // 32):
            total = (total + red[w_]).astype(F32)
        row = kc * splits * RS
        if splits == 1:
            last = True
        else:
            partial[row + split * RS:row + (split + 1) * RS] = total
            tickets[kc] += 1
            last = tickets[kc] == splits
            if last:
                total = np.zeros(RS, dtype=F32)
                for sp in range(splits):                           # split order, whoever came last
                    total = (total + partial[row + sp * RS:row + (sp + 1) * RS]).astype(F32)
                tickets[kc] = 0
                stats["last_reduces"] += 1
        if last:
            old = beta * dwbuf[kc * RS:(kc + 1) * RS].astype(F32) if beta != 0 else F32(0)
            dwbuf[kc * RS:(kc + 1) * RS] = (F32(alpha) * total + old).astype(F32)
    assert (covered == 1).all(), "work items missed or taken twice"
    assert (tickets == 0).all(), "tickets not reset"
    return stats


def run_wgrad(N, C, H, W, Kc, R, S, pad, stride, dil, groups, itemsize=4, offset=0, alpha=1.0, beta=0.0, seed=0,
              sms=132):
    """One backward filter through the emulated dw_tile_backward_filter, twice (two block orders): bitwise equal
    and within float32 rounding of the float64 reference."""
    rng = np.random.default_rng(seed)
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    p = make_problem("emu", (N, C, H, W), (Kc, C // groups, R, S), desc, "float32")
    assert K.direct_supports(p) is None, K.direct_supports(p)
    x, dy = (rng.standard_normal(s).astype(F32).astype(np.float64) for s in (p.x_shape, p.y_shape))
    ref = convolution_backward_filter(None, x, dy, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_1)
    ref_abs = convolution_backward_filter(None, np.abs(x), np.abs(dy), desc, p.w_shape,
                                          algo=ConvolutionBwdFilterAlgo.ALGO_1)
    cfg = K.wgrad_config(N, Kc * p.Cg, *p.out_size, R, S, stride, dil, sms)
    assert cfg is not None
    xbuf, xoff, sx = padded(x, offset)
    dybuf, dyoff, sy = padded(dy, offset)
    prior = rng.standard_normal(p.w_shape).astype(F32)
    outs = []
    for order in (seed, seed + 1):
        dwbuf = (prior.copy() if beta != 0 else np.full(p.w_shape, np.nan, dtype=F32)).ravel()
        stats = wgrad_kernel(xbuf, xoff, dybuf, dyoff, dwbuf, H, W, *p.out_size, *p.padding, p.Cg, p.Kg, Kc, N, sx,
                             sy, R, S, stride, dil, cfg, itemsize, alpha, beta, order)
        outs.append(dwbuf.reshape(p.w_shape))
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), "block order changed the bits"
    got = outs[0].astype(np.float64)
    want = alpha * ref + (beta * prior.astype(np.float64) if beta != 0 else 0)
    bound = 1.5 * (2 * 2.0 ** -24 + p.N * math.prod(p.out_size) * 2.0 ** -23) * (
        abs(alpha) * ref_abs + abs(beta) * np.abs(prior)) + 1e-30
    assert not np.isnan(got).any(), "unwritten dw elements"
    assert (np.abs(got - want) <= bound).all(), np.abs(got - want).max()
    return cfg, stats


# N, C, H, W, K, R, S, pad, stride, dil, groups
WGRAD_CASES = [
    (2, 3, 9, 11, 3, 3, 3, 1, 1, 1, 3),        # depthwise, ragged
    (1, 1, 7, 9, 1, 3, 3, 1, 1, 1, 1),         # N = 1, C = 1
    (2, 2, 16, 16, 2, 3, 3, 1, 1, 1, 2),       # aligned rows: 16-byte loads and vector dy loads
    (2, 2, 10, 9, 4, 3, 3, 1, 2, 1, 2),        # channel multiplier 2, stride 2
    (1, 2, 11, 13, 2, 3, 3, 2, 3, 1, 2),       # stride 3, pad 2
    (1, 2, 11, 12, 2, 5, 5, 3, 1, 2, 2),       # 5x5 dilation 2, pad 3
    (1, 1, 9, 20, 1, 7, 7, 3, 1, 1, 1),        # 7x7
    (2, 8, 6, 7, 8, 3, 3, 0, 1, 1, 2),         # groups of 4 channels, pad 0
    (1, 2, 5, 6, 2, 1, 1, 0, 2, 1, 2),         # 1x1 stride 2
    (1, 1, 6, 150, 1, 3, 3, 1, 1, 1, 1),       # > 128 columns: several q tiles
    (1, 1, 70, 8, 1, 3, 3, 1, 1, 1, 1),        # many rows: several p tiles
] + DENSE_C1 + DENSE_CG                         # dense, 1 and 2..8 input channels (as the forward's table)
# (case, sms): a large SM count splits each row into several blocks (tickets, split-order sums); a tiny one keeps
# the whole row in one block of several steps
WGRAD_SPLIT_CASES = [((12, 1, 6, 150, 1, 3, 3, 1, 1, 1, 1), 1000), ((3, 1, 56, 56, 1, 3, 3, 1, 1, 1, 1), 1000),
                     ((100, 1, 14, 14, 1, 3, 3, 1, 2, 1, 1), 1000), ((5, 2, 9, 9, 2, 3, 3, 1, 1, 1, 2), 1),
                     ((8, 1, 32, 32, 6, 5, 5, 0, 1, 1, 1), 132),     # LeNet conv1, 8 images: 2 splits per row
                     ((24, 3, 13, 14, 4, 3, 3, 1, 1, 1, 1), 132)]    # dense C 3 K 4, 24 images: 12 rows, split


def wgrad_main(quick=False):
    n = 0
    total = dict(vec_loads=0, elem_chunks=0, vec_dy=0, elem_dy=0, last_reduces=0)
    cases = [(c, 132) for c in WGRAD_CASES] + WGRAD_SPLIT_CASES
    for case, sms in (cases[:4] + WGRAD_SPLIT_CASES if quick else cases):
        for itemsize, offset, (alpha, beta) in itertools.product((4, 2), (0, 1), ((1.0, 0.0), (0.75, -0.5))):
            if (offset and (alpha, beta) != (1.0, 0.0)) or (quick and itemsize == 2 and offset):
                continue
            cfg, stats = run_wgrad(*case, itemsize, offset, alpha, beta, seed=n, sms=sms)
            total = {k: v + stats[k] for k, v in total.items()}
            n += 1
        print(case, "sms", sms, "TX, TY, TZ, VH, pitch, NT, splits, per_split =", cfg)
    assert all(total.values()), total
    print(f"{n} configurations: dw_tile_backward_filter index math matches float64, bitwise equal over two block "
          f"orders; paths taken: {total}")
    return n


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
    wgrad_main()
    dgrad_main()


if __name__ == "__main__":
    if sys.argv[1:] == ["--dgrad"]:
        dgrad_main()
    else:
        main()
