"""Host round 25b's seen paths (docs/host_overhead.md round 25b), on the CPU: the GPU path under
tools/record_launches.py's fake CuPy (launches recorded with null pointers, never run) in a subprocess.  Each scenario
runs with its switch on and off, three calls each; the third call's launches, the node it records (every field the
full path's apply sets), the output's autograd fields, the backward's launches and the gradient's layout must be the
same, and with the switch on the third call reaches the full path only where it must.

- average pooling and uniform adaptive pooling (``pooling.AVGPOOL_FAST``): AvgPool.apply and the first-order
  AvgPoolBackward.forward skipped on a remembered signature; anomaly mode, a cleared primitive table, channels-last
  backward, create_graph, unbatched input and non-uniform bins keep the full path; bad settings after seen calls
  raise the full path's errors;
- the activations' first-order backward (``backend.activation.BWD_SEEN``): activation_backward's key and the handle
  skipped; create_graph (ActivationGrad recorded) and a cleared primitive table keep the full path;
- relu after batch norm (``nn._functions.activation.FUSED_DIRECT``): the producer's fusion rule asked directly; the
  fused node's fields, the declined (hooked) case's plain node, an integer input's integer path."""
import pathlib
import textwrap

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_COMMON = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.autograd as AG
    from minidnn.backend import pooling as P
    from minidnn.backend import activation as PA
    from minidnn.nn import functional as F
    from minidnn.nn._functions import pooling as PL
    from minidnn.nn._functions import activation as NA
    from minidnn.ops import activation as OA
    from minidnn.nn._functions import norm as N
    AG._check_anomaly = lambda *a, **k: None

    calls = collections.Counter()
    def count(owner, name, key, static=False, cm=False):
        real = getattr(owner, name)
        real = real.__func__ if cm else real
        def counted(*a, **k):
            calls[key] += 1
            return real(*a, **k)
        setattr(owner, name, classmethod(counted) if cm else staticmethod(counted) if static else counted)

    def edge(e):
        return None if e is None else [getattr(e[0], "_fn_cls", type(e[0])).__name__, e[1]]

    FIELDS = ("desc", "x_shape", "dtype", "channels_last", "eps", "stats")
    def node(y):
        c = y.grad_fn
        if c is None:
            return None
        d = dict(cls=getattr(c, "_fn_cls", type(c)).__name__, need=list(c.needs_input_grad),
                 edges=[edge(e) for e in c.next_edges], meta=repr(getattr(c, "_input_meta", None)),
                 n=getattr(c, "_n_inputs", None), out=repr(getattr(c, "_out_meta", None)),
                 num=getattr(c, "num_outputs", None), name=c.name(), nr=y.output_nr, rg=y.requires_grad,
                 shape=list(y.shape), dtype=str(y.dtype), strides=list(y.data.strides), version=y._version,
                 hooks=y._hooks, saved=[type(s).__name__ for s in (getattr(c, "saved", None) or ())],
                 versions=list(getattr(c, "versions", None) or ()))
        for f in FIELDS:
            if f in getattr(c, "__dict__", ()):
                v = getattr(c, f)
                d[f] = repr(v) if f != "stats" else [list(a.shape) for a in v]
        return d

    def grad_fields(t):
        g = t.grad
        return None if g is None else [list(g.shape), str(g.dtype), list(g.data.strides)]
""")

_POOL = _COMMON + textwrap.dedent("""
    count(PL.AvgPool, "apply", "apply", cm=True)
    count(PL.AvgPoolBackward, "forward", "bwd_full", static=True)

    def scenario(name, on):
        PL.AVGPOOL_FAST[0] = on
        for t in (PL._AVGPOOL_SEEN, PL._AVGPOOL_BWD_SEEN, PL._SEEN_ADAPTIVE, PL._SEEN_POOL, P._SEEN):
            t.clear()
        mdn.manual_seed(0)
        out = {{}}
        for i in range(3):
            shape = (6, 5, 5) if name == "unbatched" else (4, 6, 5, 5) if name == "bins" else (4, 6, 4, 4)
            leaf = mdn.randn(*shape).to("cuda")
            if name == "cl":
                leaf = leaf.to(memory_format=mdn.channels_last)
            if name == "bf16":
                leaf = leaf.to(mdn.bfloat16)
            leaf.requires_grad_(name != "nograd")
            x = leaf if name == "leaf" else leaf * 1.0
            if name == "cleared" and i == 2:
                P._SEEN.clear()
            if i == 2:
                recs.clear(); calls.clear()
            if name == "avg2d":
                f = lambda: F.avg_pool2d(x, 2)
            elif name == "out2":
                f = lambda: F.adaptive_avg_pool2d(x, (2, 2))
            elif name == "bins":
                f = lambda: F.adaptive_avg_pool2d(x, 2)
            elif name == "max":
                f = lambda: F.adaptive_max_pool2d(x, 1)
            else:
                f = lambda: F.adaptive_avg_pool2d(x, 1)
            if name == "no_grad_mode":
                with mdn.no_grad():
                    y = f()
            elif name == "anomaly" and i == 2:
                with mdn.autograd.detect_anomaly():
                    y = f()
            else:
                y = f()
            if i == 2:
                out["fwd_launches"] = [list(r) for r in recs]
                out["node"] = node(y)
                out["plain"] = [y.requires_grad, y.grad_fn is None, str(y.dtype), list(y.shape),
                                list(y.data.strides)]
                recs.clear()
            if y.requires_grad:
                g = mdn.randn(*y.shape).to("cuda").to(y.dtype)
                if name == "create_graph":
                    (gx,) = mdn.autograd.grad(y, leaf, g, create_graph=True)
                    out["grad"] = [list(gx.shape), gx.requires_grad, list(gx.data.strides)]
                else:
                    y.backward(g)
                    out["grad"] = grad_fields(leaf)
                if i == 2:
                    out["bwd_launches"] = [list(r) for r in recs]
            if i == 2:
                out["calls"] = dict(calls)
        return out

    res = {{}}
    names = ("plain", "leaf", "nograd", "no_grad_mode", "cl", "bf16", "avg2d", "out2", "bins", "max", "unbatched",
             "anomaly", "cleared", "create_graph")
    for name in names:
        res[name] = [scenario(name, True), scenario(name, False)]

    errs = {{}}
    for on in (True, False):
        PL.AVGPOOL_FAST[0] = on
        for t in (PL._AVGPOOL_SEEN, PL._AVGPOOL_BWD_SEEN, PL._SEEN_ADAPTIVE, PL._SEEN_POOL, P._SEEN):
            t.clear()
        x = mdn.randn(4, 6, 4, 4).to("cuda").requires_grad_()
        for _ in range(3):
            F.adaptive_avg_pool2d(x, 1)
        got = []
        for args in ((x, 0), (x, (1, 1, 1)), (mdn.randn(4, 6, 4).to("cuda"), 1), (x.data, 1),
                     (mdn.randn(4, 6, 4, 4).to("cuda").long(), 1)):
            try:
                F.adaptive_avg_pool2d(*args)
                got.append(None)
            except Exception as e:
                got.append([type(e).__name__, str(e)])
        errs[str(on)] = got
    print("RESULT" + json.dumps(dict(res=res, errs=errs)))
""")


def test_seen_average_pooling_same_launches_nodes_backward_and_errors():
    out = run_fake_script(_POOL, ROOT)
    res = out["res"]
    for name, (on, off) in res.items():
        assert {k: v for k, v in on.items() if k != "calls"} == {k: v for k, v in off.items() if k != "calls"}, name
        assert on["fwd_launches"] or name == "bins", name       # (bins: Tensor ops, CuPy operations unrecorded)
    full = {"apply": 1, "bwd_full": 1}
    for name in ("plain", "leaf", "bf16", "avg2d", "out2"):
        assert res[name][1]["calls"] == full, name                  # off: apply and the backward's full forward
        assert res[name][0]["calls"] == {}, name                    # on: neither
        assert res[name][0]["bwd_launches"], name
    assert res["plain"][0]["node"]["cls"] == "AvgPool" and res["plain"][0]["node"]["channels_last"] == "False"
    for name in ("nograd", "no_grad_mode"):
        assert res[name][0]["node"] is None and res[name][0]["calls"] == {}, name
    assert res["cl"][0]["calls"] == {"bwd_full": 1}                 # channels-last backward: the full path
    assert res["cl"][0]["node"]["channels_last"] == "True"
    for name in ("anomaly", "cleared", "bins", "unbatched"):
        assert res[name][0]["calls"].get("apply", 0) == res[name][1]["calls"].get("apply", 0), name
    assert res["anomaly"][0]["calls"] == {"apply": 1}         # (the backward records no trace: served seen)
    assert res["cleared"][0]["calls"] == full                    # the table cleared: both learnt again
    assert res["bins"][0]["calls"] == {} and res["bins"][1]["calls"] == {}      # non-uniform bins: Tensor ops
    assert res["unbatched"][0]["calls"] == {"apply": 1}      # forward: the full path; its node's backward: seen
    assert res["create_graph"][0]["calls"] == {"bwd_full": 1}    # AvgPoolBackward.apply: differentiable again
    errs = out["errs"]
    assert errs["True"] == errs["False"], errs
    assert None not in (errs["True"][0], errs["True"][3], errs["True"][4]), errs    # (the others are valid calls)


_ACT = _COMMON + textwrap.dedent("""
    count(mdn.backend, "activation_backward", "prim_bwd")      # (ops' binding: B.activation_backward)
    count(OA, "relu", "ops_relu")
    NA._ops_relu = OA.relu

    def bwd_scenario(name, on):
        PA.BWD_SEEN[0] = on
        PA._BWD_SIGS.clear(); PA._SEEN.clear()
        mdn.manual_seed(0)
        out = {{}}
        for i in range(3):
            leaf = mdn.randn(4, 6, 5, 5).to("cuda")
            if name == "cl":
                leaf = leaf.to(memory_format=mdn.channels_last)
            if name == "bf16":
                leaf = leaf.to(mdn.bfloat16)
            leaf.requires_grad_()
            x = leaf * 1.0
            y = F.silu(x) if name == "silu" else F.relu(x)
            g = mdn.randn(*y.shape).to("cuda").to(y.dtype)
            if name in ("g_cl", "cl"):      # g_cl: x NCHW, dy channels-last -- the kernels refuse (reference)
                g = g.to(memory_format=mdn.channels_last)
            if name == "cleared" and i == 2:
                PA._SEEN.clear()
            if i == 2:
                recs.clear(); calls.clear()
            if name == "create_graph":
                (gx,) = mdn.autograd.grad(y, leaf, g, create_graph=True)
                out["grad"] = [list(gx.shape), gx.requires_grad, gx.grad_fn is not None]
            else:
                y.backward(g)
                out["grad"] = grad_fields(leaf)
            if i == 2:
                out["bwd_launches"] = [list(r) for r in recs]
                out["calls"] = dict(calls)
        return out

    def fused_scenario(name, on):
        NA.FUSED_DIRECT[0] = on
        N.TWIN[0] = False       # batch norm's twin would serve relu with no launch (its own tests: test_bn_twin*.py)
        mdn.manual_seed(0)
        bn = mdn.nn.BatchNorm2d(6).to("cuda")
        out = {{}}
        for i in range(3):
            x = mdn.randn(4, 6, 5, 5).to("cuda").requires_grad_()
            y = bn(x)
            if name == "hooked":
                y.register_hook(lambda gr: None)    # a hook on batch norm's output: the rule declines
            if i == 2:
                recs.clear(); calls.clear()
            r = F.relu(y)
            if i == 2:
                out["fwd_launches"] = [list(rr) for rr in recs]
                out["node"] = node(r)
                out["bypassed"] = [type(b).__name__ for b in (getattr(r.grad_fn, "bypassed", None) or ())]
                out["calls"] = dict(calls)
                recs.clear()
                r.backward(mdn.randn(*r.shape).to("cuda"))
                out["bwd_launches"] = [list(rr) for rr in recs]
                out["grad"] = [grad_fields(x), grad_fields(bn.weight), grad_fields(bn.bias)]
        # an integer input with a node-less producer path: ops' integer relu either way
        k = F.relu(mdn.tensor([[-1, 2]]).to("cuda"))
        out["int"] = [str(k.dtype), k.grad_fn is None]
        return out

    res = {{}}
    for name in ("plain", "cl", "bf16", "g_cl", "silu", "cleared", "create_graph"):
        res[name] = [bwd_scenario(name, True), bwd_scenario(name, False)]
    fres = {{}}
    for name in ("plain", "hooked"):
        fres[name] = [fused_scenario(name, True), fused_scenario(name, False)]
    print("RESULT" + json.dumps(dict(res=res, fres=fres)))
""")


def test_seen_activation_backward_and_fused_relu_direct():
    out = run_fake_script(_ACT, ROOT)
    res = out["res"]
    for name, (on, off) in res.items():
        assert on["bwd_launches"] == off["bwd_launches"] and on["grad"] == off["grad"], name
        assert on["bwd_launches"] or name == "g_cl", name
        assert off["calls"].get("prim_bwd", 0) == 1, name
    for name in ("plain", "cl", "bf16", "silu"):
        assert res[name][0]["calls"].get("prim_bwd", 0) == 0, name      # the remembered plan, no primitive call
    assert res["g_cl"][0]["calls"]["prim_bwd"] == 1                     # the reference ran: never remembered
    assert res["cleared"][0]["calls"]["prim_bwd"] == 1
    assert res["create_graph"][0]["calls"]["prim_bwd"] == 1 and res["create_graph"][0]["grad"][2] is True
    fres = out["fres"]
    for name, (on, off) in fres.items():
        assert {k: v for k, v in on.items() if k != "calls"} == {k: v for k, v in off.items() if k != "calls"}, name
        assert on["fwd_launches"] and on["bwd_launches"], name
    assert fres["plain"][0]["node"]["cls"] == "BatchNormReLU" and fres["plain"][0]["bypassed"]
    assert fres["plain"][0]["calls"].get("ops_relu", 0) == 0 and fres["plain"][1]["calls"]["ops_relu"] == 1
    assert fres["hooked"][0]["node"]["cls"] == "Activation"
    assert fres["plain"][0]["int"] == ["int64", True]
