"""Session 12: ln_bwd3, the layer-norm backward with one team sum a row (backend/cuda/norm_kernels.py, route "v3":
MINIDNN_NORM_ROUTE="ln_bwd16=v3" / "ln_bwd=v3"; LN_BWD3_P the vectors a thread holds).

CPU cases: the configuration chooser (teams, launch bounds, shared memory, FULL), that every configuration it picks
for the widths below compiles for sm_90 without spills, and a NumPy emulation of the kernel's index maths and
algebra (its thread -> vector ownership, the float4 planes of the scale and of the column partials, the block's sum
of its teams' rows, the one-sum identities off / c1 / c2) against the float64 reference.
GPU cases (marked cuda): v3 against the float64 reference and against the default (v2) on the same inputs, for
16-bit and float32 rows: the benchmark shape, BERT-like widths (768), long rows (4096, the scale in shared memory),
rows that do not fill the team (1000 values: no FULL), tiny row counts (fewer rows than teams), no affine, a
misaligned scale, and rows with a small variance (the re-centring).
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
from tests.backend.test_norm_kernels import Counted, _close, _draw, _dtype, _h

BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- CPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d, item, p, stage, want", [
    (1024, 2, 4, 0, (32, 4, 8, 256, 2, 0, 1, 0, 8 * 2 * 1024 * 4 + 1024 * 4)),   # a warp a row, the scale in smem
    (1024, 2, 4, 1, (32, 4, 8, 256, 2, 0, 1, 1, 8 * 2 * 1024 * 4 + 1024 * 4 + 256 * 2 * 4 * 16)),
    (1024, 2, 2, 0, (64, 2, 8, 256, 2, 0, 1, 0, 4 * 2 * 1024 * 4)),              # ln_bwd2's teams
    (1024, 4, 2, 0, (128, 2, 4, 256, 4, 1, 1, 0, 2 * 2 * 1024 * 4)),
    (1024, 4, 4, 0, (64, 4, 4, 256, 2, 0, 1, 0, 4 * 2 * 1024 * 4)),
    (768, 2, 4, 0, (32, 3, 8, 256, 2, 0, 1, 0, 8 * 2 * 768 * 4 + 768 * 4)),
    (1000, 2, 4, 0, (32, 4, 8, 256, 2, 0, 0, 0, 8 * 2 * 1000 * 4 + 1000 * 4)),   # 125 vectors: not FULL
    (1000, 4, 2, 0, (128, 2, 4, 256, 3, 1, 0, 0, 2 * 2 * 1000 * 4)),             # float32 not FULL: 3 blocks
    (8, 2, 4, 0, (32, 1, 8, 256, 3, 1, 0, 0, 8 * 2 * 8 * 4)),
    (4096, 2, 4, 0, (128, 4, 8, 256, 2, 0, 1, 0, 2 * 2 * 4096 * 4 + 4096 * 4)),
    (4096, 2, 4, 1, (128, 4, 8, 256, 2, 0, 1, 1, 2 * 2 * 4096 * 4 + 4096 * 4 + 256 * 2 * 4 * 16)),
    (4096, 4, 2, 0, (512, 2, 4, 512, 1, 1, 1, 0, 2 * 4096 * 4)),
    (8192, 2, 4, 1, (256, 4, 8, 256, 2, 0, 1, 1, 2 * 8192 * 4 + 8192 * 4 + 256 * 2 * 4 * 16)),    # 112 KB
    (16384, 2, 4, 0, None),         # 192 KB of partials and scale: over LN_BWD3_SMEM_MAX
    (100, 2, 4, 0, None),           # 100 halves do not fill 16-byte vectors
    (1024, 8, 4, 0, None),          # float64: ln_bwd2
])
def test_ln_bwd3_config(d, item, p, stage, want):
    cfg = NK.ln_bwd3_config(d, item, True, p, stage)
    assert cfg == want
    if cfg:
        team, vpt, vec, block, minb, keep, full, staged, smem = cfg
        nvec = d // vec
        assert team * vpt >= nvec and (team == 32 or team // 2 * p < nvec)
        assert block // team <= 15 and block % team == 0          # named barriers 1 .. TPB
        assert full == (team * vpt == nvec) and smem <= NK.LN_BWD3_SMEM_MAX and staged == stage
    assert NK.ln_bwd3_config(d, item, False, p, stage) is None


def _chosen_configs():
    out = set()
    for item in (2, 4):
        for p in (2, 4):
            for stage in (0, 1):
                for d in (8, 768, 1000, 1024, 2048, 4096, 8192):
                    cfg = NK.ln_bwd3_config(d, item, True, p, stage)
                    if cfg and (not stage or p == 4):       # the A/B's settings: v3p4, v3p4a, v3p2
                        out.add((item, cfg[:8]))
    return sorted(out)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("item, cfg", _chosen_configs(), ids=lambda c: str(c))
def test_ln_bwd3_compiles_without_spills(tmp_path, item, cfg):
    team, vpt, vec, block, minb, keep, full, stage = cfg
    for dtype in ((np.float32,) if item == 4 else (np.float16, BF16)):
        dt = np.dtype(dtype)
        opts = NK.options(dt, NK._PSTORAGE[_dev.dtype_name(dt)], team, vpt, vec, False, block, minb,
                          (("LNB_KEEP", keep), ("LNB_FULL", full)) + ((("LNB_ASYNC", 1),) if stage else ()))
        defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
        src = tmp_path / "k.cu"
        src.write_text(defines + NK.SOURCE)
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k"),
                            str(src)], capture_output=True, text=True, timeout=300)
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
    cfg = NK.ln_bwd3_config(d, item, True, p, 0)
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


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture
def route(monkeypatch):
    """route(version, p, stage): layer-norm backward of every dtype through ``version`` with LN_BWD3_P = p and
    LN_BWD3_ASYNC = stage, plans cleared."""
    def set_route(version, p=4, stage=False):
        NK._plans.clear()
        monkeypatch.setitem(NK.ROUTE, "ln_bwd16", version)
        monkeypatch.setitem(NK.ROUTE, "ln_bwd", version)
        monkeypatch.setattr(NK, "LN_BWD3_P", p)
        monkeypatch.setattr(NK, "LN_BWD3_ASYNC", stage)
    NK._plans.clear()
    yield set_route
    NK._plans.clear()


def _scale(rng, d, name, misalign, cp):
    pdt = np.float32
    buf = cp.asarray(rng.standard_normal(d + 1).astype(pdt))
    return buf[1:] if misalign else buf[:d]


# (16384, 1024), the benchmark's shape, is in test_ln_bwd3_settings (float64 references of 16.8 M values take time)
LN3_SHAPES = [(8, 768), (4096, 768), (2048, 4096), (7001, 1024), (3, 1024), (517, 1000), (40, 8), (300, 2048),
              (300, 36)]      # 36: 16-bit rows that do not fill vectors fall through to v1


def _affines(name):
    return ["scale", "none", "misaligned"] + (["16-bit"] if name != "float32" else [])


@pytest.mark.cuda
@pytest.mark.parametrize("name, affine", [(n, a) for n in ("bfloat16", "float16", "float32") for a in _affines(n)])
@pytest.mark.parametrize("shape", LN3_SHAPES)
def test_ln_bwd3(cp, route, name, shape, affine):
    """The default candidate setting (P = 4, no staging) on every shape and parameter kind."""
    _check_v3(cp, route, name, shape, affine, 4, False)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape", [(16384, 1024), (4096, 768), (517, 1000), (3, 1024)])
@pytest.mark.parametrize("affine", ["scale", "none"])
@pytest.mark.parametrize("p, stage", [(4, False), (4, True), (2, False)], ids=["p4", "p4async", "p2"])
def test_ln_bwd3_settings(cp, route, name, shape, affine, p, stage):
    """The A/B's settings on its shape and three others: the next row staged by cp.async (~8 rows a warp at
    (16384, 1024), a ragged last round, a staging row never refilled at (3, 1024)), and ln_bwd2's team sizes."""
    _check_v3(cp, route, name, shape, affine, p, stage)


def _check_v3(cp, route, name, shape, affine, p, stage):
    """v3 against float64 and against v2 (the default) on the same inputs; one launch (+ col_sum with a scale)."""
    rng = np.random.default_rng(hash((shape, name, affine, p)) % 2 ** 32)
    dtype = _dtype(name)
    x = _draw(rng, shape, dtype, offset=3.0)
    dy = _draw(rng, shape, dtype)
    d = shape[-1]
    scale = None
    if affine in ("scale", "misaligned"):
        scale = _scale(rng, d, name, affine == "misaligned", cp)
    elif affine == "16-bit":
        scale = cp.asarray(rng.standard_normal(d).astype(dtype))
    gx, gdy = cp.asarray(x), cp.asarray(dy)
    route("v2")
    y, m, i = B.layer_normalization_forward(None, gx, scale, None, 1, 1e-5)
    dx2, ds2, db2 = B.layer_normalization_backward(None, gx, gdy, scale, m, i, 1)
    route("v3", p, stage)
    with Counted() as c:
        dx, ds, db = B.layer_normalization_backward(None, gx, gdy, scale, m, i, 1)
    assert c.n == 1 + (scale is not None)
    aligned = not (gx.data.ptr | gdy.data.ptr) & 15
    took_v3 = NK.ln_bwd3_config(d, gx.dtype.itemsize, aligned, p, stage) is not None
    assert took_v3 == (d % (16 // gx.dtype.itemsize) == 0)       # else v2 / v1 (the route falls through)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    s64 = _h(scale)
    # the reference from the kernel's own saved statistics (the forward's float32 mean / rstd)
    dx_r, ds_r, db_r = B.layer_normalization_backward(None, x64, dy64, s64, _h(m), _h(i), 1)
    _close(dx, dx_r, name)
    _close(dx, _h(dx2), name)
    if scale is not None:
        _close(ds, ds_r, name, shape[0], what="stat")
        _close(db, db_r, name, shape[0], what="data-sum")
        _close(ds, _h(ds2), name, shape[0], what="stat")
        _close(db, _h(db2), name, shape[0], what="data-sum")
    else:
        assert ds is None and db is None
    again = B.layer_normalization_backward(None, gx, gdy, scale, m, i, 1)     # the kept plan: the same bits
    np.testing.assert_array_equal(_h(again[0]), _h(dx))
    if scale is not None:
        np.testing.assert_array_equal(_h(again[1]), _h(ds))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("stage", [False, True])
def test_ln_bwd3_small_variance_rows(cp, route, name, stage):
    """Rows of 8 values lying ~0.01 apart (rstd in the hundreds): the one-sum form keeps the re-centring
    (off = mean(x - mean)), as test_norm_kernels' short-rows case does for v2."""
    rng = np.random.default_rng(12)
    base = (rng.standard_normal((4000, 1)) * 1.5 - 2.0).astype(np.float32)
    x = (base + rng.standard_normal((4000, 8)).astype(np.float32) * 0.01).astype(_dtype(name))
    dy = _draw(rng, (4000, 8), _dtype(name))
    route("v3", 4, stage)
    gx = cp.asarray(x)
    y, m, i = B.layer_normalization_forward(None, gx, None, None, 1, 1e-5)
    dx = B.layer_normalization_backward(None, gx, cp.asarray(dy), None, m, i, 1)[0]
    assert float(np.median(_h(i))) > 50
    dx_r = B.layer_normalization_backward(None, x.astype(np.float64), dy.astype(np.float64), None, _h(m), _h(i),
                                          1)[0]
    _close(dx, dx_r, name)
