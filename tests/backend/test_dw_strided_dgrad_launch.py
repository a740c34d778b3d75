"""Strided depthwise backward data runs dw_tile_backward_data (conv_igemm._tile_backward_data, the gather form by
residue class) -- checked here without a GPU, under tools/record_launches.py's fake CuPy (NumPy arrays, launches
recorded, never run; in a subprocess so the fake never meets this session's modules): the bench's depthwise 3x3
stride-2 56x56 layer and MobileNet-small's stride-2 depthwise layer through F.conv2d's backward and through the
primitive, NCHW one launch with the compile-time stride and padding residues; NHWC does not reach it
(conv_dw_nhwc or direct_backward_data); MINIDNN_DW_TILE=0 (TILE_ENABLED off) the old kernel.  The bits on a GPU:
the stride-2/3 rows of test_depthwise_kernels.py; the index math on the CPU: test_dw_tile_emulation.py."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    recs = []
    R.record_to(L, recs)
    import minidnn.backend as B
    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.nn import functional as F
    from minidnn.tensor import Tensor
    out = {{}}
    desc = B.ConvolutionDescriptor(1, 2, 1, 128)
    ws, xs, ys = (128, 1, 3, 3), (32, 128, 56, 56), (32, 128, 28, 28)
    for fmt in ("NCHW", "NHWC"):
        cl = (lambda s: (s[0], s[2], s[3], s[1])) if fmt == "NHWC" else (lambda s: s)
        for rep in range(2):
            del recs[:]
            B.convolution_backward_data(None, fakecp.zeros(ws), fakecp.zeros(cl(ys)), desc, cl(xs), format=fmt)
            out["prim_%s_%d" % (fmt, rep)] = list(recs)
    K.TILE_ENABLED[0] = False
    del recs[:]
    B.convolution_backward_data(None, fakecp.zeros(ws), fakecp.zeros(ys), desc, xs)
    out["off"] = list(recs)
    K.TILE_ENABLED[0] = True
    x = Tensor._from_array(fakecp.zeros((16, 32, 32, 32)))
    w = Tensor._from_array(fakecp.zeros((32, 1, 3, 3)))
    x.requires_grad, w.requires_grad = True, True
    y = F.conv2d(x, w, None, 2, 1, 1, 32)
    del recs[:]
    y.backward(Tensor._from_array(fakecp.zeros((16, 32, 16, 16))))
    out["step"] = list(recs)
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _names(recs):
    return [r[0].split("(")[0] for r in recs]


def test_strided_depthwise_dgrad_is_one_tile_launch_in_nchw():
    out = _run()
    for rep in (0, 1):
        recs = out[f"prim_NCHW_{rep}"]
        assert _names(recs) == ["dw_tile_backward_data"], recs
        opts = recs[0][0]
        assert all(o in opts for o in ("-DST=2", "-DKR=3", "-DDVH=2", "-DDVW=4", "-DPHM=1", "-DPWM=1")), opts
        # grid (planes / TZ, tiles of H, tiles of W), block (TX, TY, TZ): 4096 planes of 56x56 as 14 x 14 threads
        assert recs[0][1][:6] == [4096, 2, 1, 14, 14, 1], recs[0][1]
    assert out["prim_NCHW_0"] == out["prim_NCHW_1"]


def test_nhwc_and_switched_off_keep_the_generic_kernel():
    out = _run()
    # NHWC depthwise of whole channel vectors now takes conv_dw_nhwc's gather kernel (issue 12), still one launch
    assert _names(out["prim_NHWC_0"]) in (["direct_backward_data"], ["dwn_backward_data_st"]), out["prim_NHWC_0"]
    assert _names(out["off"]) == ["direct_backward_data"], out["off"]


def test_a_training_steps_strided_depthwise_backward():
    """F.conv2d's backward of a stride-2 depthwise layer (MobileNet-small's shape): the filter gradient's tile
    kernel and the strided dgrad's, nothing else."""
    names = sorted(_names(_run()["step"]))
    assert names == ["dw_tile_backward_data", "dw_tile_backward_filter"], names
