"""The direct kernels' settled route for depthwise problems and strided backward data (conv_igemm.settle_direct with
``DW_SETTLE``, docs/host_overhead.md round 25), on the CPU: the GPU path under tools/record_launches.py's fake CuPy
(launches recorded with null pointers, never run) in a subprocess.

A depthwise convolution whose activations conv_dw_nhwc's NHWC route declines by their layout alone (NCHW: channel
stride not 1, ``declines_layout``) settles its forward, backward data (stride 1: the flipped tile kernel; strided:
the gather-form tile kernel) and backward filter once per signature, and the settled calls make the launches of the
full direct_* functions, return results of the same shape, dtype and layout, and write dw into a given slot as the
full function does; with the switch off nothing of this is settled (round 21's behaviour) and the launches are the
same.  Channels-last depthwise activations (the NHWC route may take them: pointer alignment) keep the full function.
Dense strided backward data settles to the gather kernel too.  MobileNet-small's whole fake steps (fp32, bf16
autocast) launch the same kernels with the switch on and off, and on, every depthwise call of the third step is
served by the settled route (no direct_* function is entered).  The switch is part of ``settled_state`` (nn's fast
path key)."""
import pathlib
import textwrap

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.backend as B
    import minidnn.backend.convolution as BC
    from minidnn.backend.cuda import conv_igemm as CI, conv_dw_nhwc as DWN

    def arr(shape, dtype=np.float32, cl=False):
        a = fakecp.asarray(np.random.default_rng(0).standard_normal(shape).astype(np.float32).astype(dtype))
        if cl:
            a = fakecp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        return a

    def case(x_shape, w_shape, pad=1, stride=1, groups=1, dtype=np.float32, cl=False, dw_dtype=None, into=False):
        desc = B.ConvolutionDescriptor((pad, pad), (stride, stride), (1, 1), groups=groups)
        x, w = arr(x_shape, dtype, cl), arr(w_shape, dtype)
        y = B.convolution_forward(None, x, w, desc)
        dy = arr(y.shape, dtype, cl)
        out = {{}}
        for d, (a1, a2, other) in enumerate(((x, w, None), (w, dy, x_shape), (x, dy, w_shape))):
            row = {{}}
            for on in (True, False):
                CI.DW_SETTLE[0] = on
                s = BC.settle_convolution(d, None, a1, a2, desc, other, None, dw_dtype if d == 2 else None)
                if s is None:
                    row[str(on)] = None
                    continue
                extra = {{}} if d != 2 or dw_dtype is None else {{"dw_dtype": dw_dtype}}
                full = (B.convolution_forward, B.convolution_backward_data, B.convolution_backward_filter)[d]
                recs.clear()
                r_full = full(None, a1, a2, desc, *([] if d == 0 else [other]), **extra)
                l_full = [list(r) for r in recs]
                recs.clear()
                slot = fakecp.empty(w_shape, dtype=r_full.dtype) if d == 2 and into else None
                r_set = s.run(a1, a2, None, slot)
                l_set = [list(r) for r in recs]
                row[str(on)] = dict(settled=s.direct is not None, same=l_full == l_set and len(l_full) > 0,
                                    kernels=[r[0].split("(")[0][:40] for r in l_set],
                                    shape=[list(r_full.shape), list(r_set.shape)],
                                    dtype=[str(r_full.dtype), str(r_set.dtype)],
                                    strides=[list(r_full.strides), list(r_set.strides)],
                                    into=slot is not None and r_set is slot)
            out[d] = row
        CI.DW_SETTLE[0] = True
        return out

    res = {{}}
    res["dw_s1"] = case((8, 16, 32, 32), (16, 1, 3, 3), groups=16)
    res["dw_s2"] = case((8, 32, 32, 32), (32, 1, 3, 3), stride=2, groups=32)
    res["dw_s2_odd"] = case((4, 8, 15, 15), (8, 1, 3, 3), stride=2, groups=8)
    res["dw_5x5"] = case((4, 8, 12, 12), (8, 1, 5, 5), pad=2, groups=8)
    res["dw_bf16"] = case((8, 32, 16, 16), (32, 1, 3, 3), stride=2, groups=32, dtype=mdn.bfloat16)
    res["dw_bf16_wide"] = case((8, 32, 16, 16), (32, 1, 3, 3), groups=32, dtype=mdn.bfloat16, dw_dtype=np.float32)
    res["dw_into"] = case((8, 16, 16, 16), (16, 1, 3, 3), stride=2, groups=16, into=True)
    res["dw_cl"] = case((8, 16, 16, 16), (16, 1, 3, 3), groups=16, cl=True)
    res["dense_s2"] = case((4, 3, 12, 12), (8, 3, 3, 3), stride=2)

    # declines_layout: NCHW activations are declined whatever their base; channels-last ones may be taken
    x, y = arr((8, 16, 16, 16)), arr((8, 16, 16, 16))
    xc, yc = arr((8, 16, 16, 16), cl=True), arr((8, 16, 16, 16), cl=True)
    desc = B.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), groups=16)
    pr = BC._forward_problem("t", x.shape, (16, 1, 3, 3), desc, None, x.dtype, B.TensorFormat.NCHW)
    res["declines"] = [DWN.declines_layout(pr, x, y), DWN.declines_layout(pr, xc, yc),
                       DWN.supports("forward", pr, x, y) is not None]

    st = BC.settled_state()
    CI.DW_SETTLE[0] = False
    res["state_differs"] = BC.settled_state() != st
    CI.DW_SETTLE[0] = True
    print("RESULT" + json.dumps(res))
""")

_STEPS = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import os
    import minidnn as mdn
    from minidnn.backend.cuda import conv_igemm as CI, conv_dw_nhwc as DWN
    from minidnn.nn import functional as F
    fakecp.cuda.Stream = __import__("types").SimpleNamespace
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    entered = collections.Counter()      # the full direct_* functions each ask conv_dw_nhwc.supports per call
    real_supports = DWN.supports
    def counted(direction, *a, **k):
        entered[direction] += 1
        return real_supports(direction, *a, **k)
    DWN.supports = counted

    def steps(on, amp):
        CI.DW_SETTLE[0] = on
        mdn.manual_seed(0)
        m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda")
        opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        x = mdn.randn(8, 3, 32, 32).to("cuda")
        y = mdn.randint(0, 10, (8,)).to("cuda")
        out = []
        for i in range(3):
            recs.clear(); entered.clear()
            with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(dict(launches=[list(r) for r in recs], entered=dict(entered),
                            layouts=[[list(p.grad.data.strides), str(p.grad.dtype)] for p in m.parameters()]))
        return out

    res = {{}}
    for amp in (False, True):
        res[str(amp)] = {{str(on): steps(on, amp) for on in (True, False)}}
    CI.DW_SETTLE[0] = True
    print("RESULT" + json.dumps(res))
""")


def test_depthwise_settled_route_launches_as_the_full_path():
    res = run_fake_script(_SCRIPT, ROOT)
    for name in ("dw_s1", "dw_s2", "dw_s2_odd", "dw_5x5", "dw_bf16", "dw_bf16_wide", "dw_into"):
        for d in ("0", "1", "2"):
            on, off = res[name][d]["True"], res[name][d]["False"]
            if on is None:          # not a direct-kernel call of this dtype (the float32 round trip): both None
                assert off is None, (name, d)
                continue
            for r in (on, off):
                assert r["same"], (name, d, r)
                assert r["shape"][0] == r["shape"][1] and r["dtype"][0] == r["dtype"][1], (name, d, r)
                assert r["strides"][0] == r["strides"][1], (name, d, r)
            assert on["settled"] and not off["settled"], (name, d, on["settled"], off["settled"])
            assert on["kernels"] == off["kernels"], (name, d)
    for name in ("dw_s1", "dw_s2", "dw_into"):     # float32: every direction is the direct kernels'
        assert all(res[name][d]["True"] is not None for d in ("0", "1", "2")), name
    assert res["dw_into"]["2"]["True"]["into"] and res["dw_into"]["2"]["False"]["into"]
    assert not res["dw_s1"]["2"]["True"]["into"]


def test_what_may_take_the_nhwc_route_keeps_the_full_function():
    res = run_fake_script(_SCRIPT, ROOT)
    for d in ("0", "1", "2"):
        for on in ("True", "False"):
            r = res["dw_cl"][d][on]
            if r is not None:
                assert not r["settled"] and r["same"], (d, on, r)
    on, off = res["dense_s2"]["1"]["True"], res["dense_s2"]["1"]["False"]
    assert on["settled"] and on["same"] and not off["settled"] and off["same"]
    assert res["state_differs"]
    assert res["declines"] == [True, False, True]


def test_mobilenet_steps_same_launches_and_depthwise_calls_settled():
    res = run_fake_script(_STEPS, ROOT)
    for amp in ("False", "True"):
        on, off = res[amp]["True"], res[amp]["False"]
        for a, b in zip(on, off):
            assert a["launches"] == b["launches"] and len(a["launches"]) > 0, amp
            assert a["layouts"] == b["layouts"], amp
        # the third step: the depthwise layers' calls never enter the full direct functions with the switch on
        assert on[2]["entered"] == {}, (amp, on[2]["entered"])
        if amp == "False":
            assert sum(off[2]["entered"].values()) >= 12, off[2]["entered"]
