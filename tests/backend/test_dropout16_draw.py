"""Session 14: the 16-bit dropout stream (backend/cuda/dropout_philox.py DRAW16, MINIDNN_DROPOUT_DRAW16).

Under DRAW16 a float16 / bfloat16 forward decides element i from half-word i % 8 of Philox4x32-10 block
counter + i // 8 (half-word 2w the low 16 bits of word w), kept iff h * 2^-16 >= float32(p), wherever 16-bit
thresholds hold p (``draw16_holds``: drop and keep probability within 2^-10 relative); float32 / float64 and the
other p keep the 24-bit stream.  The counter still advances by ceil(n / 4).

CPU: the host reference (test_dropout_cuda.reference_keep, draw16=True) against a plain Python-integer Philox and an
element loop; threshold16 against the float comparison over every half-word; the resolution rule at the p a user
sets (0.5, 0.1, 1e-3, 1e-5, ...); the kernels' draw16 group math emulated over their walks (V = 8 and the V = 4 of a
float32 dy regenerating a 16-bit record); the launches under the fake CuPy (options, thresholds, the record's stream,
the switch flipped in one process through the backend's remembered calls, reserve.mask()); the environment switch;
nvcc: every DRAW16 module compiles for sm_90 without spills and draws one Philox block a 16-bit group (half the
24-bit stream's multiplies in the PTX).  GPU (cuda-marked): bitwise against the reference for fp16 / bf16 over tails,
both forward kernels, unaligned and transposed views, every reserve (the three give the same y and dx), a record
regenerated under another dy dtype, graph replays, the switch flipped in one process, and the keep statistics.
"""
import json
import math
import pathlib
import shutil
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import dropout_philox as DP
from tests._nvcc import pick
from tests.backend import test_dropout_record as R
from tests.backend.test_dropout_cuda import (
    _draw,
    _engine,
    _EngineDescriptor,
    _host,
    _launches,
    philox4x32_10,
    reference_apply,
    reference_keep,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALF = [F16, BF16]
_M32 = np.uint64(0xFFFFFFFF)


# ---- CPU: the reference --------------------------------------------------------------------------------------------

def _philox_int(ctr, key):
    """Philox4x32-10 of the counter (ctr, 0) (64 bits in words 0-1) under the 64-bit key, in Python integers."""
    m = 0xFFFFFFFF
    c = [ctr & m, (ctr >> 32) & m, 0, 0]
    k0, k1 = key & m, key >> 32
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & m, (p0 >> 32) ^ c[3] ^ k1, p0 & m]
    return c


def _loop_keep16(key, counter, n, p):
    """The 16-bit stream element by element: block (counter + i // 8) mod 2^64, word (i % 8) // 2, its low half for
    even i, the high half for odd i; kept iff h / 65536 >= float32(p) in float64."""
    q = float(np.float32(p))
    out = []
    for i in range(n):
        w = _philox_int((counter + i // 8) % 2 ** 64, key)[(i % 8) // 2]
        h = (w >> 16) if i % 2 else (w & 0xFFFF)
        out.append(h / 65536.0 >= q)
    return np.array(out, np.bool_)


def test_integer_philox_is_the_known_answer():
    """The loop's Philox against Random123's vectors (counter words 2-3 zero) and the NumPy one of the reference."""
    assert _philox_int(0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ctr = np.array([[5, 7, 0, 0]], np.uint64)
    assert philox4x32_10(ctr, (11, 13))[0].tolist() == _philox_int(5 | 7 << 32, 11 | 13 << 32)


@pytest.mark.parametrize("counter", [0, 2 ** 32 - 3, 2 ** 64 - 5])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.3, 0.5, 0.9, 1.0, 1e-5])
def test_reference_stream16_is_the_element_loop(counter, p):
    """reference_keep(draw16=True) == the element loop, ragged n (every tail of a block of 8), the counter's high
    word moving inside the call and the 64-bit counter wrapping."""
    key = 0x0123_4567_89AB_CDEF
    for n in (1, 7, 8, 9, 61):
        np.testing.assert_array_equal(reference_keep(key, counter, n, p, draw16=True),
                                      _loop_keep16(key, counter, n, p), err_msg=str(n))


def test_reference_stream16_differs_from_the_24_bit_one():
    """The two streams are different numbers (the check above can fail): same key and counter, p = 0.5."""
    a, b = reference_keep(3, 0, 4096, 0.5, draw16=True), reference_keep(3, 0, 4096, 0.5)
    assert 0.4 < (a == b).mean() < 0.6


@pytest.mark.parametrize("p", [0.0, 2 ** -16, 1e-5, 1e-3, 0.0153, 0.1, 1 / 3, 0.5, 0.9, 0.999, 1 - 2 ** -16,
                               1 - 1e-9, 1.0])
def test_threshold16_is_the_float_comparison(p):
    """h >= threshold16(p)  <=>  h * 2^-16 >= float32(p), over every half-word."""
    h = np.arange(1 << 16, dtype=np.int64)
    np.testing.assert_array_equal(h >= DP.threshold16(p), h.astype(np.float64) * 2.0 ** -16 >= float(np.float32(p)))


# the drop probability a user sets -> whether 16 bits hold it, and what the 16-bit threshold would draw
RESOLUTION = [(0.5, True, 0.5), (0.1, True, 6554 / 65536), (0.25, True, 0.25), (0.9, True, 58983 / 65536),
              (0.02, True, 1311 / 65536), (0.99, True, 64881 / 65536), (1e-3, False, 66 / 65536),
              (1e-5, False, 1 / 65536), (0.999, False, 65471 / 65536), (0.015, False, 984 / 65536),
              (0.0, True, 0.0), (1.0, True, 1.0), (2 ** -16, True, 2 ** -16), (2 ** -10, True, 2 ** -10)]


@pytest.mark.parametrize("p, holds, p16", RESOLUTION)
def test_resolution_rule(p, holds, p16):
    """draw16_holds: 16-bit thresholds only where the drop and keep probabilities both move by <= 2^-10 of
    themselves (so E[y] / x stays within 2^-10 of 1); p16 = threshold16 / 2^16 is never below float32(p), never more
    than 2^-16 above.  uses_draw16 asks DRAW16, 2-byte data and the rule."""
    q = float(np.float32(p))
    assert DP.threshold16(p) / 65536 == p16 and 0 <= p16 - q < 2 ** -16
    assert DP.draw16_holds(p) is holds
    assert (abs(p16 - q) <= 2 ** -10 * min(q, 1 - q)) is holds
    if holds and q < 1:                                   # the mean of y: E[y] / x = (1 - p16) / (1 - p)
        assert abs((1 - p16) / (1 - q) - 1) <= 2 ** -10
    for on in (False, True):
        for dt in (np.float16, BF16, np.float32, np.float64):
            want = on and np.dtype(dt).itemsize == 2 and holds
            DP_draw16, DP.DRAW16 = DP.DRAW16, on
            try:
                assert DP.uses_draw16(dt, p) is want, (on, dt, p)
            finally:
                DP.DRAW16 = DP_draw16


def test_every_p_of_the_middle_holds():
    """Every p in [2^-6, 1 - 2^-6] holds (the rounding is under 2^-16 = 2^-10 * 2^-6): a scan of 200,001 p; just
    outside, some fail (0.0153 holds, 0.015 does not: RESOLUTION)."""
    for p in np.linspace(2 ** -6, 1 - 2 ** -6, 200_001):
        assert DP.draw16_holds(float(p)), p
    assert not all(DP.draw16_holds(float(p)) for p in np.linspace(2 ** -6 - 1e-3, 2 ** -6, 1001))


# ---- CPU: the kernels' group math over their walks -----------------------------------------------------------------

def _draw_groups16(h, n, V, key, base, thresh, dec, hits):
    """draw_group under DRAW16, as the kernel computes it: V = 8 -- block base + h, half-words 0..7; V = 4 -- block
    base + h / 2, words 2 (h & 1) and 2 (h & 1) + 1 (their low then high halves)."""
    blk = h if V == 8 else h >> 1
    ctr = np.uint64(base) + blk.astype(np.uint64)
    words = np.zeros((h.size, 4), np.uint64)
    words[:, 0], words[:, 1] = ctr & _M32, ctr >> np.uint64(32)
    r = philox4x32_10(words, (key & 0xFFFFFFFF, key >> 32))
    if V == 4:
        odd = (h & 1).astype(bool)
        r = np.where(odd[:, None], r[:, 2:4], r[:, 0:2])
    for j in range(V):
        w = r[:, j >> 1]
        half = (w >> np.uint32(16)) if j & 1 else (w & np.uint32(0xFFFF))
        e = h * V + j
        ok = e < n
        dec[e[ok]] = half[ok] >= thresh
        hits[e[ok]] += 1


@pytest.mark.parametrize("n", [1, 5, 8, 9, 17, 1000, 4099, 65537])
def test_draw16_groups_over_the_walks_are_the_reference(n, monkeypatch):
    """Under every walk the kernels take (dropout_fwd's, the pipe's loads one iteration ahead, small grids that loop)
    the draw16 group math decides each element once and as the reference: V = 8 (16-bit data) and V = 4 (a float32
    or float64 dy regenerating a 16-bit forward's record)."""
    monkeypatch.setattr(R, "_draw_groups", _draw_groups16)
    key, base, p = 0x1234_5678_9ABC_DEF1, 2 ** 32 - 3, 0.3
    want = reference_keep(key, base, n, p, draw16=True)
    for v, grid, unroll, pipe in ((8, 1, 4, True), (8, 3, 1, False), (8, 2, 2, False), (4, 1, 4, True),
                                  (4, 3, 2, False), (4, 1000, 1, False)):
        dec, hits = R._emulate(n, v, grid, unroll, pipe, key, base, DP.threshold16(p))
        assert (hits == 1).all(), (v, grid, unroll, pipe)
        np.testing.assert_array_equal(dec, want, err_msg=str((v, grid, unroll, pipe)))
    dec, _ = R._emulate(n, 8, 1, 1, False, key, base + 1, DP.threshold16(p))      # one block off: other numbers
    np.testing.assert_array_equal(dec, reference_keep(key, base + 1, n, p, True))
    assert n < 17 or not np.array_equal(dec, want)


# ---- CPU: the launches under the fake CuPy -------------------------------------------------------------------------

_FAKE = textwrap.dedent("""
    import json, struct, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import ml_dtypes
    import numpy as np
    R.numpy_fallback(fakecp)
    recs = R.record_packed(L, [], other="cupy")
    import minidnn.backend as B
    from minidnn.backend.cuda import dropout_philox as DP
    default = DP.DRAW16
    DP.DRAW16 = True
    st, tk = fakecp.zeros((2,), np.uint64), fakecp.zeros((1,), np.uint32)
    rows = []
    for kind in ("record", "bits", "mask"):
        DP.RESERVE = kind
        for dt in (np.float16, ml_dtypes.bfloat16, np.float32):
            for n, offset in ((37, 0), (4096, 1), (1_100_003, 0)):
                base = fakecp.asarray(np.zeros(n + offset, dt))
                x = base[offset:] if offset else base
                for p in (0.0, 0.3, 1e-5, 1.0):
                    scale = 0.0 if p == 1 else 1 / (1 - p)
                    r0 = len(recs)
                    y, res = DP.dropout_forward(x, p, scale, st, tk)
                    fwd = recs[r0:]
                    r0 = len(recs)
                    DP.dropout_backward(x, res, 2.0)
                    rows.append(dict(kind=kind, dtype=np.dtype(dt).name, n=n, p=p, fwd=fwd, bwd=recs[r0:],
                                     d16=getattr(res, "draw16", None), rep=repr(res) if kind == "record" else ""))
    # the switch flipped in one process through the backend's remembered calls (the seen key does not hold it)
    desc = B.DropoutDescriptor(0.3, seed=1)
    x = fakecp.asarray(np.ones((4, 1001), np.float16))
    flips, made = [], []
    for kind in ("record", "bits"):
        DP.RESERVE = kind
        for on in (False, False, True, True, False):
            DP.DRAW16 = on
            r0 = len(recs)
            y, res = B.dropout_forward(None, desc, x)
            B.dropout_backward(None, desc, x, res)
            flips.append([r[0] for r in recs[r0:]])
            made.append(res)
    # a draw16 record read back after one of the 24-bit stream through the same remembered backward, and with a
    # float32 dy (V = 4); reserve.mask() of each
    recs_b = []
    for res in (made[0], made[2], made[0]):
        r0 = len(recs)
        B.dropout_backward(None, desc, x, res)
        B.dropout_backward(None, desc, fakecp.asarray(np.ones((4, 1001), np.float32)), res)
        res.mask()
        recs_b.append([r[0] for r in recs[r0:]])
    print(json.dumps(dict(rows=rows, flips=flips, recs_b=recs_b, default=default,
                          d16=[getattr(m, "draw16", None) for m in made])))
""")


def test_launches_under_the_fake_cupy():
    """DRAW16 on: 16-bit calls whose p holds compile -DDRAW16=1 and pass threshold16 (forward and the record's
    backward, which follows the reserve's ``draw16``, also for a float32 dy); float32 and p = 1e-5 keep the 24-bit
    stream; the bits / mask backwards draw nothing; the switch flipped at run time reaches the next call through the
    backend's remembered runners, each way."""
    import struct
    r = subprocess.run([sys.executable, "-c", _FAKE.format(root=str(ROOT))], capture_output=True, text=True,
                       timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["default"] is (DP._DRAW16_ENV == "1")     # as imported (shipped "0", off, until the GPU A/B)
    assert len(got["rows"]) == 3 * 3 * 3 * 4
    for row in got["rows"]:
        item = 2 if row["dtype"] in ("float16", "bfloat16") else 4
        p = row["p"]
        d16 = item == 2 and p != 1e-5
        (name, _, packed), = row["fwd"]
        assert ("-DDRAW16=1" in name) == d16, row
        thresh = struct.unpack("@5QqI", bytes.fromhex(packed)[:struct.calcsize("@5QqI")])[6]
        assert thresh == (DP.threshold16(p) if d16 else DP.threshold(p)), row
        assert thresh == {0.0: 0, 0.3: 19661 if d16 else 5033165, 1e-5: 168, 1.0: 65536 if d16 else 2 ** 24}[p]
        (name_b, _, packed_b), = row["bwd"]
        if row["kind"] == "record":
            assert row["d16"] is d16 and row["rep"].endswith(", draw16=True)" if d16 else "device=cuda:0)")
            assert name_b.startswith("dropout_bwd_regen") and ("-DDRAW16=1" in name_b) == d16
            fmt = "@3QqI"
            assert struct.unpack(fmt, bytes.fromhex(packed_b)[:struct.calcsize(fmt)])[4] == thresh
        else:
            assert "-DDRAW16" not in name_b and row["d16"] is None
    fl = got["flips"]
    for i, (kind, back) in enumerate((("record", "dropout_bwd_regen("), ("bits", "dropout_bwd_bits("))):
        calls = fl[5 * i:5 * i + 5]
        for (fwd, bwd), on in zip(calls, (False, False, True, True, False)):
            assert fwd.startswith("dropout_fwd(") and ("-DDRAW16=1" in fwd) == on, (kind, on, fwd)
            assert bwd.startswith(back) and ("-DDRAW16=1" in bwd) == (on and kind == "record"), (kind, on, bwd)
    assert got["d16"][:5] == [False, False, True, True, False]
    for calls, on in zip(got["recs_b"], (False, True, False)):
        assert len(calls) == 3 and all(c.startswith("dropout_bwd_regen(") for c in calls)
        assert all(("-DDRAW16=1" in c) == on for c in calls), calls
        assert "-DSTORAGE=0" in calls[1] and "-DSTORAGE=0" in calls[2]         # float32 dy and mask(): V = 4


def test_environment_switch(env_runs):
    """MINIDNN_DROPOUT_DRAW16=1 turns it on at import, 0 off, unset the default; anything else raises.  One
    interpreter: the first setting a fresh import, the others the module re-executed (tests/conftest.py env_runs)."""
    code = "from minidnn.backend.cuda import dropout_philox as DP; print(DP.DRAW16, DP.DRAW16_RTOL)"
    default = DP._DRAW16_DEFAULT == "1"
    cases = (("1", "True 0.0009765625"), ("0", "False 0.0009765625"), (None, f"{default} 0.0009765625"),
             ("yes", None), ("0", "False 0.0009765625"))
    got = env_runs("minidnn.backend.cuda.dropout_philox", code,
                   [{} if env is None else {"MINIDNN_DROPOUT_DRAW16": env} for env, _ in cases],
                   drop=("MINIDNN_DROPOUT_DRAW16",))
    for (env, want), (rc, out, err) in zip(cases, got):
        if want is None:
            assert rc != 0 and "MINIDNN_DROPOUT_DRAW16='yes' must be 0 or 1" in err, (env, out, err[-2000:])
        else:
            assert rc == 0 and out.strip() == want, (env, out, err[-2000:])


# ---- CPU: nvcc -------------------------------------------------------------------------------------------------------

def _philox_multiplies(body):
    """Multiplies by 0xD2511F53 (one per Philox round) in a PTX entry."""
    return sum(1 for ln in body.splitlines() if ln.strip().startswith("mul") and "3528531795" in ln)


# (dtype, MASK, pipe, WIDE): the forwards of every reserve and their regenerating backward, pipe or not, 64-bit
# indices; float32 / float64 record modules: a 16-bit record regenerated with a 4-element group
DRAW16_BUILDS = [(BF16, 2, True, 0), (F16, 0, False, 0), (BF16, 1, False, 1), (F16, 2, False, 0),
                 (BF16, 0, True, 0), (np.dtype(np.float32), 0, False, 0), (np.dtype(np.float64), 0, False, 1)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype, mask, pipe, wide", pick(DRAW16_BUILDS, 4), ids=str)
def test_draw16_kernels_compile_without_spills_one_philox_a_group(tmp_path, dtype, mask, pipe, wide):
    """Each DRAW16 module compiles for sm_90 with no spills; its forwards (and regenerating backwards) make one
    Philox call (10 rounds) a group where the 24-bit module of the same options makes V / 4."""
    unroll = DP.pipe_unroll(dtype.itemsize, bool(wide)) if pipe else 2
    pminb = DP.PIPE_MINB if pipe else None
    counts = {}
    for d16 in (True, False):
        opts = DP._options(dtype, unroll, wide, 1, pminb=pminb, mask=mask, draw16=d16)
        assert ("-DDRAW16=1" in opts) == d16
        r = R._compile(tmp_path, opts)
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "warning" not in out, out[-2000:]
        spills = [ln for ln in out.splitlines() if "spill stores" in ln]
        assert spills and all(" 0 bytes spill stores" in ln for ln in spills), out
        (ptx,) = list((tmp_path / "keep").glob("*.ptx"))
        counts[d16] = {k: _philox_multiplies(v) for k, v in R._entries(ptx.read_text()).items()}
        for f in (tmp_path / "keep").iterdir():
            f.unlink()
    v = 8 if dtype.itemsize == 2 else 4
    drawing = [k for k in counts[True] if k.startswith(("dropout_fwd", "dropout_bwd_regen"))]
    assert len(drawing) == (4 if mask == 0 else 2)
    for k in drawing:
        # a walk unrolls its draw_group UNROLL (dropout_fwd) or PUNROLL (the pipe: the kernel's default where the
        # module was not planned for it) times, 10 rounds a Philox call (static count: nvcc may copy one round's
        # multiply into two branches -- bfloat16 WIDE's unplanned pipe has 21)
        u = unroll if pipe or not k.endswith("_pipe") else (2 if dtype.itemsize == 8 or wide else 4)
        assert 10 * u <= counts[True][k] <= 10 * u + 1 and counts[False][k] in (10 * u * v // 4, 10 * u * v // 4 + 1)
        assert counts[True][k] < counts[False][k] or v == 4, (k, counts)
    assert all(counts[True][k] == 0 for k in counts[True] if k not in drawing)


# ---- GPU -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture
def draw16(monkeypatch):
    """DRAW16 on for the test (read per call: nothing cleared), RESERVE settable through the returned function."""
    monkeypatch.setattr(DP, "DRAW16", True)
    monkeypatch.setattr(DP, "RESERVE", DP.RESERVE)

    def set_reserve(kind):
        DP.RESERVE = kind
    return set_reserve


SHAPES = [1, 7, 8, 9, 15, 17, 1000, 4099, 65537, 1_000_003, (1 << 20) + 13, (128, 10), (3, 5, 7), (2, 16, 9, 9)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0, 1e-5])
@pytest.mark.parametrize("reserve", DP.RESERVES)
def test_draw16_exact(cp, draw16, dtype, p, reserve):
    """Forward mask and y, the counter's advance (ceil(n / 4): unchanged), and the backward's dx bitwise against the
    reference of the stream uses_draw16 names (p = 1e-5: the 24-bit one) -- dropout_fwd below PIPE_MIN_N elements,
    dropout_fwd_pipe from it; one launch each way."""
    draw16(reserve)
    rng = np.random.default_rng(14)
    d16 = DP.uses_draw16(dtype, p)
    assert d16 == (p != 1e-5)
    for shape in SHAPES:
        shape = shape if isinstance(shape, tuple) else (shape,)
        x_h, dy_h = _draw(cp, dtype, shape, rng), _draw(cp, dtype, shape, rng)
        eng = _engine(1414)
        eng.set_device_counter(2 ** 32 - 3)
        desc = _EngineDescriptor(p, eng)
        key, c0 = eng._device_key(), eng.device_counter()
        n0 = _launches()
        y, res = B.dropout_forward(None, desc, cp.asarray(x_h))
        assert _launches() - n0 == 1
        n = x_h.size
        assert eng.device_counter() == c0 + (n + 3) // 4
        if reserve == "record":
            assert res.draw16 is d16
        want = reference_keep(key, c0, n, p, d16).reshape(shape)
        np.testing.assert_array_equal(_host(cp, res), want, err_msg=str(shape))
        scale = 0.0 if p == 1 else 1 / (1 - p)
        np.testing.assert_array_equal(_host(cp, y).view(np.uint8), reference_apply(x_h, want, scale).view(np.uint8))
        n0 = _launches()
        dx = B.dropout_backward(None, desc, cp.asarray(dy_h), res)
        assert _launches() - n0 == 1
        np.testing.assert_array_equal(_host(cp, dx).view(np.uint8), reference_apply(dy_h, want, scale).view(np.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("pipe", ["1", "0", "grid3"])
def test_draw16_both_forward_kernels(cp, draw16, dtype, pipe, monkeypatch):
    """dropout_fwd_pipe ("1": every size; "grid3": 3 blocks, every thread looping with the next loads in flight) and
    dropout_fwd ("0") under DRAW16, record reserve (its regenerating backward takes the same walk): exact."""
    draw16("record")
    monkeypatch.setattr(DP, "PIPE_FWD", "0" if pipe == "0" else "1")
    if pipe == "grid3":
        monkeypatch.setattr(DP, "pipe_grid", lambda n, itemsize, sms: 3)
    DP.clear_plans()
    try:
        rng = np.random.default_rng(5)
        eng = _engine(9)
        desc = _EngineDescriptor(0.3, eng)
        key = eng._device_key()
        for n, offset in ((1, 0), (9, 0), (4096 + 17, 0), (65536 * 3 + 5, 0), (1_000_003, 0), (2_500_001, 0),
                          (777, 1)):
            base_h = _draw(cp, dtype, (n + offset,), rng)
            dy_h = _draw(cp, dtype, (n,), rng)
            c0 = eng.device_counter()
            y, rec = B.dropout_forward(None, desc, cp.asarray(base_h)[offset:])
            assert eng.device_counter() == c0 + (n + 3) // 4 and rec.draw16
            want = reference_keep(key, c0, n, 0.3, True)
            np.testing.assert_array_equal(_host(cp, y).view(np.uint8),
                                          reference_apply(base_h[offset:], want, 1 / 0.7).view(np.uint8))
            dx = B.dropout_backward(None, desc, cp.asarray(dy_h), rec)
            np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                          reference_apply(dy_h, want, 1 / 0.7).view(np.uint8), err_msg=str(n))
    finally:
        DP.clear_plans()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("offset", [1, 3, 5])
def test_draw16_reserves_agree_unaligned_and_transposed(cp, draw16, dtype, offset):
    """The three reserves give bitwise the same y and dx (and masks) from the same engine state, for aligned,
    unaligned (x, dy, both) and transposed views; all equal to the reference."""
    rng = np.random.default_rng(offset)
    n = 4099
    base = cp.asarray(_draw(cp, dtype, (n + offset,), rng))
    dyb = cp.asarray(_draw(cp, dtype, (n + 8,), rng))
    x2, dy2 = (cp.asarray(_draw(cp, dtype, (6, 35), rng)).T for _ in range(2))
    for x, dy in ((base[:n], dyb[:n]), (base[offset:], dyb[:n]), (base[:n], dyb[offset:offset + n]),
                  (base[offset:], dyb[offset:offset + n]), (x2, dy2)):
        got = {}
        for kind in DP.RESERVES:
            draw16(kind)
            eng = _engine(77)
            eng.set_device_counter(2 ** 32 - 3)
            desc = _EngineDescriptor(0.3, eng)
            y, res = B.dropout_forward(None, desc, x)
            dx = B.dropout_backward(None, desc, dy, res)
            got[kind] = (_host(cp, y), _host(cp, dx), _host(cp, res))
        want = reference_keep(eng._device_key(), 2 ** 32 - 3, x.size, 0.3, True).reshape(x.shape)
        xh, dyh = np.ascontiguousarray(cp.asnumpy(x)), np.ascontiguousarray(cp.asnumpy(dy))
        for kind, (y, dx, m) in got.items():
            np.testing.assert_array_equal(m, want, err_msg=kind)
            np.testing.assert_array_equal(y.view(np.uint8), reference_apply(xh, want, 1 / 0.7).view(np.uint8))
            np.testing.assert_array_equal(dx.view(np.uint8), reference_apply(dyh, want, 1 / 0.7).view(np.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_draw16_record_regenerated_with_another_dy_dtype(cp, draw16, dtype):
    """A 16-bit forward's record read with a float32 / float64 / other 16-bit dy (4- and 8-element groups drawing
    the 16-bit stream), and reserve.mask(): the forward's decisions."""
    draw16("record")
    n = 65537 + 3
    eng = _engine(5)
    desc = _EngineDescriptor(0.25, eng)
    key, c0 = eng._device_key(), eng.device_counter()
    _, rec = B.dropout_forward(None, desc, cp.ones(n, dtype=dtype))
    want = reference_keep(key, c0, n, 0.25, True)
    np.testing.assert_array_equal(_host(cp, rec.mask()), want)
    rng = np.random.default_rng(2)
    for other in (np.dtype(np.float32), np.dtype(np.float64), F16, BF16):
        dy_h = _draw(cp, other, (n,), rng)
        dx = B.dropout_backward(None, desc, cp.asarray(dy_h), rec)
        np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                      reference_apply(dy_h, want, 1 / 0.75).view(np.uint8), err_msg=other.name)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", DP.RESERVES)
def test_draw16_in_a_cuda_graph(cp, draw16, dtype, kind):
    """Forward and backward captured once, replayed three times: each replay draws the 16-bit stream at the next
    counter (ceil(n / 4) apart), its backward that replay's forward's, bitwise the reference."""
    draw16(kind)
    n = (1 << 20) + 100_003                               # the pipe forward
    rng = np.random.default_rng(1)
    x_h, dy_h = _draw(cp, dtype, (n,), rng), _draw(cp, dtype, (n,), rng)
    x, dy = cp.asarray(x_h), cp.asarray(dy_h)
    eng = _engine(31)
    desc = _EngineDescriptor(0.4, eng)
    B.dropout_backward(None, desc, dy, B.dropout_forward(None, desc, x)[1])    # compile outside the capture
    key, c0 = eng._device_key(), eng.device_counter()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        y, res = B.dropout_forward(None, desc, x)
        dx = B.dropout_backward(None, desc, dy, res)
        g = s.end_capture()
    step, seen = (n + 3) // 4, []
    for i in range(3):
        g.launch(s)
        s.synchronize()
        want = reference_keep(key, c0 + i * step, n, 0.4, True)
        np.testing.assert_array_equal(_host(cp, y).view(np.uint8), reference_apply(x_h, want, 1 / 0.6).view(np.uint8))
        np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                      reference_apply(dy_h, want, 1 / 0.6).view(np.uint8))
        seen.append(want)
    assert not np.array_equal(seen[0], seen[1]) and eng.device_counter() == c0 + 3 * step


@pytest.mark.cuda
def test_draw16_switch_in_one_process(cp, draw16):
    """Through the backend's remembered calls: off, on, off -- each forward draws the stream of the setting at its
    call; the float32 call of the same descriptor never changes stream; the counters advance alike."""
    draw16("bits")
    desc = _EngineDescriptor(0.5, _engine(3))
    key = desc.engine._device_key()
    xs = {F16: cp.ones((64, 1001), dtype=F16), np.dtype(np.float32): cp.ones((64, 1001), dtype=np.float32)}
    for on in (False, False, True, True, False, True):
        DP.DRAW16 = on
        for dt, x in xs.items():
            c0 = desc.engine.device_counter()
            _, res = B.dropout_forward(None, desc, x)
            want = reference_keep(key, c0, x.size, 0.5, on and dt == F16).reshape(x.shape)
            np.testing.assert_array_equal(_host(cp, res), want, err_msg=str((on, dt)))
            assert desc.engine.device_counter() == c0 + (x.size + 3) // 4


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_draw16_keep_statistics(cp, draw16, dtype, p):
    """Kept fraction within 6 sigma of 1 - p (and of 1 - threshold16 / 2^16, 1.5e-5 away at most), overall, per
    half-word lane (i % 8) and per word (i % 8 // 2 over 16 lanes); the two halves of a word independent (elements
    2k, 2k + 1 agree on (1-p)^2 + p^2); consecutive calls independent; the bit reserve's mask = dx != 0."""
    draw16("bits")
    n = 1 << 22
    desc = _EngineDescriptor(p, _engine(2028))
    x = cp.ones(n, dtype=dtype)
    ra, rb = B.dropout_forward(None, desc, x)[1], B.dropout_forward(None, desc, x)[1]
    a, b = _host(cp, ra), _host(cp, rb)

    def within(frac, m, q):
        return abs(frac - q) <= 6 * math.sqrt(q * (1 - q) / m)
    q = 1 - DP.threshold16(p) / 65536
    assert abs(q - (1 - p)) < 2 ** -16
    assert within(a.mean(), n, 1 - p) and within(b.mean(), n, 1 - p) and within(a.mean(), n, q)
    for k in (8, 16):
        for lane in range(k):
            assert within(a[lane::k].mean(), n // k, 1 - p), (k, lane)
    same = (1 - p) ** 2 + p ** 2
    assert within((a[0::2] == a[1::2]).mean(), n // 2, same)          # low and high half of one word
    assert within((a[0::8] == a[7::8]).mean(), n // 8, same)          # first and last half-word of a block
    assert within((a == b).mean(), n, same)
    dx = _host(cp, B.dropout_backward(None, desc, x, ra)).astype(np.float32)
    np.testing.assert_array_equal(dx != 0, a)


# ---- UNROLL_FIT (the small float32 forward's launch; on by default after H200 run 5) --------------------------------

@pytest.mark.parametrize("n, itemsize, old, fit", [
    (128 * 16 * 32 * 32, 4, 1, 2),          # the small-CNN row: 2048 blocks (1.94 waves) -> 1024 (one)
    (128 * 64 * 56 * 56, 4, 4, 4),          # a call of many waves: unchanged
    (5_000_011, 4, 4, 4), (1_000_003, 4, 1, 1), (32768, 2, 1, 1), (2 ** 20 - 1, 2, 1, 1),
    (1056 * 256 * 4 * 4 * 2, 4, 4, 4),      # exactly two waves at UNROLL 4
    (1000 * 256 * 4 * 2, 4, 1, 2),          # 1000 blocks at UNROLL 2: one wave, not 2000 blocks
    (1056 * 256 * 4 * 2, 4, 2, 2),          # exactly a wave at UNROLL 2: both rules stop there
    (1056 * 256 * 4 * 2 + 4, 4, 2, 4),      # one block over: 529 blocks of 4 groups, not 1057 of 2
    (1056 * 256 * 8 * 3, 2, 2, 4),          # 16-bit groups of 8 (a dropout_fwd plan only under PIPE_FWD "0")
])
def test_unroll_fit_rule(n, itemsize, old, fit, monkeypatch):
    """UNROLL_FIT halves the forward's UNROLL only while the halved grid still fits one wave (1056 blocks: an H200's
    132 SMs x 8); the default rule halves while the grid is under one wave."""
    monkeypatch.setattr(DP, "_wave", lambda dev: 132 * 8)
    monkeypatch.setattr(DP, "UNROLL_FIT", False)
    assert DP.forward_unroll(n, itemsize, 0) == old
    monkeypatch.setattr(DP, "UNROLL_FIT", True)
    assert DP.forward_unroll(n, itemsize, 0) == fit
    v = 8 if itemsize == 2 else 4
    blocks = -(-(-(-n // v)) // (256 * fit))
    assert blocks <= 1056 or fit == 64 // (v * itemsize)          # one wave, or already the full unroll


@pytest.mark.cuda
@pytest.mark.parametrize("reserve", DP.RESERVES)
def test_unroll_fit_exact(cp, reserve, monkeypatch):
    """UNROLL_FIT's plans (the record's regenerating backward takes the same rule) are exact against the reference
    for float32 and bfloat16 (dropout_fwd: PIPE_FWD "0") at sizes around one wave of this device."""
    monkeypatch.setattr(DP, "UNROLL_FIT", True)
    monkeypatch.setattr(DP, "RESERVE", reserve)
    monkeypatch.setattr(DP, "PIPE_FWD", "0")
    DP.clear_plans()
    try:
        wave = DP._wave(0)
        rng = np.random.default_rng(4)
        eng = _engine(12)
        desc = _EngineDescriptor(0.5, eng)
        key = eng._device_key()
        changed = 0
        for dtype in (np.dtype(np.float32), BF16):
            v = 8 if dtype.itemsize == 2 else 4
            for n in (128 * 16 * 32 * 32, wave * 256 * v * 2 - 5, wave * 256 * v + 3):
                monkeypatch.setattr(DP, "UNROLL_FIT", False)
                old = DP.forward_unroll(n, dtype.itemsize, 0)
                monkeypatch.setattr(DP, "UNROLL_FIT", True)
                changed += DP.forward_unroll(n, dtype.itemsize, 0) != old
                x_h, dy_h = _draw(cp, dtype, (n,), rng), _draw(cp, dtype, (n,), rng)
                c0 = eng.device_counter()
                y, res = B.dropout_forward(None, desc, cp.asarray(x_h))
                want = reference_keep(key, c0, n, 0.5, DP.uses_draw16(dtype, 0.5))
                np.testing.assert_array_equal(_host(cp, res), want, err_msg=str((dtype, n)))
                np.testing.assert_array_equal(_host(cp, y).view(np.uint8),
                                              reference_apply(x_h, want, 2.0).view(np.uint8))
                dx = B.dropout_backward(None, desc, cp.asarray(dy_h), res)
                np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                              reference_apply(dy_h, want, 2.0).view(np.uint8))
        assert changed >= 2                      # the rule changed some of these plans on this device
    finally:
        DP.clear_plans()
