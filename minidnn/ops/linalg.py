"""matmul with NumPy's batching, broadcasting and 1-D rules, plus dtype/device transfer ops."""
from __future__ import annotations

import numpy as np

from .._amp_state import autocast_op
from ..autograd import Function, _state
from ..backend import blas as _blas
from ..backend import devices as _dev
from ..backend.devices import is_floating as _is_floating
from ..backend.errors import ArgumentError
from ..tensor import Tensor, _to_dtype, _wrap
from ._core import check_pair, fit, to_tensor

__all__ = ["matmul", "dot", "outer", "transfer", "astype", "clone", "mm", "bmm", "t", "einsum"]


class Matmul(Function):
    __slots__ = ()
    retain_inputs = True

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = gb = None
        if a.ndim == 1 and b.ndim == 1:          # dot product: g is a scalar
            return (g * b if ctx.next_edges[0] else None, g * a if ctx.next_edges[1] else None)
        # Promote 1-D operands as NumPy does, then undo the promotion on the gradients.
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        b2 = b.reshape(-1, 1) if b.ndim == 1 else b
        g2 = g
        if a.ndim == 1:
            g2 = g2.unsqueeze(-2)
        if b.ndim == 1:
            g2 = g2.unsqueeze(-1)
        if ctx.next_edges[0]:
            ga = matmul(g2, b2.swapaxes(-1, -2))
            ga = fit(ga, (a2.shape, a.dtype)).reshape(a.shape)
        if ctx.next_edges[1]:
            gb = matmul(a2.swapaxes(-1, -2), g2)
            gb = fit(gb, (b2.shape, b.dtype)).reshape(b.shape)
        return ga, gb


@autocast_op("matmul")
def matmul(a, b):
    """Matrix product with PyTorch's rules (torch.matmul, the @ operator): 1-D x 1-D is the dot product, a 1-D operand
    is treated as a row (first) or column (second) vector and that dim dropped, batch dims broadcast. Mismatched inner
    dims raise ArgumentError naming both shapes. On a GPU batched products go through cuBLAS on the current stream; a
    bfloat16 product is rounded once to bfloat16. Under autocast it runs in the autocast dtype."""
    if not isinstance(b, Tensor):
        b = to_tensor(b, a)
    check_pair("matmul", a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ArgumentError(f"matmul: both operands need at least one dimension, got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)} (use * for scalars)")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise ArgumentError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} are not aligned: {ka} (last dim of "
                         f"the first) != {kb} ({'second-to-last' if b.ndim > 1 else 'only'} dim of the second)")
    try:
        if type(a.data) is np.ndarray:
            out = _blas.cpu_matmul(a.data, b.data)  # CPU: BLAS on minidnn's threads for large products (grain)
        elif a.ndim < 2 or b.ndim < 2:
            out = a.data @ b.data
        else:
            out = _blas.matmul(a.data, b.data)      # GPU: cuBLAS on the current stream (graph-capturable)
    except ValueError:
        raise ArgumentError(f"matmul: batch dimensions of {tuple(a.shape)} and {tuple(b.shape)} cannot be broadcast "
                         "together") from None
    if out.dtype != a.dtype and a.dtype == b.dtype:
        out = out.astype(a.dtype)       # NumPy returns bfloat16 products in float32: round once, as a GEMM would
    if _state.grad_enabled and (a.requires_grad or b.requires_grad):
        return Matmul.node(a, b).output(out)
    return _wrap(out)


def dot(a, b):
    """The inner product of two 1-D tensors of one length (torch.dot), a 0-d tensor; other ranks raise ArgumentError
    (use matmul)."""
    if a.ndim != 1 or b.ndim != 1:
        raise ArgumentError(f"dot: expected 1-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return matmul(a, b)


def outer(a, b):
    """The outer product of two vectors (torch.outer): out[i, j] = a[i] * b[j]; inputs of any shape are flattened
    first."""
    return a.reshape(-1, 1) * b.reshape(1, -1)


class Transfer(Function):
    __slots__ = ("src_device", "src_dtype")

    @staticmethod
    def backward(ctx, g):
        return (transfer(g, device=ctx.src_device, dtype=ctx.src_dtype),)


def transfer(x, device=None, dtype=None, copy=False):
    """``x`` on ``device`` with ``dtype``: the explicit (differentiable) way across devices and dtypes."""
    dt = _to_dtype(dtype)
    dev = _dev.device(device) if device is not None else x.device
    same_dev = dev == x.device
    if same_dev and (dt is None or dt == x.dtype) and not copy:
        return x
    out = _dev.to_device(x.data, dev, dtype=dt, copy=copy)
    if _state.grad_enabled and x.requires_grad and (dt is None or _is_floating(dt, complex_ok=True)):
        n = Transfer.node(x)
        n.src_device, n.src_dtype = x.device, x.dtype
        return n.output(out)
    return _wrap(out)


def astype(x, dtype):
    return transfer(x, dtype=dtype)


def clone(x):
    """A copy with its own memory; differentiable (the gradient passes through unchanged)."""
    return transfer(x, copy=True)


def mm(input, mat2):
    """The matrix product of two 2-D tensors (no broadcasting, as torch.mm)."""
    if input.ndim != 2 or mat2.ndim != 2:
        raise ArgumentError(f"mm: expected 2-D tensors, got shapes {tuple(input.shape)} and {tuple(mat2.shape)}")
    if input.dtype != mat2.dtype:
        raise ArgumentError(f"mm: expected both operands to have the same dtype, but got {input.dtype} and "
                            f"{mat2.dtype}")
    return matmul(input, mat2)


def bmm(input, mat2):
    """Batched matrix product of (b, n, m) and (b, m, p) tensors (no broadcasting, as torch.bmm)."""
    if input.ndim != 3 or mat2.ndim != 3:
        raise ArgumentError(f"bmm: expected 3-D tensors, got shapes {tuple(input.shape)} and {tuple(mat2.shape)}")
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise ArgumentError(f"bmm: shapes {tuple(input.shape)} and {tuple(mat2.shape)} do not match (expected (b, n, "
                            "m) and (b, m, p))")
    if input.dtype != mat2.dtype:
        raise ArgumentError(f"bmm: expected both operands to have the same dtype, but got {input.dtype} and "
                            f"{mat2.dtype}")
    return matmul(input, mat2)


def t(input):
    """Transpose of a tensor with at most 2 dims (0-d and 1-D come back as they are)."""
    if input.ndim > 2:
        raise ArgumentError(f"t() expects a tensor with <= 2 dimensions, but self is {input.ndim}D (shape "
                            f"{tuple(input.shape)}); use transpose(dim0, dim1) or .mT")
    return input if input.ndim < 2 else input.transpose(0, 1)


# -- einsum ---------------------------------------------------------------------------------------
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse_einsum(equation, shapes):
    """Explicit subscripts (ellipses spelled out as letters), one string per operand, and the output's."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->")
    else:
        lhs, out = eq, None
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise ArgumentError(f"einsum(): {len(ins)} operands in the equation {equation!r} but {len(shapes)} given")
    used = set(c for c in eq if c.isalpha())
    free = [c for c in _LETTERS if c not in used]
    ell = 0
    for s, shp in zip(ins, shapes):
        if "..." in s:
            ell = builtin_max(ell, len(shp) - (len(s) - 3))
    ell_letters = "".join(free[:ell])
    spelled = []
    for s, shp in zip(ins, shapes):
        if "..." in s:
            k = len(shp) - (len(s) - 3)
            s = s.replace("...", ell_letters[ell - k:] if k else "")
        if len(s) != len(shp):
            raise ArgumentError(f"einsum(): the subscripts {s!r} do not match an operand of shape {tuple(shp)}")
        spelled.append(s)
    if out is None:
        counts = {}
        for s in spelled:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        out = ell_letters + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell_letters))
    else:
        out = out.replace("...", ell_letters)
    return spelled, out


def builtin_max(a, b):
    return a if a > b else b


def einsum(equation, *operands):
    """Einstein summation with PyTorch's signature (operands as arguments or one list); differentiable: the
    gradient of each operand is an einsum of the output gradient with the others."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    from ..autograd import Function

    ins, out = _parse_einsum(equation, [o.shape for o in operands])
    eq = ",".join(ins) + "->" + out
    for o in operands[1:]:
        check_pair("einsum", operands[0], o)

    class Einsum(Function):
        @staticmethod
        def forward(ctx, *ops):
            xp = ops[0]._xp()
            arrs = [o.data for o in ops]
            dt = arrs[0].dtype
            for a in arrs[1:]:
                dt = np.promote_types(dt, a.dtype)
            return _wrap(xp.einsum(eq, *[a.astype(dt, copy=False) for a in arrs]))

        @staticmethod
        def backward(ctx, g):
            grads = []
            for i, sub in enumerate(ins):
                if not ctx.needs_input_grad[i]:
                    grads.append(None)
                    continue
                shape = operands[i].shape
                uniq = "".join(dict.fromkeys(sub))      # a repeated letter ('ii') reads a diagonal
                size = {c: shape[sub.index(c)] for c in uniq}
                others = [ins[j] for j in range(len(ins)) if j != i]
                avail = set(out).union(*others) if others else set(out)
                keep = "".join(c for c in uniq if c in avail)
                gi = einsum(",".join([out] + others) + "->" + keep, g, *[operands[j] for j in range(len(ins))
                                                                        if j != i])
                if keep != uniq:      # letters summed in this operand only: broadcast the gradient back
                    gi = gi.reshape(tuple(size[c] if c in keep else 1 for c in uniq))
                    gi = gi.expand(*[size[c] for c in uniq])
                if uniq != sub:       # put the diagonal's gradient on the diagonal: times identity matrices
                    spare = iter(c for c in _LETTERS if c not in eq)
                    seen, spelled, eyes = set(), "", []
                    xp = g._xp()
                    for c in sub:
                        if c in seen:
                            f = next(spare)
                            spelled += f
                            eyes.append((c + f, _wrap(xp.eye(size[c], dtype=gi.dtype))))
                        else:
                            seen.add(c)
                            spelled += c
                    gi = einsum(",".join([uniq] + [e for e, _ in eyes]) + "->" + spelled, gi, *[t for _, t in eyes])
                grads.append(gi.astype(operands[i].dtype) if gi.dtype != operands[i].dtype else gi)
            return tuple(grads)

    return Einsum.apply(*operands)
