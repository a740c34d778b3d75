"""A convolution's bias as ConvForward's fourth input (nn/_functions/conv.py, docs/host_overhead.md round 21): one
node, as PyTorch's ConvolutionBackward0 owns the bias, where a BiasAdd node used to follow the convolution.

On the CPU: the graph (one ConvForwardBackward with an edge to the bias, no BiasAddBackward; the old graph with the
switch off), the gradients of x, w and b bit for bit those of the BiasAdd graph and close to float64 references
(db = the sum of dy over all axes but the channels), every requires_grad pattern, unbatched input, hooks on the bias
and on the output, retained graphs accumulating, gradcheck / gradgradcheck in float64 (double backward through the
bias), a Conv2d module's state_dict.  The GPU path under the fake CuPy (tools/record_launches.py, a subprocess):
with the switch on and off the same launches in the same order, and the bias's column sum and the direct kernels'
filter gradient written into the optimizer's flat-buffer slots (no leaf copies in a LeNet-5 or MobileNet-small
step).  Values on a GPU: test_conv_bias_node_cuda.py."""
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minidnn as mdn
from minidnn.autograd import gradcheck, gradgradcheck
from minidnn.nn import functional as F
from minidnn.nn._functions import conv as C
from tests.nn._fake_script import run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

CASES = [   # (nd, x shape, w shape, kwargs)
    (1, (2, 4, 9), (6, 4, 3), dict(padding=1)),
    (2, (2, 4, 7, 6), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0), groups=2)),
    (2, (3, 1, 8, 8), (5, 1, 5, 5), dict()),
    (3, (1, 2, 4, 5, 4), (3, 2, 2, 3, 2), dict(dilation=(1, 2, 1))),
]
_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _operands(xs, ws, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    return x, w, b


def _grads(nd, x, w, b, kw, need, node, g=None):
    C.BIAS_NODE[0] = node
    try:
        xt, wt, bt = (mdn.tensor(a, requires_grad=r) for a, r in zip((x, w, b), need))
        y = _FN[nd](xt, wt, bt, **kw)
        name = y.grad_fn.name() if y.grad_fn is not None else None
        if y.requires_grad:
            y.backward(mdn.tensor(g if g is not None else np.ones(y.shape, dtype=np.float32)))
        return y.data.copy(), name, [t.grad.data.copy() if t.grad is not None else None for t in (xt, wt, bt)]
    finally:
        C.BIAS_NODE[0] = True


def test_one_node_with_an_edge_to_the_bias():
    x, w, b = _operands((2, 3, 6, 6), (4, 3, 3, 3))
    xt, wt, bt = mdn.tensor(x, requires_grad=True), mdn.tensor(w, requires_grad=True), mdn.tensor(b,
                                                                                                  requires_grad=True)
    y = F.conv2d(xt, wt, bt, padding=1)
    node = y.grad_fn
    assert node.name() == "ConvForwardBackward"
    assert len(node.next_edges) == 4 and node.next_edges[2] is None
    assert node.next_edges[3][0] is bt._edge()[0] and node.next_edges[0][0] is xt._edge()[0]
    assert node.needs_input_grad == (True, True, False, True)
    # the switch off: the old graph, a BiasAdd node after the convolution
    C.BIAS_NODE[0] = False
    try:
        y2 = F.conv2d(xt, wt, bt, padding=1)
    finally:
        C.BIAS_NODE[0] = True
    assert y2.grad_fn.name() == "BiasAddBackward"
    assert y2.grad_fn.next_edges[0][0].name() == "ConvForwardBackward"
    assert np.array_equal(y.data, y2.data)
    # without a bias: three inputs, as before
    assert len(F.conv2d(xt, wt, padding=1).grad_fn.next_edges) == 3


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("need", [(True, True, True), (False, False, True), (True, False, True), (False, True, True),
                                  (True, True, False)])
def test_gradients_equal_the_bias_add_graph_and_float64(case, need):
    nd, xs, ws, kw = CASES[case]
    x, w, b = _operands(xs, ws, seed=case)
    y_on, n_on, g_on = _grads(nd, x, w, b, kw, need, True)
    y_off, n_off, g_off = _grads(nd, x, w, b, kw, need, False)
    assert n_on == "ConvForwardBackward" and n_off == "BiasAddBackward"
    assert np.array_equal(y_on, y_off)
    for a, r in zip(g_on, g_off):
        assert (a is None) == (r is None)
        if a is not None:
            assert a.dtype == r.dtype and np.array_equal(a, r)
    if need[2]:     # db = sum of dy (ones) over every axis but the channels: the number of output positions
        per = np.prod(y_on.shape) // y_on.shape[1]
        np.testing.assert_allclose(g_on[2], np.full(ws[0], per, dtype=np.float64), rtol=1e-6)
    # y - conv without bias = b along the channels (float64 reference of the forward's add)
    y0 = _FN[nd](mdn.tensor(x), mdn.tensor(w), **kw).data.astype(np.float64)
    np.testing.assert_allclose(y_on - y0, np.broadcast_to(b.reshape((1, -1) + (1,) * nd), y0.shape), atol=1e-5)


def test_random_upstream_gradient_db_against_float64():
    x, w, b = _operands((3, 2, 7, 5), (4, 2, 3, 3), seed=3)
    g = np.random.default_rng(9).standard_normal((3, 4, 5, 3)).astype(np.float32)
    _, _, (gx, gw, gb) = _grads(2, x, w, b, {}, (True, True, True), True, g)
    np.testing.assert_allclose(gb, g.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)
    _, _, (gx0, gw0, _) = _grads(2, x, w, b, {}, (True, True, False), True, g)
    assert np.array_equal(gx, gx0) and np.array_equal(gw, gw0)


def test_unbatched_input_with_bias():
    x, w, b = _operands((3, 6, 6), (2, 3, 3, 3))
    on = _grads(2, x, w, b, dict(padding=1), (True, True, True), True)
    off = _grads(2, x, w, b, dict(padding=1), (True, True, True), False)
    assert on[0].shape == (2, 6, 6) and np.array_equal(on[0], off[0])
    for a, r in zip(on[2], off[2]):
        assert np.array_equal(a, r)


def test_hooks_on_the_bias_and_the_output_and_a_retained_graph():
    x, w, b = _operands((2, 3, 5, 5), (4, 3, 3, 3))
    xt, wt = mdn.tensor(x, requires_grad=True), mdn.tensor(w, requires_grad=True)
    bt = mdn.tensor(b, requires_grad=True)
    seen = []
    bt.register_hook(lambda g: seen.append(g.data.copy()) or g * 2)
    y = F.conv2d(xt, wt, bt)
    y.register_hook(lambda g: g * 3)
    y.sum().backward(retain_graph=True)
    per = np.prod(y.shape) // y.shape[1]
    np.testing.assert_allclose(seen[0], np.full(4, 3.0 * per))
    np.testing.assert_allclose(bt.grad.data, np.full(4, 6.0 * per))
    y.sum().backward()                                # the retained graph again: .grad accumulates
    np.testing.assert_allclose(bt.grad.data, np.full(4, 12.0 * per))


def test_a_bias_shared_by_two_convolutions_accumulates():
    x, w, b = _operands((2, 3, 5, 5), (4, 3, 3, 3))
    bt = mdn.tensor(b, requires_grad=True)
    xt, wt = mdn.tensor(x), mdn.tensor(w)
    (F.conv2d(xt, wt, bt).sum() + F.conv2d(xt, wt, bt, padding=1).sum()).backward()
    np.testing.assert_allclose(bt.grad.data, np.full(4, 2 * 9 + 2 * 25, dtype=np.float64))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_gradcheck_and_gradgradcheck_through_the_bias(case):
    nd, xs, ws, kw = CASES[case]
    xs = (1,) + xs[1:]
    x, w, b = _operands(xs, ws, np.float64, seed=case)
    ins = [mdn.tensor(a, requires_grad=True) for a in (x, w, b)]
    f = lambda x, w, b: _FN[nd](x, w, b, **kw)      # noqa: E731
    assert gradcheck(f, ins)
    assert gradgradcheck(f, ins)


def test_double_backward_of_the_bias_gradient_graph():
    # d/dy of <db, v> under create_graph: db = sum of dy, so the gradient of <grad_b, v> with respect to a cotangent
    # that depends on a parameter flows through the Tensor sum
    x, w, b = _operands((2, 2, 4, 4), (3, 2, 3, 3), np.float64)
    xt, wt, bt = (mdn.tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.conv2d(xt, wt, bt, padding=1)
    gb, = mdn.autograd.grad((y * y).sum(), [bt], create_graph=True)     # 2 * sum(y) per channel
    gb.sum().backward()
    # d/db of sum_c 2 * sum(y_c) = 2 * positions per channel
    np.testing.assert_allclose(bt.grad.data, np.full(3, 2.0 * 2 * 16))
    assert xt.grad is not None and wt.grad is not None


def test_module_state_dict_and_gradients():
    mdn.manual_seed(0)
    m = mdn.nn.Conv2d(3, 4, 3, padding=1)
    assert list(m.state_dict().keys()) == ["weight", "bias"]
    x = mdn.randn(2, 3, 5, 5)
    y = m(x)
    assert y.grad_fn.name() == "ConvForwardBackward"
    y.sum().backward()
    np.testing.assert_allclose(m.bias.grad.data, np.full(4, 50.0))


# ---- the GPU path under the fake CuPy --------------------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    copies = []
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: copies.append(n)
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    from minidnn.backend.cuda import norm_kernels as NK
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    outs = []
    real_bg = NK.bias_grad
    def bg(dy, axis, wide=None, out=None):
        outs.append(("bias_grad", out is not None and any(np.shares_memory(out, p._grad_storage) for p in params)))
        return real_bg(dy, axis, wide, out)
    NK.bias_grad = bg
    res = {{}}
    for name in ("plain", "bf16", "hook", "shared"):
        for on in (True, False):
            C.BIAS_NODE[0] = on
            mdn.manual_seed(0)
            conv1 = mdn.nn.Conv2d(1, 6, 5).to("cuda")              # direct kernels (few channels)
            conv2 = mdn.nn.Conv2d(6, 16, 3, padding=1).to("cuda")
            params = list(conv1.parameters()) + list(conv2.parameters())
            opt = mdn.optim.SGD(params, lr=0.01, momentum=0.9)
            x = mdn.randn(4, 1, 12, 12).to("cuda")
            if name == "hook":
                conv2.bias.register_hook(lambda g: g)
            for i in range(3):
                if i == 2:
                    recs.clear(); outs.clear(); copies.clear()
                if name == "bf16":
                    with mdn.autocast("cuda", dtype=mdn.bfloat16):
                        y = conv2(F.relu(conv1(x)))
                elif name == "shared":
                    h = F.relu(conv1(x))
                    y = F.conv2d(h, conv2.weight, conv2.bias, padding=1) + F.conv2d(h, conv2.weight, conv2.bias,
                                                                                   padding=1)
                else:
                    y = conv2(F.relu(conv1(x)))
                node = y.grad_fn.name()
                opt.zero_grad()
                y.backward(mdn.ones_like(y))
                opt.step()
            res[name + ("_on" if on else "_off")] = dict(launches=[list(r) for r in recs], outs=outs[:], node=node,
                                                          grads=[p.grad is not None for p in params],
                                                          copies=len(copies))
    print("RESULT" + json.dumps(res))
""")


def _fake():
    return run_fake_script(_SCRIPT, ROOT)


def test_fake_gpu_same_launches_and_gradients_written_into_the_slots():
    res = _fake()
    for name in ("plain", "bf16", "hook", "shared"):
        on, off = res[name + "_on"], res[name + "_off"]
        if name == "shared":    # two convolutions meet at h: the engine's node order differs, not the launches
            assert on["launches"] and sorted(on["launches"]) == sorted(off["launches"]), name
        else:                   # the same kernels in the same order
            assert on["launches"] and on["launches"] == off["launches"], name
        assert all(on["grads"]) and all(off["grads"])
        assert on["node"] in ("ConvForwardBackward", "AddBackward", "ToCopyBackward", "CastBackward") or \
            on["node"].endswith("Backward")
    # plain: both biases' column sums land in their slots, and both convolutions' filter gradients (the direct
    # kernels: <= 8 channels) -- no leaf copies; with the switch off BiasAdd's two column sums are copied
    assert res["plain_on"]["outs"] == [["bias_grad", True]] * 2 and res["plain_on"]["copies"] == 0
    assert res["plain_off"]["outs"] == [["bias_grad", False]] * 2 and res["plain_off"]["copies"] == 2
    assert res["plain_on"]["node"] == "ConvForwardBackward" and res["plain_off"]["node"] == "BiasAddBackward"
    # autocast: the float32 biases' slots through the cast node (float32 column sums)
    assert res["bf16_on"]["outs"] == [["bias_grad", True]] * 2 and res["bf16_on"]["copies"] == 0
    assert res["bf16_off"]["copies"] == 2
    # a hook on conv2's bias: its column sum is fresh (the engine calls the hook, then copies), conv1's in its slot
    assert res["hook_on"]["outs"] == [["bias_grad", False], ["bias_grad", True]] and res["hook_on"]["copies"] == 1
    # conv2's bias used twice: the first column sum in the slot, the second meets that pending gradient and is
    # added by the engine (a fresh sum) -- never blended by the kernels
    shared = res["shared_on"]["outs"]
    assert len(shared) == 3 and shared[0] == ["bias_grad", True] and ["bias_grad", False] in shared


def _copies(model, batch, **env):
    e = dict(os.environ, MODE="copies", PYTHONPATH=str(ROOT), **env)
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "fake_gpu_step.py"), str(ROOT), model, str(batch)],
                         env=e, capture_output=True, text=True, timeout=300)
    m = re.search(r"leaf copies (\d+), gradient sums (\d+)", out.stdout)
    assert m, out.stdout[-2000:] + out.stderr[-2000:]
    return int(m.group(1))


def test_fake_gpu_steps_copy_no_leaf_gradient():
    # LeNet-5: 2 conv biases (column sums) and 2 direct-kernel filter gradients were copied; MobileNet-small: its 5
    # depthwise (direct-kernel) filter gradients
    assert _copies("lenet5", 8) == 0
    assert _copies("lenet5", 8, MINIDNN_CONV_BIAS_NODE="0") == 2
    assert _copies("mobilenet", 4) == 0


_BACKEND = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    warnings.filterwarnings("ignore")
    import minidnn.backend as B
    from minidnn.backend.cuda import norm_kernels as NK
    got = []
    real = NK.bias_grad
    NK.bias_grad = lambda dy, axis, wide=None, out=None: got.append(out) or real(dy, axis, wide, out)
    dy = fakecp.asarray(np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5))
    res = {{}}
    def err(**k):
        try:
            B.convolution_backward_bias(None, dy, **k)
            return "no error"
        except Exception as e:
            return type(e).__name__ + ": " + str(e)
    # a fresh process's errors for bad db, before anything is seen
    bad = dict(shape=dict(db=fakecp.empty((4,), np.float32)), dtype=dict(db=fakecp.empty((3,), np.float16)),
               host=dict(db=np.empty((3,), np.float32)))
    res["fresh_errors"] = {{k: err(**v) for k, v in bad.items()}}
    db0 = B.convolution_backward_bias(None, dy)            # the full path: remembered
    res["first_out"] = got[-1] is None
    slot = fakecp.empty((3,), np.float32)
    r = B.convolution_backward_bias(None, dy, db=slot)     # seen, into db
    res["seen_into"] = [r is slot, got[-1] is slot]
    strided = fakecp.zeros((6,), np.float32)[::2]          # not contiguous: the full path's reference sum, blended
    n = len(got)
    r = B.convolution_backward_bias(None, dy, db=strided)
    res["strided"] = [r is strided, len(got) == n, np.asarray(strided).tolist()]
    res["seen_errors"] = {{k: err(**v) for k, v in bad.items()}}
    res["beta1"] = err(db=slot, beta=1.0)
    print("RESULT" + json.dumps(res))
""")


def test_backend_bias_gradient_into_a_given_db():
    r = subprocess.run([sys.executable, "-c", _BACKEND.format(root=str(ROOT))], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][0][len("RESULT"):])
    assert res["first_out"] and res["seen_into"] == [True, True]
    # a strided db: the kernels are not given it (the reference sum, blended in): the float64 sums per channel
    dy = np.arange(2 * 3 * 4 * 5, dtype=np.float64).reshape(2, 3, 4, 5)
    assert res["strided"][:2] == [True, True]
    np.testing.assert_allclose(res["strided"][2], dy.sum(axis=(0, 2, 3)))
    # bad db after seen calls: the errors of a fresh process, before any work
    assert res["seen_errors"] == res["fresh_errors"]
    assert res["seen_errors"]["shape"].startswith("BadParamError") and "(4,)" in res["seen_errors"]["shape"]
    assert res["seen_errors"]["dtype"].startswith("BadParamError") and "float16" in res["seen_errors"]["dtype"]
    assert res["seen_errors"]["host"] != "no error"
    assert res["beta1"] == "no error"       # beta 1 blends into db by the full path (not the kernels' in-place write)
