"""softmax_kernels.NAN_RESCALE (session 21, off by default until a GPU run): the row kernels' chunked forward --
softmax / log-softmax rows and the cross-entropy rows of loss_kernels -- keeps the NaN sum of a thread whose first
chunks held only NaN.  CPU: the define reaches exactly the chunked forwards when on, nothing changes when off, the
builds compile; cuda: rows whose first half is NaN come out all NaN, as the float64 reference, and rows without NaN
bitwise the default's."""
import re
import shutil

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import loss_kernels as _lk
from minidnn.backend.cuda import softmax_cluster as _sc
from minidnn.backend.cuda import softmax_kernels as _sk
from tests import _nvcc
from tests.backend.test_softmax_rows_cuda import _dtype, _reset_plans

CHUNKED = (20000, 32000, 50257, 65536)
ONE_CHUNK = (1000, 8192, 16384)


def _defs(defines):
    return dict(d.split("=", 1) for d in defines)


@pytest.mark.parametrize("on", [False, True])
def test_define_only_on_chunked_forwards(monkeypatch, on):
    monkeypatch.setattr(_sk, "NAN_RESCALE", on)
    for name in ("float32", "bfloat16", "float16"):
        for c in CHUNKED + ONE_CHUNK:
            chunked = c in CHUNKED and not _sk.row_config(c, _dtype(name).itemsize, 4, 1).one
            for algo in ("ACCURATE", "LOG"):
                fwd = _defs(_sk.launch_spec(False, (64, c), (1,), algo, _dtype(name)).defines)
                bwd = _defs(_sk.launch_spec(True, (64, c), (1,), algo, _dtype(name)).defines)
                assert fwd.get("NAN_RESCALE") == ("1" if on and chunked else None), (name, c, algo)
                assert "NAN_RESCALE" not in bwd
            ce = _defs(_lk.launch_spec("ce_fwd", (64, c), _dtype(name), np.int64, False, "mean")[2])
            ceb = _defs(_lk.launch_spec("ce_bwd", (64, c), _dtype(name), np.int64, False, "mean")[2])
            assert ce.get("NAN_RESCALE") == ("1" if on and chunked else None) and "NAN_RESCALE" not in ceb


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_builds_with_the_define():
    """nvcc sm_90: the chunked forwards build with NAN_RESCALE=1 (float32 / bfloat16 / float16, both algorithms, the
    cross-entropy rows plain and widened); spills within 8 bytes of the same build without it (nvcc 13: equal or
    fewer but +4 bytes in five float16 builds)."""
    old = _sk.NAN_RESCALE
    units, names = [], []
    try:
        for on in (False, True):
            _sk.NAN_RESCALE = on
            for name in ("float32", "bfloat16", "float16"):
                for c in (32000, 50257):
                    s = _sk.launch_spec(False, (64, c), (1,), "LOG", _dtype(name))
                    units.append((_sk.SOURCE, s.defines))
                    names.append((on, "smx", name, c, s.name))
                    src, k, defines, *_ = _lk.launch_spec("ce_fwd", (64, c), _dtype(name), np.int64, False, "mean",
                                                          0.0, name != "float32")
                    units.append((_lk.SOURCE_ROWS, defines))
                    names.append((on, "ce", name, c, k))
    finally:
        _sk.NAN_RESCALE = old
    built = _nvcc.build(units, entries=[(n[-1],) for n in names])
    spills = {}
    for n, (src, defines), r in zip(names, units, built):
        assert r.returncode == 0, r.stderr[:1500]
        assert ("NAN_RESCALE=1" in defines) == n[0]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores" % n[-1], r.stderr, re.S)
        assert m is not None, r.stderr[:1500]
        spills[n] = int(m.group(1))
    for n, v in spills.items():
        if n[0]:
            assert v <= spills[(False,) + n[1:]] + 8, (n, v)




def _half_nan_rows(rows, c, seed):
    x = np.random.default_rng(seed).standard_normal((rows, c)) * 3
    x[1, : c // 2] = np.nan             # the first chunks of every thread only NaN
    x[2, c // 3] = np.nan               # a single NaN
    x[3, :] = -np.inf
    return x


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", [("bfloat16", 65536), ("float16", 32000), ("float32", 50257),
                                     ("bfloat16", 20000)])
def test_row_kernels_keep_nan_with_the_switch(cp, monkeypatch, name, c):
    """The row kernels ("0": the clusters off) with NAN_RESCALE on: a half-NaN row all NaN, as the reference; the
    other rows bitwise the default's (the rescale is the same arithmetic where no sum is NaN)."""
    monkeypatch.setattr(_sc, "CLUSTER", "0")
    x = cp.asarray(_half_nan_rows(8, c, c).astype(_dtype(name)))
    out = {}
    for on in (False, True):
        monkeypatch.setattr(_sk, "NAN_RESCALE", on)
        _reset_plans()
        for algo in ("accurate", "log"):
            out[on, algo] = B.softmax_forward(None, algo, None, x, axis=-1)
    _reset_plans()
    w = {2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    for algo in ("accurate", "log"):
        y = out[True, algo].astype(np.float32)
        assert int(cp.isnan(y[1]).sum()) == c and int(cp.isnan(y[2]).sum()) == c, algo
        keep = [0, 3, 4, 5, 6, 7]
        assert bool((out[True, algo][keep].view(w) == out[False, algo][keep].view(w)).all()), algo


@pytest.mark.cuda
def test_ce_rows_keep_nan_with_the_switch(cp, monkeypatch):
    """Cross-entropy rows of 65536 float32 classes ('none'): a half-NaN row's loss NaN with the switch on, the other
    rows' loss and lse bitwise the default's."""
    x = cp.asarray(_half_nan_rows(8, 65536, 7).astype(np.float32))
    t = cp.asarray(np.arange(8) * 4000 + 33000)            # the targets in the finite half (< 65536)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(_sk, "NAN_RESCALE", on)
        _lk._plans.clear()
        _reset_plans()
        out[on] = B.softmax_cross_entropy_forward(None, x, t, None, -100, 0.0, "none")
    _lk._plans.clear()
    _reset_plans()
    loss_on, lse_on = out[True][0].get(), out[True][1].get()
    assert np.isnan(loss_on[1]) and np.isnan(lse_on[1])
    keep = [0, 4, 5, 6, 7]
    assert np.array_equal(loss_on[keep], out[False][0].get()[keep])
    assert np.array_equal(lse_on[keep], out[False][1].get()[keep])
