"""ConvForward.apply on a settled conv signature (nn/_functions/conv.py ``_apply_seen``, docs/host_overhead.md round
24), on the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded with null pointers, never
run; NumPy computes what the fake can) in a subprocess.  Each scenario runs with the shortcut on and off, three calls
each; the third call's launches, the node it records (every field Function.apply sets on a ConvForward ctx and what
ConvForward.forward keeps), the output's autograd fields, the backward's launches and the gradients must be the same;
with the shortcut on, the third call reaches Function.apply only in anomaly mode.  A bias of another array type after
settled calls, or a weight or bias on another GPU (the fake's pointer object says GPU 1), raises apply's device
error either way."""
import pathlib
import textwrap

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.autograd as AG
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    AG._check_anomaly = lambda *a, **k: None

    applies = collections.Counter()
    real_apply = C.ConvForward.apply.__func__
    def counted(cls, *a, **k):
        applies["n"] += 1
        return real_apply(cls, *a, **k)
    C.ConvForward.apply = classmethod(counted)

    def edge(e):
        return None if e is None else [getattr(e[0], "_fn_cls", type(e[0])).__name__, e[1]]

    def node(y, args):
        c = y.grad_fn
        if c is None:
            return None
        return dict(cls=getattr(c, "_fn_cls", type(c)).__name__, need=list(c.needs_input_grad),
                    edges=[edge(e) for e in c.next_edges], meta=repr(c._input_meta), n=c._n_inputs,
                    out=repr(c._out_meta), num=c.num_outputs, name=c.name(),
                    saved=[[s is a for a in args] if s is not None else None for s in c.saved],
                    versions=list(c.versions), shapes=repr(c.shapes), dw=repr(c.dw_dtype),
                    db=repr(getattr(c, "db_dtype", "-")), seen=c.seen is not None, nr=y.output_nr,
                    rg=y.requires_grad, shape=list(y.shape), dtype=str(y.dtype), strides=list(y.data.strides))

    def arr(t):
        return None if t is None else np.asarray(t.data, dtype=np.float64).round(4).tolist()

    def scenario(name, on):
        C.SEEN_APPLY[0] = on
        C._FAST_CONV.clear(); C._SEEN_CONV.clear()
        mdn.manual_seed(0)
        conv = mdn.nn.Conv2d(3, 4, 3, padding=1, bias=name != "no_bias").to("cuda")
        if name == "frozen_w":
            conv.weight.requires_grad_(False)
        if name == "frozen_b":
            conv.bias.requires_grad_(False)
        if name == "cl":
            conv.to(memory_format=mdn.channels_last)
        out = {{}}
        for i in range(3):
            for p in conv.parameters():
                p.grad = None
            leaf = mdn.randn(2, 3, 6, 5).to("cuda").requires_grad_(name != "x_nograd")
            if name == "cl":
                leaf = leaf.to(memory_format=mdn.channels_last).detach().requires_grad_()
            x = leaf * 1.0 if name != "x_leaf" else leaf
            if i == 2:
                recs.clear(); applies.clear()
            if name == "no_grad_mode":
                with mdn.no_grad():
                    y = conv(x)
            elif name == "bf16":
                with mdn.autocast("cuda", dtype=mdn.bfloat16):
                    y = conv(x)
            elif name == "anomaly" and i == 2:
                with mdn.autograd.detect_anomaly():
                    y = conv(x)
            else:
                y = conv(x)
            if i == 2:
                out["fwd_launches"] = [list(r) for r in recs]
                out["applies"] = applies["n"]
                out["node"] = node(y, (x, conv.weight, conv.bias))
                out["plain"] = [y.requires_grad, y.grad_fn is None, str(y.dtype), list(y.shape)]
                if y.requires_grad:
                    recs.clear()
                    g = mdn.randn(*y.shape).to("cuda").to(y.dtype)
                    y.backward(g)
                    out["bwd_launches"] = [list(r) for r in recs]
                    out["grads"] = [None if leaf.grad is None else list(leaf.grad.shape),
                                    None if conv.weight.grad is None else list(conv.weight.grad.shape),
                                    None if conv.bias is None or conv.bias.grad is None else arr(conv.bias.grad)]
        return out

    res = {{}}
    names = ("all", "frozen_w", "frozen_b", "no_bias", "x_leaf", "x_nograd", "no_grad_mode", "bf16", "cl", "anomaly")
    for name in names:
        res[name] = [scenario(name, True), scenario(name, False)]

    errs = {{}}
    for on in (True, False):
        C.SEEN_APPLY[0] = on
        C._FAST_CONV.clear(); C._SEEN_CONV.clear()
        conv = mdn.nn.Conv2d(3, 4, 3).to("cuda")
        x = mdn.randn(2, 3, 6, 5).to("cuda").requires_grad_()
        for _ in range(3):
            conv(x)
        got = []
        D = sys.modules["minidnn.backend.devices"]
        D.cuda_device_count = lambda: 2                 # a second fake GPU: the device errors name cuda:1
        w1 = conv.weight.detach().clone().requires_grad_()
        w1.data.data.device_id = 1                      # the fake's pointer object: this weight on GPU 1
        b1 = conv.bias.detach().clone().requires_grad_()
        b1.data.data.device_id = 1
        for args in ((x, conv.weight, mdn.randn(4)),    # a NumPy (CPU) bias with GPU x and w
                     (x, w1, conv.bias), (x, conv.weight, b1)):
            try:
                F.conv2d(*args)
                got.append(None)
            except Exception as e:
                got.append([type(e).__name__, str(e)])
        errs[str(on)] = got
    print("RESULT" + json.dumps(dict(res=res, errs=errs)))
""")


def test_seen_conv_apply_same_launches_nodes_backward_and_errors():
    out = run_fake_script(_SCRIPT, ROOT)
    res = out["res"]
    for name, (on, off) in res.items():
        assert on == {**off, "applies": on["applies"]}, name
        assert off["applies"] == 1, name
        assert on["fwd_launches"] and on["fwd_launches"] == off["fwd_launches"], name
    for name in ("all", "frozen_w", "frozen_b", "no_bias", "x_leaf", "x_nograd", "no_grad_mode", "bf16", "cl"):
        assert res[name][0]["applies"] == 0, name        # recorded by the seen call, not apply
        assert res[name][0]["node"] is None or res[name][0]["node"]["seen"], name
    assert res["anomaly"][0]["applies"] == 1
    assert res["all"][0]["node"]["need"] == [True, True, False, True] and res["all"][0]["node"]["n"] == 4
    assert res["no_bias"][0]["node"]["n"] == 3
    assert res["frozen_w"][0]["node"]["edges"][1] is None and res["frozen_b"][0]["node"]["edges"][3] is None
    assert res["no_grad_mode"][0]["node"] is None and res["all"][0]["bwd_launches"]
    errs = out["errs"]
    assert errs["True"] == errs["False"] and all(e is not None and "device" in e[1] for e in errs["True"]), errs
