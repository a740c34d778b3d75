"""NumPy emulation of conv_igemm DIR 1 (backward data) with residue classes in one launch (CPU only, ~2 min:
`python3 tools/emulate_conv_residue.py`): the block prologue's geometry rewrite, the element loader (division decode
and PRECOMP table), the VEC loader (t_c/t_r/t_s/t_w walk, B from the (G, Cg, R, S, Kg) copy of the WHOLE filter, or
WKRSC: the channels-last filter with the (kc, js, rs) carry) and the epilogue through dx's strides -- index for index
as written in the CUDA source, against float64."""
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minidnn.backend import ConvolutionDescriptor  # noqa: E402
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402


def tdiv(a, b):        # C's truncating division
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def ref_dgrad(dy, w, pad, st, G, H, W):
    N, Kc, P, Q = dy.shape
    _, Cg, R, S = w.shape
    Kg = Kc // G
    C = Cg * G
    xp = np.zeros((N, C, H + 2 * pad + st * P + R, W + 2 * pad + st * Q + S))
    for g in range(G):
        for r in range(R):
            for s in range(S):
                xp[:, g * Cg:(g + 1) * Cg, r: r + st * P: st, s: s + st * Q: st] += \
                    np.einsum("nkhw,kc->nchw", dy[:, g * Kg:(g + 1) * Kg], w[g * Kg:(g + 1) * Kg, :, r, s])
    return xp[:, :, pad:pad + H, pad:pad + W]


def strides_of(shape, layout):
    N, C, H, W = shape
    if layout == "NHWC":
        return (H * W * C, 1, W * C, C)
    return (C * H * W, H * W, W, 1)


def flat(a, layout):
    return np.array(a.transpose(0, 2, 3, 1) if layout == "NHWC" else a).ravel()


def unflat(buf, shape, layout):
    N, C, H, W = shape
    if layout == "NHWC":
        return buf.reshape(N, H, W, C).transpose(0, 3, 1, 2)
    return buf.reshape(shape)


def run(N, C, H, W, Kc, R, S, pad, stride, G, loader="elem", table=False, tile="64x32", half=False, layout="NCHW",
        alpha=1.0, beta=0.0, seed=0):
    rng = np.random.default_rng(seed)
    p = make_problem("emu", (N, C, H, W), (Kc, C // G, R, S), ConvolutionDescriptor(pad, stride, 1, G), "float32")
    assert K._split_by_residue(p)
    P, Q = p.out_size
    Cg, Kg = C // G, Kc // G
    w = rng.standard_normal(p.w_shape)
    dy = rng.standard_normal(p.y_shape)
    prior = rng.standard_normal(p.x_shape)
    dyl = "NHWC" if loader != "elem" else layout
    dxl = dyl
    a_src = flat(dy, dyl)
    syn, syc, syh, syw = strides_of(p.y_shape, dyl)
    sxn0, sxc0, sxh0, sxw0 = strides_of(p.x_shape, dxl)
    out_buf = flat(prior, dxl) if beta != 0 else np.full(N * C * H * W, np.nan)
    if loader == "elem":
        b_src = w.ravel()
    elif loader == "vec":
        b_src = np.ascontiguousarray(w.reshape(G, Kg, Cg, R, S).transpose(0, 2, 3, 4, 1)).ravel()
    else:
        b_src = np.ascontiguousarray(w.transpose(0, 2, 3, 1)).ravel()
    g = (H, W, P, Q, R, S, pad, pad, stride, stride, 1, 1)
    tab = K._residue_tap_table(p, g, (syn, syc, syh, syw)) if table else None
    BM, BN, BK, WM, WN = K.TILES[tile]
    VECW = 8 if half else 4
    if half:
        BK = 32
    THREADS = 128
    classes = stride * stride
    grid_m = N * -(-H // stride) * -(-W // stride)
    gx, gy = -(-grid_m // BM), -(-Cg // BN)
    written = np.zeros(out_buf.size, int)
    for grp, split, bx, by in itertools.product(range(G), range(classes), range(gx), range(gy)):
        m0, n0 = bx * BM, by * BN
        # ---- prologue, as in the source
        Hs, Ws, Rs, Ss, ph, pw, sth, stw = H, W, R, S, pad, pad, stride, stride
        sxh, sxw = sxh0, sxw0
        out_off = 0
        wrs = Rs * Ss
        wt0, wjr, wjs = 0, Ss, 1
        has_taps = True
        toff = 0
        if classes > 1:
            a = split // stw
            b = split - a * stw
            r0 = (a + ph) % sth
            s0 = (b + pw) % stw
            tr = (Rs - r0 + sth - 1) // sth if Rs > r0 else 0
            ts = (Ss - s0 + stw - 1) // stw if Ss > s0 else 0
            if table:
                toff = split * Kg * (((Rs + sth - 1) // sth) * ((Ss + stw - 1) // stw))
            wt0, wjr, wjs = r0 * Ss + s0, sth * Ss, stw
            ph, pw = (a + ph - r0) // sth, (b + pw - s0) // stw
            out_off += a * sxh + b * sxw
            Hs = (Hs - a + sth - 1) // sth if Hs > a else 0
            Ws = (Ws - b + stw - 1) // stw if Ws > b else 0
            sxh *= sth
            sxw *= stw
            has_taps = tr > 0 and ts > 0
            Rs, Ss = (tr, ts) if has_taps else (1, 1)
            sth = stw = 1
        RS = Rs * Ss
        M, NG, KR = N * Hs * Ws, Cg, (Kg * RS if has_taps else 0)
        if m0 >= M:
            continue
        k_end = KR
        tiles = -(-k_end // BK) if k_end > 0 else 0
        A = np.zeros((BM, tiles * BK))
        B = np.zeros((tiles * BK, BN))

        def decode(k):
            if table:
                return tuple(tab[toff + k])
            ch = tdiv(k, RS)
            rs = k - ch * RS
            r = tdiv(rs, Ss)
            s = rs - r * Ss
            return (ch * syc, r, s, ch * Cg * wrs + wt0 + r * wjr + s * wjs)

        if loader == "elem":
            HW = Hs * Ws
            for r_ in range(BM):
                am = m0 + r_
                if am >= M:
                    continue
                n = am // HW
                hw = am - n * HW
                h = hw // Ws
                ww = hw - h * Ws
                a_hp, a_wp, a_base = h + ph, ww + pw, n * syn + grp * Kg * syc
                for k in range(k_end):
                    t = decode(k)
                    hp, wp = a_hp - t[1], a_wp - t[2]
                    ok = hp >= 0 and wp >= 0 and hp < P and wp < Q
                    if ok:
                        A[r_, k] = a_src[a_base + t[0] + hp * syh + wp * syw]
            bgrp = grp * Kg * Cg * wrs
            for k in range(k_end):
                wk = decode(k)[3]
                for nn in range(BN):
                    col = n0 + nn
                    if col < NG:
                        B[k, nn] = b_src[bgrp + wk + col * wrs]
        else:
            KV = BK // VECW
            V_STEP = THREADS // KV
            A_VECS = BM // V_STEP
            B_VECS = -(-BN // V_STEP)
            BV = BN // VECW
            B_KSTEP = THREADS // BV
            WB_VECS = -(-BK // B_KSTEP)
            for tid in range(THREADS):
                v_kq, v_r0 = (tid % KV) * VECW, tid // KV
                vh, vw, vb = [], [], []
                for i in range(A_VECS):
                    am = m0 + v_r0 + i * V_STEP
                    HW = Hs * Ws
                    n = am // HW
                    hw = am - n * HW
                    h = hw // Ws
                    ww = hw - h * Ws
                    h_, w_ = h + ph, ww + pw
                    base = n * syn + grp * Kg + h_ * syh + w_ * syw
                    if am >= M:
                        h_, base = -(1 << 30), 0
                    vh.append(h_)
                    vw.append(w_)
                    vb.append(base)
                CH = Kg
                k = v_kq
                rs = k // CH
                t_c = k - rs * CH
                t_r = rs // Ss
                t_s = rs - t_r * Ss
                t_w = (wt0 + t_r * wjr + t_s * wjs) * Kg + t_c
                t_ds, t_dr = (wjs - 1) * Kg, (wjr - Ss * wjs) * Kg
                if loader == "krsc":
                    b_cv, b_kk0 = tid % BV, tid // BV
                    col0 = n0 + b_cv * VECW
                    b_col_ok = col0 < NG
                    w_row = wrs * Cg
                    b_kc, b_rs, b_js = [], [], []
                    for i in range(WB_VECS):
                        k = b_kk0 + i * B_KSTEP
                        rs_ = k // Kg
                        jr = rs_ // Ss
                        b_kc.append(k - rs_ * Kg)
                        b_js.append(rs_ - jr * Ss)
                        b_rs.append(wt0 + jr * wjr + b_js[-1] * wjs)
                for t in range(tiles):
                    k0 = t * BK
                    k = k0 + v_kq
                    k_ok = k < k_end
                    rh, sw_ = t_r, t_s
                    t_off = rh * -syh + sw_ * -syw + t_c
                    for i in range(A_VECS):
                        hh, ww = vh[i] - rh, vw[i] - sw_
                        ok = k_ok and 0 <= hh < P and 0 <= ww < Q
                        if ok:
                            src = vb[i] + t_off
                            A[v_r0 + i * V_STEP, k0 + v_kq:k0 + v_kq + VECW] = a_src[src:src + VECW]
                    if loader == "krsc":
                        for i in range(WB_VECS):
                            kk = b_kk0 + i * B_KSTEP
                            if B_KSTEP * WB_VECS != BK and kk >= BK:
                                break
                            ok = b_col_ok and k0 + kk < k_end
                            if ok:
                                src = (grp * Kg + b_kc[i]) * w_row + b_rs[i] * Cg + col0
                                B[k0 + kk, b_cv * VECW:b_cv * VECW + VECW] = b_src[src:src + VECW]
                            b_kc[i] += BK
                            while b_kc[i] >= Kg:
                                b_kc[i] -= Kg
                                b_rs[i] += wjs
                                b_js[i] += 1
                                if b_js[i] == Ss:
                                    b_js[i] = 0
                                    b_rs[i] += wjr - Ss * wjs
                    else:
                        wk, b_ld = t_w, Kg * wrs
                        bgrp = grp * NG * Kg * wrs
                        for i in range(B_VECS):
                            nn = v_r0 + i * V_STEP
                            col = n0 + nn
                            if BN % V_STEP != 0 and nn >= BN:
                                break
                            ok = k_ok and col < NG
                            if ok:
                                src = bgrp + col * b_ld + wk
                                B[k0 + v_kq:k0 + v_kq + VECW, nn] = b_src[src:src + VECW]
                    t_c += BK
                    t_w += BK
                    while t_c >= CH:
                        t_c -= CH
                        t_w += t_ds
                        t_s += 1
                        if t_s == Ss:
                            t_s = 0
                            t_r += 1
                            t_w += t_dr
        acc = A @ B
        HW = Hs * Ws
        for r_ in range(BM):
            row = m0 + r_
            if row >= M:
                continue
            n = row // HW
            hw = row - n * HW
            h = hw // Ws
            ww = hw - h * Ws
            base = out_off + n * sxn0 + grp * Cg * sxc0 + h * sxh + ww * sxw
            for nn in range(BN):
                col = n0 + nn
                if col >= NG:
                    continue
                d = base + col * sxc0
                old = beta * out_buf[d] if beta != 0 else 0.0
                out_buf[d] = alpha * acc[r_, nn] + old
                written[d] += 1
    got = unflat(out_buf, p.x_shape, dxl)
    want = alpha * ref_dgrad(dy, w, pad, stride, G, H, W) + beta * prior
    assert (written == 1).all(), f"written {np.bincount(written)}"
    err = np.abs(got - want).max()
    assert err < 1e-9, err
    return err


CASES = [
    # N, C, H, W, K, R, S, pad, stride, G
    (2, 8, 11, 10, 8, 3, 3, 1, 2, 1),      # ragged
    (1, 8, 9, 8, 16, 1, 1, 0, 2, 1),       # 1x1 stride 2: tapless classes
    (2, 4, 10, 11, 8, 2, 2, 1, 3, 1),      # 2x2 stride 3: tapless classes
    (1, 8, 10, 9, 16, 7, 7, 3, 2, 1),      # 7x7 stride 2
    (2, 16, 7, 8, 16, 3, 3, 1, 2, 2),      # groups
    (1, 8, 13, 12, 8, 5, 5, 2, 3, 1),      # 5x5 stride 3
    (2, 8, 6, 5, 24, 3, 3, 0, 2, 1),       # pad 0, K > BN
    (1, 8, 1, 9, 8, 3, 3, 1, 2, 1),        # H = 1 < stride: empty classes
]

if __name__ == "__main__":
    n = 0
    for case in CASES:
        for loader, table, tile, half, layout in [("elem", False, "64x32", False, "NCHW"),
                                                  ("elem", True, "64x16", False, "NHWC"),
                                                  ("elem", True, "128x64", False, "NCHW"),
                                                  ("vec", False, "64x16", False, "NHWC"),
                                                  ("vec", False, "64x64", True, "NHWC"),
                                                  ("krsc", False, "64x32", False, "NHWC"),
                                                  ("krsc", False, "64x16", True, "NHWC"),
                                                  ("krsc", False, "128x64", False, "NHWC")]:
            beta = 0.0 if n % 2 == 0 else -0.5
            if half and case[4] // case[9] % 8:
                continue
            if loader == "krsc" and (case[1] // case[9]) % (8 if half else 4):
                continue
            err = run(*case, loader=loader, table=table, tile=tile, half=half, layout=layout, alpha=0.75, beta=beta,
                      seed=n)
            n += 1
            print(case, loader, table, tile, "half" if half else "f32", layout, f"beta={beta}", f"err {err:.1e}",
                  flush=True)
    print(f"{n} emulated configurations match float64")
