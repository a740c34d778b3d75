"""IGNORED_DX (loss_kernels, session 24) in every spatial backward branch, run on the host (REVIEW24): the split host
harness (tests/backend/test_ce_split_host.py: g++ over SOURCE_SPATIAL with CUDA's names shimmed) runs ce_sp_bwd as
planned for the compiled-in class count (CC), C read at run time (SP_RT), pairs of positions (PAIR, P = 2: the two
`o[j] = lse[j] - lse[j]` lines, which the SPLIT host test never builds) with CC and with SP_RT, SPLIT, the masked
batches (SP_RT off), float64 and widened 16-bit logits (XSTORAGE) -- on rows cycling through test_ce_ignored_dx's
SPECIALS (NaN, +inf, two +inf, all -inf, some -inf, -inf at the target), every other pair of rows ignored, on the
reference's lse.  An ignored row's dx must be 0 where its lse is finite and NaN (the whole row) where it is NaN or
-inf; every row's NaN pattern the CPU reference's (itself checked against PyTorch in test_ce_ignored_dx.py), the
finite values close to it.  Each IGNORED_DX line mutated back to 0 fails the routes through it (the one-position
line: CC, SP_RT, SPLIT, masked, float64, widened CC; the pairs' lines: their pair routes); a NaN-only rule (-inf lse
giving 0) fails them too, which the SPLIT host test's specials (one ignored NaN position) do not catch.  The rows and
warps kernels are the cuda test's (test_ce_ignored_dx.py)."""
import shutil

import numpy as np
import pytest

from minidnn import backend as B
from minidnn.backend.cuda import loss_kernels as _lk
from tests.backend.test_ce_ignored_dx import _nan_rows, _nchw, _rows
from tests.backend.test_ce_split_host import _host_call, _host_source
from tests.backend.test_softmax_cols_s22 import host_build
from tests.backend.test_softmax_rows_cuda import _dtype

# (label, dtype, (N, C, H, W), module switches, the defines the plan must hold; "XSTORAGE=": widened 16-bit logits)
ROUTES = [
    ("cc", "float32", (2, 9, 3, 5), {}, ("CC=9",)),
    ("cc-pairs", "float32", (2, 9, 2, 8), {}, ("CC=9", "PAIR=1")),
    ("cc-pairs-bf16", "bfloat16", (2, 9, 2, 8), {}, ("CC=9", "PAIR=1")),
    ("rt", "float32", (2, 40, 2, 7), {}, ("SP_RT=1",)),
    ("rt-pairs", "float32", (2, 40, 2, 8), {"SP_RT_PAIR_BLOCKS": 0}, ("SP_RT=1", "PAIR=1")),
    ("split", "float32", (1, 150, 4, 7), {}, ("SP_RT=1", "SPLIT=4")),
    ("masked", "float32", (2, 40, 2, 7), {"SP_RT": False}, ()),
    ("float64", "float64", (2, 9, 2, 8), {}, ()),
    ("cc-widened", "bfloat16", (2, 9, 3, 5), {}, ("CC=9", "XSTORAGE=2")),
    ("rt-pairs-widened", "float16", (2, 40, 2, 8), {"SP_RT_PAIR_BLOCKS": 0}, ("SP_RT=1", "PAIR=1", "XSTORAGE=1")),
]


def _spec(dt, shape, switches, reduction, widen):
    saved = {k: getattr(_lk, k) for k in switches}
    try:
        for k, v in switches.items():
            setattr(_lk, k, v)
        return _lk.launch_spec("ce_bwd", shape, dt, np.int64, False, reduction, widen=widen)
    finally:
        for k, v in saved.items():
            setattr(_lk, k, v)


_CASES = [(r, red) for r in ROUTES for red in ("none", "mean")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The executable holding every case's planned ce_sp_bwd (one g++ build), and the cases' specs."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    specs = []
    for (label, name, shape, switches, want), reduction in _CASES:
        spec = _spec(_dtype(name), shape, switches, reduction, any(d.startswith("XSTORAGE=") for d in want))
        assert spec[0] == "SPATIAL" and all(d in spec[2] for d in want), (label, spec[2])
        if "PAIR=1" not in want:
            assert "PAIR=1" not in spec[2], (label, spec[2])
        specs.append(spec)
    return host_build(tmp_path_factory.mktemp("ce_ign"), "ce_ignored_host", _host_source([s[2] for s in specs])), specs


@pytest.mark.parametrize("u", range(len(_CASES)), ids=[f"{r[0]}-{red}" for r, red in _CASES])
def test_ignored_dx_every_spatial_branch_on_the_host(built, u):
    exe, specs = built
    ((label, name, shape, _, want), reduction), spec = _CASES[u], specs[u]
    widen = any(d.startswith("XSTORAGE=") for d in want)
    rng = np.random.default_rng(24 + u)
    dt = _dtype(name)
    n, c, h, w = shape
    x2, t2 = _rows(rng, n * h * w, c)
    x, t = _nchw(x2, t2, n, c, h, w)
    x = x.astype(dt)
    g = (rng.standard_normal(t.shape) if reduction == "none" else np.float64(0.5)).astype(np.float32)
    acc = np.float64 if dt == np.float64 else np.float32
    g = np.asarray(g).astype(acc if widen else dt)          # T: x's dtype, float32 widened
    with np.errstate(all="ignore"):       # the reference's lse (NaN / -inf rows) and dx
        _, lse, den = B.softmax_cross_entropy_forward(None, x.astype(acc), t, None, -100, 0.0, reduction)
        ref = B.softmax_cross_entropy_backward(None, x.astype(acc), t, g.astype(acc), lse, den, None, -100, 0.0,
                                               reduction)
    lse, den = np.asarray(lse, acc), np.asarray(den, acc).reshape(1)
    dx, = _host_call(exe, u, True, spec[3], shape, 0.0, [x, t, None, lse, g, den], [(dt, x.size)])
    rows_dx = np.moveaxis(dx.astype(np.float64).reshape(shape), 1, -1).reshape(-1, c)
    rows_ref = np.moveaxis(np.asarray(ref, np.float64), 1, -1).reshape(-1, c)
    ign = t.reshape(-1) == -100
    what = (label, name, reduction)
    assert np.array_equal(np.isnan(rows_dx[ign]).all(1), _nan_rows(x2, t.reshape(-1))[ign]), what
    assert not np.nan_to_num(rows_dx[ign], nan=0.0).any(), what
    assert np.array_equal(np.isnan(rows_dx), np.isnan(rows_ref)), what
    fin = np.isfinite(rows_ref)
    tol = {"float32": 4e-6, "float64": 4e-6, "bfloat16": 2e-2, "float16": 4e-3}[name]
    np.testing.assert_allclose(rows_dx[fin], rows_ref[fin], rtol=tol, atol=tol, err_msg=str(what))
