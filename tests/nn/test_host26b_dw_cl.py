"""conv_dw_nhwc's channels-last depthwise route settled (conv_igemm.settle_direct_cl with ``DW_CL_SETTLE``,
docs/host_overhead.md round 26b), on the CPU: the GPU path under tools/record_launches.py's fake CuPy in a
subprocess (null pointers: every base aligned).

A depthwise convolution of channels-last activations settled in the NHWC format (nn's fast path: ``first`` on the
channels-first views) makes the launches of the full direct_* functions and returns a result of the same shape,
dtype and strides, forward, backward data (stride 1: the flipped forward kernel; strided: the gather kernel) and
backward filter (a float32 dw of bfloat16 data too, and into a given slot); what it reads per call is honoured --
conv_dw_nhwc switched off after settling, its V2 kernels flipped, a plan it declines: the full function's other
route, the same launches as the full path then.  Off, nothing of this is settled.  The switch is part of
``settled_state``.  MobileNet-small's channels-last fake steps (fp32, bf16 autocast) launch the same kernels with the
switch on and off, and on, no depthwise call of the third step asks conv_dw_nhwc.supports (the full functions')."""
import pathlib
import textwrap

import pytest

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.backend as B
    import minidnn.backend.convolution as BC
    from minidnn.backend.cuda import conv_igemm as CI, conv_dw_nhwc as DWN

    _acont = fakecp.ascontiguousarray       # a copy launch on a GPU where its input is not C-contiguous
    def acont(a, *args, **kw):
        if not a.flags.c_contiguous:
            recs.append(("cupy:copy (ascontiguousarray)", [], ""))
        return _acont(a, *args, **kw)
    fakecp.ascontiguousarray = acont

    def nhwc(shape, dtype=np.float32):
        n, c, h, w = shape
        a = np.random.default_rng(0).standard_normal((n, h, w, c)).astype(np.float32).astype(dtype)
        return fakecp.asarray(a)             # NHWC memory in NHWC index order

    def cf(a):
        return a.transpose(0, 3, 1, 2)

    def fields(r):
        return [list(r.shape), str(r.dtype), list(r.strides)]

    def case(x_shape, k, pad=1, stride=1, dtype=np.float32, dw_dtype=None, into=False, tweak=None, w_view=False,
             dil=1):
        c = x_shape[1]
        desc = B.ConvolutionDescriptor((pad, pad), (stride, stride), (dil, dil), groups=c)
        w = fakecp.asarray(np.random.default_rng(1).standard_normal((c, 1, k + 1, k)).astype(np.float32).astype(dtype))
        w = w[:, :, :k] if w_view else fakecp.ascontiguousarray(w[:, :, :k])   # w_view: not contiguous (copies)
        x = nhwc(x_shape, dtype)
        y = B.convolution_forward(None, x, w, desc, format="NHWC")
        dy = nhwc(cf(y).shape, dtype)
        out = {{}}
        for d, (a1, a2, other) in enumerate(((x, w, None), (w, dy, x.shape), (x, dy, w.shape))):
            row = {{}}
            for on in (True, False):
                CI.DW_CL_SETTLE[0] = on
                s = BC.settle_convolution(d, None, a1, a2, desc, other, "NHWC", dw_dtype if d == 2 else None)
                if s is None:
                    row[str(on)] = None
                    continue
                saved = (DWN.ENABLED[0], DWN.V2[0], DWN._gather_plan, DWN._wgrad_plan)
                if tweak == "disabled":
                    DWN.ENABLED[0] = False
                elif tweak == "v2_flip":
                    DWN.V2[0] = not DWN.V2[0]
                elif tweak == "no_plan":
                    DWN._gather_plan = DWN._wgrad_plan = lambda *a, **k: None
                    DWN._fwd_plans.clear(); DWN._dgrad_plans.clear(); DWN._wgrad_plans.clear()
                extra = {{}} if d != 2 or dw_dtype is None else {{"dw_dtype": dw_dtype}}
                full = (B.convolution_forward, B.convolution_backward_data, B.convolution_backward_filter)[d]
                recs.clear()
                r_full = full(None, a1, a2, desc, *([] if d == 0 else [other]), format="NHWC", **extra)
                l_full = [list(r) for r in recs]
                r_full = r_full if d == 2 else cf(r_full)       # the channels-first view nn makes
                recs.clear()
                slot = fakecp.empty(w.shape, dtype=r_full.dtype) if d == 2 and into else None
                fa = a1 if d == 1 else cf(a1)
                fb = a2 if d == 0 else cf(a2)
                r_set = s.first(fa, fb, None, slot)
                l_set = [list(r) for r in recs]
                DWN.ENABLED[0], DWN.V2[0], DWN._gather_plan, DWN._wgrad_plan = saved
                if tweak == "no_plan":
                    DWN._fwd_plans.clear(); DWN._dgrad_plans.clear(); DWN._wgrad_plans.clear()
                row[str(on)] = dict(settled=s.direct is not None, same=l_full == l_set, n=len(l_set),
                                    kernels=[r[0].split("(")[0][:40] for r in l_set],
                                    fields=[fields(r_full), fields(r_set)], into=slot is not None and r_set is slot)
            out[d] = row
        CI.DW_CL_SETTLE[0] = True
        return out

    res = {{}}
    res["s1"] = case((8, 16, 16, 16), 3)
    res["s2"] = case((8, 32, 16, 16), 3, stride=2)
    res["s2_odd"] = case((4, 16, 15, 15), 3, stride=2)
    res["k5"] = case((4, 16, 12, 12), 5, pad=2)
    res["dil2"] = case((4, 16, 12, 12), 3, pad=2, dil=2)
    res["bf16"] = case((8, 32, 16, 16), 3, dtype=mdn.bfloat16)
    res["bf16_s2"] = case((8, 32, 16, 16), 3, stride=2, dtype=mdn.bfloat16)
    res["bf16_wide"] = case((8, 32, 16, 16), 3, dtype=mdn.bfloat16, dw_dtype=np.float32)
    res["into"] = case((8, 16, 16, 16), 3, stride=2, into=True)
    res["disabled"] = case((8, 16, 16, 16), 3, tweak="disabled")
    res["v2_flip"] = case((8, 16, 16, 16), 3, stride=2, tweak="v2_flip")
    res["no_plan"] = case((8, 16, 16, 16), 3, tweak="no_plan")
    res["w_view"] = case((8, 16, 16, 16), 3, w_view=True)
    res["w_view_no_plan"] = case((8, 16, 16, 16), 3, stride=2, tweak="no_plan", w_view=True)
    res["odd_channels"] = case((8, 6, 16, 16), 3)        # not whole vectors: conv_dw_nhwc declines, nothing settled

    st = BC.settled_state()
    CI.DW_CL_SETTLE[0] = False
    res["state_differs"] = BC.settled_state() != st
    CI.DW_CL_SETTLE[0] = True
    print("RESULT" + json.dumps(res))
""")

_STEPS = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    from minidnn.backend.cuda import conv_igemm as CI, conv_dw_nhwc as DWN
    from minidnn.nn import functional as F
    fakecp.cuda.Stream = __import__("types").SimpleNamespace
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    entered = collections.Counter()
    real_supports = DWN.supports
    def counted(direction, *a, **k):
        entered[direction] += 1
        return real_supports(direction, *a, **k)
    DWN.supports = counted

    def steps(on, amp):
        CI.DW_CL_SETTLE[0] = on
        mdn.manual_seed(0)
        m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda").to(memory_format=mdn.channels_last)
        opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        x = mdn.randn(8, 3, 32, 32).to("cuda").to(memory_format=mdn.channels_last)
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
    CI.DW_CL_SETTLE[0] = True
    print("RESULT" + json.dumps(res))
""")

CASES = ["s1", "s2", "s2_odd", "k5", "dil2", "bf16", "bf16_s2", "bf16_wide", "into", "disabled", "v2_flip", "no_plan",
         "w_view", "w_view_no_plan"]


@pytest.fixture(scope="module")
def res():
    return run_fake_script(_SCRIPT, ROOT)


@pytest.mark.parametrize("name", CASES)
def test_settled_channels_last_depthwise_launches_as_the_full_path(res, name):
    for d in ("0", "1", "2"):
        on, off = res[name][d]["True"], res[name][d]["False"]
        assert on is not None and off is not None, (name, d)
        for r in (on, off):
            assert r["same"] and r["n"] > 0, (name, d, r)
            assert r["fields"][0] == r["fields"][1], (name, d, r)
        assert on["settled"] and not off["settled"], (name, d)
        assert on["kernels"] == off["kernels"], (name, d)
        if name not in ("disabled", "no_plan", "w_view_no_plan"):     # conv_dw_nhwc's kernels themselves
            assert all(k.startswith("dwn_") for k in on["kernels"] if not k.startswith("cupy")), (name, d, on)
        else:                                        # the full function's other route
            assert not any(k.startswith("dwn_") for k in on["kernels"]), (name, d, on)
    assert res["into"]["2"]["True"]["into"] and res["into"]["2"]["False"]["into"]


def test_what_conv_dw_nhwc_declines_is_not_settled(res):
    for d in ("0", "1", "2"):
        r = res["odd_channels"][d]["True"]
        assert r is None or (not r["settled"] and r["same"]), (d, r)
    assert res["state_differs"]


def test_mobilenet_channels_last_steps_same_launches_and_settled():
    out = run_fake_script(_STEPS, ROOT)
    for amp in ("False", "True"):
        on, off = out[amp]["True"], out[amp]["False"]
        for a, b in zip(on, off):
            assert a["launches"] == b["launches"] and len(a["launches"]) > 0, amp
            assert a["layouts"] == b["layouts"], amp
        assert on[2]["entered"] == {}, (amp, on[2]["entered"])
        assert sum(off[2]["entered"].values()) >= 12, off[2]["entered"]
