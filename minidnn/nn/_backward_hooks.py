"""Module backward hooks (PyTorch's ``register_full_backward_hook`` / ``register_full_backward_pre_hook``).

As PyTorch's BackwardHook does: the module's tensor arguments pass through one identity Function before
``forward`` and its tensor outputs through another after it.  The outputs' identity sees grad_output first
(pre-hooks may replace it); the inputs' identity then sees grad_input and calls
``hook(module, grad_input, grad_output)``, which may return a replacement grad_input.  When no argument
requires grad, the hooks run from the outputs' identity with grad_input all None.
"""
from __future__ import annotations

from ..autograd import Function
from ..backend import devices as _dev
from ..tensor import Tensor


class _CallState:
    __slots__ = ("module", "grad_output", "n_inputs", "positions", "inputs_hooked")

    def __init__(self, module, n_inputs, positions):
        self.module, self.n_inputs, self.positions = module, n_inputs, positions
        self.grad_output, self.inputs_hooked = None, False


def _run_hooks(state, grad_input):
    m = state.module
    for hook in list(m._backward_hooks.values()):
        result = hook(m, grad_input, state.grad_output)
        if result is not None:
            result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            if len(result) != len(grad_input):
                raise RuntimeError(f"Backward hook returned an invalid number of grad_input, got {len(result)}, but "
                                   f"expected {len(grad_input)}")
            grad_input = result
    return grad_input


class _InputIdentity(Function):
    @staticmethod
    def forward(ctx, state, *xs):
        ctx.state = state
        ctx.arrays = [x.data for x in xs]
        ctx.set_materialize_grads(False)
        outs = tuple(Tensor._from_array(x.data) for x in xs)
        ctx.mark_non_differentiable(*[o for o, x in zip(outs, xs) if not x.requires_grad])
        return outs

    @staticmethod
    def backward(ctx, *grads):
        state = ctx.state
        # PyTorch's packing: one entry per positional argument, None for non-tensors, zeros for a tensor
        # argument that does not require grad (or received none)
        grads = [g if g is not None else Tensor._from_array(_dev.array_module(a).zeros_like(a))
                 for g, a in zip(grads, ctx.arrays)]
        full = [None] * state.n_inputs
        for i, g in zip(state.positions, grads):
            full[i] = g
        if state.grad_output is not None and state.module._backward_hooks:
            full = _run_hooks(state, tuple(full))
        return (None,) + tuple(full[i] if need else None
                               for i, need in zip(state.positions, ctx.needs_input_grad[1:]))


class _OutputIdentity(Function):
    @staticmethod
    def forward(ctx, state, *ys):
        ctx.state = state
        ctx.set_materialize_grads(False)
        return tuple(Tensor._from_array(y.data) for y in ys)

    @staticmethod
    def backward(ctx, *grads):
        state = ctx.state
        m = state.module
        for hook in list(m._backward_pre_hooks.values()):
            result = hook(m, grads)
            if result is not None:
                result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
                if len(result) != len(grads):
                    raise RuntimeError(f"Backward pre hook returned an invalid number of grad_output, got "
                                       f"{len(result)}, but expected {len(grads)}")
                grads = result
        state.grad_output = grads
        if not state.inputs_hooked and m._backward_hooks:
            _run_hooks(state, (None,) * state.n_inputs)
        return (None,) + tuple(grads)


def call_with_backward_hooks(module, args, kwargs, call):
    """``call(*args, **kwargs)`` with the module's tensor arguments and outputs routed through the identities."""
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    state = _CallState(module, len(args), positions)
    args = list(args)
    if any(args[i].requires_grad for i in positions):
        wrapped = _InputIdentity.apply(state, *[args[i] for i in positions])
        if isinstance(wrapped, tuple) and any(w.grad_fn is not None for w in wrapped):
            state.inputs_hooked = True
            for i, w in zip(positions, wrapped):
                args[i] = w
    output = call(*args, **kwargs)
    single = isinstance(output, Tensor)
    outs = (output,) if single else (tuple(output) if isinstance(output, (tuple, list)) else None)
    if outs is None:
        return output
    places = [i for i, o in enumerate(outs) if isinstance(o, Tensor)]
    if not any(outs[i].requires_grad for i in places):
        return output
    wrapped = _OutputIdentity.apply(state, *[outs[i] for i in places])
    outs = list(outs)
    for i, w in zip(places, wrapped):
        outs[i] = w
    if single:
        return outs[0]
    return type(output)(outs) if isinstance(output, list) else tuple(outs)
