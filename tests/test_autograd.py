"""The autograd engine: iterative backward, accumulation, graph freeing, grad modes, hooks,
autograd.grad, higher-order gradients, anomaly detection, the Function API and in-place checks."""
import time

import numpy as np
import pytest

import minidnn as mdn
from minidnn import autograd
from minidnn.autograd import Function, gradcheck, gradgradcheck


def leaf(values, device="cpu", dtype=mdn.float64):
    return mdn.tensor(np.asarray(values, dtype=np.float64), dtype=dtype, device=device, requires_grad=True)


# ------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------
def test_long_chain_backward_is_iterative():
    """100,000 ops deep: no RecursionError, in well under a few seconds."""
    x = mdn.tensor([1.0], requires_grad=True)
    one = mdn.tensor([1.0])
    t0 = time.perf_counter()
    y = x
    for _ in range(100_000):
        y = y + one
    y.backward(mdn.tensor([1.0]))
    assert x.grad.tolist() == [1.0]
    assert y.item() == 100_001.0
    assert time.perf_counter() - t0 < 30


def test_long_chain_of_multiplications_gradient():
    x = leaf([1.0])
    y = x
    for _ in range(20_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001 ** 20_000], rtol=1e-9)


def test_fan_out_accumulates(device):
    x = leaf([1.0, 2.0, -3.0], device)
    y = x * x + x * 3.0 + x.exp()        # x used four times
    y.sum().backward()
    a = np.array([1.0, 2.0, -3.0])
    np.testing.assert_allclose(x.grad.cpu().numpy(), 2 * a + 3 + np.exp(a))


def test_diamond_graph_each_node_runs_once():
    calls = []

    class Count(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            calls.append(1)
            return g

    x = leaf([1.0, 2.0])
    h = Count.apply(x)
    (h * 2.0 + h.sin() + h).sum().backward()
    assert len(calls) == 1
    np.testing.assert_allclose(x.grad.numpy(), 3.0 + np.cos([1.0, 2.0]))


def test_leaf_gradients_accumulate_over_two_backward_calls(device):
    x = leaf([1.0, 2.0], device)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), [2 + 3, 4 + 3])
    x.grad = None
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), [3, 3])


def test_grad_is_not_aliased_to_upstream_gradient():
    x = leaf([1.0, 2.0])
    g = mdn.tensor([1.0, 1.0], dtype=mdn.float64)
    (x + 0.0).backward(g)
    x.grad.data[0] = 100.0
    assert g.tolist() == [1.0, 1.0]
    (x + 0.0).backward(g)
    assert x.grad.tolist() == [101.0, 2.0]


def test_graph_is_freed_after_backward():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


def test_graph_freed_through_autograd_grad():
    x = leaf([1.0, 2.0])
    y = (x.exp() * x).sum()
    autograd.grad(y, x)
    with pytest.raises(RuntimeError, match="retain_graph"):
        autograd.grad(y, x)


def test_retain_graph_allows_a_second_backward():
    x = leaf([1.0, 2.0])
    y = (x * x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * 3 * np.array([1.0, 4.0]))


def test_backward_through_shared_subgraph_after_freeing_other_branch():
    x = leaf([1.0, 2.0])
    h = x.exp()
    a = (h * 2.0).sum()
    b = (h * 3.0).sum()
    a.backward(retain_graph=True)
    b.backward()
    np.testing.assert_allclose(x.grad.numpy(), 5 * np.exp([1.0, 2.0]))


# ------------------------------------------------------------------------------------------------
# Grad modes
# ------------------------------------------------------------------------------------------------
def test_no_grad_context_and_decorator():
    x = leaf([1.0])
    with mdn.no_grad():
        y = x * 2.0
        assert not mdn.is_grad_enabled()
    assert mdn.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None

    @mdn.no_grad()
    def f(t):
        return t * 2.0, mdn.is_grad_enabled()

    z, enabled = f(x)
    assert not z.requires_grad and not enabled
    assert mdn.is_grad_enabled()


def test_enable_grad_inside_no_grad_context_and_decorator():
    x = leaf([1.0])

    @mdn.enable_grad()
    def f(t):
        return t * 2.0

    with mdn.no_grad():
        with mdn.enable_grad():
            y = x * 2.0
        assert not mdn.is_grad_enabled()
        z = f(x)
    assert y.requires_grad and y.grad_fn is not None
    assert z.requires_grad


def test_no_grad_restores_mode_after_an_exception():
    with pytest.raises(ValueError):
        with mdn.no_grad():
            raise ValueError
    assert mdn.is_grad_enabled()


def test_set_grad_enabled_function_context_and_decorator():
    x = leaf([1.0])
    try:
        mdn.set_grad_enabled(False)
        assert not mdn.is_grad_enabled()
        assert not (x * 2.0).requires_grad
    finally:
        mdn.set_grad_enabled(True)
    assert mdn.is_grad_enabled()
    with mdn.set_grad_enabled(False):
        assert not (x * 2.0).requires_grad
    assert mdn.is_grad_enabled()
    with mdn.no_grad():
        with mdn.set_grad_enabled(True):
            assert (x * 2.0).requires_grad
        assert not mdn.is_grad_enabled()

    @mdn.set_grad_enabled(False)
    def f():
        return mdn.is_grad_enabled()

    assert mdn.is_grad_enabled()
    assert f() is False
    assert mdn.is_grad_enabled()


def test_backward_works_inside_no_grad_on_a_recorded_graph():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    with mdn.no_grad():
        y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


# ------------------------------------------------------------------------------------------------
# Hooks, retain_grad
# ------------------------------------------------------------------------------------------------
def test_register_hook_on_leaf_modifies_gradient_and_remove():
    x = leaf([1.0, 2.0])
    seen = []
    h1 = x.register_hook(lambda g: seen.append(g.tolist()))
    h2 = x.register_hook(lambda g: g * 10.0)
    (x * 3.0).sum().backward()
    assert seen == [[3.0, 3.0]]
    np.testing.assert_allclose(x.grad.numpy(), [30.0, 30.0])
    h1.remove()
    h2.remove()
    x.grad = None
    (x * 3.0).sum().backward()
    assert seen == [[3.0, 3.0]]
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_register_hook_on_non_leaf_changes_what_flows_upstream():
    x = leaf([1.0, 2.0])
    h = x * 2.0
    handle = h.register_hook(lambda g: g * 0.5)
    (h * h).sum().backward()        # dL/dh = 2h = [4, 8] -> halved -> [2, 4] -> times 2
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0])
    handle.remove()
    x.grad = None
    h2 = x * 2.0
    (h2 * h2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [8.0, 16.0])


def test_register_hook_needs_requires_grad():
    with pytest.raises(RuntimeError, match="requires? grad"):
        mdn.tensor([1.0]).register_hook(lambda g: g)


def test_retain_grad():
    x = leaf([1.0, 2.0])
    h = x * 3.0
    h.retain_grad()
    y = h * h
    z = y.sum()
    z.backward()
    np.testing.assert_allclose(h.grad.numpy(), 2 * 3 * np.array([1.0, 2.0]))
    assert y.grad is None       # not retained
    assert h.grad.grad_fn is None


def test_retain_grad_sees_hook_modified_gradient_and_accumulates():
    x = leaf([1.0])
    h = x * 1.0
    h.retain_grad()
    h.register_hook(lambda g: g * 2.0)
    y = (h * 5.0).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert h.grad.tolist() == [20.0]   # as PyTorch: retain_grad sees the gradient after the hooks
    assert x.grad.tolist() == [20.0]


# ------------------------------------------------------------------------------------------------
# autograd.grad and higher order
# ------------------------------------------------------------------------------------------------
def test_grad_returns_tuple_and_leaves_dot_grad_untouched():
    x = leaf([1.0, 2.0])
    w = leaf([3.0, 4.0])
    y = (x * w).sum()
    gx, gw = autograd.grad(y, [x, w])
    np.testing.assert_allclose(gx.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(gw.numpy(), [1.0, 2.0])
    assert x.grad is None and w.grad is None
    assert gx.grad_fn is None and not gx.requires_grad


def test_grad_with_grad_outputs_and_non_scalar_outputs():
    x = leaf([1.0, 2.0, 3.0])
    y = x * x
    (g,) = autograd.grad(y, x, grad_outputs=mdn.tensor([1.0, 0.5, 0.0], dtype=mdn.float64))
    np.testing.assert_allclose(g.numpy(), [2.0, 2.0, 0.0])
    y2 = x * x
    with pytest.raises(RuntimeError, match=r"\(3,\)"):
        autograd.grad(y2, x)


def test_grad_multiple_outputs():
    x = leaf([1.0, 2.0])
    a, b = (x * 2.0).sum(), (x * x).sum()
    (g,) = autograd.grad([a, b], [x])
    np.testing.assert_allclose(g.numpy(), [2 + 2, 2 + 4])


def test_grad_allow_unused():
    x = leaf([1.0])
    unused = leaf([2.0])
    y = (x * 2.0).sum()
    with pytest.raises(RuntimeError, match="allow_unused"):
        autograd.grad(y, [x, unused], retain_graph=True)
    gx, gu = autograd.grad(y, [x, unused], allow_unused=True)
    assert gx.tolist() == [2.0] and gu is None


def test_grad_of_intermediate_tensor():
    x = leaf([1.0, 2.0])
    h = x * 3.0
    y = (h * h).sum()
    (gh,) = autograd.grad(y, h)
    np.testing.assert_allclose(gh.numpy(), 2 * 3 * np.array([1.0, 2.0]))
    assert x.grad is None


def test_second_derivative_of_cube():
    x = leaf([-1.0, 0.5, 2.0])
    y = (x ** 3).sum()
    (g,) = autograd.grad(y, x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 3 * x.detach().numpy() ** 2)
    assert g.requires_grad
    (gg,) = autograd.grad(g.sum(), x, create_graph=True)
    np.testing.assert_allclose(gg.detach().numpy(), 6 * x.detach().numpy())
    (ggg,) = autograd.grad(gg.sum(), x)
    np.testing.assert_allclose(ggg.numpy(), [6.0, 6.0, 6.0])


def test_backward_create_graph_then_backward_again():
    x = leaf([2.0])
    y = (x * x * x).sum()
    y.backward(create_graph=True)
    g = x.grad
    assert g.requires_grad
    x.grad = None
    g.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [12.0])


def test_hessian_vector_product_against_torch():
    torch = pytest.importorskip("torch")
    a = np.array([0.3, -1.2, 0.7, 2.0])
    v = np.array([1.0, 0.5, -1.0, 2.0])
    W = np.arange(16.0).reshape(4, 4) / 10.0

    def f(M, x, W):
        return ((x @ W).tanh() * x).sum() + (x.exp() * x.sin()).sum()

    x = leaf(a)
    (g,) = autograd.grad(f(mdn, x, mdn.tensor(W)), x, create_graph=True)
    (hv,) = autograd.grad((g * mdn.tensor(v)).sum(), x)
    t = torch.tensor(a, requires_grad=True)
    (tg,) = torch.autograd.grad(f(torch, t, torch.tensor(W)), t, create_graph=True)
    (thv,) = torch.autograd.grad((tg * torch.tensor(v)).sum(), t)
    np.testing.assert_allclose(hv.numpy(), thv.numpy(), rtol=1e-10)


def test_gradcheck_reports_a_wrong_gradient():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g        # should be 2 x g

    x = leaf([1.0, 2.0])
    with pytest.raises(AssertionError, match="input 0"):
        gradcheck(Bad.apply, (x,))
    assert gradcheck(Bad.apply, (x,), raise_exception=False) is False


def test_gradcheck_rejects_float32():
    with pytest.raises(AssertionError, match="float64"):
        gradcheck(lambda t: t * 2.0, (mdn.tensor([1.0], requires_grad=True),))


# ------------------------------------------------------------------------------------------------
# Anomaly detection
# ------------------------------------------------------------------------------------------------
def test_detect_anomaly_names_sqrt_at_zero_and_where_it_was_created():
    x = leaf([0.0, 1.0])
    with autograd.detect_anomaly():
        y = x.sqrt()                      # created here
        with pytest.raises(RuntimeError) as info:
            y.sum().backward()
    msg = str(info.value)
    assert "Sqrt" in msg and ("nan" in msg or "inf" in msg)
    assert "test_autograd.py" in msg and "y = x.sqrt()" in msg


def test_detect_anomaly_custom_function_returning_nan():
    class NaNGrad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    x = leaf([1.0])

    @autograd.detect_anomaly()
    def run():
        NaNGrad.apply(x).sum().backward()

    with pytest.raises(RuntimeError, match="NaNGrad"):
        run()
    assert not autograd.is_anomaly_enabled()


def test_without_detect_anomaly_nan_propagates_silently():
    x = leaf([0.0])
    x.sqrt().sum().backward()
    assert not np.isfinite(x.grad.numpy()).all()


# ------------------------------------------------------------------------------------------------
# Function API
# ------------------------------------------------------------------------------------------------
class MulAdd(Function):
    """y = a * b + c, with c optional (a non-tensor argument too)."""

    @staticmethod
    def forward(ctx, a, b, scale, c=None):
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        ctx.record = ctx.needs_input_grad
        out = a * b * scale
        return out + c if c is not None else out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = g * b * ctx.scale if ctx.needs_input_grad[0] else None
        gb = g * a * ctx.scale if ctx.needs_input_grad[1] else None
        return ga, gb, None, g if ctx.needs_input_grad[3] else None


def test_function_forward_backward_and_needs_input_grad():
    a = leaf([1.0, 2.0])
    b = mdn.tensor([3.0, 4.0], dtype=mdn.float64)
    c = leaf([0.5, 0.5])
    y = MulAdd.apply(a, b, 2.0, c)
    assert y.grad_fn is not None and not y.is_leaf
    assert y.grad_fn.needs_input_grad == (True, False, False, True)
    y.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [6.0, 8.0])
    np.testing.assert_allclose(c.grad.numpy(), [1.0, 1.0])
    assert b.grad is None
    assert gradcheck(lambda a, b, c: MulAdd.apply(a, b, 2.0, c), (leaf([1.0, 2.0]), leaf([3.0, 4.0]), leaf([0.1, 0.2])))


def test_function_forward_runs_without_graph():
    class Probe(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.inside = (mdn.is_grad_enabled(), (x * 2.0).requires_grad)
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 2.0

    y = Probe.apply(leaf([1.0]))
    assert y.grad_fn.inside == (False, False)


def test_function_without_grad_inputs_records_nothing():
    y = MulAdd.apply(mdn.tensor([1.0]), mdn.tensor([2.0]), 1.0)
    assert y.grad_fn is None and not y.requires_grad


class Exp(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


def test_function_saving_its_output_is_twice_differentiable():
    x = leaf([0.5, -1.0])
    assert gradcheck(Exp.apply, (x,))
    assert gradgradcheck(Exp.apply, (x,))


def test_function_saved_tensors_freed_after_backward():
    x = leaf([1.0])
    y = Exp.apply(x)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.grad_fn.saved_tensors


class SortWithIndices(Function):
    """Multi-output: values (differentiable) and indices (marked non-differentiable)."""

    @staticmethod
    def forward(ctx, x):
        idx = np.argsort(x.numpy(), kind="stable")
        values = mdn.tensor(x.numpy()[idx])
        indices = mdn.tensor(idx)
        ctx.mark_non_differentiable(indices)
        ctx.idx = idx
        return values, indices

    @staticmethod
    def backward(ctx, g_values, g_indices):
        out = np.zeros(len(ctx.idx))
        out[ctx.idx] = g_values.numpy()
        return mdn.tensor(out)


def test_function_multi_output_and_mark_non_differentiable():
    x = leaf([3.0, 1.0, 2.0])
    values, indices = SortWithIndices.apply(x)
    assert values.requires_grad and not indices.requires_grad
    assert indices.tolist() == [1, 2, 0]
    (values * mdn.tensor([1.0, 10.0, 100.0], dtype=mdn.float64)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [100.0, 1.0, 10.0])


class SplitTwo(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0, x * 3.0

    @staticmethod
    def backward(ctx, ga, gb):
        return ga * 2.0 + gb * 3.0


def test_function_multi_output_one_unused_gets_zero_gradient():
    x = leaf([1.0, 2.0])
    a, b = SplitTwo.apply(x)
    assert a.grad_fn is b.grad_fn and (a.output_nr, b.output_nr) == (0, 1)
    b.sum().backward()               # a unused: its gradient materializes as zeros
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
    assert gradcheck(SplitTwo.apply, (leaf([1.0, 2.0]),))


def test_function_backward_with_wrong_number_of_gradients():
    class Wrong(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(RuntimeError, match="returned 1 gradients"):
        Wrong.apply(leaf([1.0]), leaf([2.0])).sum().backward()


# ------------------------------------------------------------------------------------------------
# In-place operations and the version counter
# ------------------------------------------------------------------------------------------------
def test_saved_tensor_modified_in_place_is_detected():
    x = leaf([1.0, 2.0])
    a = x * 2.0
    b = a * a                         # saves a
    a.add_(1.0)
    with pytest.raises(RuntimeError, match="in-place"):
        b.sum().backward()


def test_saved_tensor_modified_under_no_grad_is_detected():
    x = leaf([1.0, 2.0])
    w = mdn.tensor([3.0, 4.0], dtype=mdn.float64)
    y = x * w                         # saves w
    with mdn.no_grad():
        w.mul_(2.0)
    with pytest.raises(RuntimeError, match="version"):
        y.sum().backward()


def test_saved_tensor_of_custom_function_modified_in_place():
    x = leaf([1.0])
    w = mdn.tensor([2.0], dtype=mdn.float64)
    y = MulAdd.apply(x, w, 1.0)
    w += 1.0
    with pytest.raises(RuntimeError, match="in-place"):
        y.sum().backward()


def test_version_counter_counts_in_place_ops():
    t = mdn.tensor([1.0, 2.0])
    v0 = t._version
    t.add_(1.0)
    t.mul_(2.0)
    t[0] = 5.0
    assert t._version == v0 + 3
    assert t.tolist() == [5.0, 6.0]


@pytest.mark.parametrize("op", [lambda t: t.add_(1.0), lambda t: t.mul_(2.0), lambda t: t.zero_(),
                                lambda t: t.fill_(1.0), lambda t: t.__setitem__(0, 1.0), lambda t: t.clamp_(0, 1)])
def test_in_place_on_leaf_requiring_grad_raises(op):
    x = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match="leaf"):
        op(x)
    assert x.tolist() == [1.0, 2.0]
    with mdn.no_grad():              # the optimizer's way
        op(x)


def test_in_place_on_non_leaf_is_recorded():
    torch = pytest.importorskip("torch")
    a_np = np.array([0.5, -1.0, 2.0])
    a = leaf(a_np)
    x = a * 2.0
    x.add_(1.0)
    x.mul_(a)
    x[1] = 0.0
    (x * x).sum().backward()
    t = torch.tensor(a_np, requires_grad=True)
    tx = t * 2.0
    tx.add_(1.0)
    tx.mul_(t)
    tx[1] = 0.0
    (tx * tx).sum().backward()
    np.testing.assert_allclose(x.detach().numpy(), tx.detach().numpy())
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy())


def test_in_place_add_on_non_leaf_simple():
    a = leaf([1.0, 2.0])
    x = a * 2.0
    x.add_(1.0)
    (x * x).sum().backward()       # d/da (2a + 1)^2 = 4 (2a + 1)
    np.testing.assert_allclose(a.grad.numpy(), [12.0, 20.0])


def test_in_place_on_tensor_not_requiring_grad_with_grad_operand():
    w = leaf([2.0, 3.0])
    buf = mdn.zeros(2, dtype=mdn.float64)
    buf[0] = 1.0
    buf.add_(w)                     # buf now depends on w
    assert buf.requires_grad
    (buf * buf).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [2 * 3.0, 2 * 3.0])


def test_setitem_with_grad_value():
    x = leaf([1.0, 2.0, 3.0])
    v = leaf([10.0])
    y = x * 1.0
    y[1:2] = v
    (y * mdn.tensor([1.0, 2.0, 3.0], dtype=mdn.float64)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 0.0, 3.0])
    np.testing.assert_allclose(v.grad.numpy(), [2.0])


# ------------------------------------------------------------------------------------------------
# .grad owns its memory (no aliasing with the user's gradient, other leaves or hooks), without a
# needless copy where the engine is the only owner
# ------------------------------------------------------------------------------------------------
def test_gradient_passed_through_to_two_leaves_is_not_shared():
    x, w = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    (x + w).backward(mdn.tensor([1.0, 1.0], dtype=mdn.float64))
    (x * 1.0).sum().backward()                  # accumulates into x.grad in place
    assert x.grad.tolist() == [2.0, 2.0] and w.grad.tolist() == [1.0, 1.0]


def test_gradient_kept_by_a_hook_is_not_modified_by_accumulation():
    x = leaf([1.0])
    h = x + 0.0
    kept = []
    h.register_hook(lambda g: kept.append(g))
    x.register_hook(lambda g: kept.append(g))
    h.sum().backward()
    (x * 5.0).sum().backward()
    assert [k.tolist() for k in kept] == [[1.0], [1.0], [5.0]]
    assert x.grad.tolist() == [6.0]


def test_retained_gradient_not_modified_by_leaf_accumulation():
    x = leaf([1.0])
    h = x + 0.0
    h.retain_grad()
    h.sum().backward()
    (x * 5.0).sum().backward()
    assert h.grad.tolist() == [1.0] and x.grad.tolist() == [6.0]


def test_function_returning_a_saved_tensor_as_gradient_is_copied():
    class ReturnsSaved(Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            (w,) = ctx.saved_tensors
            return w, None

    w = mdn.tensor([2.0, 3.0], dtype=mdn.float64)
    x = leaf([1.0, 1.0])
    ReturnsSaved.apply(x, w).sum().backward()
    ReturnsSaved.apply(x, w).sum().backward()
    assert w.tolist() == [2.0, 3.0] and x.grad.tolist() == [4.0, 6.0]


def test_fresh_gradient_is_kept_without_a_copy():
    seen = {}

    class Double(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            r = g * 2.0
            seen["id"] = id(r.data)
            return r

    x = leaf([1.0, 2.0])
    Double.apply(x).backward(mdn.tensor([1.0, 1.0], dtype=mdn.float64))
    assert id(x.grad.data) == seen["id"]


# ------------------------------------------------------------------------------------------------
# clone
# ------------------------------------------------------------------------------------------------
def test_clone_copies_and_is_differentiable(device):
    x = leaf([1.0, 2.0], device)
    c = x.clone()
    assert c.grad_fn is not None and c.requires_grad
    with mdn.no_grad():
        c.add_(10.0)
    assert x.tolist() == [1.0, 2.0]
    y = x.clone()
    (y * y).sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), [2.0, 4.0])
    assert gradcheck(lambda t: t.clone() * 3.0, (leaf([0.5, 1.0], device),))
    assert gradgradcheck(lambda t: t.clone() * t, (leaf([0.5, 1.0], device),))
    z = mdn.clone(mdn.tensor([1, 2]))
    assert z.dtype == np.int64 and z.tolist() == [1, 2] and not z.requires_grad


def test_clone_then_in_place_avoids_version_error():
    x = leaf([1.0, 2.0])
    a = x * 2.0
    b = a * a
    a2 = a.clone()
    a2.add_(1.0)
    b.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [8.0, 16.0])


def test_copy_from_tensor_requiring_grad_records():
    w = leaf([2.0, 3.0])
    buf = mdn.zeros(2, dtype=mdn.float64)
    buf.copy_(w)
    assert buf.requires_grad
    (buf * buf).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [4.0, 6.0])
    w.grad = None
    with mdn.no_grad():
        buf2 = mdn.zeros(2, dtype=mdn.float64)
        buf2.copy_(w)
    assert not buf2.requires_grad and buf2.tolist() == [2.0, 3.0]


def test_zero_and_fill_on_graph_tensors_keep_inf_out_and_record_the_value():
    a = mdn.tensor([1.0, float("inf"), 2.0], requires_grad=True)
    x = a * 2
    x.zero_()                                  # a * 0 would give nan at the inf
    np.testing.assert_array_equal(x.numpy(), [0.0, 0.0, 0.0])
    x.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.0, 0.0, 0.0])
    v = mdn.tensor(3.0, requires_grad=True)
    y = a * 1
    y.fill_(v)                                 # the value's gradient flows: 3 elements took it
    y.sum().backward()
    assert v.grad.item() == 3.0


# ------------------------------------------------------------------------------------------------
# One op mechanism (issue 13): every recorded op is a Function
# ------------------------------------------------------------------------------------------------
def _subclasses(cls):
    out, stack = set(), [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                stack.append(sub)
    return out


def test_every_node_class_of_the_package_is_a_function():
    """Besides the engine's own AccumulateGrad and FunctionCtx, nothing in minidnn subclasses Node directly: an op
    is a Function (its forward computes, its backward is written in Tensor ops), recorded by Function.apply or by
    Function's lean node()/output() path."""
    import minidnn.nn  # noqa: F401  (the nn Functions are imported with it)
    others = {c for c in _subclasses(autograd.Node) if c.__module__.startswith("minidnn")
              and not issubclass(c, Function)} - {autograd.AccumulateGrad, autograd.FunctionCtx}
    assert not others, f"Node subclasses that are not Functions: {sorted(c.__qualname__ for c in others)}"


def test_built_in_ops_record_instances_of_their_function():
    a, b = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    for y, name in ((a * b, "MulBackward"), (a + b, "AddBackward"), (a.exp(), "ExpBackward"),
                    (a.sum(), "SumBackward"), (a.reshape(2, 1), "ReshapeBackward"), (a[0], "GetItemBackward"),
                    (mdn.cat([a, b]), "CatBackward"), (a.clamp(0.0, 1.5), "ClipBackward")):
        node = y.grad_fn
        assert isinstance(node, Function) and node.name() == name
        assert type(node).backward(node, mdn.ones_like(y)) is not None
    ctx = (a * b).grad_fn
    assert ctx.needs_input_grad == (True, True) and [t is s for t, s in zip(ctx.saved_tensors, (a, b))] == [True] * 2


@pytest.mark.parametrize("order", ["ancestor_first", "descendant_first"])
def test_roots_that_lie_on_each_others_paths(order):
    """backward over several roots where one root is another's input: each node is walked once, its dependencies
    counted once per consumer (the discovery marks seen nodes in its dependency counts), so x gets both paths."""
    x = leaf([1.0, -2.0, 0.5])
    y = x * 3.0
    z = (y * y).sum()
    roots, grads = [y, z], [mdn.tensor(np.array([1.0, 2.0, 4.0])), None]
    if order == "descendant_first":
        roots, grads = roots[::-1], grads[::-1]
    autograd.backward(roots, [g if g is not None else mdn.ones_like(z) for g in grads])
    expected = 3.0 * np.array([1.0, 2.0, 4.0]) + 18.0 * np.array([1.0, -2.0, 0.5])   # dy/dx g + dz/dx
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("bad_shape", [(5, 7), (3, 2), (2, 3, 2)])
def test_a_function_returning_a_gradient_of_the_wrong_shape_is_an_error(bad_shape):
    """A gradient that does not broadcast onto its input (not a summable broadcast of it) raises, naming the Function
    and the shapes: sum_to used to hand a (5, 7) gradient for a (2, 3) input through unchanged."""
    class Bad(mdn.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return mdn.ones(*bad_shape)

    x = mdn.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Bad\.backward returned a gradient of shape .* whose shape is \(2, 3\)"):
        Bad.apply(x).sum().backward()
    assert x.grad is None


def test_a_function_returning_a_broadcast_gradient_is_summed_down():
    class Wide(mdn.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return mdn.ones(4, 2, 3)

    x = mdn.randn(2, 3, requires_grad=True)
    Wide.apply(x).sum().backward()
    assert np.array_equal(x.grad.numpy(), np.full((2, 3), 4.0, np.float32))
