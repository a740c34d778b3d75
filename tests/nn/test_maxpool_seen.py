"""Max pooling of a GPU tensor on a seen signature (nn/_functions/pooling.py ``_max_pool_seen``, docs/host_overhead.md
round 24), on the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded with null pointers,
never run) in a subprocess.  Each scenario runs with the shortcut on and off, three calls each; the third call's
launches, the node it records (every field MaxPool.apply sets, the saved tensor's identity and version, the argmax
array's shape and dtype), the output's autograd fields and the backward's launches must be the same; with the
shortcut on the third call reaches MaxPool.apply only where it must (anomaly mode, a cleared primitive table -- the
signature learnt again --, kernels refusing the call: remembered as refused).  Bad
settings after seen calls raise the full path's errors."""
import pathlib
import textwrap

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.autograd as AG
    from minidnn.backend import pooling as P
    from minidnn.nn import functional as F
    from minidnn.nn._functions import pooling as PL
    AG._check_anomaly = lambda *a, **k: None

    applies = collections.Counter()
    real_apply = PL.MaxPool.apply.__func__
    def counted(cls, *a, **k):
        applies["n"] += 1
        return real_apply(cls, *a, **k)
    PL.MaxPool.apply = classmethod(counted)

    def edge(e):
        return None if e is None else [getattr(e[0], "_fn_cls", type(e[0])).__name__, e[1]]

    def node(y, x):
        c = y.grad_fn
        if c is None:
            return None
        return dict(cls=getattr(c, "_fn_cls", type(c)).__name__, need=list(c.needs_input_grad),
                    edges=[edge(e) for e in c.next_edges], meta=repr(c._input_meta), n=c._n_inputs,
                    out=repr(c._out_meta), num=c.num_outputs, desc=repr(c.desc), name=c.name(),
                    argmax=[list(c.argmax.shape), str(c.argmax.dtype), list(c.argmax.strides)],
                    saved_is_x=[s is x for s in c.saved], versions=list(c.versions), nr=y.output_nr,
                    rg=y.requires_grad, shape=list(y.shape), dtype=str(y.dtype), strides=list(y.data.strides),
                    version=y._version, hooks=y._hooks)

    real_supports = P.pool_kernels.supports

    def scenario(name, on):
        # unsupported: the kernels refuse every call (the primitive's CuPy reference runs): never remembered
        P.pool_kernels.supports = (lambda *a, **k: False) if name == "unsupported" else real_supports
        PL.MAXPOOL_FAST[0] = on
        PL._MAXPOOL_SEEN.clear(); PL._SEEN_POOL.clear(); P._SEEN.clear()
        mdn.manual_seed(0)
        out = {{}}
        for i in range(3):
            leaf = mdn.randn(4, 6, 9, 8).to("cuda")
            if name == "cl" or (name == "switch" and i == 2):      # switch: NCHW twice, then channels-last
                leaf = leaf.to(memory_format=mdn.channels_last)
            if name == "bf16":
                leaf = leaf.to(mdn.bfloat16)
            leaf.requires_grad_(name != "nograd")
            x = leaf if name == "leaf" else leaf * 1.0
            if name == "bumped":
                x.mul_(1.0)                 # x at version 1: the node saves that version
            if name == "cleared" and i == 2:
                P._SEEN.clear()
            if i == 2:
                recs.clear(); applies.clear()
            kw = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True) if name == "ceil" else \
                dict(kernel_size=3, dilation=2) if name == "dilated" else dict(kernel_size=2)
            if name == "no_grad_mode":
                with mdn.no_grad():
                    y = F.max_pool2d(x, **kw)
            elif name == "anomaly" and i == 2:
                with mdn.autograd.detect_anomaly():
                    y = F.max_pool2d(x, **kw)
            else:
                y = F.max_pool2d(x, **kw)
            if i == 2:
                out["fwd_launches"] = [list(r) for r in recs]
                out["applies"] = applies["n"]
                out["node"] = node(y, x)
                out["plain"] = [y.requires_grad, y.grad_fn is None, str(y.dtype), list(y.shape)]
                if y.requires_grad:
                    recs.clear()
                    y.backward(mdn.randn(*y.shape).to("cuda").to(y.dtype))
                    out["bwd_launches"] = [list(r) for r in recs]
                    out["grad"] = [list(leaf.grad.shape), str(leaf.grad.dtype), list(leaf.grad.data.strides)]
        return out

    res, neg = {{}}, {{}}
    names = ("plain", "leaf", "nograd", "no_grad_mode", "cl", "bf16", "ceil", "dilated", "bumped", "switch",
             "anomaly", "cleared", "unsupported")
    for name in names:
        on = scenario(name, True)
        neg[name] = [v is False for v in PL._MAXPOOL_SEEN.values()]     # what the on-run remembered
        res[name] = [on, scenario(name, False)]
    P.pool_kernels.supports = real_supports

    errs = {{}}
    for on in (True, False):
        PL.MAXPOOL_FAST[0] = on
        PL._MAXPOOL_SEEN.clear(); PL._SEEN_POOL.clear(); P._SEEN.clear()
        x = mdn.randn(4, 6, 9, 8).to("cuda").requires_grad_()
        for _ in range(3):
            F.max_pool2d(x, 2)
        got = []
        for args, kw in (((x, 2), dict(padding=2)), ((x, 0), {{}}), ((mdn.randn(6, 9).to("cuda"), 2), {{}})):
            try:
                F.max_pool2d(*args, **kw)
                got.append(None)
            except Exception as e:
                got.append([type(e).__name__, str(e)])
        errs[str(on)] = got
    print("RESULT" + json.dumps(dict(res=res, errs=errs, neg=neg)))
""")


def test_seen_max_pool_same_launches_nodes_backward_and_errors():
    out = run_fake_script(_SCRIPT, ROOT)
    res = out["res"]
    for name, (on, off) in res.items():
        assert on == {**off, "applies": on["applies"]}, name
        assert off["applies"] == 1, name
        assert on["fwd_launches"] == off["fwd_launches"], name
        assert on["fwd_launches"] or name == "unsupported", name     # (the reference: CuPy operations only)
    for name in ("plain", "leaf", "nograd", "no_grad_mode", "cl", "bf16", "ceil", "bumped"):
        assert res[name][0]["applies"] == 0, name       # served by the seen call
    assert res["bumped"][0]["node"]["versions"] == [1]
    for name in ("anomaly", "cleared", "switch", "unsupported"):
        assert res[name][0]["applies"] == 1, name       # the full path
    assert out["neg"]["unsupported"] == [True] and out["neg"]["plain"] == [False]   # refused: remembered as such
    assert res["plain"][0]["node"]["cls"] == "MaxPool" and res["plain"][0]["node"]["saved_is_x"] == [True]
    assert res["plain"][0]["bwd_launches"] and res["cl"][0]["bwd_launches"]
    assert res["nograd"][0]["node"] is None and res["no_grad_mode"][0]["node"] is None
    errs = out["errs"]
    assert errs["True"] == errs["False"] and all(e is not None for e in errs["True"]), errs
