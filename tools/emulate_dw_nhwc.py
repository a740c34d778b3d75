"""NumPy emulation of minidnn/backend/cuda/conv_dw_nhwc.py's kernels (CPU only: `python3 tools/emulate_dw_nhwc.py`;
tests/backend/test_dw_nhwc_emulation.py runs a subset in the normal suite).

Replays dwn_forward (forward; FLIP=1 stride-1 backward data), dwn_backward_data_st (strided backward data) and
dwn_backward_filter thread by thread over the launchers' grids (conv_dw_nhwc.vector / tile / grid_config /
wgrad_config), each thread's CV channel lanes as one NumPy vector: the work-item decode, the window walk with its
compile-time tap selection, the vector loads (asserted CV-aligned and reading no poisoned (NaN) element: the
activations sit in buffers with padded channel / row strides and NaN in the gaps), the alpha/beta vector stores
(every output written exactly once, nothing outside), and for the filter gradient the per-tap block sums in ty
order, the split partials and the slab tickets with blocks run in shuffled orders, float32 sums: two orders must
give the same bits, and every result must match the float64 reference of the CPU backend.

Both generations: ``v2=True`` (session 7, the default of conv_dw_nhwc.V2) replays the shrinking gather tiles
(gather_tile, with an ``sms`` argument to force small grids), the taps read as RS vectors (WVEC), the filter
gradient's chunked two-stage block sums and its two-level split sums (group tickets, then the slab ticket)."""
import itertools
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
from minidnn.backend.cuda import conv_dw_nhwc as D  # noqa: E402


class Buf:
    """A flat NHWC buffer: element (n, h, w, c) at n*s[0] + h*s[1] + w*s[2] + c; gaps hold NaN."""

    def __init__(self, a_nchw, cv, pad_c=0, pad_w=0):
        N, C, H, W = a_nchw.shape
        sw = C + pad_c * cv                     # pad_c: whole vectors of gap per pixel
        sh = (W + pad_w) * sw
        self.s = (H * sh, sh, sw)
        self.data = np.full(N * H * sh + 2 * cv, np.nan)
        idx = self.index(N, H, W, C)
        self.data[idx] = a_nchw.transpose(0, 2, 3, 1)
        self.shape = (N, C, H, W)
        self.cv = cv
        self.writes = np.zeros(self.data.size, dtype=int)

    def index(self, N, H, W, C):
        n, h, w, c = np.ix_(range(N), range(H), range(W), range(C))
        return n * self.s[0] + h * self.s[1] + w * self.s[2] + c

    def load(self, addr):
        assert addr % self.cv == 0, "unaligned vector load"
        v = self.data[addr:addr + self.cv]
        assert v.size == self.cv and not np.isnan(v).any(), "vector load of poison / outside the tensor"
        return v.copy()

    def store(self, addr, acc, alpha, beta):
        assert addr % self.cv == 0, "unaligned vector store"
        old = self.data[addr:addr + self.cv]
        o = alpha * acc + (beta * old if beta != 0 else 0)
        self.data[addr:addr + self.cv] = o
        self.writes[addr:addr + self.cv] += 1

    def nchw(self):
        N, C, H, W = self.shape
        return self.data[self.index(N, H, W, C)].transpose(0, 3, 1, 2)

    def check_writes(self):
        N, C, H, W = self.shape
        inside = np.zeros(self.data.size, dtype=bool)
        inside[self.index(N, H, W, C).ravel()] = True
        assert (self.writes[inside] == 1).all(), "an output written other than once"
        assert (self.writes[~inside] == 0).all(), "wrote outside the tensor"


def load_taps(wflat, c0, RS, CV, flip, wvec):
    """A thread's taps wt[t][c]: WVEC reads RS vectors of CV from c0*RS (element e = c*RS + t), else scalars."""
    wt = np.full((RS, CV), np.nan)
    if not wvec:
        for k, c in itertools.product(range(RS), range(CV)):
            wt[k, c] = wflat[(c0 + c) * RS + (RS - 1 - k if flip else k)]
        return wt
    for v in range(RS):
        a = c0 * RS + v * CV
        assert a % CV == 0, "unaligned tap vector"
        vec = wflat[a:a + CV]
        assert vec.size == CV
        for k in range(CV):
            c, t = divmod(v * CV + k, RS)
            wt[RS - 1 - t if flip else t, c] = vec[k]
    assert not np.isnan(wt).any()
    return wt


def forward_kernel(inp, wflat, out, C, H, W, P, Q, pad_h, pad_w, R, S, ST, DL, CV, VH, VQ, flip, cfg, alpha, beta,
                   wvec=False):
    """dwn_forward over its grid (FLIP: w read flipped)."""
    ct, sy, slabs, groups = cfg
    RS = R * S
    IRH, IWN = (VH - 1) * ST + (R - 1) * DL + 1, (VQ - 1) * ST + (S - 1) * DL + 1
    tiles_q = -(-Q // VQ)
    tiles = -(-P // VH) * tiles_q
    items = inp.shape[0] * tiles
    for bx, by, ty, tx in itertools.product(range(slabs), range(groups), range(sy), range(ct)):
        c0 = (bx * ct + tx) * CV
        it = by * sy + ty
        if c0 >= C or it >= items:
            continue
        n = it // tiles
        t = it - n * tiles
        tp = t // tiles_q
        p0, q0 = tp * VH, (t - tp * tiles_q) * VQ
        wt = load_taps(wflat, c0, RS, CV, flip, wvec)
        acc = np.zeros((VH, VQ, CV))
        hb, wb = p0 * ST - pad_h, q0 * ST - pad_w
        for ir in range(IRH):
            h = hb + ir
            if not 0 <= h < H:
                continue
            for ic in range(IWN):
                wq = wb + ic
                if not 0 <= wq < W:
                    continue
                xv = inp.load(n * inp.s[0] + h * inp.s[1] + wq * inp.s[2] + c0)
                for i in range(VH):
                    dr = ir - i * ST
                    if dr < 0 or dr % DL or dr // DL >= R:
                        continue
                    for j in range(VQ):
                        ds = ic - j * ST
                        if ds < 0 or ds % DL or ds // DL >= S:
                            continue
                        acc[i, j] += wt[(dr // DL) * S + ds // DL] * xv
        for i in range(VH):
            if p0 + i >= P:
                break
            for j in range(VQ):
                if q0 + j >= Q:
                    break
                out.store(n * out.s[0] + (p0 + i) * out.s[1] + (q0 + j) * out.s[2] + c0, acc[i, j], alpha, beta)


def dgrad_st_kernel(wflat, dy, dx, C, H, W, P, Q, pad_h, pad_w, R, S, ST, DL, CV, VQ, cfg, alpha, beta,
                    wvec=False):
    """dwn_backward_data_st over its grid (items over dx rows x VQ columns)."""
    ct, sy, slabs, groups = cfg
    RS = R * S
    tiles_q = -(-W // VQ)
    tiles = H * tiles_q
    items = dx.shape[0] * tiles
    for bx, by, ty, tx in itertools.product(range(slabs), range(groups), range(sy), range(ct)):
        c0 = (bx * ct + tx) * CV
        it = by * sy + ty
        if c0 >= C or it >= items:
            continue
        n = it // tiles
        t0 = it - n * tiles
        h = t0 // tiles_q
        w0 = (t0 - h * tiles_q) * VQ
        wt = load_taps(wflat, c0, RS, CV, False, wvec)
        for j in range(VQ):
            wq = w0 + j
            if wq >= W:
                break
            acc = np.zeros(CV)
            for r in range(R):
                hh = h + pad_h - r * DL
                if hh < 0 or hh % ST or hh // ST >= P:
                    continue
                for s in range(S):
                    ww = wq + pad_w - s * DL
                    if ww < 0 or ww % ST or ww // ST >= Q:
                        continue
                    acc += wt[r * S + s] * dy.load(n * dy.s[0] + (hh // ST) * dy.s[1] + (ww // ST) * dy.s[2] + c0)
            dx.store(n * dx.s[0] + h * dx.s[1] + wq * dx.s[2] + c0, acc, alpha, beta)


def block_sums_v1(acc, sy, SLAB, RS, CV, nthr):
    """Session 5: per tap, the column's owner adds the SY rows in ty order."""
    f32 = np.float32
    sums = np.zeros((RS, SLAB), dtype=f32)
    assert SLAB <= nthr                                    # one pass of the col loop per thread
    for k in range(RS):
        buf = acc[:, :, k, :].reshape(sy, SLAB)            # buf[ty * SLAB + tx * CV + c]
        for col in range(SLAB):
            v = f32(0)
            for yy in range(sy):
                v = f32(v + buf[yy, col])
            sums[k, col] = v
    return sums


def block_sums_v2(acc, sy, SLAB, RS, CV, nthr):
    """V2: taps in chunks of TC; per column, segments of SEG rows added in row order, then the segments in order."""
    f32 = np.float32
    TC, SEG = D.chunk_taps(RS, CV), D.SEG
    assert RS % TC == 0 and TC * CV <= 32
    nseg = -(-sy // SEG)
    assert (sy + nseg) * TC * SLAB == D.wgrad_shared_floats(SLAB // CV, sy, CV, RS, True) <= 12288   # 48 KB
    sums = np.zeros((RS, SLAB), dtype=f32)
    for t0 in range(0, RS, TC):
        buf = acc[:, :, t0:t0 + TC, :].transpose(0, 2, 1, 3).reshape(sy, TC * SLAB)   # [ty, k*SLAB + tx*CV + c]
        segs = np.zeros((nseg, TC * SLAB), dtype=f32)
        for sg in range(nseg):
            v = np.zeros(TC * SLAB, dtype=f32)
            for y in range(sg * SEG, min(sy, sg * SEG + SEG)):
                v = (v + buf[y]).astype(f32)
            segs[sg] = v
        v = np.zeros(TC * SLAB, dtype=f32)
        for sg in range(nseg):
            v = (v + segs[sg]).astype(f32)
        sums[t0:t0 + TC] = v.reshape(TC, SLAB)
    return sums


def wgrad_kernel(x, dy, dwflat, C, H, W, P, Q, pad_h, pad_w, R, S, ST, DL, CV, VH, VQ, cfg, alpha, beta, order,
                 stats, v2=False):
    """dwn_backward_filter with its blocks run in ``order`` (float32 sums, as the GPU)."""
    ct, sy, slabs, splits, per_split, group = cfg
    ng = -(-splits // group)
    gtickets = np.zeros((slabs, ng + 1), dtype=int)
    gsum = np.full((slabs, ng, R * S * ct * CV), np.nan, dtype=np.float32)
    RS, SLAB = R * S, ct * CV
    IRH, IWN = (VH - 1) * ST + (R - 1) * DL + 1, (VQ - 1) * ST + (S - 1) * DL + 1
    tiles_q = -(-Q // VQ)
    tiles = -(-P // VH) * tiles_q
    items = x.shape[0] * tiles
    f32 = np.float32
    partial = np.full(slabs * splits * RS * SLAB, np.nan, dtype=f32)
    tickets = np.zeros(slabs, dtype=int)
    nthr = ct * sy
    for bx, by in order:
        begin, end = by * per_split, min(items, (by + 1) * per_split)
        acc = np.zeros((sy, ct, RS, CV), dtype=f32)
        for ty, tx in itertools.product(range(sy), range(ct)):
            c0 = bx * SLAB + tx * CV
            if c0 >= C:
                continue
            for it in range(begin + ty, end, sy):
                n = it // tiles
                t = it - n * tiles
                tp = t // tiles_q
                p0, q0 = tp * VH, (t - tp * tiles_q) * VQ
                d = np.zeros((VH, VQ, CV), dtype=f32)
                for i, j in itertools.product(range(VH), range(VQ)):
                    if p0 + i < P and q0 + j < Q:
                        d[i, j] = dy.load(n * dy.s[0] + (p0 + i) * dy.s[1] + (q0 + j) * dy.s[2] + c0)
                hb, wb = p0 * ST - pad_h, q0 * ST - pad_w
                for ir in range(IRH):
                    h = hb + ir
                    if not 0 <= h < H:
                        continue
                    for ic in range(IWN):
                        wq = wb + ic
                        if not 0 <= wq < W:
                            continue
                        xv = x.load(n * x.s[0] + h * x.s[1] + wq * x.s[2] + c0).astype(f32)
                        for i in range(VH):
                            dr = ir - i * ST
                            if dr < 0 or dr % DL or dr // DL >= R:
                                continue
                            for j in range(VQ):
                                ds = ic - j * ST
                                if ds < 0 or ds % DL or ds // DL >= S:
                                    continue
                                k = (dr // DL) * S + ds // DL
                                acc[ty, tx, k] = (d[i, j].astype(np.float64) * xv + acc[ty, tx, k]).astype(f32)
        base = bx * SLAB * RS
        part = (bx * splits + by) * RS * SLAB
        sums = (block_sums_v2 if v2 else block_sums_v1)(acc, sy, SLAB, RS, CV, nthr)    # [k, col] float32
        for k, col in itertools.product(range(RS), range(SLAB)):
            v = sums[k, col]
            if splits == 1:
                if bx * SLAB + col < C:
                    dst = base + col * RS + k
                    dwflat[dst] = alpha * v + (beta * dwflat[dst] if beta != 0 else 0)
                    stats["writes"][dst] += 1
            else:
                partial[part + k * SLAB + col] = v
        if splits == 1:
            continue

        def finish(bx, idx, v):
            k, col = divmod(idx, SLAB)
            if bx * SLAB + col < C:
                dst = bx * SLAB * RS + col * RS + k
                dwflat[dst] = alpha * v + (beta * dwflat[dst] if beta != 0 else 0)
                stats["writes"][dst] += 1

        ps = bx * splits * RS * SLAB
        if not v2:
            tickets[bx] += 1
            if tickets[bx] != splits:
                continue
            stats["last_reduces"] += 1
            for idx in range(RS * SLAB):
                v = f32(0)
                for b in range(splits):
                    pv = partial[ps + b * RS * SLAB + idx]
                    assert not np.isnan(pv), "a split's partial read before it was written"
                    v = f32(v + pv)
                finish(bx, idx, v)
            tickets[bx] = 0
            continue
        # V2: group tickets, then the slab ticket (index NG)
        g = by // group
        gb, ge = g * group, min(splits, (g + 1) * group)
        tk = gtickets[bx]
        tk[g] += 1
        assert tk[g] <= ge - gb
        if tk[g] != ge - gb:
            continue
        stats["group_reduces"] += 1
        for idx in range(RS * SLAB):
            v = f32(0)
            for b in range(gb, ge):
                pv = partial[ps + b * RS * SLAB + idx]
                assert not np.isnan(pv), "a split's partial read before it was written"
                v = f32(v + pv)
            if ng > 1:
                gsum[bx, g, idx] = v
            else:
                finish(bx, idx, v)
        tk[g] = 0
        if ng == 1:
            stats["last_reduces"] += 1
            continue
        tk[ng] += 1
        if tk[ng] != ng:
            continue
        stats["last_reduces"] += 1
        for idx in range(RS * SLAB):
            v = f32(0)
            for gg in range(ng):
                gv = gsum[bx, gg, idx]
                assert not np.isnan(gv), "a group sum read before it was written"
                v = f32(v + gv)
            finish(bx, idx, v)
        tk[ng] = 0
    assert (gtickets == 0).all(), "group / slab tickets left non-zero"
    assert (tickets == 0).all(), "tickets left non-zero"


def _problem(N, C, H, W, R, S, pad, stride, dil, itemsize):
    desc = ConvolutionDescriptor(pad, stride, dil, C)
    p = make_problem("emu", (N, C, H, W), (C, 1, R, S), desc, "float32" if itemsize == 4 else "bfloat16")
    return desc, p


def run(N, C, H, W, R, S, pad, stride, dil, direction, itemsize=4, pad_c=0, alpha=1.0, beta=0.0, seed=0, v2=True,
        sms=132):
    """One forward / backward_data problem, emulated and checked against float64; returns (VH, VQ, grid config).
    ``sms``: the SM count the V2 tile choice sees (a large one forces the smallest tiles)."""
    rng = np.random.default_rng(seed)
    desc, p = _problem(N, C, H, W, R, S, pad, stride, dil, itemsize)
    R, S = p.kernel
    cv = D.vector(itemsize, R * S)
    assert C % cv == 0 and D.window_ok(R, S, stride, dil, 4)
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    wflat = w.ravel()
    if direction == "forward":
        ref = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
        src = x
    else:
        ref = convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
        src = dy
    prior = rng.standard_normal(ref.shape)
    inp = Buf(src, cv, pad_c, 1)
    out = Buf(prior if beta != 0 else np.full(ref.shape, np.nan), cv, pad_c, 2)
    (H_, W_), (P_, Q_) = p.in_size, p.out_size
    fpad = tuple(dil * (r - 1) - q for r, q in zip(p.kernel, p.padding))
    if direction == "forward" or (stride == 1 and min(fpad) >= 0):
        flip = direction != "forward"
        in_hw, out_hw, pads = ((H_, W_), (P_, Q_), p.padding) if not flip else ((P_, Q_), (H_, W_), fpad)
        vh, vq = D.gather_tile("forward", cv, 1 if flip else stride, N, C, *out_hw, sms, v2)
        tiles = -(-out_hw[0] // vh) * -(-out_hw[1] // vq)
        cfg = D.grid_config(C, cv, N * tiles)
        forward_kernel(inp, wflat, out, C, *in_hw, *out_hw, *pads, R, S, 1 if flip else stride, dil, cv, vh, vq, flip,
                       cfg, alpha, beta, v2)
    else:
        vh, vq = D.gather_tile("backward_data_st", cv, stride, N, C, H_, W_, sms, v2)
        assert vh == 1
        cfg = D.grid_config(C, cv, N * H_ * -(-W_ // vq))
        dgrad_st_kernel(wflat, inp, out, C, H_, W_, P_, Q_, *p.padding, R, S, stride, dil, cv, vq, cfg, alpha, beta,
                        v2)
    out.check_writes()
    want = alpha * ref + (beta * prior if beta != 0 else 0)
    err = np.abs(out.nchw() - want).max()
    assert err < 1e-9, err
    return vh, vq, cfg


def run_wgrad(N, C, H, W, R, S, pad, stride, dil, itemsize=4, pad_c=0, alpha=1.0, beta=0.0, seed=0, sms=132,
              v2=True, one_level=None):
    """One filter gradient, emulated in two shuffled block orders, checked against float64; returns the config.
    ``one_level``: conv_dw_nhwc.WGRAD2_ONE_LEVEL for this call (1: every multi-split launch sums in two levels)."""
    saved = D.WGRAD2_ONE_LEVEL
    D.WGRAD2_ONE_LEVEL = saved if one_level is None else one_level
    try:
        return _run_wgrad(N, C, H, W, R, S, pad, stride, dil, itemsize, pad_c, alpha, beta, seed, sms, v2)
    finally:
        D.WGRAD2_ONE_LEVEL = saved


def _run_wgrad(N, C, H, W, R, S, pad, stride, dil, itemsize, pad_c, alpha, beta, seed, sms, v2):
    rng = np.random.default_rng(seed)
    desc, p = _problem(N, C, H, W, R, S, pad, stride, dil, itemsize)
    R, S = p.kernel
    cv = D.vector(itemsize, R * S)
    x, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.y_shape)
    ref = convolution_backward_filter(None, x, dy, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_1)
    (H_, W_), (P_, Q_) = p.in_size, p.out_size
    vh, vq = D.tile("backward_filter", cv, stride)
    items = N * -(-P_ // vh) * -(-Q_ // vq)
    cfg = D.wgrad_config(C, cv, items, sms, v2)
    ct, sy, slabs, splits, per_split, group = cfg
    assert ct * sy <= 256 and ct * sy >= ct * cv and splits <= 65535
    xb, db = Buf(x, cv, pad_c, 1), Buf(dy, cv, pad_c, 0)
    prior = rng.standard_normal(ref.shape)
    results = []
    blocks = list(itertools.product(range(slabs), range(splits)))
    for trial in range(2):
        order = list(blocks)
        np.random.default_rng(seed + 100 + trial).shuffle(order)
        dwflat = (prior.ravel().astype(np.float32).astype(np.float64) if beta != 0
                  else np.full(ref.size, np.nan))
        stats = dict(writes=np.zeros(ref.size, dtype=int), last_reduces=0, group_reduces=0)
        wgrad_kernel(xb, db, dwflat, C, H_, W_, P_, Q_, *p.padding, R, S, stride, dil, cv, vh, vq, cfg, alpha, beta,
                     order, stats, v2)
        assert (stats["writes"] == 1).all(), "a dw element written other than once"
        assert (splits > 1) == (stats["last_reduces"] == slabs)
        if v2 and splits > 1:
            assert stats["group_reduces"] == slabs * -(-splits // group)
        results.append(dwflat.copy())
    assert np.array_equal(results[0], results[1]), "block order changed the bits"
    want = alpha * ref + (beta * prior.astype(np.float32).astype(np.float64) if beta != 0 else 0)
    bound = 1e-5 * (abs(alpha) * convolution_backward_filter(None, np.abs(x), np.abs(dy), desc, p.w_shape,
                                                             algo=ConvolutionBwdFilterAlgo.ALGO_1)
                    + abs(beta) * np.abs(prior) + 1)
    got = results[0].reshape(ref.shape)
    assert (np.abs(got - want) <= bound).all(), np.abs(got - want).max()
    return cfg


# N, C, H, W, R, S, pad, stride, dil
CASES = [
    (2, 8, 9, 11, 3, 3, 1, 1, 1),        # ragged spatial sizes
    (1, 40, 7, 6, 3, 3, 1, 1, 1),        # C 40: fp32 10 vectors, bf16 5
    (2, 12, 11, 13, 3, 3, 1, 2, 1),      # stride 2, ragged
    (1, 16, 9, 10, 3, 3, 2, 1, 1),       # padding 2 (stride 1: the gather kernel for dgrad)
    (1, 8, 12, 11, 5, 5, 2, 1, 1),       # 5x5 pad 2
    (2, 8, 13, 9, 5, 5, 2, 2, 1),        # 5x5 stride 2
    (1, 8, 10, 12, 3, 3, 2, 1, 2),       # dilation 2
    (1, 8, 8, 8, 3, 3, 0, 1, 1),         # pad 0
    (1, 8, 11, 9, 3, 3, 1, 3, 1),        # stride 3
    (1, 8, 5, 23, 1, 1, 0, 2, 1),        # 1x1 stride 2
]
# C past one slab (CT 32 vectors): fp32 C 136 = 34 vectors -> CT 17, 2 slabs; bf16 C 272 -> 34 vectors
WIDE = [(1, 136, 3, 5, 3, 3, 1, 1, 1), (1, 144, 4, 3, 3, 3, 1, 2, 1)]


def main(quick=False):
    n = 0
    for case in CASES + WIDE:
        for itemsize in (4, 2):
            if case[1] % D.vector(itemsize, case[4] * case[5]):
                continue                       # not whole vectors: conv_dw_nhwc.supports declines
            for v2 in (False, True):
                for direction in ("forward", "backward_data"):
                    run(*case, direction, itemsize, 0, 1.0, 0.0, seed=1, v2=v2)
                    run(*case, direction, itemsize, 1, 0.75, -0.5, seed=2, v2=v2)   # padded channel stride, a/b
                    n += 2
                run_wgrad(*case, itemsize, 0, 1.0, 0.0, seed=3, v2=v2)
                run_wgrad(*case, itemsize, 2, 0.5, 2.0, seed=4, sms=1, v2=v2)       # few SMs: one split per slab
                run_wgrad((case[0] + 2) * 2, *case[1:], itemsize, 0, 1.0, 0.0, seed=5, sms=512, v2=v2)  # many
                n += 3
            run_wgrad((case[0] + 2) * 2, *case[1:], itemsize, 1, -1.5, 0.25, seed=9, sms=512, one_level=1)
            n += 1                                                  # two levels of split sums where splits > 2
            for direction in ("forward", "backward_data"):            # V2's smallest tiles (VH = VQ = 1)
                vh, vq, _ = run(*case, direction, itemsize, 0, 1.0, 0.0, seed=6, sms=10 ** 6)
                assert (vh, vq) == (1, 1)
                n += 1
    print(f"{n} emulated launches agree with float64")


if __name__ == "__main__":
    main()
