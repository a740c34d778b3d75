"""Session 17: the 16-bit layer-norm forward route "v3kw" (norm_kernels ln_fwd3 with LN3_KEEP / LN3_FULL on a team
of 3 vectors a thread where ln_config3's team would leave slots empty: (32768, 768) bf16 one warp a row instead of
64 threads holding 96 vectors; MINIDNN_NORM_ROUTE=ln_fwd16=v3kw, off by default).

CPU: ln_config3w's teams (768 / 1536 / 3072 values change, the rest keep ln_config3's), the launch bounds
_ln_forward_plan3 gives them, nvcc without spills at those bounds, the route's launch under the fake CuPy.
GPU (marked cuda): y, mean, rstd against float64 and close to the default route "v3k" on the same inputs, for the
widths the route changes, bf16 / fp16, with and without affine parameters, a misaligned and a 16-bit parameter.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import norm_kernels as NK
from tests._nvcc import pick
from tests.backend.test_norm_kernels import TOL, Counted, _close, _draw, _dtype, _h

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
F16 = np.dtype(np.float16)


@pytest.mark.parametrize("d, want", [(768, (32, 3, 8)), (1536, (64, 3, 8)), (3072, (128, 3, 8)),
                                     (1024, (64, 2, 8)), (512, (32, 2, 8)), (384, (32, 2, 8)),
                                     (1000, (64, 2, 8)), (4096, (256, 2, 8)), (2304, (256, 2, 8)), (8, (32, 1, 8)),
                                     (100, None)])
def test_ln_config3w(d, want):
    assert NK.ln_config3w(d, F16, True) == want
    base = NK.ln_config3(d, F16, True)
    if want is not None and want != base:           # changed only where the default's team has empty slots
        assert d != base[0] * base[1] * base[2] and d == want[0] * want[1] * want[2]
    assert NK.ln_config3w(d, np.dtype(np.float32), True) is None


def _minb(team, vpt):
    """_ln_forward_plan3's launch bounds for the smem route (the expression, not a copy of its numbers)."""
    if vpt == NK.LN3W_VPT:
        return 3 if team == 32 else 4
    return 8 if vpt == 1 else 5


def test_default_route_is_v3kw():
    # the default since session 17's run 3 (bf16 (32768, 768) 1.06x, (16384, 1024) the same plan as v3k)
    assert NK._version("ln_fwd", F16) == "v3kw"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cfg", pick([(32, 3), (64, 3), (128, 3)], 1, [(32, 3)]), ids=str)
def test_v3kw_compiles_without_spills(tmp_path, cfg):
    from minidnn.backend.cuda import launch
    team, vpt = cfg
    for dt in (_dtype("bfloat16"), F16) if team == 32 else (_dtype("bfloat16"),):      # (~3 s a build here)
        opts = NK.options(dt, NK._PSTORAGE["float32"], team, vpt, 8, False, 256, _minb(team, vpt),
                          (("LN3_SMEM", 1), ("LN3_KEEP", 1), ("LN3_FULL", 1)))
        src = tmp_path / "k.cu"
        launch.write_source(str(src), NK.SOURCE, [o[2:] for o in opts if o.startswith("-D")])
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-ftz=true", "-Xptxas",
                            "-v,--entry=ln_fwd3", "-o", str(tmp_path / "k"), str(src)], capture_output=True,
                           text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-2000:]
        lines = out.splitlines()
        i = next(i for i, line in enumerate(lines) if "entry function 'ln_fwd3'" in line)
        spill = next(line for line in lines[i:i + 4] if "spill stores" in line)
        assert int(spill.split("bytes spill stores")[0].split(",")[-1]) == 0, (dt, cfg, spill)


def test_v3kw_launch_under_the_fake_cupy():
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, ml_dtypes, record_launches as R
fakecp, L = R._install({ROOT!r})
seen = []
real = L.get_kernel
L.get_kernel = lambda src, name, opts=(): seen.append((name, opts)) or real(src, name, opts)
import minidnn.backend as B
from minidnn.backend.cuda import norm_kernels as NK
assert NK.ROUTE["ln_fwd16"] == "v3kw"
for d in (768, 1024):
    x = fakecp.asarray(np.ones((64, d), ml_dtypes.bfloat16))
    B.layer_normalization_forward(None, x, None, None, 1, 1e-5)
(n1, o1), (n2, o2) = seen
assert n1 == n2 == "ln_fwd3"
assert {{"-DTEAM=32", "-DVPT=3", "-DMINB=3", "-DLN3_KEEP=1", "-DLN3_FULL=1", "-DLN3_SMEM=1"}} <= set(o1), o1
assert {{"-DTEAM=64", "-DVPT=2", "-DMINB=5", "-DLN3_KEEP=1", "-DLN3_FULL=1"}} <= set(o2), o2     # 1024: as v3k
print("OK")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, MINIDNN_NORM_ROUTE="ln_fwd16=v3kw"))
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


# (dtype, shape, parameters): the widths v3kw changes (768 warp teams, 1536 / 3072 teams of 64 / 128), row counts
# that leave the last block's teams without rows
CASES = [("bfloat16", (32768, 768), "both"), ("bfloat16", (517, 768), "none"), ("bfloat16", (3001, 1536), "misaligned"),
         ("bfloat16", (300, 3072), "16-bit"), ("float16", (4096, 768), "both"), ("float16", (7, 768), "16-bit")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, affine", CASES, ids=lambda v: str(v))
def test_v3kw_against_float64_and_v3k(cp, monkeypatch, name, shape, affine):
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
    cfgs = []
    real = NK._ln_forward_plan3

    def spy(*args, **kw):
        cfgs.append(args[6])
        return real(*args, **kw)
    monkeypatch.setattr(NK, "_ln_forward_plan3", spy)
    out = {}
    for version in ("v3k", "v3kw"):
        NK._plans.clear()
        monkeypatch.setitem(NK.ROUTE, "ln_fwd16", version)
        with Counted() as c:
            out[version] = B.layer_normalization_forward(None, gx, scale, bias, 1, 1e-5)
        assert c.n == 1
    NK._plans.clear()
    assert cfgs == [NK.ln_config3(d, dtype, True), NK.ln_config3w(d, dtype, True)] and cfgs[1][1] == 3
    y_r, m_r, i_r = B.layer_normalization_forward(None, x.astype(np.float64), _h(scale), _h(bias), 1, 1e-5)
    y, m, i = out["v3kw"]
    _close(y, y_r, name)
    _close(m, m_r, name, what="stat")
    _close(i, i_r, name, what="stat")
    # the default route on the same inputs: other team sums, so not bitwise; within a unit of the data's rounding
    np.testing.assert_allclose(_h(y), _h(out["v3k"][0]), rtol=TOL[name]["rtol"], atol=TOL[name]["atol"])
    np.testing.assert_allclose(_h(m), _h(out["v3k"][1]), rtol=1e-5, atol=1e-5)
