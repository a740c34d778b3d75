"""The direct convolution kernels' route settled once per signature (conv_igemm.settle_direct, used by
backend.convolution's settled calls -- nn's fast path -- docs/host_overhead.md round 21), on the CPU: the GPU path
under tools/record_launches.py's fake CuPy (launches recorded with null pointers, never run) in a subprocess.  For
LeNet-like problems (dense, few channels: the register-tiled plane kernels) the settled forward, backward data and
backward filter (float32, bfloat16, a float32 dw of bfloat16 data, dw written into a given array) make the same
launches as the primitives' full path; what the settled form does not take -- channels-last activations, the tile
kernels switched off -- settles to None and keeps the full function; TILE_ENABLED is part of ``settled_state``.
Since round 25 (the default since session 13 run 4) a depthwise problem with NCHW activations (which the NHWC
route declines by layout) and strided backward data (the gather kernel) settle too, with the full function's
launches (test_host25_dw_settle.py covers the switch, DW_SETTLE, both ways).  Values on a
GPU: test_conv_bias_node_cuda.py (LeNet-5 / MobileNet-small steps with the fast path on and off)."""
import pathlib
import textwrap

from tests.nn._fake_script import run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.backend as B
    import minidnn.backend.convolution as BC
    from minidnn.backend.cuda import conv_igemm as CI

    def arr(shape, dtype=np.float32, cl=False):
        a = fakecp.asarray(np.random.default_rng(0).standard_normal(shape).astype(np.float32).astype(dtype))
        if cl:
            a = fakecp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        return a

    def case(x_shape, w_shape, pad=0, stride=1, groups=1, dtype=np.float32, cl=False, dw_dtype=None, into=False):
        desc = B.ConvolutionDescriptor((pad, pad), (stride, stride), (1, 1), groups=groups)
        x, w = arr(x_shape, dtype, cl), arr(w_shape, dtype)
        y = B.convolution_forward(None, x, w, desc)
        dy = arr(y.shape, dtype, cl)
        out = {{}}
        for d, (a1, a2, other) in enumerate(((x, w, None), (w, dy, x_shape), (x, dy, w_shape))):
            s = BC.settle_convolution(d, None, a1, a2, desc, other, None, dw_dtype if d == 2 else None)
            if s is None:
                out[d] = None
                continue
            extra = {{}} if d != 2 or dw_dtype is None else {{"dw_dtype": dw_dtype}}
            full = (B.convolution_forward, B.convolution_backward_data, B.convolution_backward_filter)[d]
            recs.clear()
            r_full = full(None, a1, a2, desc, *([] if d == 0 else [other]), **extra)
            l_full = [list(r) for r in recs]
            recs.clear()
            slot = None
            if d == 2 and into:
                slot = fakecp.empty(w_shape, dtype=r_full.dtype)
            r_set = s.run(a1, a2, None, slot)
            l_set = [list(r) for r in recs]
            out[d] = dict(settled=s.direct is not None, same=l_full == l_set and len(l_full) > 0,
                          same_kernels=[r[:2] for r in l_full] == [r[:2] for r in l_set] and len(l_full) > 0,
                          shape=[list(r_full.shape), list(r_set.shape)], dtype=[str(r_full.dtype), str(r_set.dtype)],
                          contiguous=bool(r_set.flags.c_contiguous), into=slot is not None and r_set is slot,
                          n=len(l_set))
        return out

    res = {{}}
    res["lenet1"] = case((8, 1, 32, 32), (6, 1, 5, 5))
    res["lenet2"] = case((8, 6, 14, 14), (16, 6, 5, 5))
    res["pad"] = case((4, 3, 12, 12), (8, 3, 3, 3), pad=1)
    res["bf16"] = case((8, 6, 14, 14), (16, 6, 5, 5), dtype=mdn.bfloat16)
    res["bf16_wide"] = case((8, 6, 14, 14), (16, 6, 5, 5), dtype=mdn.bfloat16, dw_dtype=np.float32)
    res["into"] = case((8, 6, 14, 14), (16, 6, 5, 5), into=True)
    res["depthwise"] = case((4, 8, 12, 12), (8, 1, 3, 3), pad=1, groups=8)
    res["cl"] = case((4, 3, 12, 12), (8, 3, 3, 3), pad=1, cl=True)
    res["strided"] = case((4, 3, 12, 12), (8, 3, 3, 3), pad=1, stride=2)
    st = BC.settled_state()
    CI.TILE_ENABLED[0] = False
    res["state_differs"] = BC.settled_state() != st
    res["tile_off"] = case((8, 6, 14, 14), (16, 6, 5, 5))
    CI.TILE_ENABLED[0] = True
    print("RESULT" + json.dumps(res))
""")


def _run():
    return run_fake_script(_SCRIPT, ROOT)


def test_settled_direct_route_launches_as_the_full_path():
    res = _run()
    for name in ("lenet1", "lenet2", "pad", "bf16", "bf16_wide", "into"):
        for d in ("0", "1", "2"):
            r = res[name][d]
            assert r is not None, (name, d)
            assert r["same"] and r["contiguous"], (name, d, r)
            assert r["shape"][0] == r["shape"][1] and r["dtype"][0] == r["dtype"][1], (name, d, r)
        assert res[name]["0"]["settled"] and res[name]["2"]["settled"], name
        # backward data: settled where the stride-1 flipped tile kernel runs (all of these)
        assert res[name]["1"]["settled"], name
    assert res["bf16_wide"]["2"]["dtype"] == ["float32", "float32"]
    assert res["into"]["2"]["into"] and not res["lenet2"]["2"]["into"]


def test_what_the_settled_route_does_not_take_keeps_the_full_function():
    res = _run()
    for name in ("cl", "tile_off"):
        for d in ("0", "1", "2"):
            r = res[name][d]
            if r is None:
                continue
            if (name, d) == ("cl", "1"):
                # an NCHW call's backward data from a channels-last dy: the settled call writes dx channels-first
                # itself (the kernel's output strides differ), where the full function writes it as dy and
                # _finish copies it to the call's format: the same kernels and grids, no copy
                assert not r["settled"] and r["same_kernels"] and r["contiguous"], (name, d, r)
                continue
            # settled calls of other kernels (or none): the full function, same launches
            assert not r["settled"] and r["same"], (name, d, r)
    for name in ("depthwise", "strided"):  # NCHW depthwise and strided backward data: settled (round 25)
        for d in ("0", "1", "2"):
            r = res[name][d]
            assert r["settled"] and r["same"], (name, d, r)
    assert res["state_differs"]
