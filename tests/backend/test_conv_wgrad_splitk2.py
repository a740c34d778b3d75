"""The deterministic filter gradient's split-K summed in two levels (SK2=1, session 7; docs/conv_kernels.md
"Session 7: the filter gradient's split-K").

CPU part: ``splitk2_chunks`` against the kernel's own chunk walk; a NumPy replay of the kernel's split-K section (the
same index expressions: live fragments, chunk and tile tickets, the chunk sum stored over the chunk's first partial)
under shuffled block orders -- bitwise the two-level float32 sum whatever order, every ticket back at zero, no
ticket or partial slot shared by two tiles, every real (row, column) of a tile in a live fragment; under the fake
CuPy (tools/record_launches.py) the launch carries -DSK2=1 exactly where the plan has >= SPLITK2_MIN_SPLITS splits,
MINIDNN_WGRAD_SPLITK2's switch restores the old launch (same grid, same arguments), and the ticket array covers
tiles * (1 + chunks).
GPU part (cuda-marked): SK2 plans against the float64 reference (ragged tails, a ragged last split and chunk,
groups, dilation, 1x1 and 3-channel stems, fp32 / TF32 / bf16 / fp16, float32 dw from half data, NCHW / NHWC,
alpha/beta into a NaN-poisoned or prior dw), bitwise repeatable, tickets left zeroed, one launch; the exact sum order
(per-image splits added on the host in the two-level order, bitwise); the old one-level kernel beside it.
"""
import json
import math
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.convolution import ConvolutionDescriptor
from minidnn.backend.cuda import conv_igemm as K

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---- CPU: the chunking and a replay of the kernel's reduction ----------------------------------------------------

def _kernel_chunk(splits):
    skg = 1
    while skg * skg < splits:      # the kernel's loop, verbatim
        skg += 1
    return skg, (splits + skg - 1) // skg


def test_chunks_match_the_kernel_walk():
    for s in list(range(1, 600)) + [1023, 1024, 1025, 4095, 65535]:
        assert K.splitk2_chunks(s) == _kernel_chunk(s), s
    assert K.splitk2_chunks(512) == (23, 23) and K.splitk2_chunks(171) == (14, 13)


def _replay(tiles_x, tiles_y, groups, splits, M, NG, tile, rng, order_seed):
    """Run the kernel's SK2 section block by block in a shuffled order (each block atomic: a valid interleaving of
    the ticket protocol, whose fences order every store before the draw that publishes it).  Returns (the tile
    results per (tile, thread, fragment), the tickets, the partial buffer's reads by tile)."""
    BM, BN, _, WM, WN = K.TILES[tile]
    warps_m, warps_n = BM // WM, BN // WN
    threads = warps_m * warps_n * 32
    MI, NJ = WM // 16, WN // 8
    frags = MI * NJ
    ntiles = tiles_x * tiles_y * groups
    skg, nch = _kernel_chunk(splits)
    tickets = np.zeros(ntiles * (1 + nch), np.uint32)
    partial = np.full(ntiles * splits * frags * threads * 4, np.nan, np.float32)
    owner = np.full(partial.size // 4, -1)                       # which tile wrote each float4 slot
    acc_in = rng.standard_normal((ntiles, splits, frags, threads, 4)).astype(np.float32)
    results = {}
    blocks = [(bx, by, z) for z in range(groups * splits) for by in range(tiles_y) for bx in range(tiles_x)]
    order = np.random.default_rng(order_seed).permutation(len(blocks))
    for b in order:
        bx, by, z = blocks[b]
        grp, split = z // splits, z % splits
        m0, n0 = bx * BM, by * BN
        tile = (grp * tiles_y + by) * tiles_x + bx
        assert ntiles == tiles_x * tiles_y * ((groups * splits) // splits)
        chunk, c0 = split // skg, (split // skg) * skg
        c1 = min(splits, c0 + skg)
        base = tile * splits * frags * threads

        def live(tid, i, j):
            warp = tid // 32
            wm0, wn0 = (warp % warps_m) * WM, (warp // warps_m) * WN
            return m0 + wm0 + i * 16 < M and n0 + wn0 + j * 8 < NG

        def slot(sp, f, tid):
            return base + sp * frags * threads + f * threads + tid

        for tid in range(threads):
            for i in range(MI):
                for j in range(NJ):
                    if live(tid, i, j):
                        s = slot(split, i * NJ + j, tid)
                        assert owner[s] in (-1, tile)
                        owner[s] = tile
                        partial[4 * s:4 * s + 4] = acc_in[tile, split, i * NJ + j, tid]
        t = ntiles + tile * nch + chunk
        last = tickets[t] == c1 - c0 - 1
        tickets[t] += 1
        if not last:
            continue
        acc = np.zeros((threads, frags, 4), np.float32)
        for sp in range(c0, c1):
            for tid in range(threads):
                for f in range(frags):
                    if live(tid, f // NJ, f % NJ):
                        s = slot(sp, f, tid)
                        assert not np.isnan(partial[4 * s]).any()
                        acc[tid, f] = acc[tid, f] + partial[4 * s:4 * s + 4]
        tickets[t] = 0
        if nch > 1:
            for tid in range(threads):
                for f in range(frags):
                    if live(tid, f // NJ, f % NJ):
                        s = slot(c0, f, tid)
                        partial[4 * s:4 * s + 4] = acc[tid, f]
            last = tickets[tile] == nch - 1
            tickets[tile] += 1
            if not last:
                continue
            acc = np.zeros((threads, frags, 4), np.float32)
            for c in range(nch):
                for tid in range(threads):
                    for f in range(frags):
                        if live(tid, f // NJ, f % NJ):
                            s = slot(c * skg, f, tid)
                            acc[tid, f] = acc[tid, f] + partial[4 * s:4 * s + 4]
            tickets[tile] = 0
        assert tile not in results
        results[tile] = (acc, np.array([[[live(tid, f // NJ, f % NJ)] for f in range(frags)]
                                         for tid in range(threads)])[..., 0])
    return results, tickets, acc_in, (skg, nch, MI, NJ, warps_m, WM, WN, threads)


REPLAY_CASES = [  # (tiles_x, tiles_y, groups, splits, M, NG, tile)
    (1, 1, 1, 23, 16, 32, "64x32"),          # a MobileNet pointwise: M = 16 of 64 rows; chunks 5 x 5 (last 3)
    (1, 1, 1, 17, 27, 16, "64x16"),          # the 3-channel stem: M = 27, a last chunk of one split
    (2, 1, 2, 16, 100, 24, "64x32"),         # groups, two m-tiles, NG 24 of 32 columns, 4 x 4 chunks
    (1, 2, 1, 18, 64, 70, "64x64"),          # columns past NG in the second n-tile
]


@pytest.mark.parametrize("case", REPLAY_CASES, ids=["pw16", "stem", "groups", "ragged-n"])
def test_replayed_reduction_is_the_two_level_sum_in_any_block_order(case):
    tx, ty, groups, splits, M, NG, tile = case
    runs = []
    for seed in (0, 1, 2):
        res, tickets, acc_in, (skg, nch, *_rest) = _replay(tx, ty, groups, splits, M, NG, tile,
                                                          np.random.default_rng(1), seed)
        assert not tickets.any()
        assert sorted(res) == list(range(tx * ty * groups))
        runs.append(res)
    for t in runs[0]:
        acc, live = runs[0][t]
        for other in runs[1:]:
            assert np.array_equal(acc.view(np.uint32), other[t][0].view(np.uint32))
        want = np.zeros(acc.shape, np.float32)
        for c in range(nch):
            part = np.zeros(acc.shape, np.float32)
            for sp in range(c * skg, min(splits, (c + 1) * skg)):
                part = part + acc_in[t, sp].transpose(1, 0, 2)
            want = want + part
        assert np.array_equal(acc[live].view(np.uint32), want[live].view(np.uint32))


@pytest.mark.parametrize("tile", list(K.TILES))
@pytest.mark.parametrize("M, NG", [(16, 32), (27, 16), (100, 70), (1, 1), (144, 16)])
def test_live_fragments_cover_every_real_element(tile, M, NG):
    """Dead fragments (never stored, never read) hold padding only: the mma accumulator layout's (row, column) of
    every thread of every fragment, over all m/n tiles of the GEMM, real ones all inside live fragments."""
    BM, BN, _, WM, WN = K.TILES[tile]
    warps_m = BM // WM
    MI, NJ = WM // 16, WN // 8
    covered = np.zeros((M, NG), bool)
    for m0 in range(0, M, BM):
        for n0 in range(0, NG, BN):
            for tid in range(128):
                warp, lane = tid // 32, tid % 32
                wm0, wn0 = (warp % warps_m) * WM, (warp // warps_m) * WN
                gq, tq = lane // 4, lane % 4
                for i in range(MI):
                    for j in range(NJ):
                        live = m0 + wm0 + i * 16 < M and n0 + wn0 + j * 8 < NG
                        for half in (0, 1):
                            for e in (0, 1):
                                row, col = m0 + wm0 + i * 16 + gq + 8 * half, n0 + wn0 + j * 8 + 2 * tq + e
                                if row < M and col < NG:
                                    assert live, (tile, M, NG, tid, i, j)
                                    covered[row, col] = True
    assert covered.all()


def test_sk2_option_only_when_asked():
    plain = K.igemm_options(2, "bfloat16", False, "64x32", True, wide=True)[0]
    sk2 = K.igemm_options(2, "bfloat16", False, "64x32", True, wide=True, sk2=True)[0]
    assert sk2 == plain + ("-DSK2=1",) and not any("SK2" in o for o in plain)


# ---- CPU: the launches under the fake CuPy -------------------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    import ml_dtypes
    recs = []
    R.record_to(L, recs)
    import minidnn.backend as B
    from minidnn.backend.conv_problem import make_problem
    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.backend.cuda import conv_pointwise as PW
    PW.ENABLED[0] = False           # the kernel's launches are tested here (1x1 problems would take the product)
    out = {{}}
    rng = np.random.default_rng(0)
    for name, xs, ws, pad, dt, wide in [
            ("pw16", (128, 16, 32, 32), (32, 16, 1, 1), 0, ml_dtypes.bfloat16, True),
            ("pw64", (128, 64, 8, 8), (128, 64, 1, 1), 0, ml_dtypes.bfloat16, False),
            ("r20-16", (128, 16, 32, 32), (16, 16, 3, 3), 1, np.float32, False),
            ("few", (2, 16, 8, 8), (16, 16, 3, 3), 1, np.float32, False)]:
        desc = B.ConvolutionDescriptor(pad, 1, 1, 1)
        p = make_problem("t", xs, ws, desc, np.dtype(dt).name)
        x = fakecp.asarray(np.ascontiguousarray(np.moveaxis(rng.standard_normal(xs).astype(dt), 1, -1)))
        dy = fakecp.asarray(np.ascontiguousarray(np.moveaxis(rng.standard_normal(p.y_shape).astype(dt), 1, -1)))
        x, dy = x.transpose(0, 3, 1, 2), dy.transpose(0, 3, 1, 2)
        res = {{}}
        for on in (True, False, True):
            K.SPLITK2[0] = on
            del recs[:]
            K.implicit_backward_filter(p, x, dy, False, False, out_dtype=np.float32 if wide else None)
            res.setdefault(str(on), []).append(list(recs))
        res["tickets"] = int(max(t.size for t in K._ticket_arrays.values()))
        out[name] = res
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def fake_launches():
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# (case, tile, tiles, splits) as filter_splits gives them on a 132-SM device (the fake's sm_count)
@pytest.mark.parametrize("case, sk2", [("pw16", True), ("pw64", True), ("r20-16", True), ("few", False)])
def test_sk2_launch_where_the_plan_has_many_splits(fake_launches, case, sk2):
    res = fake_launches[case]
    on, off = res["True"], res["False"][0]
    assert on[0] == on[1]                                  # the switch back on: the same launch again
    kern = [r for r in on[0] if r[0].startswith("conv_igemm")]
    old = [r for r in off if r[0].startswith("conv_igemm")]
    assert len(kern) == 1 and len(old) == 1 and "DIR=2" in kern[0][0]
    assert ("SK2=1" in kern[0][0]) is sk2 and "SK2" not in old[0][0]
    assert kern[0][1] == old[0][1]                         # the same grid: the same tiles and splits
    grid = kern[0][1]
    assert (grid[2] >= K.SPLITK2_MIN_SPLITS) is sk2
    if sk2:
        tiles = grid[0] * grid[1]
        assert res["tickets"] >= tiles * (1 + K.splitk2_chunks(grid[2])[1])


def test_the_measured_layers_take_sk2(fake_launches):
    """The run-2 profile's grids: MobileNet's 16->32 pointwise [1, 1, 512], 64->128 [1, 2, 32]; ResNet-20's 16-channel
    3x3 [3, 1, 171] (bf16 there; this float32 case has BK 16: more splits, same tiles)."""
    grid = lambda case: [r for r in fake_launches[case]["True"][0] if r[0].startswith("conv_igemm")][0][1]  # noqa
    assert grid("pw16")[:3] == [1, 1, 512] and grid("pw64")[:3] == [1, 2, 32]
    assert grid("r20-16")[:2] == [3, 1] and grid("r20-16")[2] >= 171


# ---- on a GPU -----------------------------------------------------------------------------------------------------

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups): every one has >= 16 splits in every dtype
GPU_SHAPES = [
    ("pw16-32", 32, 16, 32, 32, 32, 1, 1, 0, 1, 1, 1),             # MobileNet's pointwise at N32: M 16 of 64
    ("stem3-16", 32, 3, 32, 32, 16, 3, 3, 1, 1, 1, 1),             # M = 27 (element loader)
    ("ragged-68", 9, 24, 31, 31, 40, 3, 3, 1, 1, 1, 1),            # a ragged last split and last chunk
    ("groups2-1x1", 16, 32, 20, 20, 48, 1, 1, 0, 1, 1, 2),
    ("k70-dil2", 16, 40, 19, 17, 70, 3, 3, 2, 1, 2, 1),            # columns past NG in the second n-tile
    ("stride2-ragged", 24, 17, 33, 29, 33, 3, 3, 1, 2, 1, 1),
]


def _gpu():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    import cupy
    return cupy


def _problem(shape, dtype):
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = shape
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    return make_problem("test", (N, C, H, W), (Kc, C // groups, R, S), desc, dtype), desc


def _splits(p, dtype):
    from minidnn.backend.cuda import launch as L
    crs, kr = p.Cg * math.prod(p.kernel), p.N * math.prod(p.out_size)
    tile = K.choose_tile(crs, p.Kg, p.groups, L.sm_count())
    BM, BN, BK = K.TILES[tile][:3]
    BK = 32 if dtype != "float32" else BK
    return K.filter_splits(kr, -(-crs // BM) * -(-p.Kg // BN) * p.groups, p.groups, BK, L.sm_count())[0]


def _ref(p, desc, x, dy):
    from minidnn.backend import convolution_backward_filter
    from minidnn.backend.conv_algorithms import ConvolutionBwdFilterAlgo as FA
    from minidnn.backend.handle import Handle
    h = Handle("cpu")
    return (convolution_backward_filter(h, x, dy, desc, p.w_shape, algo=FA.ALGO_1),
            convolution_backward_filter(h, np.abs(x), np.abs(dy), desc, p.w_shape, algo=FA.ALGO_1))


def _npdt(dt):
    import ml_dtypes
    return {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dt]


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "fp16", "bf16-dwf32"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[s[0] for s in GPU_SHAPES])
def test_sk2_filter_gradient_against_float64(shape, mode, layout, monkeypatch):
    cp = _gpu()
    from minidnn.backend.cuda import conv_pointwise as PW
    from minidnn.backend.cuda import launch as L
    monkeypatch.setattr(PW, "ENABLED", [False])    # the kernel is tested here (a 1x1 problem would take the product)
    dt = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16",
          "bf16-dwf32": "bfloat16"}[mode]
    npdt = _npdt(dt)
    wide = mode == "bf16-dwf32"
    odt = np.float32 if wide else npdt
    p, desc = _problem(shape, dt)
    assert _splits(p, dt) >= K.SPLITK2_MIN_SPLITS, "the shape must take the two-level split-K"
    rng = np.random.default_rng(GPU_SHAPES.index(shape))
    x = rng.standard_normal(p.x_shape).astype(npdt).astype(np.float64)
    dy = rng.standard_normal(p.y_shape).astype(npdt).astype(np.float64)
    ref, ref_abs = _ref(p, desc, x, dy)
    xg, dyg = cp.asarray(x.astype(npdt)), cp.asarray(dy.astype(npdt))
    if layout == "NHWC":
        xg = cp.ascontiguousarray(xg.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        dyg = cp.ascontiguousarray(dyg.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    tf32 = mode == "tf32"
    u_in = 2.0 ** -11 if tf32 else 0.0
    u_out = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float16): 2.0 ** -11}.get(np.dtype(odt), 2.0 ** -8)
    kr = p.N * math.prod(p.out_size)
    w0 = rng.standard_normal(p.w_shape)
    assert K.SPLITK2[0]
    for alpha, beta in ((1.0, 0.0), (0.75, -0.5)):
        fresh = (lambda: cp.asarray(w0.astype(odt))) if beta else (lambda: cp.full(p.w_shape, np.nan, dtype=odt))
        outs = []
        for rep in range(2):
            out = fresh()
            before = L.launch_count()
            K.implicit_backward_filter(p, xg, dyg, tf32, rep == 0, alpha, beta, out,
                                       out_dtype=np.float32 if wide else None)
            launches = L.launch_count() - before
            outs.append(cp.asnumpy(out))
        assert launches <= 3          # one kernel (+ the NCHW staging copies of x and dy where the problem is large)
        old = w0.astype(odt).astype(np.float64)
        want = alpha * ref + beta * old
        got = outs[1].astype(np.float64)
        assert not np.isnan(got).any()
        bound = 1.5 * ((2 * u_in + kr * 2.0 ** -23) * abs(alpha) * ref_abs
                       + u_out * (abs(alpha) * ref_abs + abs(beta * old))) + 1e-30
        err = np.abs(got - want)
        assert (err <= bound).all(), f"{shape[0]} {mode} {layout} a={alpha} b={beta}: max err {err.max()}"
        # PRECOMP table or not, the same sums in the same order: bitwise equal
        assert np.array_equal(outs[0].view(np.uint8), outs[1].view(np.uint8))
    cp.cuda.runtime.deviceSynchronize()
    assert any(k[-1] == "splitk2" for k in K._plans if isinstance(k, tuple))
    for t in K._ticket_arrays.values():
        assert int(t.max()) == 0


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16"])
def test_sk2_is_bitwise_repeatable_and_the_old_kernel_agrees(mode):
    cp = _gpu()
    dt = "bfloat16" if mode == "bf16" else "float32"
    npdt = _npdt(dt)
    shape = GPU_SHAPES[0]
    p, desc = _problem(shape, dt)
    rng = np.random.default_rng(11)
    x = rng.standard_normal(p.x_shape).astype(npdt)
    dy = rng.standard_normal(p.y_shape).astype(npdt)
    xg = cp.ascontiguousarray(cp.asarray(x).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    dyg = cp.ascontiguousarray(cp.asarray(dy).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    runs = [cp.asnumpy(K.implicit_backward_filter(p, xg, dyg, mode == "tf32", False)) for _ in range(3)]
    assert all(np.array_equal(runs[0].view(np.uint8), r.view(np.uint8)) for r in runs[1:])
    try:
        K.SPLITK2[0] = False
        old = cp.asnumpy(K.implicit_backward_filter(p, xg, dyg, mode == "tf32", False))
    finally:
        K.SPLITK2[0] = True
    ref, ref_abs = _ref(p, desc, x.astype(np.float64), dy.astype(np.float64))
    u = 2.0 ** -24 if dt == "float32" else 2.0 ** -8
    bound = 1.5 * ((2 ** -10 if mode == "tf32" else 0) + p.N * 1024 * 2.0 ** -23 + u) * ref_abs + 1e-30
    for got in (runs[0], old):
        assert (np.abs(got.astype(np.float64) - ref) <= bound).all()
    cp.cuda.runtime.deviceSynchronize()
    for t in K._ticket_arrays.values():
        assert int(t.max()) == 0


@pytest.mark.cuda
def test_sk2_sums_the_splits_in_the_two_level_order():
    """16 splits of one image each (KR = 16 x 128 pixels, 8 slices of 16 a split): the result is bitwise the float32
    sum ((p0 + p1 + p2 + p3) + (p4 + ... + p7) + ...) of the per-image products, each computed by the kernel itself on
    one image (one split: the plain kernel, the same slices in the same order)."""
    cp = _gpu()
    shape = ("per-image", 16, 8, 8, 16, 8, 3, 3, 1, 1, 1, 1)
    p, _ = _problem(shape, "float32")
    if _splits(p, "float32") != 16:
        pytest.skip("the launcher picks another split count on this GPU")
    p1, _ = _problem(("one", 1) + shape[2:], "float32")
    assert _splits(p1, "float32") == 1
    rng = np.random.default_rng(13)
    xg = cp.asarray(rng.standard_normal(p.x_shape), np.float32)
    dyg = cp.asarray(rng.standard_normal(p.y_shape), np.float32)
    whole = cp.asnumpy(K.implicit_backward_filter(p, xg, dyg, False, False))
    parts = [cp.asnumpy(K.implicit_backward_filter(p1, xg[n:n + 1], dyg[n:n + 1], False, False)) for n in range(16)]
    skg, nch = K.splitk2_chunks(16)
    total = np.zeros(p.w_shape, np.float32)
    for c in range(nch):
        chunk = np.zeros(p.w_shape, np.float32)
        for s in range(c * skg, min(16, (c + 1) * skg)):
            chunk = chunk + parts[s]
        total = total + chunk
    assert np.array_equal(whole.view(np.uint32), total.view(np.uint32))
    one_level = np.zeros(p.w_shape, np.float32)
    for s in range(16):
        one_level = one_level + parts[s]
    try:
        K.SPLITK2[0] = False
        old = cp.asnumpy(K.implicit_backward_filter(p, xg, dyg, False, False))
    finally:
        K.SPLITK2[0] = True
    assert np.array_equal(old.view(np.uint32), one_level.view(np.uint32))      # the old kernel: split order
