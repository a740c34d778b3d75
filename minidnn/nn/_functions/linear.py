"""A linear layer's product when its weight is autocast's cast of a float32 parameter.

# x: (*, in)   w: (out, in)   g = dy: (*, out)   y = x @ w.T   dx = g @ w   dw = g^T x over every leading row

``F.linear`` computes ``input @ weight.T`` with the Tensor ops (a Matmul and a transpose), whose backward gives dw
in the weight's dtype.  Under autocast that weight is a float16/bfloat16 cast of a float32 parameter, and the cast
node converts dw back to float32: one more launch per layer and step, and a rounding of dw to the low precision.
``LinearFloat32WeightGrad`` computes the same forward product and, in a first-order backward, dw in float32 straight
from the GEMM (cuBLAS's float32 output; on the CPU the product of float32 copies), which the cast node passes through
(``_amp_state.float32_grad_of``, docs/amp.md).  Under create_graph it is the plain formula in the weight's dtype.
"""
from __future__ import annotations

import numpy as np

from ...autograd import Function, is_grad_enabled
from ...backend import blas
from ._util import wrap

__all__ = ["LinearFloat32WeightGrad"]


class LinearFloat32WeightGrad(Function):
    """x @ w.T for a weight ``float32_grad_of`` marks; its dw comes back in float32 (first order)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, w if ctx.needs_input_grad[0] else None)
        return x @ w.T

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx = g @ w if need[0] else None
        if not need[1]:
            return gx, None
        if is_grad_enabled():           # create_graph: differentiable ops, dw in w's dtype
            x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
            return gx, g2.T @ x2
        x2, g2 = x.data.reshape(-1, x.shape[-1]), g.data.reshape(-1, g.shape[-1])
        return gx, wrap(blas.matmul(g2.T, x2, out_dtype=np.float32))
