"""nn's remembered batch-norm calls (nn/_functions/norm.py ``_Remembered``, docs/host_overhead.md round 14) on the CPU:
the GPU path run under tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded with null pointers, never
run) in a subprocess, so the fake never meets this test session's modules.  Every scenario runs twice -- remembered
calls on (``norm.FAST[0] = True``) and off (every call through the full path) -- three steps each, and the third
step's launches (kernel, options, grid, block, packed arguments), the nodes it records (every field Function.apply
sets), the outputs' autograd fields and the versions of the running statistics and the counter must be the same.
With the switch on, the third step must also have reached no batch-norm or activation primitive (the remembered
objects served it), and wherever an exactness condition holds (fusion off, a hook, an in-place change, eval mode,
anomaly mode, a replaced weight array, a misaligned x, the one-pass switch flipped, no_grad) the result is the full
path's.  Bad input after remembered calls raises as before.  The bits on a GPU: test_bn_fast_path_cuda.py."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

import minidnn as mdn
from minidnn.nn._functions import norm as N

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys, collections
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)        # CuPy functions the fake lacks: NumPy's, on fake arrays
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    import warnings
    warnings.filterwarnings("ignore")     # the fake's uninitialised outputs overflow in the gradient sums
    import minidnn as mdn
    import minidnn.autograd as AG
    import minidnn.backend as B
    AG._check_anomaly = lambda *a, **k: None     # anomaly mode's NaN check would read the fake's unwritten outputs
    from minidnn.autograd import FunctionCtx
    from minidnn.backend.cuda import bn_kernels as K
    from minidnn.nn import functional as F
    from minidnn.nn._functions import norm as N
    from minidnn.tensor import Tensor
    nn = mdn.nn

    calls = collections.Counter()          # primitive calls made (the full path reaches them; remembered calls not)
    for name in ("batch_normalization_forward_training", "batch_normalization_backward",
                 "batch_normalization_backward_ex", "activation_forward"):
        def counted(*a, _f=getattr(B, name), _n=name, **k):
            calls[_n] += 1
            return _f(*a, **k)
        setattr(B, name, counted)

    def edge(e):
        if e is None:
            return None
        n = e[0]
        return [getattr(n, "_fn_cls", type(n)).__name__, e[1]]

    def node(t, names={{}}):
        n = t.grad_fn
        d = {{"requires_grad": t.requires_grad, "output_nr": t.output_nr, "shape": list(t.data.shape),
              "strides": list(t.data.strides), "dtype": str(t.data.dtype)}}
        if n is None:
            return d
        d.update(cls=n._fn_cls.__name__, type=type(n).__name__, needs=list(n.needs_input_grad),
                 edges=[edge(e) for e in n.next_edges], n_inputs=n._n_inputs, num_outputs=n.num_outputs,
                 meta=[None if m is None else [list(m[0]), str(m[1])] for m in n._input_meta],
                 out_meta=[[list(m[0]), str(m[1]), m[2].__name__] for m in n._out_meta],
                 saved=[None if s is None else names.get(id(s), "?") for s in n.saved], versions=list(n.versions),
                 fields=sorted(k for k in n.__dict__ if k != "seen"), eps=getattr(n, "eps", None),
                 stats=[[list(s.shape), str(s.dtype)] for s in getattr(n, "stats", ())],
                 bypassed=[getattr(b, "_fn_cls", type(b)).__name__ for b in getattr(n, "bypassed", ())],
                 pre_hooks=n.pre_hooks is not None, trace=n.trace is not None,
                 slots=[s for s in FunctionCtx.__slots__ if s != "__dict__" and not hasattr(n, s)])
        return d

    def grads(ts):
        return [None if t.grad is None else [list(t.grad.data.shape), list(t.grad.data.strides),
                                             str(t.grad.data.dtype)] for t in ts]

    def make(shape, cl, dtype, affine=True, track=True):
        mdn.manual_seed(0)
        layer = {{2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}}[len(shape)]
        bns = [layer(shape[1], affine=affine, track_running_stats=track).to("cuda") for _ in range(3)]
        x = Tensor._from_array(fakecp.zeros(shape, dtype="float32"))
        z = Tensor._from_array(fakecp.zeros(shape, dtype="float32"))
        if dtype != "float32":
            x, z = x.to(dtype=getattr(mdn, dtype)), z.to(dtype=getattr(mdn, dtype))
        if cl:
            fmt = mdn.channels_last if len(shape) == 4 else mdn.channels_last_3d
            x, z = x.to(memory_format=fmt), z.to(memory_format=fmt)
        x.requires_grad = z.requires_grad = True
        return bns, x, z

    def step(bns, x, z, out=None):
        # plain batch norm, batch norm + ReLU, batch norm + add + ReLU, each forward then backward
        res = {{}}
        for i, form in enumerate(("plain", "relu", "add")):
            del recs[:]
            y0 = y = bns[i](x)
            a = None
            if form == "relu":
                y = F.relu(y)
            elif form == "add":
                a = y0 + z
                y = F.relu(a)
            res[form + "_fwd"] = list(recs)
            names = {{id(x): "x", id(z): "z", id(bns[i].weight): "w", id(bns[i].bias): "b", id(y0): "y", id(a): "a"}}
            res[form + "_node"] = node(y, names)
            if form != "plain":
                res[form + "_bn_node"] = node(y0, names)
            del recs[:]
            if y.requires_grad:
                y.backward(Tensor._from_array(fakecp.zeros_like(y.data)))     # laid out as y
            res[form + "_bwd"] = list(recs)
        res["grads"] = grads([x, z] + [p for b in bns for p in b.parameters()])
        res["versions"] = [[t._version for t in (b.running_mean, b.running_var, b.num_batches_tracked)
                            if t is not None] for b in bns]
        x.grad = z.grad = None
        for b in bns:
            b.zero_grad()
        return res

    def run(fast, shape=(4, 16, 6, 6), cl=False, dtype="float32", affine=True, track=True, setup=None, steps=3,
            first=None):
        N.FAST[0] = fast
        N.TWIN[0] = False       # launch for launch against the full path: the twin drops the ReLU's by design
        N.ADD_TWIN[0] = False   # (and the residual add's twin its ReLU's: test_add_twin*.py)
        N._REMEMBERED.clear()
        if first is not None:
            first()
        bns, x, z = make(shape, cl, dtype, affine, track)
        for i in range(steps):
            if setup is not None and i == steps - 1:
                setup(bns, x, z)
            calls.clear()
            res = step(bns, x, z)
        res["calls"] = dict(calls)
        N.FAST[0] = True
        return res

    out = {{}}
    cases = {{"nchw": {{}}, "cl": {{"cl": True}}, "bf16": {{"dtype": "bfloat16"}},
              "cl_bf16": {{"cl": True, "dtype": "bfloat16"}},
              "2d": {{"shape": (8, 16)}}, "3d": {{"shape": (4, 16, 10)}}, "5d": {{"shape": (2, 8, 3, 4, 5)}},
              "cl_5d": {{"shape": (2, 8, 3, 4, 5), "cl": True}}, "affine_off": {{"affine": False}},
              "untracked": {{"track": False}}, "c64": {{"shape": (4, 64, 4, 4)}}}}
    for name, kw in cases.items():
        out[name] = [run(True, **kw), run(False, **kw)]

    def fusion_off(bns, x, z):
        B.cudnn.fusion = False
    def onepass_off(bns, x, z):
        K.ONEPASS = False
    def no_grad_x(bns, x, z):
        x.requires_grad = False
    def frozen(bns, x, z):
        for b in bns:
            b.weight.requires_grad = False
    def new_weight_arrays(bns, x, z):
        for b in bns:
            b.weight.data = b.weight.data.copy()
    def anomaly(bns, x, z):
        mdn.autograd.set_detect_anomaly(True)
    def misaligned(bns, x, z):
        buf = fakecp.zeros(x.data.size + 1, dtype=x.data.dtype)[1:].reshape(x.data.shape)
        x.data = buf
    from minidnn.backend.cuda import bn_nhwc
    nhwc = bn_nhwc.ENABLED
    def nhwc_flip(bns, x, z):
        bn_nhwc.ENABLED = not nhwc
    for name, first in (("nhwc_flip_cl", None), ("nhwc_late_cl", lambda: setattr(bn_nhwc, "ENABLED", not nhwc))):
        res = []
        for fast in (True, False):
            res.append(run(fast, cl=True, setup=nhwc_flip if first is None else
                           (lambda bns, x, z: setattr(bn_nhwc, "ENABLED", nhwc)), first=first))
            bn_nhwc.ENABLED = nhwc
        out[name] = res
    for name, setup, undo in (("fusion_off", fusion_off, lambda: setattr(B.cudnn, "fusion", True)),
                              ("onepass_off", onepass_off, lambda: setattr(K, "ONEPASS", True)),
                              ("no_grad_x", no_grad_x, None), ("frozen", frozen, None),
                              ("new_weight_arrays", new_weight_arrays, None),
                              ("anomaly", anomaly, lambda: mdn.autograd.set_detect_anomaly(False)),
                              ("misaligned", misaligned, None)):
        res = []
        for fast in (True, False):
            res.append(run(fast, setup=setup))
            if undo is not None:
                undo()
        out[name] = res

    # the bypass conditions of the fusion rules, remembered calls on: the plain ReLU node, as the full path records
    bns, x, z = make((4, 16, 6, 6), False, "float32")
    for _ in range(3):
        step(bns, x, z)
    y = bns[1](x)
    y.register_hook(lambda g: g)
    out["hooked"] = node(F.relu(y))["cls"]
    y = bns[1](x)
    with mdn.no_grad():
        x.add_(1.0)
    out["in_place"] = node(F.relu(y))["cls"]
    x.grad = None
    with mdn.no_grad():
        out["no_grad"] = node(bns[0](x))
    bns[0].eval()
    calls.clear()
    for _ in range(3):
        bns[0](x)
    out["eval_calls"] = dict(calls)
    bns[0].train()

    # bad input after remembered calls: the full path's errors
    def err(f):
        try:
            f()
            return "no error"
        except Exception as e:
            return type(e).__name__ + ": " + str(e)
    b = bns[0]
    args = lambda: (x, b.running_mean, b.running_var, b.weight, b.bias, True, 0.1, 1e-5)
    for _ in range(3):
        F.batch_norm(*args(), _counter=b.num_batches_tracked)
    out["remembered_calls_before_errors"] = len(N._REMEMBERED)
    errs = {{}}
    errs["momentum"] = err(lambda: F.batch_norm(x, b.running_mean, b.running_var, b.weight, b.bias, True, 0.1 + 0j,
                                               1e-5, _counter=b.num_batches_tracked))
    errs["eps"] = err(lambda: F.batch_norm(x, b.running_mean, b.running_var, b.weight, b.bias, True, 0.1, -1.0,
                                          _counter=b.num_batches_tracked))
    keep = b.weight.data
    b.weight.data = fakecp.zeros((4, 4), dtype="float32")
    errs["weight_shape"] = err(lambda: F.batch_norm(*args(), _counter=b.num_batches_tracked))
    b.weight.data = keep
    errs["x_channels"] = err(lambda: F.batch_norm(Tensor._from_array(fakecp.zeros((4, 8, 6, 6), dtype="float32")),
                                                  b.running_mean, b.running_var, b.weight, b.bias, True, 0.1, 1e-5,
                                                  _counter=b.num_batches_tracked))
    errs["one_value"] = err(lambda: F.batch_norm(Tensor._from_array(fakecp.zeros((1, 16), dtype="float32")),
                                                 b.running_mean, b.running_var, b.weight, b.bias, True, 0.1, 1e-5))
    out["errors"] = errs
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    script = _SCRIPT.format(root=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


_CASES = ["nchw", "cl", "bf16", "cl_bf16", "2d", "3d", "5d", "cl_5d", "affine_off", "untracked", "c64"]
_SETUPS = ["nhwc_flip_cl", "nhwc_late_cl",
           "fusion_off", "onepass_off", "no_grad_x", "frozen", "new_weight_arrays", "anomaly", "misaligned"]


@pytest.mark.parametrize("case", _CASES + _SETUPS)
def test_remembered_calls_record_and_launch_what_the_full_path_does(case):
    fast, full = _run()[case]
    assert full["calls"], "the full path reaches the primitives"
    assert set(fast) == set(full)
    for k in full:
        if k != "calls":
            assert fast[k] == full[k], k
    # the forms fused as the full path fuses them (fusion off: the plain ReLU)
    want = {"relu": "Activation", "add": "Activation"} if case == "fusion_off" else \
        {"relu": "BatchNormReLU", "add": "BatchNormAddReLU"}
    for form, cls in want.items():
        assert full[form + "_node"]["cls"] == cls
    assert full["plain_node"]["cls"] == "BatchNormTraining"
    assert all(full[f + "_fwd"] for f in ("plain", "relu", "add")) and full["plain_bwd"]


@pytest.mark.parametrize("case", _CASES + ["fusion_off", "no_grad_x", "frozen"])
def test_remembered_calls_reach_no_primitive(case):
    """With the switch on, the third step's batch-norm forwards, fused ReLUs and the three backward forms are all
    served by the remembered objects.  Fusion off (from the third step on): the plain ReLU calls its primitive, and
    the two batch norms it follows reach the plain backward for the first time, through the full path, which
    settles it for the next steps."""
    fast, _ = _run()[case]
    want = {"activation_forward": 2, "batch_normalization_backward": 2} if case == "fusion_off" else {}
    assert fast["calls"] == want


@pytest.mark.parametrize("case", ["onepass_off", "new_weight_arrays", "anomaly", "misaligned", "nhwc_flip_cl",
                                  "nhwc_late_cl"])
def test_a_changed_condition_takes_the_full_path(case):
    """What the key cannot hold is checked per call: the one-pass switch, bn_nhwc's switch (for channels-last rows,
    either way), a replaced weight array, anomaly mode and x's alignment send the call to the full path (whose
    launches and nodes the first test compares)."""
    fast, full = _run()[case]
    assert fast["calls"].get("batch_normalization_forward_training") == 3
    if case == "anomaly":
        assert fast["relu_node"]["trace"] and full["relu_node"]["trace"]


def test_the_fusion_rules_keep_their_conditions():
    out = _run()
    assert out["hooked"] == "Activation"        # a hook on y
    assert out["in_place"] == "Activation"      # x changed in place after batch norm
    assert out["no_grad"]["requires_grad"] is False and "cls" not in out["no_grad"]
    assert out["eval_calls"] == {}              # eval: the inference Function, never remembered...
    # ...and it reaches batch_normalization_forward_inference (not counted), not the training primitive


def test_bad_input_after_remembered_calls_still_raises():
    out = _run()
    assert out["remembered_calls_before_errors"] >= 1
    errs = out["errors"]
    assert errs["momentum"].startswith("TypeError")
    assert "epsilon" in errs["eps"]
    assert errs["weight_shape"].startswith("ArgumentError") and "weight" in errs["weight_shape"]
    assert errs["x_channels"].startswith("ArgumentError")
    assert errs["one_value"].startswith("ArgumentError") and "more than 1 value" in errs["one_value"]


def test_cpu_calls_are_not_remembered():
    before = len(N._REMEMBERED)
    bn = mdn.nn.BatchNorm2d(4)
    x = mdn.randn(2, 4, 3, 3, requires_grad=True)
    for _ in range(3):
        mdn.nn.functional.relu(bn(x)).sum().backward()
    assert len(N._REMEMBERED) == before
