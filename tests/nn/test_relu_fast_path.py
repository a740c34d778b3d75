"""F.relu of a GPU tensor on a remembered signature (nn/_functions/activation.py ``_relu_remembered``,
docs/host_overhead.md round 20), on the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded
with null pointers, never run) in a subprocess.  Each scenario runs with the shortcut on and off, three calls each;
the third call's launches (kernel, options, grid, block, packed arguments), the node it records (every field
Function.apply sets on an Activation ctx, the saved tensor's identity and version), the output's autograd fields and
the backward's launches must be the same, and with the shortcut on the third call reaches no activation primitive
where it applies -- and does reach it where it must not apply (a fusing producer, anomaly mode, a cleared primitive
table, an integer tensor).  The values on a GPU: test_relu_fast_path_cuda.py."""
import pathlib
import textwrap

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.autograd as AG
    import minidnn.backend as B
    from minidnn.backend import activation as P
    from minidnn.nn import functional as F
    from minidnn.nn._functions import activation as A
    AG._check_anomaly = lambda *a, **k: None

    calls = collections.Counter()
    real = B.activation_forward
    def counted(*a, **k):
        calls["fwd"] += 1
        return real(*a, **k)
    B.activation_forward = counted

    def edge(e):
        return None if e is None else [getattr(e[0], "_fn_cls", type(e[0])).__name__, e[1]]

    def node(y, x):
        c = y.grad_fn
        if c is None:
            return None
        return dict(cls=getattr(c, "_fn_cls", type(c)).__name__, need=list(c.needs_input_grad),
                    edges=[edge(e) for e in c.next_edges], meta=repr(c._input_meta), n=c._n_inputs,
                    out=repr(c._out_meta), num=c.num_outputs, desc=repr(getattr(c, "desc", None)),
                    saved_is_x=[s is x for s in c.saved], versions=list(c.versions), nr=y.output_nr,
                    rg=y.requires_grad, shape=list(y.shape), dtype=str(y.dtype), name=c.name())

    def scenario(name, on):
        A.RELU_FAST[0] = on
        A._RELU_SEEN.clear()
        P._SEEN.clear()
        mdn.manual_seed(0)
        out = {{}}
        for i in range(3):
            if i == 2:
                recs.clear(); calls.clear()
            x = mdn.randn(4, 6, 5, 7).to("cuda")
            if name == "leaf":
                x.requires_grad_(); src = x
            elif name == "nograd":
                src = x
            elif name == "no_grad_mode":
                x.requires_grad_(); src = x
            elif name == "cl":
                x = x.to(memory_format=mdn.channels_last).requires_grad_(); src = x
            elif name == "bf16":
                x = x.to(mdn.bfloat16).requires_grad_(); src = x
            elif name == "conv":
                w = mdn.randn(6, 6, 3, 3).to("cuda").requires_grad_()
                x.requires_grad_(); src = F.conv2d(x, w, padding=1)
            elif name == "bn":
                bn = mdn.nn.BatchNorm2d(6).to("cuda")
                x.requires_grad_(); src = bn(x)
            elif name == "int":
                src = mdn.tensor(np.arange(24).reshape(2, 12) - 12).to("cuda")
            if i == 2 and name == "anomaly":
                pass
            if name == "anomaly":
                x.requires_grad_(); src = x
            if name == "cleared" and i == 2:
                P._SEEN.clear()
            if name == "cleared":
                x.requires_grad_(); src = x
            if i == 2:
                recs.clear(); calls.clear()
            if name == "no_grad_mode":
                with mdn.no_grad():
                    y = F.relu(src)
            elif name == "anomaly" and i == 2:
                with mdn.autograd.detect_anomaly():
                    y = F.relu(src)
            else:
                y = F.relu(src)
            if i == 2:
                out["fwd_launches"] = [list(r) for r in recs]
                out["primitive_calls"] = calls["fwd"]
                out["node"] = node(y, src)
                out["plain"] = [y.requires_grad, y.grad_fn is None, str(y.dtype), list(y.shape)]
                if y.requires_grad:
                    recs.clear()
                    y.backward(mdn.ones_like(y))
                    out["bwd_launches"] = [list(r) for r in recs]
                    out["grad"] = None if x.grad is None else [list(x.grad.shape), str(x.grad.dtype)]
        return out

    res = {{}}
    for name in ("leaf", "nograd", "no_grad_mode", "cl", "bf16", "conv", "bn", "int", "anomaly", "cleared"):
        res[name] = [scenario(name, True), scenario(name, False)]

    # after a cleared primitive table and kernel plans (a changed kernel setting: a new plan object), the full-path
    # call learns the plan again: the next call is served remembered
    from minidnn.backend.cuda import act_kernels as K
    A.RELU_FAST[0] = True
    A._RELU_SEEN.clear()
    P._SEEN.clear()
    x = mdn.randn(4, 6, 5, 7).to("cuda").requires_grad_()
    relearn = []
    for i in range(5):
        if i == 2:
            P._SEEN.clear()
            K._plans.clear()
        calls.clear()
        F.relu(x)
        relearn.append(calls["fwd"])
    res["relearn"] = relearn
    print("RESULT" + json.dumps(res))
""")


def _run():
    return run_fake_script(_SCRIPT, ROOT)


def test_remembered_relu_same_launches_nodes_and_backward():
    res = _run()
    # learnt on call 0, served on 1, the cleared table re-validated on 2 (and learnt again), served on 3 and 4
    assert res.pop("relearn") == [1, 0, 1, 0, 0]
    for name, (on, off) in res.items():
        assert on == {**off, "primitive_calls": on["primitive_calls"]}, name
        assert off["primitive_calls"] == (0 if name == "int" else 1), name
    # served by the remembered call: no primitive reached on the third call
    for name in ("leaf", "nograd", "no_grad_mode", "cl", "bf16", "conv"):
        on, off = res[name]
        assert on["primitive_calls"] == 0, name
        assert on["fwd_launches"] and on["fwd_launches"] == off["fwd_launches"], name
    assert res["leaf"][0]["node"]["cls"] == "Activation" and res["leaf"][0]["node"]["saved_is_x"] == [True]
    assert res["leaf"][0]["bwd_launches"] and res["conv"][0]["bwd_launches"]
    assert res["nograd"][0]["node"] is None and res["no_grad_mode"][0]["node"] is None
    # where it must not apply, the full path ran (and recorded what it records)
    assert res["bn"][0]["node"]["cls"] != "Activation"          # the producer's fusion rule fused it
    for name in ("bn", "anomaly", "cleared"):
        assert res[name][0]["primitive_calls"] == res[name][1]["primitive_calls"], name
    assert res["anomaly"][0]["primitive_calls"] == 1 and res["cleared"][0]["primitive_calls"] == 1
    assert res["int"][0]["node"] is None and res["int"][0]["primitive_calls"] == 0
