"""GPU dropout without a byte mask (session 13, backend/cuda/dropout_philox.py's RESERVE): "bits" (the default since
the H200's run 3) -- a 1-bit mask in a BitMaskReserve (MASK = 2) -- and "record" -- the forward records (key,
counter) in a 16-byte PhiloxReserve and the backward draws the same numbers again (MASK = 0 kernels).

On the CPU: an emulation of the kernels' walks (threads, grid, UNROLL / the pipe's PUNROLL with its loads one
iteration ahead, whole groups and tails) under the host's plans, against the Philox reference of
test_dropout_cuda.py, for ragged sizes, and of the bit packing (shuffled words = the plain bit layout, each word
written once, read back by the bits backward); the reserve types' errors; the launches under the fake CuPy (the
forward allocates and writes no byte mask, the backward reads none: the record's or the bit words' address is the
one pointer they share); the switch set in one process; every MASK = 0 and MASK = 2 configuration compiles for
sm_90 without spills and with no byte loads or stores.  On a GPU (cuda-marked): both paths bitwise the mask path (y
and dx) over shapes with tails, every dtype, unaligned and non-contiguous views, p from 0 to 1; CUDA-graph replays;
nn.Dropout with a double backward; the channel dropouts; the keep rate.
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
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]
_M32 = np.uint64(0xFFFFFFFF)


# ---- CPU: the kernels' walks emulated ------------------------------------------------------------------------------

def _draw_groups(h, n, V, key, base, thresh, dec, hits):
    """draw_group for the groups ``h`` (array): PH = V / 4 Philox blocks base + h * PH + q each, word j deciding
    element h * V + 4q + j where that is < n.  Writes the decisions into ``dec``, counts writes in ``hits``."""
    ph = V // 4
    for q in range(ph):
        ctr = np.uint64(base) + (h * ph + q).astype(np.uint64)
        words = np.zeros((h.size, 4), np.uint64)
        words[:, 0], words[:, 1] = ctr & _M32, ctr >> np.uint64(32)
        r = philox4x32_10(words, (key & 0xFFFFFFFF, key >> 32))
        for j in range(4):
            e = h * V + 4 * q + j
            ok = e < n
            dec[e[ok]] = (r[ok, j] >> 8) >= thresh
            hits[e[ok]] += 1


def _emulate(n, V, grid, unroll, pipe, key, base, thresh):
    """The keep decisions a launch of ``grid`` blocks of 256 threads makes over n elements: dropout_fwd's walk
    (h0 = thread, UNROLL groups h0 + u * stride an iteration) or dropout_fwd_pipe's (``pipe``: PUNROLL = unroll
    groups loaded one iteration ahead -- the group drawn must be the group loaded).  The regenerating backward runs
    the same code (walk / walk_pipe, MODE 1).  Returns (decisions, writes per element)."""
    dec, hits = np.zeros(n, np.bool_), np.zeros(n, np.int64)
    stride, groups = grid * 256, -(-n // V)
    h0 = np.arange(stride, dtype=np.int64)
    if not pipe:
        while (h0 < groups).any():
            for u in range(unroll):
                h = h0 + u * stride
                _draw_groups(h[h < groups], n, V, key, base, thresh, dec, hits)
            h0 = h0 + unroll * stride
        return dec, hits
    cur = [h0 + u * stride for u in range(unroll)]        # the group each thread's cur[u] holds the loads of
    while (h0 < groups).any():
        nxt = [h0 + (unroll + u) * stride for u in range(unroll)]
        for u in range(unroll):
            h = h0 + u * stride
            assert np.array_equal(cur[u], h)              # the draw's loads are its group's
            live = h < groups
            _draw_groups(h[live], n, V, key, base, thresh, dec, hits)
        cur = nxt
        h0 = h0 + unroll * stride
    return dec, hits


def _launch_of(kind, n, dtype, sms):
    """(grid, unroll, pipe) the host plans for ``kind`` ("fwd" the record forward, "regen" its backward)."""
    dtype = np.dtype(dtype)
    if DP.uses_pipe(dtype, n):
        return DP.pipe_grid(n, dtype.itemsize, sms), DP.pipe_unroll(dtype.itemsize, n >= 2 ** 31), True
    groups = -(-n // (8 if dtype.itemsize == 2 else 4))
    unroll = DP.forward_unroll(n, dtype.itemsize, 0)
    bps = DP.BPS_FWD if kind == "fwd" else DP.BPS_BWD
    need = max(1, -(-groups // (256 * unroll)))
    return (need if not bps else min(need, sms * bps)), unroll, False


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 9, 17, 1000, 4099, 65537, 300_001])
def test_regeneration_emulated_equals_the_forward_decisions(dtype, n, monkeypatch):
    """The backward's plan (grid, UNROLL / pipe) regenerates, from the record, every element's decision exactly
    once and equal to the forward's and to the reference -- ragged n (partial groups: 16-bit groups of 8, others of
    4), a counter whose high word moves inside the call, and small grids that make each thread loop."""
    monkeypatch.setattr(DP, "_wave", lambda dev: 132 * 8)
    key, base, p = 0x1234_5678_9ABC_DEF1, 2 ** 32 - 3, 0.3
    thresh = DP.threshold(p)
    want = reference_keep(key, base, n, p)
    v = 8 if dtype.itemsize == 2 else 4
    for sms in (132, 1):                                  # an H100's grid; one SM: the pipe's threads loop
        got = {}
        for kind in ("fwd", "regen"):
            grid, unroll, pipe = _launch_of(kind, n, dtype, sms)
            dec, hits = _emulate(n, v, grid, unroll, pipe, key, base, thresh)
            assert (hits == 1).all(), (kind, sms, grid, unroll, pipe)
            got[kind] = dec
        np.testing.assert_array_equal(got["fwd"], want)
        np.testing.assert_array_equal(got["regen"], want)
    # a different walk decides the same (the decision is a function of the element index only): V = 4 and 8,
    # one and many groups a thread, the element walk of an unaligned view takes the same groups
    for other_v, grid, unroll, pipe in ((4, 1, 1, False), (8, 2, 4, True), (4, 3, 2, True)):
        dec, hits = _emulate(n, other_v, grid, unroll, pipe, key, base, thresh)
        assert (hits == 1).all()
        np.testing.assert_array_equal(dec, want)


def test_emulation_catches_a_wrong_counter():
    """The emulation can fail: a walk one Philox block off (base + 1) decides differently."""
    key, n, p = 99, 4099, 0.5
    dec, _ = _emulate(n, 4, 2, 2, False, key, 1, DP.threshold(p))
    assert not np.array_equal(dec, reference_keep(key, 0, n, p))
    dec, _ = _emulate(n, 4, 2, 2, False, key, 0, DP.threshold(p))
    np.testing.assert_array_equal(dec, reference_keep(key, 0, n, p))


def _emulate_bits(n, V, grid, unroll, keep):
    """RESERVE "bits": the words pack_bits stores over dropout_fwd's walk (pipe or not: the same groups each step,
    MODE 2 running a warp while its first group is live) from the keep decisions ``keep`` (bool (n,)), and how often
    each word is written.  A lane's V bits shift to V * (lane % (32 / V)); 32 / V lanes OR together; the first of
    them (if its group is live) stores word h * V / 32."""
    words, writes = np.zeros(-(-n // 32), np.uint32), np.zeros(-(-n // 32), np.int64)
    stride, groups, per = grid * 256, -(-n // V), 32 // V
    padded = np.zeros(groups * V + 32 * V, np.uint32)
    padded[:n] = keep
    kb_of = (padded.reshape(-1, V) << np.arange(V, dtype=np.uint32)).sum(1).astype(np.uint32)   # group -> V bits
    h0 = np.arange(stride, dtype=np.int64)
    while ((h0 & ~31) < groups).any():
        for u in range(unroll):
            h = h0 + u * stride
            warps = h.reshape(-1, 32)
            warps = warps[(warps[:, 0] & ~31) < groups]             # live warps (all 32 lanes reach the shuffle)
            if not warps.size:
                continue
            lane = warps & 31
            kb = np.where(warps < groups, kb_of[np.minimum(warps, groups - 1)], 0).astype(np.uint32)
            w = (kb << (V * (lane % per)).astype(np.uint32)).reshape(warps.shape[0], 32 // per, per)
            word = np.bitwise_or.reduce(w, axis=2)
            first = warps.reshape(warps.shape[0], 32 // per, per)[:, :, 0]
            store = first < groups
            idx = (first[store] * V) >> 5
            words[idx] = word[store]
            np.add.at(writes, idx, 1)
        h0 = h0 + unroll * stride
    return words, writes


@pytest.mark.parametrize("V", [4, 8])
@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 100, 4099, 65537, 300_001])
@pytest.mark.parametrize("grid, unroll", [(1, 1), (2, 4), (1000, 1), (3, 2)])
def test_bit_mask_emulated_is_the_plain_bit_layout(V, n, grid, unroll):
    """pack_bits over any walk writes every word of the plain little-endian bit mask (element i: bit i % 32 of word
    i // 32) exactly once; dropout_bwd_bits' read of group h (word h * V / 32 shifted by h * V % 32) gives back
    each element's decision."""
    keep = reference_keep(7, 3, n, 0.5)
    words, writes = _emulate_bits(n, V, grid, unroll, keep)
    assert (writes == 1).all()
    want = np.packbits(np.concatenate([keep, np.zeros(-n % 32, np.bool_)]), bitorder="little").view("<u4")
    np.testing.assert_array_equal(words, want)
    h = np.arange(-(-n // V))
    kb = words[(h * V) >> 5] >> ((h * V) & 31).astype(np.uint32)
    back = ((kb[:, None] >> np.arange(V, dtype=np.uint32)) & 1).astype(np.bool_).reshape(-1)[:n]
    np.testing.assert_array_equal(back, keep)


# ---- CPU: the reserve type ---------------------------------------------------------------------------------------

def test_reserve_type_errors_on_the_cpu():
    """A PhiloxReserve of another shape or p than dy's call: BadParamError naming both; one with a NumPy dy: the
    kernels alone read it.  (The record array stands in as NumPy: the checks run before any work.)"""
    desc = B.DropoutDescriptor(0.5)
    r = DP.PhiloxReserve(np.zeros(2, np.uint64), (4, 5), 0.5, 0)
    assert r.shape == (4, 5) and r.size == 20 and r.threshold == DP.threshold(0.5) and r.nbytes == 16
    assert repr(r) == "PhiloxReserve(shape=(4, 5), p=0.5, device=cuda:0)"
    with pytest.raises(B.BadParamError, match=r"reserve PhiloxReserve\(shape=\(4, 5\), p=0.5, device=cuda:0\) does "
                                              r"not match dy of shape \(5, 4\) with p=0.5"):
        B.dropout_backward(None, desc, np.ones((5, 4)), r)
    with pytest.raises(B.BadParamError, match=r"p=0.5, device=cuda:0\) does not match dy of shape \(4, 5\) with "
                                              r"p=0.25"):
        B.dropout_backward(None, B.DropoutDescriptor(0.25), np.ones((4, 5)), r)
    with pytest.raises(B.BadParamError, match=r"is read by the GPU kernels only; dy is ndarray \(4, 5\)"):
        B.dropout_backward(None, desc, np.ones((4, 5)), r)
    assert B.PhiloxReserve is DP.PhiloxReserve and B.BitMaskReserve is DP.BitMaskReserve
    assert B.dropout_get_reserve_space_size(np.ones((4, 5))) == 20      # the CPU's reserve is its mask
    bits = DP.BitMaskReserve(np.zeros(1, np.uint32), (4, 5), 0.5, 0)
    assert bits.nbytes == 4 and bits.size == 20
    with pytest.raises(B.BadParamError, match=r"reserve BitMaskReserve\(shape=\(4, 5\), p=0.5, device=cuda:0\) "
                                              r"does not match dy of shape \(20,\) with p=0.5"):
        B.dropout_backward(None, desc, np.ones(20), bits)
    with pytest.raises(B.BadParamError, match=r"is read by the GPU kernels only; dy is ndarray \(4, 5\)"):
        B.dropout_backward(None, desc, np.ones((4, 5), np.float32), bits)


# ---- CPU: the launches under the fake CuPy -----------------------------------------------------------------------

_FAKE = textwrap.dedent("""
    import json, struct, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import ml_dtypes
    import numpy as np
    R.numpy_fallback(fakecp)                                  # cupy.ones for reserve.mask()
    recs = R.record_packed(L, [], other="cupy")
    allocs = []
    empty = fakecp.empty
    def logged(shape, dtype=np.float32):
        a = empty(shape, dtype)
        allocs.append([list(a.shape), str(a.dtype)])
        return a
    fakecp.empty = logged
    import minidnn.backend as B
    from minidnn.backend.cuda import dropout_philox as DP
    assert DP.RESERVE == "bits"        # the default (session 13 run 3)
    out = []
    st, tk = fakecp.zeros((2,), np.uint64), fakecp.zeros((1,), np.uint32)
    for kind in ("record", "bits"):
        DP.RESERVE = kind
        for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
            for n, offset in ((1, 0), (37, 0), (4096, 0), (1_100_003, 0), (4096, 1)):
                base = fakecp.asarray(np.zeros(n + offset, dt))
                x = base[offset:] if offset else base
                for p in (0.0, 0.3, 1.0):
                    scale = 0.0 if p == 1 else 1 / (1 - p)
                    a0, r0 = len(allocs), len(recs)
                    y, res = DP.dropout_forward(x, p, scale, st, tk)
                    fa, fwd = allocs[a0:], recs[r0:]
                    a0, r0 = len(allocs), len(recs)
                    dx = DP.dropout_backward(x, res, 2.0)
                    ba, bwd = allocs[a0:], recs[r0:]
                    rec = res.record if kind == "record" else res.bits
                    out.append(dict(dtype=np.dtype(dt).name, n=n, offset=offset, p=p, fwd=fwd, bwd=bwd, fa=fa,
                                    ba=ba, kind=type(res).__name__, shape=list(res.shape), rp=res.p, nbytes=res.nbytes,
                                    rec=[rec.data.ptr, list(rec.shape), str(rec.dtype)],
                                    ptrs=[x.data.ptr, y.data.ptr, st.data.ptr, tk.data.ptr, dx.data.ptr]))
    DP.RESERVE = "bits"
    # the backend: forward / backward through the seen tables, the switch flipped in one process, a mask passed in
    desc = B.DropoutDescriptor(0.3, seed=1)
    x = fakecp.asarray(np.ones((4, 1001), np.float32))
    flips = []
    made = dict()
    for kind in ("record", "record", "mask", "mask", "bits", "bits", "record"):
        DP.RESERVE = kind
        r0 = len(recs)
        y, res = B.dropout_forward(None, desc, x)
        dx = B.dropout_backward(None, desc, x, res)
        flips.append([type(res).__name__, [r[0].split("(")[0] for r in recs[r0:]],
                      B.dropout_get_reserve_space_size(x)])
        made[kind] = res
    DP.RESERVE = "bits"
    r0 = len(recs)
    for kind in ("mask", "record", "bits"):                  # each reserve whatever the setting
        B.dropout_backward(None, desc, x, made[kind])
    passed = [r[0].split("(")[0] for r in recs[r0:]]
    errors = []
    r0 = len(recs)
    for kind in ("record", "bits"):
        for bad_desc, bad_dy in ((B.DropoutDescriptor(0.5, seed=1), x), (desc, x[:2]), (desc, x.reshape(1001, 4))):
            try:
                B.dropout_backward(None, bad_desc, bad_dy, made[kind])
            except B.BadParamError as e:
                errors.append(str(e))
    after = len(recs) - r0
    materialise, mshape = [], []
    for kind in ("record", "bits"):
        r0 = len(recs)
        m = made[kind].mask()
        materialise.append([r[0].split("(")[0] for r in recs[r0:]])
        mshape.append([list(m.shape), str(m.dtype)])
    print(json.dumps(dict(rows=out, flips=flips, passed=passed, errors=errors, after=after,
                          materialise=materialise, mshape=mshape)))
""")


def test_launches_under_the_fake_cupy_store_no_mask():
    """RESERVE "record": the forward allocates y and a 2-word record (no mask) and passes x, y, the record, state,
    ticket; the backward allocates dx and passes dy, dx, the record (no mask), on the forward's grid.  "bits": the
    forward allocates ceil(n / 32) words beside y and passes them where the mask was; dropout_bwd_bits reads them."""
    import struct
    r = subprocess.run([sys.executable, "-c", _FAKE.format(root=str(ROOT))], capture_output=True, text=True,
                       timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got["rows"]) == 2 * 4 * 5 * 3
    for row in got["rows"]:
        n, p, dtype = row["n"], row["p"], np.dtype(BF16 if row["dtype"] == "bfloat16" else row["dtype"])
        item, acc = dtype.itemsize, "d" if dtype.itemsize == 8 else "f"
        scale = 0.0 if p == 1 else 1 / (1 - p)
        bits = row["kind"] == "BitMaskReserve"
        words = -(-n // 32)
        assert row["kind"] in ("PhiloxReserve", "BitMaskReserve") and row["shape"] == [n] and row["rp"] == p
        rec_ptr, rec_shape, rec_dtype = row["rec"]
        assert (rec_shape, rec_dtype) == (([words], "uint32") if bits else ([2], "uint64"))
        assert row["nbytes"] == (4 * words if bits else 16)
        # the forward allocates y and the record or the bit words, no byte mask; the backward dx only
        assert row["fa"] == [[[n], row["dtype"]], [rec_shape, rec_dtype]] and row["ba"] == [[[n], row["dtype"]]], row
        assert len(row["fwd"]) == 1 and len(row["bwd"]) == 1
        x_ptr, y_ptr, st_ptr, tk_ptr, dx_ptr = row["ptrs"]
        name, dims, packed = row["fwd"][0]
        pipe = DP.uses_pipe(dtype, n)        # 2-byte data of PIPE_MIN_N elements or more
        assert name.startswith("dropout_fwd_pipe(" if pipe else "dropout_fwd("), name
        assert f"-DMASK={2 if bits else 0}" in name
        fmt = "@5QqI" + acc + "i"
        vals = struct.unpack(fmt, bytes.fromhex(packed)[:struct.calcsize(fmt)])
        # x, y, the record (or bit words), the state, the ticket -- and nothing else the size of a byte mask
        assert vals[:5] == (x_ptr, y_ptr, rec_ptr, st_ptr, tk_ptr), row
        d16 = DP.uses_draw16(dtype, p)                       # DRAW16 (session 14, default off): 16-bit data
        assert vals[5] == n and vals[6] == (DP.threshold16 if d16 else DP.threshold)(p)
        assert ("-DDRAW16=1" in name) == d16
        assert vals[7] == (scale if acc == "d" else float(np.float32(scale)))
        aligned = row["offset"] * item % 16 == 0
        assert vals[8] == int(aligned)
        name_b, dims_b, packed = row["bwd"][0]
        if bits:
            assert name_b.startswith("dropout_bwd_bits(") and "-DMASK=2" in name_b, name_b
            groups = -(-n // (8 if item == 2 else 4))
            assert dims_b == [-(-groups // 256), 1, 1, 256, 1, 1, 0]
            fmt = "@3Qq" + acc + "i"
            vals = struct.unpack(fmt, bytes.fromhex(packed)[:struct.calcsize(fmt)])
            assert vals[:3] == (x_ptr, rec_ptr, dx_ptr), row            # dy, the bit words, dx
            assert vals[3] == n and vals[4] == 2.0 and vals[5] == int(aligned)
            continue
        assert name_b.startswith("dropout_bwd_regen_pipe(" if pipe else "dropout_bwd_regen(") and "-DMASK=0" in name_b
        assert dims_b == dims, (dims_b, dims)                  # the forward's walk and grid
        fmt = "@3QqI" + acc + "i"
        vals = struct.unpack(fmt, bytes.fromhex(packed)[:struct.calcsize(fmt)])
        assert vals[:3] == (x_ptr, dx_ptr, rec_ptr), row        # dy, dx, the record: no mask read
        assert vals[3] == n and vals[4] == (DP.threshold16 if d16 else DP.threshold)(p) and vals[5] == 2.0
        assert vals[6] == int(aligned) and ("-DDRAW16=1" in name_b) == d16
    # the switch set in one process: each call takes the path it names; the seen tables keyed on it
    fl = got["flips"]
    rec = ["PhiloxReserve", ["dropout_fwd", "dropout_bwd_regen"], 16]
    mask = ["ndarray", ["dropout_fwd", "dropout_bwd_tile"], 4004]
    bits = ["BitMaskReserve", ["dropout_fwd", "dropout_bwd_bits"], 4 * 126]
    assert fl == [rec, rec, mask, mask, bits, bits, rec], fl
    assert got["passed"] == ["dropout_bwd_tile", "dropout_bwd_regen", "dropout_bwd_bits"]
    # mismatched reserves raise before any work (p, then shape, then a reshaped dy: same size, other shape)
    assert got["after"] == 0 and len(got["errors"]) == 6, got["errors"]
    for errors, kind in ((got["errors"][:3], "PhiloxReserve"), (got["errors"][3:], "BitMaskReserve")):
        assert f"reserve {kind}(shape=(4, 1001), p=0.3, device=cuda:0) does not match dy of shape (4, 1001) with " \
               "p=0.5" in errors[0]
        assert "dy of shape (2, 1001) with p=0.3" in errors[1] and "dy of shape (1001, 4)" in errors[2]
    # reserve.mask(): one launch of the reserve's backward on ones (scale 1), then CuPy's != (not a launch of ours)
    assert got["materialise"] == [["dropout_bwd_regen"], ["dropout_bwd_bits"]]
    assert got["mshape"] == [[[4, 1001], "bool"]] * 2


# ---- CPU: nvcc -----------------------------------------------------------------------------------------------------

def _compile(tmp_path, opts, ptx=False):
    """nvcc of DP.SOURCE under ``opts``: PTX on stdout (``ptx``), else the cubin with ptxas's -v lines and the PTX
    that ptxas read kept in tmp_path/keep (one cicc run serves the spill lines and the PTX checks)."""
    defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
    src = tmp_path / "k.cu"
    src.write_text(defines + DP.SOURCE)
    keep = tmp_path / "keep"
    keep.mkdir(exist_ok=True)
    args = (["--ptx", "-o", "-"] if ptx else
            ["-cubin", "-Xptxas", "-v", "--keep", "--keep-dir", str(keep), "-o", str(tmp_path / "k")])
    r = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_90"] + args + [str(src)], capture_output=True, text=True,
                       timeout=300)
    return r


def _entries(ptx):
    """PTX text of each .entry (name -> body)."""
    parts = ptx.split(".entry ")[1:]
    return {p.split("(")[0].strip(): p for p in parts}


def _byte_accesses(body, op):
    """Lines of a PTX body doing a byte-wide ``op`` (st.global / ld.global)."""
    return [ln for ln in body.splitlines() if op in ln and (".u8" in ln or ".b8" in ln or ".s8" in ln)]


# (UNROLL, WIDE, HINT, pipe): the forward UNROLL rule's 1-4 (pipe: PUNROLL with PMINB), 64-bit indices, each hint
RECORD_BUILDS = [(4, 0, 1, True), (1, 0, 0, False), (2, 1, 2, True), (2, 0, 1, False)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype", pick(DTYPES, 2), ids=lambda d: d.name)
@pytest.mark.parametrize("unroll, wide, hint, pipe", pick(RECORD_BUILDS, 2))
@pytest.mark.parametrize("mask", [0, 2])
def test_record_kernels_compile_without_spills_and_touch_no_mask(tmp_path, dtype, unroll, wide, hint, pipe, mask):
    """Every MASK = 0 (record) and MASK = 2 (bit mask) module compiles for sm_90 with no spills; its kernels have no
    byte-wide global loads or stores (a byte mask's), which the MASK = 1 module's forward and backward do have
    (test_byte_mask_module_touches_bytes: the check can fail).  The PTX read is the one ptxas built (nvcc --keep,
    byte-identical to --ptx's output: checked on nvcc 13.0), so one nvcc run serves both checks."""
    if pipe:
        unroll = DP.pipe_unroll(dtype.itemsize, bool(wide))
    opts = DP._options(dtype, unroll, wide, hint, pminb=DP.PIPE_MINB if pipe else None, mask=mask)
    r = _compile(tmp_path, opts)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "warning" not in out, out[-2000:]
    kernels = ({"dropout_fwd", "dropout_fwd_pipe", "dropout_bwd_regen", "dropout_bwd_regen_pipe"} if mask == 0 else
               {"dropout_fwd", "dropout_fwd_pipe", "dropout_bwd_bits"})
    spills = [line for line in out.splitlines() if "spill stores" in line]
    assert len(spills) == len(kernels) and all(" 0 bytes spill stores" in line for line in spills), out
    kept = list((tmp_path / "keep").glob("*.ptx"))
    assert len(kept) == 1, kept
    ptx = _entries(kept[0].read_text())
    assert set(ptx) == kernels
    if mask == 2:                                        # the forwards pack bits with shuffles
        assert all("shfl.sync.bfly" in ptx[k] for k in ("dropout_fwd", "dropout_fwd_pipe"))
    for name, body in ptx.items():
        for op in ("st.global", "ld.global"):
            assert not _byte_accesses(body, op), (name, op)


# The MASK = 1 builds of the float32 (4-byte, 32-bit index) cases above: (UNROLL, HINT); MASK 0 and 2 share them.
BYTE_MASK_BUILDS = sorted({(DP.pipe_unroll(4, False) if pipe else unroll, hint)
                           for unroll, wide, hint, pipe in RECORD_BUILDS if not wide})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("unroll, hint", BYTE_MASK_BUILDS)
def test_byte_mask_module_touches_bytes(tmp_path, unroll, hint):
    """The byte-access check above can fail: the MASK = 1 module's forward stores bytes and its backward loads them."""
    mask_ptx = _entries(_compile(tmp_path, DP._options(np.dtype(np.float32), unroll, 0, hint), ptx=True).stdout)
    assert _byte_accesses(mask_ptx["dropout_fwd"], "st.global")
    assert _byte_accesses(mask_ptx["dropout_bwd_tile"], "ld.global")


# ---- GPU -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture
def switch(monkeypatch):
    """set(kind): the forward's reserve choice (plans and seen tables keyed on it, nothing cleared)."""
    monkeypatch.setattr(DP, "RESERVE", "record")

    def set_(kind):
        DP.RESERVE = kind
    return set_


_TYPES = {"record": DP.PhiloxReserve, "bits": DP.BitMaskReserve}


def _pair(cp, switch, desc_of, x, dy, p, kind="record", seed=77, counter=2 ** 32 - 3):
    """(y, dx, reserve, engine) of the ``kind`` path and of the mask path, from the same engine state."""
    got = []
    for k in (kind, "mask"):
        switch(k)
        eng = _engine(seed)
        eng.set_device_counter(counter)
        desc = desc_of(p, eng)
        n0 = _launches()
        y, res = B.dropout_forward(None, desc, x)
        dx = B.dropout_backward(None, desc, dy, res)
        assert _launches() - n0 == 2
        assert type(res) is _TYPES.get(k, cp.ndarray)
        got.append((_host(cp, y), _host(cp, dx), res, eng))
    switch("record")
    return got


SHAPES = [1, 3, 5, 7, 9, 15, 17, 1000, 4099, 65537, 1_000_003, (128, 10), (3, 5, 7), (2, 16, 9, 9)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("kind", ["record", "bits"])
def test_record_path_is_the_mask_path_bitwise(cp, switch, dtype, p, kind):
    rng = np.random.default_rng(3)
    for shape in SHAPES:
        shape = shape if isinstance(shape, tuple) else (shape,)
        x_h, dy_h = _draw(cp, dtype, shape, rng), _draw(cp, dtype, shape, rng)
        (yr, dxr, rec, er), (ym, dxm, mask, em) = _pair(cp, switch, _EngineDescriptor, cp.asarray(x_h),
                                                        cp.asarray(dy_h), p, kind)
        np.testing.assert_array_equal(yr.view(np.uint8), ym.view(np.uint8), err_msg=str(shape))
        np.testing.assert_array_equal(dxr.view(np.uint8), dxm.view(np.uint8), err_msg=str(shape))
        np.testing.assert_array_equal(_host(cp, rec.mask()), _host(cp, mask))
        assert er.device_counter() == em.device_counter()
        key, c0 = er._device_key(), 2 ** 32 - 3
        if kind == "record":                             # the record holds the key and the call's first counter
            assert [int(v) for v in _host(cp, rec.record)] == [key, c0]
        else:                                            # the plain bit layout, tail bits zero
            packed = np.packbits(np.concatenate([_host(cp, mask).reshape(-1), np.zeros(-x_h.size % 32, np.bool_)]),
                                 bitorder="little").view("<u4")
            np.testing.assert_array_equal(_host(cp, rec.bits), packed)
        want = reference_keep(key, c0, x_h.size, p, DP.uses_draw16(dtype, p)).reshape(shape)
        np.testing.assert_array_equal(dxr.view(np.uint8), reference_apply(dy_h, want, 0.0 if p == 1 else 1 / (1 - p))
                                      .view(np.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("offset", [1, 3, 5])
@pytest.mark.parametrize("kind", ["record", "bits"])
def test_record_path_unaligned_and_non_contiguous(cp, switch, dtype, offset, kind):
    """A view off a 16-byte boundary (x and dy: the element loads) and a transposed one (copied): bitwise the mask
    path; dy's alignment need not be x's."""
    rng = np.random.default_rng(offset)
    n = 4099
    base = cp.asarray(_draw(cp, dtype, (n + offset,), rng))
    dyb = cp.asarray(_draw(cp, dtype, (n + 8,), rng))
    cases = ((base[offset:], dyb[:n]), (base[:n], dyb[offset:offset + n]), (base[offset:], dyb[offset:offset + n]))
    for x, dy in cases:
        (yr, dxr, *_), (ym, dxm, *_) = _pair(cp, switch, _EngineDescriptor, x, dy, 0.3, kind)
        np.testing.assert_array_equal(yr.view(np.uint8), ym.view(np.uint8))
        np.testing.assert_array_equal(dxr.view(np.uint8), dxm.view(np.uint8))
    x2 = cp.asarray(_draw(cp, dtype, (6, 35), rng)).T
    dy2 = cp.asarray(_draw(cp, dtype, (6, 35), rng)).T
    (yr, dxr, *_), (ym, dxm, *_) = _pair(cp, switch, _EngineDescriptor, x2, dy2, 0.3, kind)
    np.testing.assert_array_equal(yr.view(np.uint8), ym.view(np.uint8))
    np.testing.assert_array_equal(dxr.view(np.uint8), dxm.view(np.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16, np.dtype(np.float64)], ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["record", "bits"])
def test_record_path_in_a_cuda_graph(cp, switch, dtype, kind):
    """Forward and backward captured once, replayed three times: each replay draws fresh numbers (the record or the
    bits are rewritten on the device) and its backward is that replay's forward's, bitwise as the reference."""
    switch(kind)
    n = 100_003
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
        y, rec = B.dropout_forward(None, desc, x)
        dx = B.dropout_backward(None, desc, dy, rec)
        g = s.end_capture()
    assert type(rec) is _TYPES[kind]
    step, seen = (n + 3) // 4, []
    for i in range(3):
        g.launch(s)
        s.synchronize()
        want = reference_keep(key, c0 + i * step, n, 0.4, DP.uses_draw16(dtype, 0.4))
        if kind == "record":
            assert [int(v) for v in _host(cp, rec.record)] == [key, c0 + i * step]
        np.testing.assert_array_equal(_host(cp, y).view(np.uint8), reference_apply(x_h, want, 1 / 0.6).view(np.uint8))
        np.testing.assert_array_equal(_host(cp, dx).view(np.uint8),
                                      reference_apply(dy_h, want, 1 / 0.6).view(np.uint8))
        seen.append(want)
    assert not np.array_equal(seen[0], seen[1]) and eng.device_counter() == c0 + 3 * step


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["record", "bits"])
def test_nn_dropout_step_and_double_backward_match_the_mask_path(cp, switch, kind):
    """nn.Dropout in a small step (Linear -> Dropout -> Linear), then a double backward (create_graph: DropoutMask
    is its own derivative, reading the same reserve): every gradient bitwise equal between the two paths."""
    import minidnn as mdn
    got = []
    for k in (kind, "mask"):
        switch(k)
        mdn.manual_seed(5)
        lin1, lin2, drop = mdn.nn.Linear(33, 64).to("cuda"), mdn.nn.Linear(64, 10).to("cuda"), mdn.nn.Dropout(0.3)
        x = mdn.tensor(np.random.default_rng(0).standard_normal((16, 33)).astype(np.float32), device="cuda",
                       requires_grad=True)
        h = drop(lin1(x))
        out = lin2(h)
        (gx,) = mdn.autograd.grad((out * out).sum(), [x], create_graph=True)
        (ggx,) = mdn.autograd.grad((gx * gx).sum(), [x])
        got.append([t.detach().cpu().numpy() for t in (h, out, gx, ggx)])
    switch("record")
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)
    assert (got[0][0] == 0).any() and (got[0][0] != 0).any()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["record", "bits"])
def test_functional_dropout_double_backward(cp, switch, dtype, kind):
    """F.dropout's gradient of sum(y^2) is 2 m^2 s^2 x, and its gradient again through DropoutMask's backward: both
    bitwise between the paths, and the first against the kept positions."""
    import minidnn as mdn
    import minidnn.nn.functional as F
    dt = mdn.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    got = []
    for k in (kind, "mask"):
        switch(k)
        mdn.manual_seed(8)
        x = mdn.tensor(np.random.default_rng(2).standard_normal((64, 33)).astype(np.float32).astype(dt),
                       device="cuda", requires_grad=True)
        y = F.dropout(x, 0.25)
        (gx,) = mdn.autograd.grad((y * y).sum(), [x], create_graph=True)
        (ggx,) = mdn.autograd.grad(gx.sum(), [x])
        got.append([t.detach().cpu().numpy().astype(np.float32) for t in (y, gx, ggx)])
    switch("record")
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)
    kept = got[0][0] != 0
    assert kept.any() and not kept.all()
    assert not got[0][1][~kept].any() and not got[0][2][~kept].any()


@pytest.mark.cuda
@pytest.mark.parametrize("fn", ["dropout1d", "dropout2d", "dropout3d"])
def test_channel_dropout_unchanged(cp, switch, fn):
    """The channel dropouts (a Dropout of ones, broadcast) give the same output and gradient both ways."""
    import minidnn as mdn
    import minidnn.nn.functional as F
    shape = {"dropout1d": (4, 8, 11), "dropout2d": (4, 8, 5, 6), "dropout3d": (2, 8, 3, 4, 5)}[fn]
    got = []
    for k in ("record", "bits", "mask"):
        switch(k)
        mdn.manual_seed(9)
        x = mdn.tensor(np.random.default_rng(1).standard_normal(shape).astype(np.float32), device="cuda",
                       requires_grad=True)
        y = getattr(F, fn)(x, 0.5)
        y.backward(mdn.ones(shape, device="cuda"))
        got.append((y.detach().cpu().numpy(), x.grad.cpu().numpy()))
    switch("record")
    for other in got[1:]:
        for a, b in zip(got[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("kind", ["record", "bits"])
def test_record_keep_rate_within_binomial_bounds(cp, switch, dtype, p, kind):
    """The regenerated masks (reserve.mask()) keep 1 - p within 6 sigma, per Philox word and per 16-bit group lane
    too; consecutive calls agree on (1-p)^2 + p^2 (independent)."""
    n = 1 << 22
    switch(kind)
    desc = _EngineDescriptor(p, _engine(2027))
    x = cp.ones(n, dtype=dtype)
    ra, rb = B.dropout_forward(None, desc, x)[1], B.dropout_forward(None, desc, x)[1]
    a, b = _host(cp, ra.mask()), _host(cp, rb.mask())

    def within(frac, m, q):
        return abs(frac - q) <= 6 * math.sqrt(q * (1 - q) / m)
    assert within(a.mean(), n, 1 - p) and within(b.mean(), n, 1 - p)
    for k in (4, 8):
        for lane in range(k):
            assert within(a[lane::k].mean(), n // k, 1 - p), (k, lane)
    assert within((a == b).mean(), n, (1 - p) ** 2 + p ** 2)
    dx = _host(cp, B.dropout_backward(None, desc, x, ra)).astype(np.float32)
    np.testing.assert_array_equal(dx != 0, a)


def test_cache_hint_by_call_size(monkeypatch):
    """HINT_BY_SIZE (session 13 run 7): the streaming hints only where the call's two arrays exceed the device's L2
    (62.9 MB on an H200); a device that does not say its L2 (0) and HINT_BY_SIZE off keep the configured hint."""
    from minidnn.backend.cuda import device_facts
    monkeypatch.setitem(device_facts._l2, 7, (62914560, True))
    monkeypatch.setitem(device_facts._l2, 8, (0, False))
    assert DP.call_hint(1, 128 * 64 * 56 * 56, 4, 7) == 1       # float32 x + y: 205.5 MB
    assert DP.call_hint(1, 128 * 64 * 56 * 56, 2, 7) == 1       # bfloat16: 102.8 MB
    assert DP.call_hint(2, 128 * 16 * 32 * 32, 4, 7) == 0       # 16.8 MB: plain loads and stores
    assert DP.call_hint(1, 62914560 // 8, 4, 7) == 0            # exactly L2
    assert DP.call_hint(1, 62914560 // 8 + 1, 4, 7) == 1
    assert DP.call_hint(1, 1000, 4, 8) == 1                     # L2 unknown
    assert DP.call_hint(0, 10 ** 9, 4, 7) == 0
    monkeypatch.setattr(DP, "HINT_BY_SIZE", False)
    assert DP.call_hint(1, 1000, 4, 7) == 1
