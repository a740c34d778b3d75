"""F.cross_entropy of GPU tensors on a seen signature (nn/_functions/loss.py ``_ce_seen``, docs/host_overhead.md round
24), on the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded with null pointers, never
run; CuPy operations computed in NumPy) in a subprocess.  Each scenario runs with the shortcut on and off, three calls
each; the third call's launches, the node it records (every field CrossEntropy.apply sets), the loss's autograd
fields, the backward's launches and the gradient's layout must be the same; with the shortcut on, the third call
reaches CrossEntropy.apply only where it must (anomaly mode, the legacy size_average flag, unbatched input).  Bad
input after seen calls raises the full path's errors, the legacy flag warns at every call."""
import pathlib
import textwrap

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    import minidnn as mdn
    import minidnn.autograd as AG
    from minidnn.nn import functional as F
    from minidnn.nn._functions import loss as LS
    AG._check_anomaly = lambda *a, **k: None

    applies = collections.Counter()
    real_apply = LS.CrossEntropy.apply.__func__
    def counted(cls, *a, **k):
        applies["n"] += 1
        return real_apply(cls, *a, **k)
    LS.CrossEntropy.apply = classmethod(counted)

    def edge(e):
        return None if e is None else [getattr(e[0], "_fn_cls", type(e[0])).__name__, e[1]]

    def node(y):
        c = y.grad_fn
        if c is None:
            return None
        return dict(cls=getattr(c, "_fn_cls", type(c)).__name__, need=list(c.needs_input_grad),
                    edges=[edge(e) for e in c.next_edges], meta=repr(c._input_meta), n=c._n_inputs,
                    out=repr(c._out_meta), num=c.num_outputs, name=c.name(), widen=c.widen,
                    fused=c.fused is not None, versions=list(c.versions), nr=y.output_nr, rg=y.requires_grad,
                    shape=list(y.shape), dtype=str(y.dtype))

    def scenario(name, on):
        LS.CE_FAST[0] = on
        LS._CE_SEEN.clear()
        mdn.manual_seed(0)
        out = {{}}
        for i in range(3):
            shape = (10,) if name == "unbatched" else (6, 10)
            leaf = mdn.randn(*shape).to("cuda").requires_grad_(name != "nograd")
            x = leaf * 1.0
            t = mdn.randint(0, 10, () if name == "unbatched" else (6,)).to("cuda")
            kw = {{}}
            if name == "weight":
                kw["weight"] = mdn.rand(10).to("cuda")
            if name == "options":
                kw.update(ignore_index=3, label_smoothing=0.1, reduction="sum")
            if name == "none":
                kw["reduction"] = "none"
            if name == "legacy":
                kw["size_average"] = False
            if i == 2:
                recs.clear(); applies.clear()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if name == "no_grad_mode":
                    with mdn.no_grad():
                        y = F.cross_entropy(x, t, **kw)
                elif name == "bf16":
                    with mdn.autocast("cuda", dtype=mdn.bfloat16):
                        y = F.cross_entropy(x.to(mdn.bfloat16), t, **kw)
                elif name == "anomaly" and i == 2:
                    with mdn.autograd.detect_anomaly():
                        y = F.cross_entropy(x, t, **kw)
                else:
                    y = F.cross_entropy(x, t, **kw)
            if i == 2:
                out["warned"] = len(caught)
                out["fwd_launches"] = [list(r) for r in recs]
                out["applies"] = applies["n"]
                out["node"] = node(y)
                out["plain"] = [y.requires_grad, y.grad_fn is None, str(y.dtype), list(y.shape)]
                if y.requires_grad:
                    recs.clear()
                    y.sum().backward()
                    out["bwd_launches"] = [list(r) for r in recs]
                    out["grad"] = [list(leaf.grad.shape), str(leaf.grad.dtype)]
        return out

    res = {{}}
    names = ("plain", "weight", "options", "none", "nograd", "no_grad_mode", "bf16", "anomaly", "legacy", "unbatched")
    for name in names:
        res[name] = [scenario(name, True), scenario(name, False)]

    errs = {{}}
    for on in (True, False):
        LS.CE_FAST[0] = on
        LS._CE_SEEN.clear()
        x = mdn.randn(6, 10).to("cuda").requires_grad_()
        t = mdn.randint(0, 10, (6,)).to("cuda")
        for _ in range(3):
            F.cross_entropy(x, t)
        got = []
        for args, kw in (((x, mdn.randint(0, 10, (5,)).to("cuda")), {{}}), ((x, t), dict(reduction="avg")),
                         ((x, t), dict(weight=mdn.rand(9).to("cuda"))), ((x, t), dict(label_smoothing=1.5)),
                         ((x, t.to(mdn.float32)), {{}})):
            try:
                F.cross_entropy(*args, **kw)
                got.append(None)
            except Exception as e:
                got.append([type(e).__name__, str(e)])
        errs[str(on)] = got
    print("RESULT" + json.dumps(dict(res=res, errs=errs)))
""")


def test_seen_cross_entropy_same_launches_nodes_backward_and_errors():
    out = run_fake_script(_SCRIPT, ROOT)
    res = out["res"]
    for name, (on, off) in res.items():
        assert on == {**off, "applies": on["applies"]}, name
        assert off["applies"] == 1, name
    for name in ("plain", "weight", "options", "none", "nograd", "no_grad_mode", "bf16"):
        assert res[name][0]["applies"] == 0, name       # served by the seen call
    for name in ("anomaly", "legacy", "unbatched"):
        assert res[name][0]["applies"] == 1, name       # the full path
    assert res["legacy"][0]["warned"] == 1
    assert res["plain"][0]["node"]["cls"] == "CrossEntropy" and res["plain"][0]["node"]["fused"]
    assert res["plain"][0]["fwd_launches"] and res["plain"][0]["bwd_launches"]
    assert res["bf16"][0]["node"]["widen"] and res["nograd"][0]["node"] is None
    errs = out["errs"]
    assert errs["True"] == errs["False"], errs
    assert all(e is not None for e in errs["True"][:4]), errs
