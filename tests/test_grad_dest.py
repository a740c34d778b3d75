"""Gradient destinations (minidnn/_grad_dest.py): a Function's backward writing an input's gradient in place --
into the gradient the engine already holds for that input (beta 1), or into a leaf's flat-buffer slot (beta 0).
Checked against the same graph computed without destinations (float64, exact), and for every case where a
destination must NOT be offered."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import autograd
from minidnn._grad_dest import destination
from minidnn.autograd import Function

TAKEN = []      # (beta) per destination used by Scale's backward, for the assertions


class Scale(Function):
    """y = k * x, whose backward uses the destination when ``use`` is set (the way a blending kernel would:
    dest = beta * dest + k * gy in one pass)."""
    use = True

    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return mdn.Tensor(x.data * k)

    @staticmethod
    def backward(ctx, gy):
        d = destination(ctx, 0) if Scale.use else None
        if d is None:
            return mdn.Tensor(gy.data * ctx.k), None
        array, beta, pending = d
        assert array.shape == gy.shape and array.dtype == gy.data.dtype
        TAKEN.append(beta)
        array[...] = (array if beta else 0) + gy.data * ctx.k
        return (pending if pending is not None else mdn.Tensor(array)), None


@pytest.fixture(autouse=True)
def _reset():
    TAKEN.clear()
    Scale.use = True
    yield
    Scale.use = True


def _twice_used(use, seed=0):
    """x used by a plain op and by Scale (a residual-style fork): x.grad and the destinations taken."""
    rng = np.random.default_rng(seed)
    x = mdn.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = mdn.tensor(rng.standard_normal((3, 4)))
    Scale.use = use
    h = x * 1.5                       # x's first consumer, a plain op
    out = (Scale.apply(h, 3.0) * w).sum() + (h * h).sum()      # h used twice: Scale and h*h
    out.backward()
    return x.grad.numpy().copy(), list(TAKEN)


def test_pending_gradient_is_blended_in_place_with_the_engines_sum():
    ref, taken_ref = _twice_used(False)
    TAKEN.clear()
    got, taken = _twice_used(True)
    assert taken_ref == [] and taken == [1.0]      # h*h's gradient of h was pending when Scale's backward ran
    np.testing.assert_array_equal(got, ref)


def test_pending_gradient_taken_when_scale_runs_second():
    # Scale's node runs after the mul's: the mul is recorded later, so the engine reaches it first (LIFO ready list)
    rng = np.random.default_rng(1)
    x = mdn.tensor(rng.standard_normal((5,)), requires_grad=True)
    h = x * 2.0
    a = Scale.apply(h, 3.0)
    b = h * h
    (a.sum() + (b * 0.5).sum()).backward()
    expected = 2.0 * (3.0 + 0.5 * 2 * (2.0 * x.numpy()))
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=0, atol=1e-12)
    assert TAKEN == [1.0]


def test_leaf_flat_slot_written_directly_and_kept():
    x = mdn.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    flat = np.full(10, 7.0)
    slot = flat[2:8].reshape(2, 3)
    x._grad_storage = slot
    Scale.apply(x, 2.5).sum().backward()
    assert TAKEN == [0.0]
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.5))
    np.testing.assert_array_equal(flat[2:8], np.full(6, 2.5))      # in the flat buffer itself
    assert flat[0] == 7.0 and flat[9] == 7.0                       # nothing outside the slot
    # a second backward accumulates (x.grad exists now: no destination, the engine's in-place add)
    TAKEN.clear()
    Scale.apply(x, 2.5).sum().backward()
    assert TAKEN == []
    np.testing.assert_array_equal(flat[2:8], np.full(6, 5.0))


def test_leaf_used_twice_second_producer_blends_into_the_slot():
    x = mdn.tensor(np.ones((4,)), requires_grad=True)
    flat = np.zeros(4)
    x._grad_storage = flat
    (Scale.apply(x, 2.0).sum() + Scale.apply(x, 3.0).sum()).backward()
    assert sorted(TAKEN) == [0.0, 1.0]
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 5.0))
    np.testing.assert_array_equal(flat, np.full(4, 5.0))


def test_no_destination_for_a_leaf_with_a_hook():
    x = mdn.tensor(np.ones((4,)), requires_grad=True)
    x._grad_storage = np.zeros(4)
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    Scale.apply(x, 2.0).sum().backward()
    assert TAKEN == []
    np.testing.assert_array_equal(seen[0], np.full(4, 2.0))
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 2.0))


def test_no_destination_when_the_pending_gradient_is_shared():
    # an add passes the same gradient tensor to both operands: writing into it in place would corrupt the other
    x = mdn.tensor(np.ones((3,)), requires_grad=True)
    y = mdn.tensor(np.ones((3,)), requires_grad=True)
    hx = x * 1.0
    s = hx + y * 1.0          # AddBackward sends the same gradient to hx's and y*1's nodes
    out = s.sum() + Scale.apply(hx, 4.0).sum()
    out.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 5.0))
    np.testing.assert_array_equal(y.grad.numpy(), np.full(3, 1.0))


def test_no_destination_in_autograd_grad_or_create_graph():
    x = mdn.tensor(np.ones((3,)), requires_grad=True)
    x._grad_storage = np.zeros(3)
    (g,) = autograd.grad(Scale.apply(x, 2.0).sum(), [x])
    assert TAKEN == []
    np.testing.assert_array_equal(g.numpy(), np.full(3, 2.0))
    Scale.apply(x, 2.0).sum().backward(create_graph=True)
    assert TAKEN == []
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 2.0))


def test_no_destination_outside_backward():
    x = mdn.tensor(np.ones((3,)), requires_grad=True)
    y = Scale.apply(x, 2.0)
    assert destination(y.grad_fn, 0) is None


def test_a_pending_view_is_offered_only_when_nothing_else_refers_to_its_base():
    class Ctx:
        pass
    child = object()
    ctx = Ctx()
    ctx.next_edges = ((child, 0),)
    base = np.zeros((2, 6))
    alias = base[1]                                   # another view of the same memory, alive
    g = mdn.Tensor._from_array(base[0])
    del base
    prev = autograd._state.buffers
    try:
        autograd._state.buffers = {child: [g]}
        del g
        assert destination(ctx, 0) is None            # the base is shared with `alias`: never written in place
        del alias
        d = destination(ctx, 0)                       # now only the pending view refers to it
        assert d is not None and d[1] == 1.0 and d[0].shape == (6,)
        autograd._state.buffers[child][0] = mdn.Tensor._from_array(np.zeros((3, 4)).T)      # a strided view: offered,
        assert destination(ctx, 0) is not None                                              # callers check layout
    finally:
        autograd._state.buffers = prev


def _fake_step_counts(model, batch, **env):
    """(leaf copies, gradient sums) of one warm training step of ``model`` on the fake CuPy (tools/fake_gpu_step.py,
    MODE=copies: the GPU path's Python with launches recorded, never run), in a subprocess."""
    import os
    import pathlib
    import re
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    e = dict(os.environ, MODE="copies", PYTHONPATH=str(root), **env)
    out = subprocess.run([sys.executable, str(root / "tools" / "fake_gpu_step.py"), str(root), model, str(batch)],
                         env=e, capture_output=True, text=True, timeout=300)
    m = re.search(r"leaf copies (\d+), gradient sums (\d+)", out.stdout)
    assert m, out.stdout[-2000:] + out.stderr[-2000:]
    return int(m.group(1)), int(m.group(2))


def test_gpu_step_keeps_gradients_in_place_under_the_fake_cupy():
    # ResNet-20: 65 parameters (21 conv weights, 21 x 2 batch-norm, the linear layer's 2), 9 residual blocks.  With
    # destinations the conv weights, batch-norm parameters and the linear layer's two (cublasLt's product and its
    # row-sum epilogue) land in the flat buffer (the stem's direct-kernel conv too, since round 21), and every residual
    # block's input gradient is blended in place (the one sum left is the loss's own root buffer meeting nothing:
    # counted by the engine's call, not an add).  Without cublasLt the linear layer's two are copied.
    assert _fake_step_counts("resnet20", 8, MINIDNN_GRAD_DEST="0") == (65, 10)
    assert _fake_step_counts("resnet20", 8) == (0, 1)
    assert _fake_step_counts("resnet20", 8, MINIDNN_CUBLASLT="0") == (2, 1)


class _Float32Grad(Function):
    """y = sum(k * w) over a 16-bit w, whose backward hands w's gradient back in float32 into the destination (as
    the filter-gradient kernels do with ``dw_dtype``)."""

    @staticmethod
    def forward(ctx, w, k):
        ctx.k, ctx.shape = k, w.shape
        return mdn.Tensor(np.asarray((w.data.astype(np.float32) * k).sum(), dtype=np.float32))

    @staticmethod
    def backward(ctx, gy):
        d = destination(ctx, 0)
        g = np.full(ctx.shape, ctx.k, dtype=np.float32) * np.float32(gy.data)
        if d is None:
            return mdn.Tensor(g), None
        TAKEN.append(d[1])
        assert d[0].dtype == np.float32
        d[0][...] = g
        return mdn.Tensor(d[0]), None


def test_the_slot_is_offered_through_autocasts_cast_of_a_float32_leaf():
    from minidnn.amp.autocast_mode import _cast
    w = mdn.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3), requires_grad=True)
    flat = np.zeros(8, np.float32)
    w._grad_storage = flat[1:7].reshape(2, 3)
    wc = _cast(w, mdn.bfloat16)                 # autocast's marked cast node (float32 -> bfloat16)
    assert wc.dtype == mdn.bfloat16 and getattr(wc.grad_fn, "float32_grad_ok", False)
    _Float32Grad.apply(wc, 3.0).backward()
    assert TAKEN == [0.0]
    np.testing.assert_array_equal(flat, [0, 3, 3, 3, 3, 3, 3, 0])
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 3), 3.0, np.float32))
    # a float16/bfloat16 leaf's cast (src dtype not float32) is not looked through
    TAKEN.clear()
    v = mdn.tensor(np.ones(3, np.float32), requires_grad=True).to(mdn.float16).detach().requires_grad_()
    v._grad_storage = np.zeros(3, np.float16)
    _Float32Grad.apply(_cast(v, mdn.bfloat16), 1.0).backward()
    assert TAKEN == []
