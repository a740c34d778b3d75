"""Session 12: the 16-bit layer-norm forward "v3k" (norm_kernels ln_fwd3 with LN3_KEEP, LN3_FULL; the default route
since round 2 for teams up to LN3K_MAX_TEAM = 128 threads, i.e. rows up to 2048 values; v3s for longer rows;
MINIDNN_NORM_ROUTE=ln_fwd16=v3s gives v3s everywhere) against the float64 reference and against "v3s": the same sums
in the same order (each value converted once instead of three times; no per-vector tests where the team covers the
row), so y, mean and rstd are compared BITWISE with v3s.

CPU: which widths are FULL, and every configuration the route plans compiles for sm_90 without spills.  GPU (marked
cuda): row widths that fill the team (256, 1024, 4096: LN3_FULL) and that do not (768, 1000), tiny row counts, with
and without affine parameters, misaligned float32 and 16-bit parameters.
"""
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import norm_kernels as NK
from tests._nvcc import pick
from tests.backend.test_norm_kernels import Counted, _close, _draw, _dtype, _h

WIDTHS = [256, 512, 768, 1000, 1024, 2048, 4096]


def _configs_of(d):
    """(TEAM, VPT, VEC, MINB, FULL) as _ln_forward_plan3 builds route v3k."""
    team, vpt, vec = NK.ln_config3(d, np.dtype(np.float16), True)
    return team, vpt, vec, 8 if vpt == 1 else 5, int(d == team * vpt * vec)


def _configs():
    """The configurations route v3k compiles with LN3_KEEP (teams <= LN3K_MAX_TEAM)."""
    return sorted({_configs_of(d) for d in WIDTHS if _configs_of(d)[0] <= NK.LN3K_MAX_TEAM})


def test_v3k_default_route_and_team_rule():
    """v3k was the 16-bit default until session 17 (now its successor v3kw, the same KEEP / FULL builds with full
    teams); KEEP / FULL build up to 128-thread teams (2048 values), v3s above (4096: a 256-thread team, 0.95x v3s on
    the H200)."""
    assert NK._version("ln_fwd", np.dtype(np.float16)) in ("v3k", "v3kw")
    assert NK.LN3K_MAX_TEAM == 128
    assert {d: _configs_of(d)[0] <= NK.LN3K_MAX_TEAM for d in WIDTHS} == {
        256: True, 512: True, 768: True, 1000: True, 1024: True, 2048: True, 4096: False}


def test_v3k_full_widths():
    """LN3_FULL exactly where ln_fwd3's team covers the row: 768 (96 vectors on 64 threads x 2) and 1000 do not."""
    full = {d: _configs_of(d)[4] for d in WIDTHS}
    assert full == {256: 1, 512: 1, 768: 0, 1000: 0, 1024: 1, 2048: 1, 4096: 1}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cfg", pick(_configs(), 3), ids=str)
def test_v3k_compiles_without_spills(tmp_path, cfg):
    team, vpt, vec, minb, full = cfg
    for dtype in (np.float16, ml_dtypes.bfloat16):
        dt = np.dtype(dtype)
        opts = NK.options(dt, NK._PSTORAGE["float32"], team, vpt, vec, False, 256, minb,
                          (("LN3_SMEM", 1), ("LN3_KEEP", 1), ("LN3_FULL", full)))
        defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
        src = tmp_path / "k.cu"
        src.write_text(defines + NK.SOURCE)
        # ptxas builds only ln_fwd3 (--entry: its registers and spills are its own, as in the whole module)
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v,--entry=ln_fwd3", "-o",
                            str(tmp_path / "k"), str(src)], capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-2000:]
        lines = out.splitlines()
        i = next(i for i, line in enumerate(lines) if "entry function 'ln_fwd3'" in line)
        spill = next(line for line in lines[i:i + 4] if "spill stores" in line)
        assert int(spill.split("bytes spill stores")[0].split(",")[-1]) == 0, (dt, cfg, spill)


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


# (dtype, shape, parameters): FULL rows (1024, 256), rows that do not fill the team (768, 1000), tiny row counts, the
# 256-thread team (4096: the default plans v3s there), every parameter kind at least once.  ~10 NVRTC compiles.
FWD_CASES = [("bfloat16", (4096, 1024), "both"), ("bfloat16", (8, 768), "none"),
             ("bfloat16", (3001, 1000), "misaligned"), ("bfloat16", (600, 4096), "both"),
             ("bfloat16", (20001, 256), "16-bit"), ("bfloat16", (3, 1024), "none"),
             ("float16", (4096, 1024), "16-bit"), ("float16", (517, 768), "both")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, affine", FWD_CASES, ids=lambda v: str(v))
def test_ln_fwd3_keep(cp, monkeypatch, name, shape, affine):
    rng = np.random.default_rng(hash((shape, name, affine)) % 2 ** 32)
    dtype = _dtype(name)
    x = _draw(rng, shape, dtype, offset=3.0)
    d = shape[-1]
    scale = bias = None
    if affine in ("both", "misaligned"):
        k = int(affine == "misaligned")
        scale = cp.asarray(rng.standard_normal(d + 1).astype(np.float32))[k:k + d]
        bias = cp.asarray(rng.standard_normal(d + 1).astype(np.float32))[k:k + d]
    elif affine == "16-bit":
        scale = cp.asarray(rng.standard_normal(d).astype(dtype))
        bias = cp.asarray(rng.standard_normal(d).astype(dtype))
    gx = cp.asarray(x)
    keeps = []
    real = NK._ln_forward_plan3

    def spy(*args, **kw):
        keeps.append(kw.get("keep", False))
        return real(*args, **kw)
    monkeypatch.setattr(NK, "_ln_forward_plan3", spy)
    out = {}
    for version in ("v3s", "v3k"):
        NK._plans.clear()
        monkeypatch.setitem(NK.ROUTE, "ln_fwd16", version)
        with Counted() as c:
            out[version] = B.layer_normalization_forward(None, gx, scale, bias, 1, 1e-5)
        assert c.n == 1
    NK._plans.clear()
    assert keeps == [False, NK.ln_config3(d, dtype, True)[0] <= NK.LN3K_MAX_TEAM]
    y_r, m_r, i_r = B.layer_normalization_forward(None, x.astype(np.float64), _h(scale), _h(bias), 1, 1e-5)
    y, m, i = out["v3k"]
    _close(y, y_r, name)
    _close(m, m_r, name, what="stat")
    _close(i, i_r, name, what="stat")
    for got, want in zip(out["v3k"], out["v3s"]):
        np.testing.assert_array_equal(_h(got), _h(want))
