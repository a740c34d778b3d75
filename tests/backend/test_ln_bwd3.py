"""Session 12: ln_bwd3, the layer-norm backward with one team sum a row (backend/cuda/norm_kernels.py, route "v3": the
default for 16-bit and float32 rows since round 2; MINIDNN_NORM_ROUTE="ln_bwd16=v2,ln_bwd=v2" gives ln_bwd2 back;
P = 2 or 4 vectors a thread by ln_bwd3_p's rule, MINIDNN_LN_BWD3_P forces one).

CPU cases: the configuration chooser (teams, launch bounds, shared memory, FULL), the P rule (one wave of P = 2's
teams), that every configuration the default route picks for the GPU cases' widths compiles for sm_90 without
spills, and a NumPy emulation of the kernel's index maths and algebra (its thread -> vector ownership, the float4
planes of the scale and of the column partials, the block's sum of its teams' rows, the one-sum identities) against
the float64 reference, including rows with a small variance (the same float32 error as ln_bwd2's).
GPU cases (marked cuda; ~20 NVRTC compiles): the DEFAULT route against float64 -- the benchmark shape once, BERT
widths, long rows (the scale in shared memory), rows that do not fill the team (1000 values), tiny row counts
(P = 2), 36-value 16-bit rows (not 16-byte vectors: ln_bwd2 / v1), no affine, a misaligned scale, a 16-bit scale,
both forced P settings of tools/ln_ab.py, and rows with a small variance (also against ln_bwd2 on the same inputs).
The statistics passed in are the float64 forward's rounded to float32 (no forward compile; the rounded mean makes
the kernel's re-centring matter), the reference uses the float64 statistics themselves: the true gradient.
"""
import math
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import norm_kernels as NK
from tests._nvcc import pick
from tests.backend.test_norm_kernels import TOL, Counted, _close, _draw, _dtype, _h

BF16 = np.dtype(ml_dtypes.bfloat16)
EPS32 = 2.0 ** -24
SMS = 132           # H100 SXM / H200: the P rule's waves below


# ---- CPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d, item, p, want", [
    (1024, 2, 4, (32, 4, 8, 256, 2, 0, 1, 8 * 2 * 1024 * 4 + 1024 * 4)),     # a warp a row, the scale in smem
    (1024, 2, 2, (64, 2, 8, 256, 2, 0, 1, 4 * 2 * 1024 * 4)),                # ln_bwd2's teams
    (1024, 4, 2, (128, 2, 4, 256, 4, 1, 1, 2 * 2 * 1024 * 4)),
    (1024, 4, 4, (64, 4, 4, 256, 2, 0, 1, 4 * 2 * 1024 * 4)),
    (768, 2, 4, (32, 3, 8, 256, 2, 0, 1, 8 * 2 * 768 * 4 + 768 * 4)),
    (768, 2, 2, (64, 2, 8, 256, 2, 0, 0, 4 * 2 * 768 * 4)),                  # 96 vectors on 64 x 2: not FULL
    (1000, 2, 4, (32, 4, 8, 256, 2, 0, 0, 8 * 2 * 1000 * 4 + 1000 * 4)),     # 125 vectors: not FULL
    (1000, 4, 2, (128, 2, 4, 256, 3, 1, 0, 2 * 2 * 1000 * 4)),               # float32 not FULL: 3 blocks
    (8, 2, 4, (32, 1, 8, 256, 3, 1, 0, 8 * 2 * 8 * 4)),
    (4096, 2, 4, (128, 4, 8, 256, 2, 0, 1, 2 * 2 * 4096 * 4 + 4096 * 4)),
    (4096, 4, 2, (512, 2, 4, 512, 1, 1, 1, 2 * 4096 * 4)),
    (8192, 4, 2, None),             # 2048 vectors on 512 threads: 4 a thread, more than P
    (16384, 2, 4, None),            # 192 KB of partials and scale: over LN_BWD3_SMEM_MAX
    (100, 2, 4, None),              # 100 halves do not fill 16-byte vectors
    (1024, 8, 4, None),             # float64: ln_bwd2
])
def test_ln_bwd3_config(d, item, p, want):
    cfg = NK.ln_bwd3_config(d, item, True, p)
    assert cfg == want
    if cfg:
        team, vpt, vec, block, minb, keep, full, smem = cfg
        nvec = d // vec
        assert team * vpt >= nvec and (team == 32 or team // 2 * p < nvec)
        assert block // team <= 15 and block % team == 0          # named barriers 1 .. TPB
        assert full == (team * vpt == nvec) and smem <= NK.LN_BWD3_SMEM_MAX
    assert NK.ln_bwd3_config(d, item, False, p) is None


def test_ln_bwd3_default_route():
    """16-bit and float32 layer-norm backward take route v3 by default (float64: ln_bwd2, ln_bwd3 has no float64
    configuration), with the P rule (LN_BWD3_P 0) unless MINIDNN_LN_BWD3_P was set."""
    assert NK._version("ln_bwd", np.dtype(np.float16)) == NK._version("ln_bwd", np.dtype(np.float32)) == "v3"
    assert NK.ln_bwd3_config(1024, 8, True, 4) is None and NK.ln_bwd3_config(1024, 8, True, 2) is None


@pytest.mark.parametrize("rows, d, item, want", [
    (8, 768, 2, 2), (8, 768, 4, 2),             # latency-bound: H200 P = 2 1.04x ln_bwd2, P = 4 0.93x / 0.99x
    (4096, 768, 2, 4), (4096, 768, 4, 4),       # throughput: P = 4 1.26x / 1.21x
    (2048, 4096, 2, 4), (2048, 4096, 4, 4),     # P = 4 1.23x / 1.10x (fp32 P = 2 0.85x)
    (16384, 1024, 2, 4), (16384, 1024, 4, 4),
    (1056, 768, 2, 2), (1057, 768, 2, 4),       # one wave of P = 2 at 768 bf16: 132 SMs x 2 blocks x 4 teams
    (792, 768, 4, 2), (793, 768, 4, 4),         # float32: 132 x 3 x 2 (not FULL: three blocks an SM)
    (3, 8192, 4, 4),                            # no P = 2 configuration (4 vectors a thread): P = 4
])
def test_ln_bwd3_p_rule(monkeypatch, rows, d, item, want):
    monkeypatch.setattr(NK, "LN_BWD3_P", 0)
    assert NK.ln_bwd3_p(rows, d, item, True, SMS) == want
    cfg = NK.ln_bwd3_plan_config(rows, d, item, True, SMS)
    assert cfg == NK.ln_bwd3_config(d, item, True, want)
    monkeypatch.setattr(NK, "LN_BWD3_P", 6 - want)             # MINIDNN_LN_BWD3_P forces the other
    assert NK.ln_bwd3_p(rows, d, item, True, SMS) == 6 - want


def _plan_p(rows, d, item):
    saved, NK.LN_BWD3_P = NK.LN_BWD3_P, 0
    try:
        return NK.ln_bwd3_p(rows, d, item, True, SMS)
    finally:
        NK.LN_BWD3_P = saved


# The GPU cases: (dtype, shape, parameters).  The benchmark shape once; (600, 4096) and (3001, 1000) take P = 4 (more
# rows than one wave of P = 2's teams), (8, 768), (40, 8), (3, 1024), (300, 36) P = 2; 36 16-bit values do not fill
# 16-byte vectors (ln_bwd2 / v1).
CASES = [("bfloat16", (16384, 1024), "scale"), ("bfloat16", (4096, 768), "scale"), ("bfloat16", (4096, 768), "none"),
         ("bfloat16", (600, 4096), "scale"), ("bfloat16", (3001, 1000), "16-bit"), ("bfloat16", (8, 768), "misaligned"),
         ("bfloat16", (40, 8), "none"), ("bfloat16", (300, 36), "scale"), ("float16", (4096, 768), "16-bit"),
         ("float16", (3, 1024), "scale"), ("float32", (4096, 768), "scale"), ("float32", (4096, 768), "none"),
         ("float32", (8, 768), "scale"), ("float32", (3001, 1000), "scale"), ("float32", (600, 4096), "misaligned"),
         ("float32", (300, 36), "none")]
LN3_SHAPES = sorted({c[1] for c in CASES})
FORCED = {(4096, 768), (8, 768)}          # test_ln_bwd3_forced_p: the other P there


def _gpu_configs():
    """(itemsize, config) of every ln_bwd3 launch the GPU cases below plan (default rule and the forced P's)."""
    out = set()
    for rows, d in [s for s in LN3_SHAPES] + [(4000, 8)]:
        for item in (2, 4):
            for p in {_plan_p(rows, d, item), 2, 4} if (rows, d) in FORCED else {_plan_p(rows, d, item)}:
                cfg = NK.ln_bwd3_config(d, item, True, p)
                if cfg:
                    out.add((item, cfg[:7]))
    return sorted(out)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("item, cfg", pick(_gpu_configs(), 4), ids=lambda c: str(c))
def test_ln_bwd3_compiles_without_spills(tmp_path, item, cfg):
    team, vpt, vec, block, minb, keep, full = cfg
    for dtype in ((np.float32,) if item == 4 else (np.float16, BF16)):
        dt = np.dtype(dtype)
        opts = NK.options(dt, NK._PSTORAGE[_dev.dtype_name(dt)], team, vpt, vec, False, block, minb,
                          (("LNB_KEEP", keep), ("LNB_FULL", full)))
        defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
        src = tmp_path / "k.cu"
        src.write_text(defines + NK.SOURCE)
        # ptxas builds only ln_bwd3 (--entry: its registers and spills are its own, as in the whole module)
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v,--entry=ln_bwd3", "-o",
                            str(tmp_path / "k"), str(src)], capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-2000:]
        lines = out.splitlines()
        i = next(i for i, line in enumerate(lines) if "entry function 'ln_bwd3'" in line)
        spill = next(line for line in lines[i:i + 4] if "spill stores" in line)
        assert int(spill.split("bytes spill stores")[0].split(",")[-1]) == 0, (dt, cfg, spill)


def _emulate_ln_bwd3(x, dy, mean, rstd, scale, cfg, grid):
    """The kernel's index maths and algebra in float32 NumPy (x, dy already float32): returns dx, dscale, dbias and
    the partial rows, walking blocks, teams and their rows as the kernel does."""
    team, vpt, vec, block = cfg[:4]
    rows, d = x.shape
    nvec, tpb, np_ = d // vec, block // team, vec // 4
    f = np.float32
    sc = np.ones(d, f) if scale is None else scale.astype(f)
    ssc = np.zeros(np_ * nvec * 4, f)                      # the LNB_SSC fill formula
    j = np.arange(d)
    ssc[(j % vec // 4) * nvec * 4 + j // vec * 4 + j % 4] = sc
    dx = np.zeros_like(x)
    partial = np.zeros((grid, 2 * d), f)
    t = np.arange(team)
    for blk in range(grid):
        smem = np.zeros(tpb * 2 * d, f)
        for tib in range(tpb):
            acc = smem[tib * 2 * d:(tib + 1) * 2 * d]
            for r in range(blk * tpb + tib, rows, grid * tpb):
                for k in range(vpt):
                    vi = k * team + t
                    live = vi < nvec
                    v = vi[live]
                    cols = v[:, None] * vec + np.arange(vec)                    # (threads, VEC)
                    h, c = np.arange(vec) // 4, np.arange(vec) % 4
                    scv = ssc[(h[None, :] * nvec + v[:, None]) * 4 + c[None, :]]   # float4 plane reads
                    np.testing.assert_array_equal(scv, sc[cols])
                # the row's sums over the whole team (the order differs from the kernel's: float32 tolerance)
                dv = (x[r] - f(mean[r])).astype(f)
                g = (dy[r] * sc).astype(f)
                cs, s1, sgd = f(dv.sum()), f(g.sum()), f((g * dv).sum())
                off = f(cs / f(d))
                is_ = f(rstd[r])
                c1, c2 = f(s1 / f(d)), f(is_ * (sgd - off * s1) / f(d))
                k1, k2, offis = f(is_ * c1), f(is_ * c2), f(off * is_)
                xh = (dv * is_ - offis).astype(f)
                dx[r] = is_ * g - k1 - xh * k2
                # the partials at plane h (sum(dy * xhat)) and NP + h (sum(dy)) of vector vi, float c
                vi = j // vec
                e = j % vec
                acc[((e // 4) * nvec + vi) * 4 + e % 4] += dy[r] * xh
                acc[((np_ + e // 4) * nvec + vi) * 4 + e % 4] += dy[r]
        jj = np.arange(2 * d)
        half = (jj >= d).astype(int)
        jr = jj - half * d
        at = ((half * np_ + jr % vec // 4) * nvec) * 4 + jr // vec * 4 + jr % 4
        partial[blk] = sum(smem[m * 2 * d + at] for m in range(tpb))
    col = partial.astype(np.float64).sum(axis=0)
    return dx, col[:d], col[d:], partial


@pytest.mark.parametrize("rows, d, item, p, grid", [(37, 1024, 2, 4, 3), (21, 1000, 2, 4, 2), (9, 768, 4, 4, 4),
                                                    (13, 64, 2, 2, 1), (5, 4096, 2, 4, 2)])
def test_ln_bwd3_index_emulation(rows, d, item, p, grid):
    rng = np.random.default_rng(rows * d)
    cfg = NK.ln_bwd3_config(d, item, True, p)
    x = (rng.standard_normal((rows, d)) * 1.5 + 3.0).astype(np.float32)
    dy = rng.standard_normal((rows, d)).astype(np.float32)
    scale = rng.standard_normal(d).astype(np.float32)
    x64, dy64, s64 = x.astype(np.float64), dy.astype(np.float64), scale.astype(np.float64)
    y_r, m_r, i_r = B.layer_normalization_forward(None, x64, s64, None, 1, 1e-5)
    dx_r, ds_r, db_r = B.layer_normalization_backward(None, x64, dy64, s64, m_r, i_r, 1)
    dx, ds, db, partial = _emulate_ln_bwd3(x, dy, m_r.astype(np.float32), i_r.astype(np.float32), scale, cfg, grid)
    np.testing.assert_allclose(dx, dx_r, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(ds, ds_r, rtol=1e-4, atol=1e-4 * math.sqrt(rows) * 4)
    np.testing.assert_allclose(db, db_r, rtol=1e-4, atol=1e-4 * math.sqrt(rows) * 4)
    assert partial.shape == (grid, 2 * d)


def _small_variance_rows(name, rows=4000, d=8):
    """Rows of ``d`` values lying ~0.01 apart around -2 +- 1.5 (rstd ~100) and their dy."""
    rng = np.random.default_rng(12)
    base = (rng.standard_normal((rows, 1)) * 1.5 - 2.0).astype(np.float32)
    x = (base + rng.standard_normal((rows, d)).astype(np.float32) * 0.01).astype(_dtype(name))
    return x, _draw(rng, (rows, d), _dtype(name))


def _stats(x64):
    """The float64 forward's mean and rstd: float64 (the reference's) and rounded to float32 (the kernel's input)."""
    _, m, i = B.layer_normalization_forward(None, x64, None, None, 1, 1e-5)
    return m, i, m.astype(np.float32), i.astype(np.float32)


def _dx_bound(name, rstd64, g64):
    """|dx - dx_ref| allowed: the data tolerance (TOL) plus 16 float32 roundings of the row's largest term.  dx =
    rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * scale: each rounding of the float32 terms (|g|, and
    the products of xhat ~ 1 and the means ~ |g|) is ~eps * rstd * max|g| absolute, whatever the sizes of dx, so
    rows with a large rstd (a small variance) carry errors ~rstd * max|g| * eps that the relative tolerance of a
    near-zero dx cannot cover."""
    return TOL[name]["atol"] + 16 * EPS32 * rstd64.reshape(-1, 1) * np.abs(g64).max(axis=1, keepdims=True)


def _v2_v3_error_units(x, dy, mean, rstd, d):
    """max |dx - dx_ref| over rows in units of eps * rstd * max|g| for the float32 emulation of ln_bwd2's and of
    ln_bwd3's formulas (no scale), the statistics the float64 forward's rounded to float32."""
    f = np.float32
    dv = (x - mean[:, None]).astype(f)
    is_ = rstd[:, None]
    cs, s1 = dv.sum(1, dtype=f)[:, None], dy.sum(1, dtype=f)[:, None]
    off = (cs * f(1 / d)).astype(f)
    xh2 = ((dv - off) * is_).astype(f)                                      # ln_bwd2: two sums
    c2 = (dy * xh2).sum(1, dtype=f)[:, None] * f(1 / d)
    v2 = (is_ * (dy - s1 * f(1 / d) - xh2 * c2)).astype(f)
    sgd = (dy * dv).sum(1, dtype=f)[:, None]                                # ln_bwd3: one sum of three
    c2 = (is_ * (sgd - off * s1) * f(1 / d)).astype(f)
    k1, k2, offis = is_ * s1 * f(1 / d), (is_ * c2).astype(f), (off * is_).astype(f)
    v3 = (is_ * dy - k1 - (dv * is_ - offis).astype(f) * k2).astype(f)
    return v2, v3


def test_ln_bwd3_small_variance_emulation():
    """Why run 3's float32 small-variance case failed: its reference took the kernel's float32 mean WITHOUT the
    re-centring (x - m has a mean of ~1e-7, times rstd^2 ~ 1e4), so ln_bwd2's formula fails it as often (764 of
    32000 values in this emulation) as ln_bwd3's; against the true gradient (float64 statistics) both formulas are
    within the eps * rstd * max|g| bound, ln_bwd3 no worse than ln_bwd2."""
    x, dy = _small_variance_rows("float32")
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    m64, i64, m32, i32 = _stats(x64)
    v2, v3 = _v2_v3_error_units(x, dy, m32, i32, 8)
    dx_r = B.layer_normalization_backward(None, x64, dy64, None, m64, i64, 1)[0]
    unit = EPS32 * i64.reshape(-1, 1) * np.abs(dy64).max(axis=1, keepdims=True)
    e2, e3 = (np.abs(v - dx_r) / unit for v in (v2, v3))
    assert e3.max() <= 8 and e2.max() <= 8 and e3.max() <= 1.5 * e2.max()
    assert np.sqrt((e3 ** 2).mean()) <= 1.2 * np.sqrt((e2 ** 2).mean())
    assert np.all(np.abs(v3 - dx_r) <= _dx_bound("float32", i64, dy64) + TOL["float32"]["rtol"] * np.abs(dx_r))
    # the first round's reference (the rounded mean, not re-centred) is off by far more than either formula
    wrong = B.layer_normalization_backward(None, x64, dy64, None, m32.astype(np.float64), i64, 1)[0]
    assert np.abs(wrong - dx_r).max() > 100 * np.abs(v2 - dx_r).max()


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture
def taken(monkeypatch):
    """The ln_bwd3 configurations the plans built (a list), plans cleared before and after."""
    got = []
    real = NK._ln_backward_plan3

    def spy(x, rows, d, scale, cfg, palign, dev):
        got.append(cfg)
        return real(x, rows, d, scale, cfg, palign, dev)
    NK._plans.clear()
    monkeypatch.setattr(NK, "_ln_backward_plan3", spy)
    yield got
    NK._plans.clear()


def _run(cp, name, shape, affine, rng, x=None, dy=None):
    """(dx, dscale, dbias) of the default route and the float64 reference (the float64 forward's statistics), with
    the data bound of _dx_bound; the kernel gets those statistics rounded to float32."""
    dtype = _dtype(name)
    d = shape[-1]
    x = _draw(rng, shape, dtype, offset=3.0) if x is None else x
    dy = _draw(rng, shape, dtype) if dy is None else dy
    scale = None
    if affine in ("scale", "misaligned"):
        buf = cp.asarray(rng.standard_normal(d + 1).astype(np.float32))
        scale = buf[1:] if affine == "misaligned" else buf[:d]
    elif affine == "16-bit":
        scale = cp.asarray(rng.standard_normal(d).astype(dtype))
    x64, dy64, s64 = x.astype(np.float64), dy.astype(np.float64), _h(scale)
    m64, i64, m32, i32 = _stats(x64)
    with Counted() as c:
        got = B.layer_normalization_backward(None, cp.asarray(x), cp.asarray(dy), scale, cp.asarray(m32),
                                             cp.asarray(i32), 1)
    assert c.n == 1 + (scale is not None)
    want = B.layer_normalization_backward(None, x64, dy64, s64, m64, i64, 1)
    g64 = dy64 if s64 is None else dy64 * s64
    return got, want, _dx_bound(name, i64, g64)


def _check(got, want, bound, name, rows):
    dx, ds, db = got
    err = np.abs(_h(dx) - want[0])
    assert np.all(err <= bound + TOL[name]["rtol"] * np.abs(want[0])), float(err.max())
    if want[1] is None:
        assert ds is None and db is None
        return
    _close(ds, want[1], name, rows, what="stat")
    _close(db, want[2], name, rows, what="data-sum")


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, affine", CASES, ids=lambda v: str(v))
def test_ln_bwd_default(cp, taken, name, shape, affine):
    """The default route on every case: the configuration the P rule picks for this GPU (or none: ln_bwd2 / v1),
    values against float64, one launch (+ col_sum with a scale), a repeated call bitwise (the kept plan)."""
    rng = np.random.default_rng(hash((shape, name, affine)) % 2 ** 32)
    got, want, bound = _run(cp, name, shape, affine, rng)
    item = _dtype(name).itemsize
    want_cfg = NK.ln_bwd3_plan_config(shape[0], shape[-1], item, True, NK._launch.sm_count(0))
    assert taken == ([want_cfg] if want_cfg else [])
    assert (want_cfg is None) == (shape[-1] % (16 // item) != 0)
    _check(got, want, bound, name, shape[0])


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, p", [("bfloat16", (4096, 768), 2), ("bfloat16", (8, 768), 4),
                                            ("float32", (8, 768), 4), ("float32", (4096, 768), 2)])
def test_ln_bwd3_forced_p(cp, taken, monkeypatch, name, shape, p):
    """tools/ln_ab.py's settings v3p4 / v3p2 (MINIDNN_LN_BWD3_P) on the shapes where the rule picks the other P."""
    monkeypatch.setattr(NK, "LN_BWD3_P", p)
    rng = np.random.default_rng(p * shape[0])
    got, want, bound = _run(cp, name, shape, "scale", rng)
    assert taken == [NK.ln_bwd3_config(shape[-1], _dtype(name).itemsize, True, p)]
    _check(got, want, bound, name, shape[0])


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_ln_bwd3_small_variance_rows(cp, taken, monkeypatch, name):
    """Rows of 8 values ~0.01 apart (rstd ~100): the one-sum form keeps the re-centring on the row's own mean (the
    kernel gets the float32-rounded mean); against the true gradient within _dx_bound, and for float32 no worse
    than ln_bwd2 (route v2) on the same inputs, in units of eps * rstd * max|g| (emulation: 3.7 against 4.8)."""
    x, dy = _small_variance_rows(name)
    rng = np.random.default_rng(5)
    got, want, bound = _run(cp, name, x.shape, "none", rng, x, dy)
    assert taken and float(np.median(_stats(x.astype(np.float64))[1])) > 50      # the ill-conditioned regime
    _check(got, want, bound, name, x.shape[0])
    if name == "float32":
        monkeypatch.setitem(NK.ROUTE, "ln_bwd", "v2")
        NK._plans.clear()
        got2, _, _ = _run(cp, name, x.shape, "none", rng, x, dy)
        assert len(taken) == 1                          # v2 did not plan ln_bwd3
        _check(got2, want, bound, name, x.shape[0])
        unit = bound - TOL[name]["atol"]
        e3 = (np.abs(_h(got[0]) - want[0]) / unit).max()
        e2 = (np.abs(_h(got2[0]) - want[0]) / unit).max()
        assert e3 <= 2 * e2 + 1 / 16, (e3, e2)          # units of 16 eps * rstd * max|g|
