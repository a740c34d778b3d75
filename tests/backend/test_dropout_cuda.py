"""The GPU dropout kernels (backend/cuda/dropout_philox.py) against a NumPy Philox4x32-10 reference.

The reference decides element i of a call exactly as the kernel's docstring promises: Philox4x32-10 block counter = c0 +
i // 4 under the engine's key, word i % 4 = r, kept iff (r >> 8) * 2^-24 >= float32(p); the state's counter then moves
by ceil(n / 4). ``draw16``: session 14's 16-bit stream (half-word i % 8 of block c0 + i // 8; DP.DRAW16,
tests/backend/test_dropout16_draw.py) -- the GPU tests here take it where DP.uses_draw16 says. On the CPU: the reference
against Random123's known-answer vectors, the threshold against the float comparison over every 24-bit draw, the kernels
compile for sm_90 without spills, and the Python path (one launch per call, its grid and packed arguments, the aligned /
element-load choice) under the fake CuPy of tools/record_launches.py. On a GPU (cuda-marked): exact masks and outputs
for float32/float64/float16/bfloat16 over ragged sizes, unaligned and non-contiguous views, p = 0 and p = 1, the
backward, keep-rate statistics, seeds, graph capture and the nn Function.
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
from minidnn.backend import rng as _rng
from minidnn.backend.cuda import dropout_philox as DP
from tests import _nvcc
from tests._nvcc import pick

ROOT = pathlib.Path(__file__).resolve().parents[2]
BF16 = np.dtype(ml_dtypes.bfloat16)
_M32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counters, key):
    """Philox4x32-10 of 4-word counters (m, 4) under the 2-word key: (m, 4) uint32."""
    c = [np.asarray(counters[:, i], np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & _M32, (k1 + np.uint64(0xBB67AE85)) & _M32
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _M32]
    return np.stack(c, -1).astype(np.uint32)


def reference_keep(key, counter, n, p, draw16=False):
    """The keep mask of a call of n elements starting at ``counter`` (flat, bool).  ``draw16``: the 16-bit stream
    (session 14, DP.DRAW16): element i is half-word i % 8 of block counter + i // 8 (half-word 2w the low 16 bits of
    word w), kept iff h * 2^-16 >= float32(p) (a float64 comparison: exact)."""
    blocks = (n + 7) // 8 if draw16 else (n + 3) // 4
    ctr = np.arange(blocks, dtype=np.uint64) + np.uint64(counter)
    words = np.zeros((blocks, 4), np.uint64)
    words[:, 0], words[:, 1] = ctr & _M32, ctr >> np.uint64(32)
    r = philox4x32_10(words, (int(key) & 0xFFFFFFFF, int(key) >> 32)).reshape(-1)
    if draw16:
        halves = np.stack([r & np.uint32(0xFFFF), r >> np.uint32(16)], -1).reshape(-1)[:n]
        return halves.astype(np.float64) * 2.0 ** -16 >= float(np.float32(p))
    u = (r[:n] >> 8).astype(np.float32) * np.float32(2.0 ** -24)
    return u >= np.float32(p)


def reference_apply(x, keep, scale):
    """x * (keep ? scale : 0) as the kernel computes it: in float32 (float64 for float64) with scale rounded there,
    then rounded to x's dtype."""
    acc = np.float64 if x.dtype == np.float64 else np.float32
    return (x.astype(acc) * np.where(keep, acc(scale), acc(0))).astype(x.dtype)


# ---- CPU ---------------------------------------------------------------------------------------------------------

def test_reference_philox_matches_known_answers():
    """Random123's known-answer vectors for Philox4x32-10."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in cases:
        assert philox4x32_10(np.array([ctr], np.uint64), key)[0].tolist() == list(want)


@pytest.mark.parametrize("p", [0.0, 1e-9, 0.1, 0.25, 1 / 3, 0.5, 0.7, 0.9, 1 - 1e-9, 1 - 2 ** -26, 1.0])
def test_threshold_is_the_float_comparison(p):
    """(r >> 8) >= threshold(p)  <=>  (r >> 8) * 2^-24 >= float32(p), over every 24-bit value."""
    r24 = np.arange(1 << 24, dtype=np.uint32)
    by_float = r24.astype(np.float32) * np.float32(2.0 ** -24) >= np.float32(p)
    np.testing.assert_array_equal(r24 >= DP.threshold(p), by_float)


_DTYPES = pick(["float32", "float64", "float16", "bfloat16"], 1, always=["bfloat16"])
_BUILDS = pick([(1, 0, 0, 16), (2, 0, 1, 8), (4, 0, 2, 16), (1, 1, 1, 16), (2, 1, 0, 4), (4, 0, 1, 4)], 3)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_kernels_compile_without_spills():
    """Each dtype x (unroll, wide, hint, tile) build (a spread: tests/_nvcc.py): its four kernels without a spill or a
    warning, and where a hint is asked for, the streaming hints in the tile backward's vector loads and stores.  All
    builds in one nvcc run, the hinted ones' PTX in a second (tests/_nvcc.build: each unit's lines and PTX are those
    of its own build)."""
    cases, units = [], []
    for dtype in _DTYPES:
        dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
        for unroll, wide, hint, tile in _BUILDS:
            tile = max(tile, 16 // dt.itemsize)          # (backward_tile never goes below one 16-byte vector of dy)
            opts = DP._options(dt, unroll, wide, hint, tile)
            cases.append((dtype, unroll, wide, hint, tile))
            units.append((DP.SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
    for case, r in zip(cases, _nvcc.build(units)):
        out = r.stderr
        assert r.returncode == 0 and "warning" not in out, (case, out[-2000:])
        spills = [line for line in out.splitlines() if "spill stores" in line]
        assert len(spills) == 4 and all(" 0 bytes spill stores" in line for line in spills), (case, out)  # 4 kernels
    hinted = [i for i, c in enumerate(cases) if c[3]]
    for i, r in zip(hinted, _nvcc.build([units[i] for i in hinted], ptx=True)):
        hint = cases[i][3]                                # the streaming hints reach the vector loads and stores
        tile_ptx = r.ptx["dropout_bwd_tile"]
        assert "st.global.cs.v4" in tile_ptx and ("ld.global.cs.v4" in tile_ptx) == (hint == 1), cases[i]


_FAKE_SCRIPT = textwrap.dedent("""
    import json, struct, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import ml_dtypes
    import numpy as np
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    from minidnn.backend.cuda import dropout_philox as DP
    DP.RESERVE = "mask"     # the stored-mask path (the other reserves: tests/backend/test_dropout_record.py)
    out = []
    st, tk = fakecp.zeros((2,), np.uint64), fakecp.zeros((1,), np.uint32)
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        for n, offset in ((1, 0), (37, 0), (4096, 0), (1_000_003, 0), (4096, 1), (5_000_011, 0)):
            base = fakecp.asarray(np.zeros(n + offset, dt))
            x = base[offset:] if offset else base
            for p in (0.0, 0.3, 1.0):
                before = len(recs)
                y, keep = DP.dropout_forward(x, p, 0.0 if p == 1 else 1 / (1 - p), st, tk)
                fwd = recs[before:]
                before = len(recs)
                dx = DP.dropout_backward(x, keep, 2.0)
                bwd = recs[before:]
                out.append(dict(dtype=np.dtype(dt).name, n=n, offset=offset, p=p, fwd=fwd, bwd=bwd,
                                unroll=DP.forward_unroll(n, np.dtype(dt).itemsize, 0),
                                tile=DP.backward_tile(n, np.dtype(dt).itemsize, 0),
                                y=[list(y.shape), str(y.dtype)], keep=[list(keep.shape), str(keep.dtype)],
                                dx=[list(dx.shape), str(dx.dtype)]))
    # the backend's remembered calls (second and third call of a signature) launch what the first did
    import minidnn.backend as B
    desc = B.DropoutDescriptor(0.3, seed=1)
    x = fakecp.asarray(np.ones((4, 1001), np.float32))
    seen = []
    for rep in range(3):
        before = len(recs)
        y, keep = B.dropout_forward(None, desc, x)
        dx = B.dropout_backward(None, desc, x, keep)
        seen.append(recs[before:])
    errors = []     # a remembered signature does not let a bad call through: checked, and nothing launched
    before = len(recs)
    for bad in (keep[:2], keep.astype(np.float32), fakecp.asarray(np.ones((4, 1001), np.bool_))[:, ::-1]):
        try:
            B.dropout_backward(None, desc, x, bad)
        except B.BadParamError as e:
            errors.append(str(e)[:40])
    print(json.dumps(dict(rows=out, seen=seen, table=len(DP.seen), errors=errors, after=len(recs) - before)))
""")


def test_python_path_under_the_fake_cupy():
    """One launch per call, the kernel options, grid and packed arguments; unaligned views take the element loads."""
    import struct
    r = subprocess.run([sys.executable, "-c", _FAKE_SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                       timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    rows = got["rows"]
    assert len(rows) == 4 * 6 * 3
    assert got["seen"][0] == got["seen"][1] == got["seen"][2] and len(got["seen"][0]) == 2 and got["table"] == 3
    # two bad masks raise before any work; a reversed (non-contiguous) good one is copied (by CuPy), then one launch
    assert got["errors"] == ["dropout_backward: reserve must be the bo"] * 2 and got["after"] == 1, got
    for row in rows:
        n, p, wide = row["n"], row["p"], 0
        itemsize = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[row["dtype"]]
        acc = "d" if itemsize == 8 else "f"
        assert row["y"] == [[n], row["dtype"]] and row["keep"] == [[n], "bool"] and row["dx"] == [[n], row["dtype"]]
        assert len(row["fwd"]) == 1 and len(row["bwd"]) == 1, row
        groups = -(-n // (8 if itemsize == 2 else 4))
        unroll, tile = row["unroll"], row["tile"]
        # the rule: 64 bytes of x a thread, halved while under one wave (132 x 8 blocks; 5,000,011 float32: 1221
        # blocks of 4 groups of 4; float16: 611 blocks of 4 groups of 8 -> 2 groups, unless UNROLL_FIT: 1222 blocks
        # would not fit one wave); the backward's tile: one 16-byte vector of dy a thread (TILE_BWD 4, raised to
        # that floor), whatever the size
        if n == 5_000_011:
            half16 = 4 if DP.UNROLL_FIT else 2
            assert (unroll, tile) == ({2: half16, 4: 4, 8: 2}[itemsize], max(4, 16 // itemsize)), row
        else:
            assert (unroll, tile) == (1, max(4, 16 // itemsize)), row
        name, dims, _ = row["fwd"][0]
        if DP.uses_pipe(np.float16 if itemsize == 2 else np.float32, n):    # session 9: 16-bit data of PIPE_MIN_N
            punroll = DP.PIPE_UNROLL     # elements or more through dropout_fwd_pipe, 4 groups a thread and iteration
            #                              on (at most) the resident blocks
            assert name.startswith("dropout_fwd_pipe(") and f"-DPUNROLL={punroll}" in name, name
            assert f"-DPMINB={DP.PIPE_MINB}" in name and f"-DWIDE={wide}" in name
            assert dims == [max(1, min(-(-groups // (256 * punroll)), 132 * DP.PIPE_MINB)), 1, 1, 256, 1, 1, 0]
        else:
            assert name.startswith("dropout_fwd(") and f"-DUNROLL={unroll}" in name and f"-DWIDE={wide}" in name
            assert dims == [-(-groups // (256 * unroll)), 1, 1, 256, 1, 1, 0]
        assert f"-DHINT={DP.HINT_FWD}" in name
        name, dims, _ = row["bwd"][0]
        assert name.startswith("dropout_bwd_tile") and f"-DTILE={tile}" in name and f"-DHINT={DP.HINT_BWD}" in name
        assert dims == [-(-n // (256 * tile)), 1, 1, 256, 1, 1, 0]
        fmt = "@5QqI" + acc + "i"
        vals = struct.unpack(fmt, bytes.fromhex(row["fwd"][0][2])[:struct.calcsize(fmt)])
        scale = 0.0 if p == 1 else 1 / (1 - p)
        d16 = DP.uses_draw16(np.float16 if itemsize == 2 else np.float32, p)    # DRAW16 (default off): 16-bit data
        assert vals[:5] == (0,) * 5 and vals[5] == n and vals[6] == (DP.threshold16 if d16 else DP.threshold)(p)
        assert ("-DDRAW16=1" in row["fwd"][0][0]) == d16 and "-DDRAW16" not in name
        assert vals[7] == (scale if acc == "d" else float(np.float32(scale)))
        aligned = row["offset"] * itemsize % 16 == 0
        assert vals[8] == int(aligned), row
        fmt = "@3Qq" + acc + "i"
        vals = struct.unpack(fmt, bytes.fromhex(row["bwd"][0][2])[:struct.calcsize(fmt)])
        assert vals[3] == n and vals[4] == 2.0 and vals[5] == int(aligned)


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


class _EngineDescriptor(B.DropoutDescriptor):
    """A descriptor drawing from one given engine (so the test knows its key and counter)."""
    __slots__ = ("engine",)

    def __init__(self, p, engine):
        super().__init__(p)
        self.engine = engine

    def generator(self, dev_spec):
        return self.engine


def _engine(seed):
    return _rng.CudaCounterEngine(B.device("cuda:0"), seed)


def _host(cp, a):
    """A device array on the host; a PhiloxReserve or BitMaskReserve as the bool mask it stands for."""
    return cp.asnumpy(a.mask() if isinstance(a, DP.OPAQUE) else a)


def _draw(cp, dtype, shape, rng):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _launches():
    from minidnn.backend.cuda import launch
    return launch.launch_count()


DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]
SIZES = [1, 3, 4, 5, 7, 8, 9, 15, 17, 1000, 4099, 65537, 1_000_003, (128, 10), (3, 5, 7), (2, 16, 9, 9)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("reserve", DP.RESERVES)
def test_forward_and_backward_exact(cp, dtype, shape, p, reserve, monkeypatch):
    monkeypatch.setattr(DP, "RESERVE", reserve)
    rng = np.random.default_rng(7)
    shape = shape if isinstance(shape, tuple) else (shape,)
    x_h = _draw(cp, dtype, shape, rng)
    dy_h = _draw(cp, dtype, shape, rng)
    eng = _engine(1234)
    eng.set_device_counter(2 ** 32 - 3)          # the counter's high word moves within the call
    desc = _EngineDescriptor(p, eng)
    key = eng._device_key()
    c0 = eng.device_counter()
    x = cp.asarray(x_h)
    before = _launches()
    y, keep = B.dropout_forward(None, desc, x)
    assert _launches() - before == 1
    n = x_h.size
    assert eng.device_counter() == c0 + (n + 3) // 4
    want = reference_keep(key, c0, n, p, DP.uses_draw16(dtype, p)).reshape(shape)
    np.testing.assert_array_equal(_host(cp, keep), want)
    assert type(keep) is {"record": DP.PhiloxReserve, "bits": DP.BitMaskReserve}.get(reserve, cp.ndarray)
    assert y.dtype == dtype and y.shape == shape
    np.testing.assert_array_equal(_host(cp, y).view(np.uint8), reference_apply(x_h, want, desc.scale).view(np.uint8))
    before = _launches()
    dx = B.dropout_backward(None, desc, cp.asarray(dy_h), keep)
    assert _launches() - before == 1
    np.testing.assert_array_equal(_host(cp, dx).view(np.uint8), reference_apply(dy_h, want, desc.scale).view(np.uint8))


# every launch choice tools/dropout_bench.py sweeps: (UNROLL_FWD, BPS_FWD, HINT_FWD, TILE_BWD, UNROLL_BWD, BPS_BWD,
# HINT_BWD); the one-wave rule and HINT_BY_SIZE switched off (every call takes the setting as given, small ones too)
SETTINGS = [(4, 0, 0, 16, 1, 0, 1), (2, 0, 1, 16, 1, 0, 0), (1, 0, 2, 16, 1, 0, 2), (1, 8, 0, 8, 1, 0, 1),
            (2, 8, 0, 4, 1, 0, 1), (4, 0, 1, 0, 1, 0, 1), (1, 8, 0, 0, 2, 8, 0)]


# the byte mask under every setting; the record and bit-mask paths (whose backward takes the forward's UNROLL, BPS_BWD
# and HINT_BWD, not the tile) under the settings that vary those, float32 and bfloat16 (NVRTC compiles: device time)
_SETTING_CASES = [(d, s, r) for d in DTYPES for s in SETTINGS
                  if d.itemsize == 4 or d == BF16 or s in (SETTINGS[0], SETTINGS[5])
                  for r in DP.RESERVES
                  if r == "mask" or (d.itemsize == 4 or d == BF16) and s in (SETTINGS[0], SETTINGS[1], SETTINGS[3])]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, setting, reserve", _SETTING_CASES,
                         ids=lambda v: v.name if isinstance(v, np.dtype) else v if isinstance(v, str) else
                         "f{}-{}-{}_b{}-{}-{}-{}".format(*v))
def test_every_launch_setting_exact(cp, dtype, setting, reserve, monkeypatch):
    """Each setting's kernels against the reference over ragged sizes (tails of every tile and group) and an
    unaligned view, forward and backward (the record path's backward takes the forward's UNROLL, BPS_BWD and
    HINT_BWD)."""
    monkeypatch.setattr(DP, "RESERVE", reserve)
    names = ("UNROLL_FWD", "BPS_FWD", "HINT_FWD", "TILE_BWD", "UNROLL_BWD", "BPS_BWD", "HINT_BWD")
    for name, v in zip(names, setting):
        monkeypatch.setattr(DP, name, v)
    monkeypatch.setattr(DP, "_wave", lambda dev: 0)
    monkeypatch.setattr(DP, "HINT_BY_SIZE", False)      # the hints as given at every size (these calls fit L2)
    DP.clear_plans()
    try:
        rng = np.random.default_rng(11)
        eng = _engine(3)
        desc = _EngineDescriptor(0.4, eng)
        key = eng._device_key()
        for n, offset in ((1, 0), (13, 0), (31, 0), (4096 + 17, 0), (65536 * 3 + 5, 0), (1_000_003, 0), (777, 1),
                          (5000, 3)):
            base_h = _draw(cp, dtype, (n + offset,), rng)
            x_h = base_h[offset:]
            dy_h = _draw(cp, dtype, (n,), rng)
            base = cp.asarray(base_h)
            c0 = eng.device_counter()
            y, keep = B.dropout_forward(None, desc, base[offset:])
            assert eng.device_counter() == c0 + (n + 3) // 4
            want = reference_keep(key, c0, n, 0.4, DP.uses_draw16(dtype, 0.4))
            np.testing.assert_array_equal(_host(cp, keep), want, err_msg=str((n, offset)))
            np.testing.assert_array_equal(_host(cp, y).view(np.uint8),
                                          reference_apply(x_h, want, desc.scale).view(np.uint8))
            dx = B.dropout_backward(None, desc, cp.asarray(dy_h), keep)
            np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                          reference_apply(dy_h, want, desc.scale).view(np.uint8))
            dx = B.dropout_backward(None, desc, base[offset:], keep)
            np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                          reference_apply(x_h, want, desc.scale).view(np.uint8))
    finally:
        DP.clear_plans()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("pipe", ["1", "0", "grid3"])
def test_pipe_forward_exact(cp, dtype, pipe, monkeypatch):
    """Session 9's dropout_fwd_pipe (PIPE_FWD "1": every dtype; "0": dropout_fwd; "grid3": the pipe on 3 blocks, so
    every thread walks many iterations with the next loads in flight) against the reference: masks, outputs and
    the counter's advance exact over ragged sizes and an unaligned view."""
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
            x_h = base_h[offset:]
            c0 = eng.device_counter()
            n0 = _launches()
            y, keep = B.dropout_forward(None, desc, cp.asarray(base_h)[offset:])
            assert _launches() - n0 == 1
            assert eng.device_counter() == c0 + (n + 3) // 4
            want = reference_keep(key, c0, n, 0.3, DP.uses_draw16(dtype, 0.3))
            np.testing.assert_array_equal(_host(cp, keep), want, err_msg=str((n, offset, pipe)))
            np.testing.assert_array_equal(_host(cp, y).view(np.uint8),
                                          reference_apply(x_h, want, desc.scale).view(np.uint8))
    finally:
        DP.clear_plans()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("offset", [1, 2, 3, 5])
def test_unaligned_and_non_contiguous_views(cp, dtype, offset):
    """A view starting off a 16-byte boundary takes the element loads; a transposed one is copied; both exact."""
    rng = np.random.default_rng(offset)
    n = 1003
    base_h = _draw(cp, dtype, (n + offset,), rng)
    eng = _engine(5)
    desc = _EngineDescriptor(0.3, eng)
    key = eng._device_key()
    base = cp.asarray(base_h)
    c0 = eng.device_counter()
    y, keep = B.dropout_forward(None, desc, base[offset:])
    want = reference_keep(key, c0, n, 0.3, DP.uses_draw16(dtype, 0.3))
    np.testing.assert_array_equal(_host(cp, keep), want)
    np.testing.assert_array_equal(_host(cp, y).view(np.uint8),
                                  reference_apply(base_h[offset:], want, desc.scale).view(np.uint8))
    dx = B.dropout_backward(None, desc, base[offset:], keep)           # unaligned dy
    np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                  reference_apply(base_h[offset:], want, desc.scale).view(np.uint8))
    mask_base = cp.zeros(n + offset, dtype=np.bool_)
    mask_base[offset:] = keep.mask() if isinstance(keep, DP.OPAQUE) else keep
    dx = B.dropout_backward(None, desc, base[:n], mask_base[offset:])   # unaligned mask
    np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                  reference_apply(base_h[:n], want, desc.scale).view(np.uint8))
    x2_h = _draw(cp, dtype, (6, 35), rng)
    c0 = eng.device_counter()
    y2, keep2 = B.dropout_forward(None, desc, cp.asarray(x2_h).T)     # non-contiguous: the C-order copy's mask
    want2 = reference_keep(key, c0, x2_h.size, 0.3, DP.uses_draw16(dtype, 0.3)).reshape(35, 6)
    np.testing.assert_array_equal(_host(cp, keep2), want2)
    np.testing.assert_array_equal(_host(cp, y2).view(np.uint8),
                                  reference_apply(np.ascontiguousarray(x2_h.T), want2, desc.scale).view(np.uint8))
    dx2 = B.dropout_backward(None, desc, cp.asarray(x2_h).T, keep2)
    np.testing.assert_array_equal(_host(cp, dx2).view(np.uint8),
                                  reference_apply(np.ascontiguousarray(x2_h.T), want2, desc.scale).view(np.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_p_zero_and_one_and_non_finite(cp, dtype):
    """p = 0 keeps everything (y == x bit for bit), p = 1 nothing (y == 0); both one launch that advances the
    stream.  A dropped inf/NaN gives NaN (x * 0, as the reference and PyTorch)."""
    x_h = _draw(cp, dtype, (4099,), np.random.default_rng(3))
    eng = _engine(9)
    for p in (0.0, 1.0):
        c0 = eng.device_counter()
        before = _launches()
        y, keep = B.dropout_forward(None, _EngineDescriptor(p, eng), cp.asarray(x_h))
        assert _launches() - before == 1 and eng.device_counter() == c0 + (4099 + 3) // 4
        assert bool(_host(cp, keep).all()) if p == 0 else not _host(cp, keep).any()
        if p == 0:
            np.testing.assert_array_equal(_host(cp, y).view(np.uint8), x_h.view(np.uint8))
        else:
            assert not _host(cp, y).astype(np.float64).any()
    special = np.array([np.inf, -np.inf, np.nan, 1.0] * 64, dtype)
    y, keep = B.dropout_forward(None, _EngineDescriptor(0.5, eng), cp.asarray(special))
    yh, kh = _host(cp, y).astype(np.float64), _host(cp, keep)
    assert np.isnan(yh[~kh][special[~kh].astype(np.float64) != 1.0]).all()
    np.testing.assert_array_equal(yh[kh], special[kh].astype(np.float64) * 2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_rate_within_binomial_bounds(cp, dtype, p):
    """Overall and per Philox word (i % 4) and per group lane (i % 8): the keep fraction within 6 sigma of 1 - p;
    masks of consecutive calls agree on (1-p)^2 + p^2 of the elements (independence), again within 6 sigma."""
    n = 1 << 22
    eng = _engine(2026)
    desc = _EngineDescriptor(p, eng)
    x = cp.ones(n, dtype=dtype)
    a = _host(cp, B.dropout_forward(None, desc, x)[1])
    b = _host(cp, B.dropout_forward(None, desc, x)[1])

    def within(frac, m, q):
        return abs(frac - q) <= 6 * math.sqrt(q * (1 - q) / m)
    assert within(a.mean(), n, 1 - p) and within(b.mean(), n, 1 - p)
    for k in (4, 8):
        for lane in range(k):
            assert within(a[lane::k].mean(), n // k, 1 - p), (k, lane)
    same = (1 - p) ** 2 + p ** 2
    assert within((a == b).mean(), n, same)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16), BF16], ids=lambda d: d.name)
def test_same_seed_same_masks_and_plain_descriptors_use_the_kernel(cp, dtype):
    x = cp.ones((37, 91), dtype=dtype)
    a, b = B.DropoutDescriptor(0.4, seed=77), B.DropoutDescriptor(0.4, seed=77)
    before = _launches()
    ma = [B.dropout_forward(None, a, x)[1] for _ in range(3)]
    assert _launches() - before == 3                 # the GPU generator of a plain descriptor feeds the kernel
    ma = [_host(cp, m) for m in ma]
    mb = [_host(cp, B.dropout_forward(None, b, x)[1]) for _ in range(3)]
    for u, v in zip(ma, mb):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(ma[0], ma[1])
    eng = _engine(77)                                 # the plain descriptor's stream is the engine's of its seed
    d16 = DP.uses_draw16(dtype, 0.4)
    np.testing.assert_array_equal(ma[0], reference_keep(eng._device_key(), 0, x.size, 0.4, d16).reshape(x.shape))
    np.testing.assert_array_equal(ma[1], reference_keep(eng._device_key(), (x.size + 3) // 4, x.size, 0.4, d16)
                                  .reshape(x.shape))
    a.reset()
    np.testing.assert_array_equal(_host(cp, B.dropout_forward(None, a, x)[1]), ma[0])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
def test_captured_forward_replays_draw_fresh_masks(cp, dtype):
    """Captured once, replayed twice: the replays' masks are those of the next two counters."""
    n = 10_001
    eng = _engine(31)
    desc = _EngineDescriptor(0.5, eng)
    x = cp.ones(n, dtype=dtype)
    B.dropout_forward(None, desc, x)                  # compile, and the engine's device state exists
    key, c0 = eng._device_key(), eng.device_counter()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        y, keep = B.dropout_forward(None, desc, x)
        dx = B.dropout_backward(None, desc, x, keep)
        g = s.end_capture()
    got = []
    for _ in range(2):
        g.launch(s)
        s.synchronize()
        got.append((_host(cp, keep).copy(), _host(cp, dx).astype(np.float32)))
    step = (n + 3) // 4
    for i, (k, d) in enumerate(got):
        want = reference_keep(key, c0 + i * step, n, 0.5, DP.uses_draw16(dtype, 0.5))
        np.testing.assert_array_equal(k, want)
        np.testing.assert_array_equal(d, np.where(want, 2.0, 0.0).astype(np.float32))
    assert eng.device_counter() == c0 + 2 * step


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_nn_dropout_forward_backward_on_the_kernels(cp, dtype, monkeypatch):
    # the nn path reaches the kernels: one launch of our own each way (the remembered signatures call the settled
    # runners directly, so the launches are counted, not the module functions)
    import minidnn as mdn
    import minidnn.nn.functional as F
    from minidnn.backend.cuda import launch as L
    dt = mdn.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = mdn.tensor(np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32).astype(dt),
                   device="cuda", requires_grad=True)
    g = mdn.ones((64, 33), dtype=dt, device="cuda")
    for _ in range(2):      # the first call validates and remembers; the second takes the remembered path
        x.grad = None
        n0 = L.launch_count()
        y = F.dropout(x, 0.25)
        n1 = L.launch_count()
        y.backward(g)
        assert (n1 - n0, L.launch_count() - n1) == (1, 1)
    yh = y.detach().cpu().numpy().astype(np.float32)
    kept = yh != 0
    xh = x.detach().cpu().numpy()
    np.testing.assert_array_equal(yh, reference_apply(xh, kept, 1 / 0.75).astype(np.float32))
    np.testing.assert_array_equal(x.grad.cpu().numpy().astype(np.float32),
                                  np.where(kept, np.float32(1 / 0.75), 0).astype(dt).astype(np.float32))
