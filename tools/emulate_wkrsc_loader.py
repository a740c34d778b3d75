# ruff: noqa: E701, E702  (a transcription of the kernel loaders, kept line for line)
"""Round 12 of docs/host_overhead.md: emulates, in NumPy, the two B loaders of conv_igemm's VEC backward data
(conv_igemm_source.py, line for line): the CRSK form (!WKRSC, reading the (G, Cg, R, S, Kg) copy) and WKRSC=1
(reading the forward's (K, R, S, Cg) copy), slice by slice, per residue class, group and column tile, for 4-wide
(float32) and 8-wide (16-bit) vectors, and checks that every (k, n) cell of every slice is written by each loader
exactly once, with the same value (or the same zero).  The multiply reads B only through BS(stage, k, n), so the
same cells give the same sums in the same order.      python tools/emulate_wkrsc_loader.py  (~1 min)"""
import itertools

import numpy as np

THREADS = 128

def slices(Kg, Cg, G, R0, S0, st, pad, tile_bn, vecw, BK, rng):
    w = rng.standard_normal((G * Kg, Cg, R0, S0))
    krsc = np.ascontiguousarray(np.moveaxis(w, 1, -1)).ravel()
    crsk = np.ascontiguousarray(w.reshape(G, Kg, Cg, R0, S0).transpose(0, 2, 3, 4, 1)).ravel()
    wrs = R0 * S0
    NG = Cg
    BN = tile_bn
    checked = 0
    classes = [(a, b) for a in range(st) for b in range(st)] if st > 1 else [None]
    for cls in classes:
        if cls is None:
            wt0, wjr, wjs, R, S = 0, S0, 1, R0, S0
        else:
            a, b = cls
            r0, s0 = (a + pad) % st, (b + pad) % st
            tr = (R0 - r0 + st - 1) // st if R0 > r0 else 0
            ts = (S0 - s0 + st - 1) // st if S0 > s0 else 0
            if not (tr and ts):
                continue
            wt0, wjr, wjs, R, S = r0 * S0 + s0, st * S0, st, tr, ts
        KR = Kg * R * S
        for grp in range(G):
            for n0 in range(0, NG, BN):
                A = {}; Bw = {}
                # CRSK loader
                KV = BK // vecw; V_STEP = THREADS // KV; B_VECS = -(-BN // V_STEP)
                st_c = []
                for tid in range(THREADS):
                    v_kq, v_r0 = (tid % KV) * vecw, tid // KV
                    k = v_kq; rs = k // Kg
                    t_c = k - rs * Kg; t_r = rs // S; t_s = rs - t_r * S
                    t_w = (wt0 + t_r * wjr + t_s * wjs) * Kg + t_c
                    st_c.append([v_kq, v_r0, t_c, t_r, t_s, t_w])
                t_ds, t_dr = (wjs - 1) * Kg, (wjr - S * wjs) * Kg
                # WKRSC loader
                BV = BN // vecw; B_KSTEP = THREADS // BV; BV2 = -(-BK // B_KSTEP)
                st_k = []
                for tid in range(THREADS):
                    b_cv, b_kk0 = tid % BV, tid // BV
                    rows = []
                    for i in range(BV2):
                        k = b_kk0 + i * B_KSTEP; rs = k // Kg; jr = rs // S
                        b_kc = k - rs * Kg; b_js = rs - jr * S; b_rs = wt0 + jr * wjr + b_js * wjs
                        rows.append([b_kc, b_rs, b_js])
                    st_k.append((b_cv, b_kk0, rows))
                for k0 in range(0, KR, BK):
                    A.clear(); Bw.clear()
                    for s in st_c:
                        v_kq, v_r0, t_c, t_r, t_s, t_w = s
                        k = k0 + v_kq; k_ok = k < KR
                        for i in range(B_VECS):
                            nn = v_r0 + i * V_STEP; col = n0 + nn
                            if BN % V_STEP and nn >= BN: break
                            ok = k_ok and col < NG
                            for e in range(vecw):
                                key = (v_kq + e, nn)
                                assert key not in A
                                A[key] = crsk[grp * NG * Kg * wrs + col * Kg * wrs + t_w + e] if ok else 0.0
                        t_c += BK; t_w += BK
                        while t_c >= Kg:
                            t_c -= Kg; t_w += t_ds; t_s += 1
                            if t_s == S: t_s = 0; t_r += 1; t_w += t_dr
                        s[2:] = [t_c, t_r, t_s, t_w]
                    for b_cv, b_kk0, rows in st_k:
                        col0 = n0 + b_cv * vecw; b_col_ok = col0 < NG
                        for i, r in enumerate(rows):
                            kk = b_kk0 + i * B_KSTEP
                            if B_KSTEP * BV2 != BK and kk >= BK: break
                            ok = b_col_ok and k0 + kk < KR
                            b_kc, b_rs, b_js = r
                            for e in range(vecw):
                                key = (kk, b_cv * vecw + e)
                                assert key not in Bw
                                Bw[key] = krsc[(grp * Kg + b_kc) * wrs * Cg + b_rs * Cg + col0 + e] if ok else 0.0
                            b_kc += BK
                            while b_kc >= Kg:
                                b_kc -= Kg; b_rs += wjs; b_js += 1
                                if b_js == S: b_js = 0; b_rs += wjr - S * wjs
                            r[:] = [b_kc, b_rs, b_js]
                    want = {(k, n) for k in range(BK) for n in range(BN)}
                    assert want <= set(A) and want <= set(Bw), "a cell left unwritten"
                    for key in want:
                        assert A[key] == Bw[key], (key, A[key], Bw[key])
                    checked += len(want)
    return checked

rng = np.random.default_rng(0)
total = 0
for (Kg, Cg, G, R, S, st, pad), (bn, vecw, bk) in itertools.product(
        [(16, 16, 1, 3, 3, 1, 1), (32, 16, 1, 3, 3, 2, 1), (16, 16, 2, 3, 3, 1, 1), (32, 16, 2, 3, 3, 2, 1),
         (40, 48, 1, 5, 5, 1, 2), (64, 32, 1, 3, 3, 2, 1), (24, 24, 1, 1, 1, 2, 0), (16, 8, 1, 2, 2, 3, 1),
         (8, 8, 1, 5, 5, 3, 2)],
        [(16, 4, 16), (32, 4, 16), (64, 4, 16), (16, 8, 32), (32, 8, 32), (64, 8, 32)]):
    if Cg % vecw or Kg % vecw:
        continue
    total += slices(Kg, Cg, G, R, S, st, pad, bn, vecw, bk, rng)
print("cells compared:", total, "all equal")
