"""Numerical gradient checks (PyTorch's ``torch.autograd.gradcheck`` / ``gradgradcheck``): central differences in
float64 compared with the analytic vector-Jacobian products, one random cotangent per output.  Reached as
``minidnn.autograd.gradcheck``."""
from __future__ import annotations

import numpy as np

from .autograd import enable_grad, grad, no_grad
from .backend.devices import is_floating as _is_floating
from .tensor import Tensor

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


class GradcheckError(AssertionError):
    pass


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _flat_outputs(fn, inputs):
    out = fn(*inputs)
    outs = _as_tuple(out) if not isinstance(out, list) else tuple(out)
    return tuple(o for o in outs if isinstance(o, Tensor))


def _numerical_jacobian_vjp(fn, inputs, i, vs, eps):
    """d<outputs, vs>/d inputs[i] by central differences, in float64, one element at a time."""
    x = inputs[i]
    xp = x._xp()
    flat = x.data.reshape(-1)       # a view: perturb in place
    grad = np.zeros(flat.size, dtype=np.float64)
    with no_grad():
        for k in range(flat.size):
            orig = flat[k].item()
            flat[k] = orig + eps
            fp = sum(float((o.data * v).sum()) for o, v in zip(_flat_outputs(fn, inputs), vs))
            flat[k] = orig - eps
            fm = sum(float((o.data * v).sum()) for o, v in zip(_flat_outputs(fn, inputs), vs))
            flat[k] = orig
            grad[k] = (fp - fm) / (2 * eps)
    return grad.reshape(x.shape), xp


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True, seed=0):
    """Compare analytical gradients of ``fn(*inputs)`` with float64 central differences.

    Every floating input that requires grad is checked through a random vector-Jacobian product
    (one backward, 2 * numel forwards per input).  On failure the report names the input, the
    worst element, and the numerical and analytical values there.
    """
    inputs = _as_tuple(inputs) if not isinstance(inputs, list) else tuple(inputs)
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and x.requires_grad and x.dtype != np.float64:
            raise GradcheckError(f"gradcheck: input {i} has dtype {x.dtype}; use float64 inputs (finite differences "
                                 "in lower precision are too coarse to check anything)")
    outs = _flat_outputs(fn, inputs)
    rng = np.random.default_rng(seed)
    vs = []
    for o in outs:
        xp = o._xp()
        vs.append(xp.asarray(rng.standard_normal(o.shape)).astype(o.dtype) if _is_floating(o.dtype)
                  else xp.zeros(o.shape, dtype=o.dtype))
    diff_inputs = [(i, x) for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    diff_outs = [(o, v) for o, v in zip(outs, vs) if o.requires_grad]
    if diff_outs:
        analytic = grad([o for o, _ in diff_outs], [x for _, x in diff_inputs],
                        [Tensor._from_array(v) for _, v in diff_outs], allow_unused=True)
    else:
        analytic = (None,) * len(diff_inputs)
    for (i, x), a in zip(diff_inputs, analytic):
        num, xp = _numerical_jacobian_vjp(fn, inputs, i, vs, eps)
        ana = np.zeros(x.shape) if a is None else a.numpy().astype(np.float64)
        err = np.abs(num - ana)
        tol = atol + rtol * np.abs(num)
        if not np.all(err <= tol) or not np.all(np.isfinite(ana)):
            k = int(np.argmax(err - tol)) if err.size else 0
            idx = np.unravel_index(k, x.shape) if x.ndim else ()
            msg = (f"gradcheck failed for input {i} (shape {tuple(x.shape)}): "
                   f"worst element {tuple(int(j) for j in idx)}: "
                   f"numerical {num.reshape(-1)[k]:.8g} vs analytical {ana.reshape(-1)[k]:.8g} "
                   f"(|diff| {err.reshape(-1)[k]:.3g} > atol {atol} + rtol {rtol} * |numerical|)")
            if raise_exception:
                raise GradcheckError(msg)
            return False
    return True


def gradgradcheck(fn, inputs, grad_outputs=None, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True, seed=1):
    """gradcheck of the first derivative: checks that backward is itself correctly differentiable."""
    inputs = _as_tuple(inputs) if not isinstance(inputs, list) else tuple(inputs)
    outs = _flat_outputs(fn, inputs)
    rng = np.random.default_rng(seed)
    if grad_outputs is None:
        grad_outputs = tuple(Tensor._from_array(o._xp().asarray(rng.standard_normal(o.shape)), requires_grad=True)
                             for o in outs)
    grad_outputs = _as_tuple(grad_outputs)
    n_in = len(inputs)
    diff_idx = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]

    def first_derivative(*args):
        # gradcheck evaluates its function under no_grad for the finite differences; the first
        # derivative needs a graph to differentiate, whatever the ambient mode.
        with enable_grad():
            xs, gos = args[:n_in], args[n_in:]
            outs = _flat_outputs(fn, xs)
            gs = grad(outs, [xs[i] for i in diff_idx], gos, create_graph=True, allow_unused=True)
            return tuple(g for g in gs if g is not None)

    return gradcheck(first_derivative, tuple(inputs) + tuple(grad_outputs), eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, seed=seed)
