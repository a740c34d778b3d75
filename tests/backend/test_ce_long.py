"""Session 17: loss_kernels.CE_LONG, the cross-entropy forward of multi-chunk rows streamed through a cp.async stage
(docs/step_kernels.md, "Session 17: the cross-entropy forward on long rows").

CPU: the rule (LONG=1 added to the row forward of ONE=0 rows with vector loads and float accumulation only; the
tiling, MINB, the grid, the block and every other define are CE_LONG "0"'s, so each block walks the same rows and
thread 0 keeps the same running sums -- the ground of the GPU test's bitwise claim), the stage's size and that two
blocks an SM fit it, CE_LONG_SLOTS's rule (three slots where the rows are whole and they fit), and nvcc sm_90 builds
of LONG plans: no spills at their 64 / 128 registers, the copies as cp.async (16-byte .cg; 8-byte .ca for widened
16-bit logits) and the wait before the reads.
GPU: tests/backend/test_ce_long_cuda.py.
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

from minidnn.backend.cuda import loss_kernels as _lk
from tests._nvcc import pick
from tests.backend.test_softmax_rows_cuda import _defs, _dtype

SHAPES = [(4096, 32000), (1000, 16385), (300, 50257), (17, 32769), (16384, 1000), (4096, 16384), (8, 16388),
          (64, 131072), (65536, 512), (4, 1000, 3)]
NAMES = [("float32", False), ("bfloat16", False), ("float16", False), ("float64", False), ("bfloat16", True),
         ("float16", True)]
VARIANTS = [(False, "mean", 0.0), (True, "none", 0.0), (True, "sum", 0.1), (False, "mean", 0.2)]


def _spec(shape, name, widen, w, red, eps, kname="ce_fwd"):
    return _lk.launch_spec(kname, shape, _dtype(name), np.int64, w, red, eps, widen)


@pytest.mark.parametrize("setting", ["1", "2", "0", "x"])
def test_ce_long_rule(monkeypatch, setting):
    """"1" adds LONG=1 -- and only it -- to the forward of rows of several chunks (ONE=0, a block a row, vector
    loads, float accumulation); "2" adds LONG=2 there instead where the plan has FASTX (16-bit logits, not widened),
    else LONG=1; "0" (and an unknown value) plan the kernels before it; the backward never changes."""
    seen = 0
    for shape in SHAPES:
        for name, widen in NAMES:
            for w, red, eps in VARIANTS:
                monkeypatch.setattr(_lk, "CE_LONG", "0")
                base, bbase = _spec(shape, name, widen, w, red, eps), _spec(shape, name, widen, w, red, eps, "ce_bwd")
                monkeypatch.setattr(_lk, "CE_LONG", setting)
                spec = _spec(shape, name, widen, w, red, eps)
                assert _spec(shape, name, widen, w, red, eps, "ce_bwd") == bbase
                assert spec[:2] == base[:2] and spec[3:] == base[3:], (spec, base)
                d, d0 = _defs(spec[2]), _defs(base[2])
                assert {k: v for k, v in d.items() if k != "LONG"} == d0 and "LONG" not in d0
                long_row = (base[0] == "ROWS" and d0["ONE"] == 0 and d0["G"] == d0["BLOCK"] and d0["VEC"] > 1
                            and name != "float64")
                want = None
                if setting in ("1", "2") and long_row:
                    want = 2 if setting == "2" and d0["FASTX"] == 1 else 1
                assert d.get("LONG") == want, (shape, name, widen, d)
                if base[0] == "ROWS":
                    assert d0["FASTX"] == (name in ("bfloat16", "float16") and not widen)
                assert _lk.long_stage_bytes(spec[2]) == (0 if "LONG" not in d else
                                                         d["BLOCK"] * d["NV"] * (2 * d["VEC"] if widen
                                                                                 else d["VBYTES"]))
                seen += "LONG" in d
    assert seen > 0 if setting in ("1", "2") else seen == 0


def test_ce_long_shapes_of_the_brief(monkeypatch):
    """The shapes issue 10 names: (4096, 32000), (300, 50257), (17, 32769) float32 / bfloat16 / widened take LONG
    with 512-thread blocks, two an SM (MINB 2; smoothing: MINB 1, 128 registers), a 64 KB (float32) or 32 KB stage;
    (1000, 16385) is one RAGGED chunk (ONE=1) and keeps its kernel; so do float64 rows."""
    monkeypatch.setattr(_lk, "CE_LONG", "1")
    for shape in ((4096, 32000), (300, 50257), (17, 32769)):
        for name, widen, stage in (("float32", False, 65536), ("bfloat16", False, 32768), ("bfloat16", True, 32768)):
            for w, red, eps in VARIANTS:
                spec = _spec(shape, name, widen, w, red, eps)
                d = _defs(spec[2])
                assert d["LONG"] == 1 and d["BLOCK"] == d["G"] == 512 and spec[5] == 512, (shape, name, d)
                assert d["MINB"] == (1 if eps else 2) and _lk.long_stage_bytes(spec[2]) == stage
                # the blocks an SM the grid assumes (MINB; 1: registers allow one) fit the stage beside the
                # kernel's ~0.4 KB of static shared memory and the 1 KB the driver keeps a block, in 228 KB
                assert d["MINB"] * (stage + 1024 + 512) <= 228 * 1024
    for name, widen in NAMES:
        assert "LONG" not in _defs(_spec((1000, 16385), name, widen, True, "none", 0.0)[2])
    assert "LONG" not in _defs(_spec((4096, 32000), "float64", False, False, "mean", 0.0)[2])


@pytest.mark.parametrize("slots", ["3", "1"])
def test_ce_long_slots_rule(monkeypatch, slots):
    """CE_LONG_SLOTS "3" adds LSLOTS=3 to LONG plans of whole rows (not RAGGED) whose three slots fit the blocks an SM
    (MINB) -- 16-bit and widened at two blocks, float32 only with smoothing's one -- and nothing else; "1" never."""
    for shape in SHAPES:
        for name, widen in NAMES:
            for w, red, eps in VARIANTS:
                monkeypatch.setattr(_lk, "CE_LONG_SLOTS", "1")
                base = _spec(shape, name, widen, w, red, eps)
                monkeypatch.setattr(_lk, "CE_LONG_SLOTS", slots)
                spec = _spec(shape, name, widen, w, red, eps)
                d, d0 = _defs(spec[2]), _defs(base[2])
                assert spec[:2] == base[:2] and spec[3:] == base[3:]
                assert {k: v for k, v in d.items() if k != "LSLOTS"} == d0
                slot = _lk.long_stage_bytes(base[2])
                fits = "LONG" in d0 and d0["RAGGED"] == 0 and d0["MINB"] * (3 * slot + 2048) <= 228 * 1024
                assert d.get("LSLOTS") == (3 if slots == "3" and fits else None), (shape, name, widen, eps, d)
                assert _lk.long_stage_bytes(spec[2]) == slot * d.get("LSLOTS", 1)
                if fits and slots == "3":
                    assert (name != "float32") or d0["MINB"] == 1, (shape, name, widen, eps)


def test_ce_long_default_is_on():
    import os
    assert _lk.CE_LONG == os.environ.get("MINIDNN_CE_LONG", "2")
    assert _lk.CE_LONG_SLOTS == os.environ.get("MINIDNN_CE_LONG_SLOTS", "1")


def _nvcc(tmp_path, i, defines, entry="ce_rows_fwd", ptx=False):
    from minidnn.backend.cuda import launch
    src = tmp_path / f"ce_long_{i}.cu"
    launch.write_source(str(src), _lk.SOURCE_ROWS, defines)
    out = str(src) + (".ptx" if ptx else ".o")
    args = ["--ptx"] if ptx else ["-cubin", "-Xptxas", f"-v,--entry={entry}"]
    r = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_90", *args, "-o", out, str(src)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[:1500]
    return open(out).read() if ptx else r.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_ce_long_compiles_without_spills(tmp_path, monkeypatch):
    """nvcc sm_90 builds LONG plans (float32, 16-bit, widened; RAGGED and whole rows; weights, every reduction,
    smoothing) without a spill (the CE_LONG "0" (4096, 32000) float32 forward spilled 248 bytes)."""
    monkeypatch.setattr(_lk, "CE_LONG", "1")
    cases = [(shape, name, widen, *v) for shape in ((4096, 32000), (300, 50257), (17, 32769))
             for name, widen in NAMES if name != "float64" for v in VARIANTS]
    default = ((4096, 32000), "float32", False, False, "mean", 0.0)
    slots3 = ((4096, 32000), "bfloat16", False, False, "mean", 0.0)
    for i, (shape, name, widen, w, red, eps) in enumerate(pick(cases, 2, always=[default, slots3])):
        # 16-bit logits: CE_LONG "2" (FASTX's exp; "1" differs from it in the exp only); whole rows: three slots
        monkeypatch.setattr(_lk, "CE_LONG", "2" if name != "float32" and not widen else "1")
        monkeypatch.setattr(_lk, "CE_LONG_SLOTS", "3")
        defines = _spec(shape, name, widen, w, red, eps)[2]
        assert "LONG=1" in defines or "LONG=2" in defines
        err = _nvcc(tmp_path, i, defines)
        m = re.search(r"Compiling entry function 'ce_rows_fwd'.*?(\d+) bytes spill stores", err, re.S)
        assert m is not None and int(m.group(1)) == 0, (shape, name, widen, w, red, eps, err[-600:])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_ce_long_ptx_copies_and_waits(tmp_path, monkeypatch):
    """The LONG forward's x reaches shared memory by cp.async (16 bytes, .cg; widened 16-bit: 8 bytes, .ca), each
    chunk's reads follow a wait; CE_LONG "0"'s forward has neither (it loads x into registers)."""
    for i, (name, widen, copy) in enumerate((("float32", False, "cp.async.cg.shared.global [%r{}], [%rd{}], 16;"),
                                             ("bfloat16", True, "cp.async.ca.shared.global [%r{}], [%rd{}], 8;"))):
        for setting in ("1", "0")[:2 - i]:              # "0": float32's only (nvcc time)
            monkeypatch.setattr(_lk, "CE_LONG", setting)
            ptx = _nvcc(tmp_path, f"{i}{setting}", _spec((4096, 32000), name, widen, False, "mean", 0.0)[2], ptx=True)
            fwd = ptx[ptx.index(".entry ce_rows_fwd"):]
            fwd = fwd[:fwd.find(".entry", 10)] if ".entry" in fwd[10:] else fwd
            pat = re.escape(copy).replace(r"\{\}", r"\d+")
            if setting == "1":
                assert re.search(pat, fwd) and "cp.async.wait_all" in fwd and "cp.async.commit_group" in fwd
            else:
                assert "cp.async" not in fwd


def test_no_long_plan_below_sm80(monkeypatch):
    """LONG's stage is filled by cp.async (sm_80+): a device below it plans the kernel before LONG (an sm_75 GPU's
    NVRTC refuses cp.async); the softmax backward's cp.async stash (BWD_STASH 3) likewise plans none there."""
    from minidnn.backend.cuda import device_facts, softmax_kernels
    on = _lk.launch_spec("ce_fwd", (4096, 32000), np.float32, np.int64, False, "mean")
    off = _lk.launch_spec("ce_fwd", (4096, 32000), np.float32, np.int64, False, "mean", sm80=False)
    assert any(d.startswith("LONG=") for d in on[2]) and not any(d.startswith("LONG=") for d in off[2])
    assert [d for d in on[2] if not d.startswith("LONG=")] == list(off[2])
    monkeypatch.setattr(softmax_kernels, "BWD_STASH", 3)
    for sm80, want in ((False, 0), (True, None)):
        monkeypatch.setitem(device_facts._l2, 7, (50 << 20, sm80))
        monkeypatch.setitem(device_facts._smem, 7, (228 << 10, 227 << 10))
        got = softmax_kernels.call_stash(True, 7)
        assert (got == 0) if want == 0 else got > 0, (sm80, got)
