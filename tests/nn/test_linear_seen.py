"""F.linear of GPU tensors on a seen signature (nn/_functions/linear.py ``linear_seen``, docs/host_overhead.md
round 24), on the CPU: the GPU path under tools/record_launches.py's fake CuPy (launches recorded with null pointers,
never run; the fake's cublasLt computes in NumPy) in a subprocess.  Each scenario runs with the shortcut on and off,
three calls each; the third call's launches, the node it records (every field Function.apply sets on a Linear ctx and
what Linear.forward keeps), the output's autograd fields, the backward's launches and the gradients' values must be
the same, and with the shortcut on the third call skips the full path where it applies -- and takes it in anomaly
mode.  Bad input after seen calls raises the full path's errors.  The 2-D arrays are used as they are (no reshaped
views): the gradients equal float64 references, 2-D and 3-D inputs."""
import pathlib
import textwrap

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    import minidnn.autograd as AG
    from minidnn.nn import functional as F
    from minidnn.nn._functions import linear as LN
    AG._check_anomaly = lambda *a, **k: None

    full = collections.Counter()
    real_remember = LN.remember_linear
    def counted(key, y):
        full["calls"] += 1
        return real_remember(key, y)
    LN.remember_linear = counted

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
                    versions=list(c.versions), x_shape=list(c.x_shape), rows=c.rows, dw=repr(c.dw_dtype),
                    db=repr(c.db_dtype), nr=y.output_nr, rg=y.requires_grad, shape=list(y.shape),
                    dtype=str(y.dtype))

    def arr(t):
        return None if t is None else np.asarray(t.data, dtype=np.float64).round(5).tolist()

    def scenario(name, on):
        LN.LINEAR_FAST[0] = on
        LN._LINEAR_SEEN.clear()
        mdn.manual_seed(0)
        lin = mdn.nn.Linear(8, 6, bias=name != "no_bias").to("cuda")
        if name == "frozen_w":
            lin.weight.requires_grad_(False)
        if name == "frozen_b":
            lin.bias.requires_grad_(False)
        out = {{}}
        for i in range(3):
            for p in lin.parameters():
                p.grad = None
            shape = (4, 5, 8) if name == "nd3" else (5, 8)
            leaf = mdn.randn(*shape).to("cuda").requires_grad_(name != "x_nograd")
            x = leaf * 1.0 if name != "x_leaf" else leaf
            if i == 2:
                recs.clear(); full.clear()
            if name == "no_grad_mode":
                with mdn.no_grad():
                    y = lin(x)
            elif name == "bf16":
                with mdn.autocast("cuda", dtype=mdn.bfloat16):
                    y = lin(x)
            elif name == "anomaly" and i == 2:
                with mdn.autograd.detect_anomaly():
                    y = lin(x)
            else:
                y = lin(x)
            if i == 2:
                out["fwd_launches"] = [list(r) for r in recs]
                out["full_path"] = full["calls"]
                out["node"] = node(y, (x, lin.weight, lin.bias))
                out["plain"] = [y.requires_grad, y.grad_fn is None, str(y.dtype), list(y.shape)]
                out["y"] = arr(y)
                if y.requires_grad:
                    recs.clear()
                    g = mdn.randn(*y.shape).to("cuda").to(y.dtype)
                    y.backward(g)
                    out["bwd_launches"] = [list(r) for r in recs]
                    out["grads"] = [arr(leaf.grad), arr(lin.weight.grad),
                                    None if lin.bias is None else arr(lin.bias.grad)]
                    if name in ("all", "nd3"):       # float64 references of the three gradients
                        x64 = np.asarray(x.data, np.float64).reshape(-1, 8)
                        g64 = np.asarray(g.data, np.float64).reshape(-1, 6)
                        w64 = np.asarray(lin.weight.data, np.float64)
                        out["ref_err"] = [
                            float(abs(np.asarray(leaf.grad.data).reshape(-1, 8) - g64 @ w64).max()),
                            float(abs(np.asarray(lin.weight.grad.data) - g64.T @ x64).max()),
                            float(abs(np.asarray(lin.bias.grad.data) - g64.sum(0)).max()),
                            float(abs(np.asarray(y.data).reshape(-1, 6)
                                      - (x64 @ w64.T + np.asarray(lin.bias.data, np.float64))).max())]
        return out

    res = {{}}
    names = ("all", "frozen_w", "frozen_b", "no_bias", "x_leaf", "x_nograd", "nd3", "no_grad_mode", "bf16", "anomaly")
    for name in names:
        res[name] = [scenario(name, True), scenario(name, False)]

    # bad input after seen calls: the full path's errors
    errs = {{}}
    for on in (True, False):
        LN.LINEAR_FAST[0] = on
        LN._LINEAR_SEEN.clear()
        lin = mdn.nn.Linear(8, 6).to("cuda")
        x = mdn.randn(5, 8).to("cuda").requires_grad_()
        for _ in range(3):
            F.linear(x, lin.weight, lin.bias)
        got = []
        sys.modules["minidnn.backend.devices"].cuda_device_count = lambda: 2     # a second fake GPU
        w1 = lin.weight.detach().clone().requires_grad_()
        w1.data.data.device_id = 1                      # the fake's pointer object: this weight on GPU 1
        for args in ((mdn.randn(5, 7).to("cuda"), lin.weight, lin.bias), (x, w1, lin.bias),
                     (x, lin.weight, mdn.randn(5).to("cuda")),
                     (x, mdn.randn(6, 8, 1).to("cuda"), lin.bias)):
            try:
                F.linear(*args)
                got.append(None)
            except Exception as e:
                got.append([type(e).__name__, str(e)])
        errs[str(on)] = got
    print("RESULT" + json.dumps(dict(res=res, errs=errs)))
""")


def test_seen_linear_same_launches_nodes_backward_and_errors():
    out = run_fake_script(_SCRIPT, ROOT)
    res = out["res"]
    for name, (on, off) in res.items():
        assert on == {**off, "full_path": on["full_path"]}, name
        assert off["full_path"] == 1, name
        assert on["fwd_launches"] and on["fwd_launches"] == off["fwd_launches"], name
    for name in ("all", "frozen_w", "frozen_b", "no_bias", "x_leaf", "x_nograd", "nd3", "no_grad_mode", "bf16"):
        assert res[name][0]["full_path"] == 0, name         # served by the seen call
    assert res["anomaly"][0]["full_path"] == 1              # anomaly mode: the full path
    assert res["all"][0]["node"]["cls"] == "Linear" and res["all"][0]["node"]["need"] == [True, True, True]
    assert res["frozen_w"][0]["node"]["need"] == [True, False, True]
    assert res["x_nograd"][0]["node"]["edges"][0] is None
    assert res["no_grad_mode"][0]["node"] is None and res["no_grad_mode"][0]["plain"][:2] == [False, True]
    assert res["bf16"][0]["plain"][2] == "bfloat16" and res["bf16"][0]["bwd_launches"]
    for name in ("all", "nd3"):
        assert max(res[name][0]["ref_err"]) < 1e-4, (name, res[name][0]["ref_err"])
    errs = out["errs"]
    assert errs["True"] == errs["False"] and all(e is not None for e in errs["True"]), errs
