"""Autocast's direct weights (session 11, docs/measurements/amp_host_2026-11-26.md): a convolution's or a linear
layer's float32 weight and bias, cast to float16/bfloat16 by autocast, get no cast node -- the layer's node records
its edge to the parameter's own accumulator and hands back a float32 gradient.

The oracle is the old path, the cast node per weight (``_amp_state.DIRECT_WEIGHTS[0] = False``): every test runs the
same computation both ways from the same parameters and asserts the forward values and every gradient bit for bit
equal (float32 bits compared as integers), with the same dtypes -- over conv1d/2d/3d, strides, groups, depthwise,
channels-last, linear with and without bias, the flat-buffer cast and the per-tensor cast, cache_enabled=False, a
weight used twice, a weight used by another op too, an in-place change between uses, nested regions, autocast
disabled inside a region, hooks, retain_graph, autograd.grad and create_graph (double backward).  The graph is
checked too: the layer's edge goes to the parameter's AccumulateGrad (direct) or to an AutocastCast (old).
"""
from __future__ import annotations

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F
from minidnn import _amp_state
from minidnn.amp.autocast_mode import AutocastCast
from minidnn.autograd import AccumulateGrad

BF16 = mdn.bfloat16


def _bits(a):
    a = np.ascontiguousarray(a.detach().cpu().numpy() if isinstance(a, mdn.Tensor) else a)
    return a.dtype, a.view(np.uint8).tobytes()


def _both(fn, set_direct_weights):
    """fn() run with the cast nodes and with direct weights: the two results (lists of Tensors / arrays)."""
    out = []
    for on in (False, True):
        set_direct_weights(on)
        out.append(fn())
    return out


def _assert_same(old, new):
    assert len(old) == len(new)
    for i, (a, b) in enumerate(zip(old, new)):
        if a is None or b is None:
            assert a is None and b is None, i
            continue
        da, ba = _bits(a)
        db, bb = _bits(b)
        assert da == db, (i, da, db)
        assert ba == bb, f"result {i} differs"


def _params(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [mdn.tensor((rng.standard_normal(s) * 0.5).astype(np.float32), requires_grad=True) for s in shapes]


def _grads(*ts):
    return [t.grad for t in ts]


# ---- the graph ------------------------------------------------------------------------------------------------

def test_conv_and_linear_edges_go_to_the_parameters(set_direct_weights):
    x = mdn.randn(2, 3, 6, 6)
    w, b = _params(0, (4, 3, 3, 3), (4,))
    lw, lb = _params(1, (5, 4 * 4 * 4), (5,))
    for on in (False, True):
        set_direct_weights(on)
        with mdn.autocast("cpu"):
            y = F.conv2d(x, w, b)
            z = F.linear(y.flatten(1), lw, lb)
        assert y.dtype == BF16 and z.dtype == BF16
        conv_edges = y.grad_fn.next_functions
        lin_edges = z.grad_fn.next_functions
        for node, p in ((conv_edges[1][0], w), (conv_edges[3][0], b), (lin_edges[1][0], lw), (lin_edges[2][0], lb)):
            if on:
                assert type(node) is AccumulateGrad and node.variable is p
            else:
                assert type(node) is AutocastCast and node.next_functions[0][0].variable is p
        # the input x needs no gradient; a leaf input that does is cast by a node either way (its gradient is 16-bit)
        assert conv_edges[0] == (None, 0)


def test_leaf_input_keeps_its_cast_node(set_direct_weights):
    set_direct_weights(True)
    x = mdn.randn(2, 3, 6, 6, requires_grad=True)
    (w,) = _params(0, (4, 3, 3, 3))
    with mdn.autocast("cpu"):
        y = F.conv2d(x, w)
    assert type(y.grad_fn.next_functions[0][0]) is AutocastCast
    y.float().sum().backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float32


def test_switch_off_outside_float32_and_non_leaf_weights(set_direct_weights):
    """Direct weights are float32 leaves only: a float16 parameter, a weight computed from a parameter (a non-leaf)
    and a weight that needs no gradient keep the old casts."""
    set_direct_weights(True)
    x = mdn.randn(2, 3, 6, 6)
    (w,) = _params(0, (4, 3, 3, 3))
    with mdn.autocast("cpu"):
        y_nonleaf = F.conv2d(x, w * 2)
        y_const = F.conv2d(x, w.detach())
    assert type(y_nonleaf.grad_fn.next_functions[1][0]) is AutocastCast
    assert y_const.grad_fn is None
    with mdn.no_grad(), mdn.autocast("cpu"):
        assert F.conv2d(x, w).grad_fn is None


# ---- gradients bit for bit --------------------------------------------------------------------------------------

CONVS = [  # (nd, N, C, size, K, k, stride, padding, groups, bias)
    (2, 2, 3, 7, 4, 3, 1, 1, 1, True),
    (2, 2, 4, 8, 6, 3, 2, 1, 2, False),
    (2, 2, 6, 7, 6, 3, 1, 1, 6, True),      # depthwise
    (2, 3, 8, 5, 8, 1, 1, 0, 1, True),      # 1x1
    (1, 2, 3, 9, 4, 3, 1, 1, 1, True),
    (3, 2, 2, 5, 3, 3, 1, 1, 1, True),
]


@pytest.mark.parametrize("case", CONVS, ids=[f"conv{c[0]}d-{i}" for i, c in enumerate(CONVS)])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
def test_conv_gradients_bit_equal(set_direct_weights, case, channels_last):
    nd, N, C, n, K, k, st, pad, g, with_bias = case
    if channels_last and nd != 2:
        pytest.skip("channels_last is 4-D")
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((N, C) + (n,) * nd).astype(np.float32)

    def run():
        w, b = _params(7, (K, C // g) + (k,) * nd, (K,))
        x = mdn.tensor(x0, requires_grad=True)
        xin = x.to(memory_format=mdn.channels_last) if channels_last else x
        with mdn.autocast("cpu"):
            y = conv(xin, w, b if with_bias else None, stride=st, padding=pad, groups=g)
        r = mdn.tensor(np.random.default_rng(5).standard_normal(tuple(y.shape)).astype(np.float32))
        (y.float() * r).sum().backward()
        assert w.grad.dtype == np.float32
        return [y, x.grad, w.grad, b.grad if with_bias else None]
    _assert_same(*_both(run, set_direct_weights))


@pytest.mark.parametrize("lead", [(5,), (2, 3), ()])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_gradients_bit_equal(set_direct_weights, lead, with_bias):
    x0 = np.random.default_rng(2).standard_normal(lead + (12,)).astype(np.float32)

    def run():
        w, b = _params(4, (7, 12), (7,))
        x = mdn.tensor(x0, requires_grad=True)
        with mdn.autocast("cpu"):
            y = F.linear(x, w, b if with_bias else None)
        (y.float() * y.float().detach()).sum().backward()
        return [y, x.grad, w.grad, b.grad if with_bias else None]
    _assert_same(*_both(run, set_direct_weights))


def _net(seed=0):
    mdn.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.Conv2d(8, 6, 1),
                         nn.Flatten(), nn.Linear(6 * 6 * 6, 5))


@pytest.mark.parametrize("opt_kind", ["fused", "unfused", "none"])
@pytest.mark.parametrize("cache_enabled", [True, False])
def test_training_steps_bit_equal(set_direct_weights, opt_kind, cache_enabled):
    """Four steps of a small network (the flat-buffer cast from the second region with the fused optimizer; the
    per-tensor cast without one; no cache): the parameters' gradients and values after each step are the same."""
    x = mdn.randn(4, 3, 6, 6)
    y = mdn.tensor([0, 1, 2, 3])

    def run():
        model = _net()
        opt = None if opt_kind == "none" else mdn.optim.SGD(
            model.parameters(), lr=0.1, momentum=0.9, fused=opt_kind == "fused")
        out = []
        for _ in range(4):
            with mdn.autocast("cpu", cache_enabled=cache_enabled):
                loss = F.cross_entropy(model(x), y)
            for p in model.parameters():
                p.grad = None
            loss.backward()
            out += [loss] + [p.grad for p in model.parameters()]
            if opt is not None:
                opt.step()
            else:
                with mdn.no_grad():
                    for p in model.parameters():
                        p.sub_(p.grad * 0.1)
        return out + list(model.parameters())
    _assert_same(*_both(run, set_direct_weights))


# ---- the edge cases ---------------------------------------------------------------------------------------------

def test_weight_used_twice_and_by_another_op(set_direct_weights):
    """A weight used by two convolutions (one cast from the cache: one direct weight, two edges to the parameter)
    and a linear weight used by a matmul too (the cached direct weight becomes the cast node's output for the same
    data: the matmul's 16-bit gradient is converted by the node, as before)."""
    rng = np.random.default_rng(8)
    x0 = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    v0 = rng.standard_normal((5, 3)).astype(np.float32)

    def run():
        w, b, lw, lw2 = _params(9, (4, 4, 3, 3), (4,), (5, 4 * 5 * 5), (5, 4 * 5 * 5))
        x, v = mdn.tensor(x0), mdn.tensor(v0)
        cache = _amp_state._state()["cache"]
        with mdn.autocast("cpu"):
            h = F.conv2d(F.relu(F.conv2d(x, w, b, padding=1)), w, b, padding=1)
            z = F.linear(h.flatten(1), lw)
            m = mdn.matmul(v.T, lw)     # the same weight through another op (its cast from the cache)
            assert type(cache[id(lw)][2].grad_fn) is AutocastCast
            m2 = mdn.matmul(v.T, lw2)   # another op first, then the linear layer: through the node both
            z2 = F.linear(h.flatten(1), lw2)
            assert z2.grad_fn.next_functions[1][0] is cache[id(lw2)][2].grad_fn
        loss = z.float().square().sum() + m.float().sum() + z2.float().sum() + m2.float().square().sum()
        loss.backward()
        return [loss, w.grad, b.grad, lw.grad, lw2.grad]
    _assert_same(*_both(run, set_direct_weights))


def test_in_place_change_between_uses(set_direct_weights):
    """A weight changed in place inside the region (a new version) is cast again: the second use computes with the
    new values, both uses' gradients reach the parameter."""
    x0 = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)

    def run():
        w, b = _params(2, (4, 3, 3, 3), (4,))
        x = mdn.tensor(x0)
        with mdn.autocast("cpu"):
            y1 = F.conv2d(x, w, b)
            with mdn.no_grad():
                w.mul_(0.5)
            y2 = F.conv2d(x, w, b)
        assert not np.array_equal(y1.float().numpy(), y2.float().numpy())
        (y1.float().sum() + 2 * y2.float().sum()).backward()
        return [y1, y2, w.grad, b.grad]
    _assert_same(*_both(run, set_direct_weights))


def test_in_place_change_after_the_forward(set_direct_weights):
    """The optimizer's update between the forward and the backward: the layer computed with the cast it saved (its
    own copy), as the cast node's consumer did; neither path raises."""
    x0 = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)

    def run():
        w, b = _params(2, (4, 3, 3, 3), (4,))
        x = mdn.tensor(x0, requires_grad=True)
        with mdn.autocast("cpu"):
            y = F.conv2d(x, w, b)
        with mdn.no_grad():
            w.add_(1.0)
        y.float().square().sum().backward()
        return [x.grad, w.grad, b.grad]
    _assert_same(*_both(run, set_direct_weights))


def test_cache_cleared_at_region_exit_and_nested_regions(set_direct_weights):
    x0 = np.random.default_rng(4).standard_normal((2, 3, 6, 6)).astype(np.float32)
    set_direct_weights(True)
    (w,) = _params(3, (4, 3, 3, 3))
    cache = _amp_state._state()["cache"]
    with mdn.autocast("cpu"):
        y1 = F.conv2d(mdn.tensor(x0), w)
        w1 = cache[id(w)][2]
        with mdn.autocast("cpu"):       # nested: the outer region's cache serves it
            y2 = F.conv2d(mdn.tensor(x0), w)
            assert cache[id(w)][2] is w1
        assert cache[id(w)][2] is w1
    assert not cache
    assert type(w1.grad_fn) is AccumulateGrad and w1.grad_fn.variable is w and w1.dtype == BF16
    assert y1.grad_fn.next_functions[1][0] is y2.grad_fn.next_functions[1][0] is w1.grad_fn
    with mdn.autocast("cpu"):
        F.conv2d(mdn.tensor(x0), w)
        assert cache[id(w)][2] is not w1            # a new region: a new cast

    def run(inner):
        (w,) = _params(3, (4, 3, 3, 3))
        with mdn.autocast("cpu"):
            a = F.conv2d(mdn.tensor(x0), w)
            if inner == "nested":
                with mdn.autocast("cpu"):
                    b = F.conv2d(mdn.tensor(x0), w, stride=2)
            else:
                with mdn.autocast("cpu", enabled=False):     # autocast off inside: the float32 weight itself
                    b = F.conv2d(mdn.tensor(x0), w, stride=2)
                assert b.dtype == np.float32 and type(b.grad_fn.next_functions[1][0]) is AccumulateGrad
        (a.float().sum() + b.float().square().sum()).backward()
        return [a, b, w.grad]
    for inner in ("nested", "disabled"):
        _assert_same(*_both(lambda: run(inner), set_direct_weights))


def test_mixed_uses_sum_the_same_terms(set_direct_weights):
    """The one difference from the old path: a parameter with three or more gradient contributions, some from
    direct uses and some from elsewhere (a float32 use outside autocast, another op's cast node), has them added
    in the engine's arrival order at its accumulator, where the old path first added the autocast uses at the cast
    node.  The same float32 terms (each bit-equal), summed in another order: equal to float32 rounding."""
    x0 = np.random.default_rng(4).standard_normal((2, 3, 6, 6)).astype(np.float32)

    def run():
        (w,) = _params(3, (4, 3, 3, 3))
        with mdn.autocast("cpu"):
            a = F.conv2d(mdn.tensor(x0), w)
            b = F.conv2d(mdn.tensor(x0), w, stride=2)
            with mdn.autocast("cpu", enabled=False):
                c = F.conv2d(mdn.tensor(x0), w)
        (a.float().sum() + b.float().square().sum() + c.square().sum()).backward()
        return [a, b, c, w.grad]
    old, new = _both(run, set_direct_weights)
    _assert_same(old[:3], new[:3])
    assert new[3].dtype == old[3].dtype == np.float32
    np.testing.assert_allclose(new[3].numpy(), old[3].numpy(), rtol=1e-6, atol=1e-6 * np.abs(old[3].numpy()).max())


def test_hooks_retain_graph_and_autograd_grad(set_direct_weights):
    """A tensor hook on the parameter sees the float32 gradient and may replace it; post-accumulate hooks run;
    a retained graph's second backward accumulates; autograd.grad returns float32 gradients."""
    x0 = np.random.default_rng(6).standard_normal((2, 3, 6, 6)).astype(np.float32)

    def run():
        w, b = _params(5, (4, 3, 3, 3), (4,))
        seen, after = [], []
        w.register_hook(lambda g: (seen.append(g.dtype), g * 3)[1])
        b.register_post_accumulate_grad_hook(lambda p: after.append(p.grad.dtype))
        with mdn.autocast("cpu"):
            y = F.conv2d(mdn.tensor(x0), w, b)
        loss = y.float().square().sum()
        loss.backward(retain_graph=True)
        loss.backward(retain_graph=True)
        assert seen == [np.float32, np.float32] and after == [np.float32, np.float32]
        gw, gb = mdn.autograd.grad(loss, [w, b])
        assert gw.dtype == np.float32 and gb.dtype == np.float32
        return [w.grad, b.grad, gw, gb]
    _assert_same(*_both(run, set_direct_weights))


def test_create_graph_double_backward(set_direct_weights):
    """create_graph: the weight's gradient comes back in float32 with a graph (the cast node's differentiable
    transfer, as before), and the second-order gradients through it -- a gradient penalty on dw and on dx, reaching
    the weight through the layer's backward ops -- are the old path's bits."""
    rng = np.random.default_rng(12)
    x0 = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    l0 = rng.standard_normal((4, 3)).astype(np.float32)

    def run():
        w, b = _params(13, (5, 3, 3, 3), (5,))
        lw, lb = _params(14, (2, 3), (2,))
        x = mdn.tensor(x0, requires_grad=True)
        with mdn.autocast("cpu"):
            y = F.conv2d(x, w, b, padding=1)
            z = F.linear(mdn.tensor(l0, requires_grad=True), lw, lb)
        loss = y.float().square().sum() + z.float().square().sum()
        gx, gw, gb, glw, glb = mdn.autograd.grad(loss, [x, w, b, lw, lb], create_graph=True)
        for g in (gw, gb, glw, glb):
            assert g.dtype == np.float32 and g.requires_grad
        (gx.square().sum() + gw.square().sum() + gb.sum() + glw.square().sum() + glb.square().sum()).backward()
        return [gx, gw, gb, glw, glb, x.grad, w.grad, b.grad, lw.grad, lb.grad]
    _assert_same(*_both(run, set_direct_weights))


def test_create_graph_weight_used_twice(set_direct_weights):
    """The other difference: under create_graph a weight used twice gets each use's 16-bit gradient widened to
    float32 and the two added in float32, where the old path added them in 16 bits at the cast node and widened the
    rounded sum (first-order backward adds float32 gradients on both paths: bit-equal above).  The same terms, one
    16-bit rounding less: equal to within bfloat16's rounding."""
    x0 = np.random.default_rng(17).standard_normal((2, 4, 6, 6)).astype(np.float32)

    def run():
        w, b = _params(18, (4, 4, 3, 3), (4,))
        with mdn.autocast("cpu"):
            y = F.conv2d(F.conv2d(mdn.tensor(x0), w, b, padding=1), w, b, padding=1)
        gw, gb = mdn.autograd.grad(y.float().square().sum(), [w, b], create_graph=True)
        return [gw, gb]
    old, new = _both(run, set_direct_weights)
    for a, b in zip(old, new):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=2 ** -7,
                                   atol=2 ** -7 * np.abs(a.detach().numpy()).max())


def test_create_graph_backward_into_grad(set_direct_weights):
    x0 = np.random.default_rng(15).standard_normal((2, 4)).astype(np.float32)

    def run():
        w, b = _params(16, (3, 4), (3,))
        with mdn.autocast("cpu"):
            y = F.linear(mdn.tensor(x0), w, b)
        y.float().square().sum().backward(create_graph=True)
        assert w.grad.dtype == np.float32 and w.grad.requires_grad
        g1 = [w.grad.detach(), b.grad.detach()]
        ww = w.grad
        w.grad = b.grad = None
        ww.square().sum().backward()
        return g1 + [w.grad, b.grad]
    _assert_same(*_both(run, set_direct_weights))


def test_switch_from_the_environment():
    import subprocess
    import sys
    code = ("import minidnn as mdn, minidnn.nn.functional as F; from minidnn import _amp_state;"
            "w = mdn.randn(4, 3, 3, 3, requires_grad=True);"
            "exec('with mdn.autocast(\"cpu\"):\\n y = F.conv2d(mdn.randn(1, 3, 5, 5), w)');"
            "print(_amp_state.DIRECT_WEIGHTS[0], type(y.grad_fn.next_functions[1][0]).__name__)")
    for env, want in (("0", "False AutocastCast"), ("1", "True AccumulateGrad")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "MINIDNN_AMP_DIRECT_WEIGHTS": env})
        assert out.stdout.split()[-2:] == want.split()


# ---- the fake CuPy (tools/fake_gpu_step.py: the GPU path's Python, kernels recorded and never run) -----------------

@pytest.mark.parametrize("model,cl", [("mobilenet", "0"), ("resnet20", "1")])
def test_fake_gpu_step_launches_unchanged(tmp_path, model, cl):
    """The bf16 training step's launches (kernels, their arguments, the CuPy operations) are the same with direct
    weights on and off, and so are the engine's leaf-gradient copies and gradient sums (MODE=copies)."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    records, copies = [], []
    for on in ("0", "1"):
        out = tmp_path / f"rec{on}.json"
        for mode in ("record", "copies"):
            env = dict(os.environ, MODE=mode, AMP="bf16", CL=cl, OUT=str(out), MINIDNN_AMP_DIRECT_WEIGHTS=on)
            r = subprocess.run([sys.executable, os.path.join(root, "tools", "fake_gpu_step.py"), root, model, "2"],
                               capture_output=True, text=True, env=env, cwd=root, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            if mode == "copies":
                copies.append(r.stdout.strip().splitlines()[-1].split(":", 1)[1])
        records.append(json.loads(out.read_text()))
    assert records[0] == records[1] and len(records[0]) > 50
    assert copies[0] == copies[1] and "leaf copies" in copies[0]
