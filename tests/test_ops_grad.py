"""The op table: every differentiable op, forward against NumPy float64, float64 gradcheck on every
device, PyTorch as an oracle for forward and backward, and gradgradcheck for elementwise/matmul.

A row is ``Case(id, fn, inputs, ref)``:
  fn(M, *tensors)   the op, written once; ``M`` is the module (minidnn, or torch for the oracle),
  inputs            one spec per differentiable input: (kind, shape), kinds in ``_make``,
  ref(*arrays)      the NumPy float64 reference,
  torch             True: run ``fn(torch, ...)`` as the oracle; a callable: its own torch spelling;
                    False: no PyTorch equivalent,
  gg                also gradgradcheck this row.
Tensors stay tiny (gradcheck costs 2 * numel forwards per input).
"""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.autograd import gradcheck, gradgradcheck

try:            # only the two property tests at the end need hypothesis
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:
    st = None


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------
def _make(kind, shape, rng):
    n = int(np.prod(shape)) if shape else 1
    if kind == "r":       # any real
        return rng.standard_normal(shape)
    if kind == "p":       # positive, away from 0 (log, sqrt, pow base)
        return rng.uniform(0.5, 2.0, shape)
    if kind == "nz":      # away from the kink at 0 (abs, relu)
        return rng.uniform(0.3, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    if kind == "u":       # distinct values far apart (max/min without ties)
        return (rng.permutation(n).astype(np.float64) * 0.37 - 1.0).reshape(shape)
    if kind == "z1":      # one exact zero (prod)
        a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        a.reshape(-1)[1] = 0.0
        return a
    if kind == "z2":      # two zeros (prod: gradient nonzero only where the other zero is excluded)
        a = rng.uniform(0.5, 1.5, shape)
        a.reshape(-1)[0] = 0.0
        a.reshape(-1)[-1] = 0.0
        return a
    raise ValueError(kind)


class Case:
    def __init__(self, id, fn, inputs, ref, torch=True, gg=False):
        self.id, self.fn, self.inputs, self.ref, self.torch, self.gg = id, fn, inputs, ref, torch, gg

    def arrays(self):
        rng = np.random.default_rng(abs(hash(self.id)) % (2 ** 32))
        return [_make(k, s, rng) for k, s in self.inputs]

    def __repr__(self):
        return self.id


def R(*s):
    return ("r", s)


def P(*s):
    return ("p", s)


def NZ(*s):
    return ("nz", s)


def U(*s):
    return ("u", s)


def _c(M, arr, like):
    """A constant (mask, index) on the device of ``like``, for minidnn and torch alike."""
    return M.tensor(arr, device=like.device)


COND = np.array([[True, False, True, False], [False, True, True, False], [True, True, False, False]])
MASK = np.array([[True, False, True, True], [False, False, True, False], [True, False, False, True]])
BIN_SHAPES = [((3, 4), (3, 4)), ((2, 3, 1), (4,)), ((1,), (3,)), ((), (2, 3)), ((0, 3), (1, 3)), ((2, 1, 3), (2, 2, 1))]


def _shape_id(sa, sb):
    return "x".join(map(str, sa)) + "_" + "x".join(map(str, sb))


CASES = []

# -- binary arithmetic: tensor (op) tensor over broadcasting, size-1, 0-d and size-0 shapes --------
for sa, sb in BIN_SHAPES:
    sid = _shape_id(sa, sb)
    CASES += [
        Case(f"add-{sid}", lambda M, a, b: a + b, [R(*sa), R(*sb)], lambda a, b: a + b, gg=True),
        Case(f"sub-{sid}", lambda M, a, b: a - b, [R(*sa), R(*sb)], lambda a, b: a - b, gg=True),
        Case(f"mul-{sid}", lambda M, a, b: a * b, [R(*sa), R(*sb)], lambda a, b: a * b, gg=True),
        Case(f"div-{sid}", lambda M, a, b: a / b, [R(*sa), NZ(*sb)], lambda a, b: a / b, gg=True),
        Case(f"pow-{sid}", lambda M, a, b: a ** b, [P(*sa), R(*sb)], lambda a, b: a ** b, gg=True),
    ]

# -- with Python scalars on either side -----------------------------------------------------------
CASES += [
    Case("add-scalar", lambda M, a: a + 2.5, [R(2, 3)], lambda a: a + 2.5, gg=True),
    Case("radd-scalar", lambda M, a: 2.5 + a, [R(2, 3)], lambda a: 2.5 + a, gg=True),
    Case("sub-scalar", lambda M, a: a - 2, [R(2, 3)], lambda a: a - 2, gg=True),
    Case("rsub-scalar", lambda M, a: 2 - a, [R(2, 3)], lambda a: 2 - a, gg=True),
    Case("mul-scalar", lambda M, a: a * 3, [R(2, 3)], lambda a: a * 3, gg=True),
    Case("rmul-scalar", lambda M, a: -1.5 * a, [R(2, 3)], lambda a: -1.5 * a, gg=True),
    Case("div-scalar", lambda M, a: a / 4, [R(2, 3)], lambda a: a / 4, gg=True),
    Case("rdiv-scalar", lambda M, a: 2 / a, [NZ(2, 3)], lambda a: 2 / a, gg=True),
    Case("pow-2", lambda M, a: a ** 2, [R(2, 3)], lambda a: a ** 2, gg=True),
    Case("pow-3", lambda M, a: a ** 3, [R(2, 3)], lambda a: a ** 3, gg=True),
    Case("pow-half", lambda M, a: a ** 0.5, [P(2, 3)], lambda a: a ** 0.5, gg=True),
    Case("pow-neg", lambda M, a: a ** -1.5, [P(2, 3)], lambda a: a ** -1.5, gg=True),
    Case("rpow-scalar", lambda M, a: 2.0 ** a, [R(2, 3)], lambda a: 2.0 ** a, gg=True),
    Case("pow-0d-exponent", lambda M, a, b: a ** b, [P(2, 3), R()], lambda a, b: a ** b, gg=True),
]

# -- unary -------------------------------------------------------------------------------------------
for shape in [(2, 3), (), (1, 4), (0, 2)]:
    sid = "x".join(map(str, shape)) or "0d"
    CASES += [
        Case(f"neg-{sid}", lambda M, a: -a, [R(*shape)], lambda a: -a, gg=True),
        Case(f"abs-{sid}", lambda M, a: abs(a), [NZ(*shape)], np.abs, gg=True),
        Case(f"exp-{sid}", lambda M, a: a.exp(), [R(*shape)], np.exp, gg=True),
        Case(f"log-{sid}", lambda M, a: a.log(), [P(*shape)], np.log, gg=True),
        Case(f"sqrt-{sid}", lambda M, a: a.sqrt(), [P(*shape)], np.sqrt, gg=True),
        Case(f"sin-{sid}", lambda M, a: a.sin(), [R(*shape)], np.sin, gg=True),
        Case(f"cos-{sid}", lambda M, a: a.cos(), [R(*shape)], np.cos, gg=True),
        Case(f"tanh-{sid}", lambda M, a: a.tanh(), [R(*shape)], np.tanh, gg=True),
        Case(f"sigmoid-{sid}", lambda M, a: a.sigmoid(), [R(*shape)], lambda a: 1 / (1 + np.exp(-a)), gg=True),
        Case(f"relu-{sid}", lambda M, a: a.relu(), [NZ(*shape)], lambda a: np.maximum(a, 0), gg=True),
    ]
CASES += [
    Case("exp-fn", lambda M, a: M.exp(a), [R(3)], np.exp, gg=True),
    Case("sigmoid-large", lambda M, a: (a * 40).sigmoid(), [R(2, 3)], lambda a: 1 / (1 + np.exp(-40 * a))),
    Case("clip-both", lambda M, a: a.clip(-0.5, 0.5), [R(3, 4)], lambda a: np.clip(a, -0.5, 0.5), gg=True),
    Case("clamp-min", lambda M, a: a.clamp(min=0.1), [R(3, 4)], lambda a: np.maximum(a, 0.1), gg=True),
    Case("clip-max", lambda M, a: M.clip(a, max=-0.2), [R(3, 4)], lambda a: np.minimum(a, -0.2), gg=True),
    Case("maximum", lambda M, a, b: M.maximum(a, b), [R(3, 4), R(3, 4)], np.maximum, gg=True),
    Case("maximum-bcast", lambda M, a, b: M.maximum(a, b), [R(2, 1, 3), R(2, 1)], np.maximum, gg=True),
    Case("minimum", lambda M, a, b: M.minimum(a, b), [R(3, 4), R(3, 4)], np.minimum, gg=True),
    Case("minimum-bcast", lambda M, a, b: M.minimum(a, b), [R(4,), R(3, 1)], np.minimum, gg=True),
    Case("where", lambda M, a, b: M.where(_c(M, COND, a), a, b), [R(3, 4), R(3, 4)],
         lambda a, b: np.where(COND, a, b), gg=True),
    Case("where-bcast", lambda M, a, b: M.where(_c(M, COND, a), a, b), [R(3, 1), R(4,)],
         lambda a, b: np.where(COND, a, b), gg=True),
    Case("where-scalar", lambda M, a: M.where(_c(M, COND, a), a, 0.0), [R(3, 4)],
         lambda a: np.where(COND, a, 0.0), gg=True),
    Case("where-from-data", lambda M, a: M.where(a > 0, a, a * 0.1), [NZ(3, 4)],
         lambda a: np.where(a > 0, a, a * 0.1), gg=True),
    Case("chain", lambda M, a, b: ((a * b).tanh() + (a / (b * b + 1)).sin()) ** 2, [R(2, 3), R(3)],
         lambda a, b: (np.tanh(a * b) + np.sin(a / (b * b + 1))) ** 2, gg=True),
]


# -- reductions ----------------------------------------------------------------------------------------
def _np_var(a, axis=None, keepdims=False, ddof=1):
    return np.var(a, axis=axis, keepdims=keepdims, ddof=ddof)


def _np_lse(a, axis=None, keepdims=False):
    m = np.max(a, axis=axis, keepdims=True)
    r = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axis) if axis is not None else r.reshape(())


CASES += [
    Case("sum-all", lambda M, a: a.sum(), [R(3, 4)], np.sum),
    Case("sum-axis1", lambda M, a: a.sum(1), [R(3, 4)], lambda a: a.sum(1)),
    Case("sum-axis-neg-keepdims", lambda M, a: a.sum(axis=-1, keepdims=True), [R(2, 3, 2)],
         lambda a: a.sum(-1, keepdims=True), torch=lambda M, a: a.sum(dim=-1, keepdim=True)),
    Case("sum-tuple", lambda M, a: a.sum(axis=(0, 2)), [R(2, 3, 2)], lambda a: a.sum((0, 2))),
    Case("sum-dim-keepdim", lambda M, a: a.sum(dim=(0, -1), keepdim=True), [R(2, 3, 2)],
         lambda a: a.sum((0, 2), keepdims=True)),
    Case("sum-size0", lambda M, a: a.sum(0), [R(0, 3)], lambda a: a.sum(0)),
    Case("sum-0d", lambda M, a: M.sum(a), [R()], np.sum),
    Case("mean-all", lambda M, a: a.mean(), [R(3, 4)], np.mean),
    Case("mean-axis", lambda M, a: a.mean(axis=0), [R(3, 4)], lambda a: a.mean(0)),
    Case("mean-dim-keepdim", lambda M, a: a.mean(dim=(1, 2), keepdim=True), [R(2, 3, 2)],
         lambda a: a.mean((1, 2), keepdims=True)),
    Case("var-default", lambda M, a: a.var(), [R(3, 4)], lambda a: np.var(a, ddof=1)),
    Case("var-dim-correction0", lambda M, a: a.var(dim=1, correction=0), [R(3, 4)],
         lambda a: np.var(a, axis=1, ddof=0)),
    Case("var-tuple-keepdim", lambda M, a: a.var(dim=(0, 2), keepdim=True), [R(2, 3, 2)],
         lambda a: np.var(a, axis=(0, 2), ddof=1, keepdims=True)),
    Case("var-axis-neg", lambda M, a: a.var(-1, correction=2), [R(2, 5)], lambda a: np.var(a, axis=-1, ddof=2),
         torch=lambda M, a: a.var(dim=-1, correction=2)),
    Case("std-default", lambda M, a: a.std(), [R(3, 4)], lambda a: np.std(a, ddof=1)),
    Case("std-dim-correction0-keepdim", lambda M, a: a.std(dim=0, correction=0, keepdim=True), [R(3, 4)],
         lambda a: np.std(a, axis=0, ddof=0, keepdims=True)),
    Case("max-all", lambda M, a: a.max(), [U(3, 4)], np.max),
    Case("max-axis", lambda M, a: a.amax(1), [U(3, 4)], lambda a: a.max(1),
         torch=lambda M, a: a.amax(dim=1)),
    Case("max-dim-keepdim", lambda M, a: a.max(dim=-2, keepdim=True).values, [U(2, 3, 2)],
         lambda a: a.max(-2, keepdims=True), torch=lambda M, a: a.amax(dim=-2, keepdim=True)),
    Case("max-tuple", lambda M, a: a.max(axis=(0, 2)), [U(2, 3, 2)], lambda a: a.max((0, 2)),
         torch=lambda M, a: a.amax(dim=(0, 2))),
    Case("min-all", lambda M, a: a.min(), [U(3, 4)], np.min),
    Case("min-axis-keepdims", lambda M, a: a.amin(0, keepdim=True), [U(3, 4)], lambda a: a.min(0, keepdims=True),
         torch=lambda M, a: a.amin(dim=0, keepdim=True)),
    Case("min-tuple-neg", lambda M, a: a.min(axis=(-1, -3)), [U(2, 3, 2)], lambda a: a.min((-1, -3)),
         torch=lambda M, a: a.amin(dim=(-1, -3))),
    Case("logsumexp-all", lambda M, a: a.logsumexp(), [R(3, 4)], _np_lse,
         torch=lambda M, a: a.logsumexp(dim=(0, 1))),
    Case("logsumexp-dim", lambda M, a: a.logsumexp(dim=1), [R(3, 4)], lambda a: _np_lse(a, 1)),
    Case("logsumexp-neg-keepdims", lambda M, a: a.logsumexp(axis=-1, keepdims=True), [R(2, 3, 2)],
         lambda a: _np_lse(a, -1, True), torch=lambda M, a: a.logsumexp(dim=-1, keepdim=True)),
    Case("logsumexp-tuple", lambda M, a: a.logsumexp(dim=(0, 2)), [R(2, 3, 2)], lambda a: _np_lse(a, (0, 2))),
    Case("logsumexp-large", lambda M, a: (a * 1000).logsumexp(dim=1), [R(2, 3)], lambda a: _np_lse(a * 1000, 1)),
    Case("prod-all", lambda M, a: a.prod(), [NZ(2, 3)], np.prod),
    Case("prod-dim", lambda M, a: a.prod(dim=1), [NZ(3, 4)], lambda a: a.prod(1)),
    Case("prod-tuple-keepdims", lambda M, a: a.prod(axis=(0, -1), keepdims=True), [NZ(2, 3, 2)],
         lambda a: a.prod((0, 2), keepdims=True), torch=False),
    Case("prod-one-zero", lambda M, a: a.prod(dim=1), [("z1", (3, 4))], lambda a: a.prod(1)),
    Case("prod-two-zeros", lambda M, a: a.prod(), [("z2", (2, 3))], np.prod),
    Case("prod-zero-all", lambda M, a: a.prod(), [("z1", (2, 3))], np.prod),
]

# -- matmul (NumPy 1-D rules, batching, broadcasting) ----------------------------------------------
for sa, sb in [((3, 4), (4, 2)), ((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 2, 3), (3, 2)),
               ((2, 1, 2, 3), (3, 3, 2)), ((3,), (2, 3, 2)), ((2, 2, 3), (3,)), ((2, 0), (0, 3)), ((0, 2), (2, 3))]:
    sid = _shape_id(sa, sb)
    CASES += [Case(f"matmul-{sid}", lambda M, a, b: a @ b, [R(*sa), R(*sb)], lambda a, b: a @ b, gg=True)]
CASES += [Case("matmul-fn", lambda M, a, b: M.matmul(a, b), [R(2, 3), R(3, 2)], np.matmul, gg=True)]

# -- shape ops ------------------------------------------------------------------------------------------
CASES += [
    Case("reshape", lambda M, a: a.reshape(4, 3), [R(3, 4)], lambda a: a.reshape(4, 3)),
    Case("reshape-tuple-neg", lambda M, a: a.reshape((2, -1)), [R(3, 4)], lambda a: a.reshape(2, -1)),
    Case("reshape-size0", lambda M, a: a.reshape(3, 0), [R(0, 3)], lambda a: a.reshape(3, 0)),
    Case("view", lambda M, a: a.view(-1), [R(3, 4)], lambda a: a.reshape(-1)),
    Case("flatten", lambda M, a: a.flatten(), [R(2, 3, 2)], lambda a: a.reshape(-1)),
    Case("flatten-start", lambda M, a: a.flatten(1), [R(2, 3, 2)], lambda a: a.reshape(2, 6)),
    Case("flatten-start-end", lambda M, a: M.flatten(a, 0, 1), [R(2, 3, 2)], lambda a: a.reshape(6, 2)),
    Case("transpose-reverse", lambda M, a: a.transpose(), [R(2, 3, 2)], lambda a: a.transpose(),
         torch=lambda M, a: a.permute(2, 1, 0)),
    Case("transpose-perm", lambda M, a: a.transpose(1, 0, 2), [R(2, 3, 2)], lambda a: a.transpose(1, 0, 2),
         torch=lambda M, a: a.permute(1, 0, 2)),
    Case("transpose-perm-tuple", lambda M, a: a.transpose((2, 0, 1)), [R(2, 3, 2)], lambda a: a.transpose(2, 0, 1),
         torch=lambda M, a: a.permute(2, 0, 1)),
    Case("transpose-2d", lambda M, a: a.transpose(1, 0), [R(3, 4)], lambda a: a.T),
    Case("transpose-2d-01", lambda M, a: a.transpose(0, 1), [R(3, 4)], lambda a: a.T),      # PyTorch: a swap
    Case("transpose-swap-3d", lambda M, a: a.transpose(0, 2), [R(2, 3, 2)], lambda a: a.swapaxes(0, 2)),
    Case("transpose-swap-neg", lambda M, a: a.transpose(-1, -3), [R(2, 3, 2)], lambda a: a.swapaxes(0, 2)),
    Case("transpose-swap-4d", lambda M, a: a.transpose(1, 3), [R(1, 2, 3, 2)], lambda a: a.swapaxes(1, 3)),
    Case("permute", lambda M, a: a.permute(2, 0, 1), [R(2, 3, 2)], lambda a: a.transpose(2, 0, 1)),
    Case("permute-tuple-neg", lambda M, a: a.permute((-1, 0, 1)), [R(2, 3, 2)], lambda a: a.transpose(2, 0, 1)),
    Case("T-2d", lambda M, a: a.T, [R(3, 4)], lambda a: a.T),
    Case("T-3d", lambda M, a: a.T, [R(2, 3, 2)], lambda a: a.T, torch=lambda M, a: a.permute(2, 1, 0)),
    Case("swapaxes", lambda M, a: a.swapaxes(0, -1), [R(2, 3, 2)], lambda a: a.swapaxes(0, -1)),
    Case("squeeze-all", lambda M, a: a.squeeze(), [R(1, 3, 1, 2)], lambda a: a.squeeze()),
    Case("squeeze-axis", lambda M, a: a.squeeze(2), [R(1, 3, 1, 2)], lambda a: a.squeeze(2)),
    Case("squeeze-dim-neg", lambda M, a: a.squeeze(dim=-4), [R(1, 3, 1, 2)], lambda a: a.squeeze(0)),
    Case("squeeze-non1", lambda M, a: a.squeeze(1), [R(1, 3, 1, 2)], lambda a: a),
    Case("unsqueeze", lambda M, a: a.unsqueeze(1), [R(3, 4)], lambda a: a[:, None]),
    Case("unsqueeze-neg", lambda M, a: a.unsqueeze(-1), [R(3, 4)], lambda a: a[..., None]),
    Case("expand", lambda M, a: a.expand(2, 3, 4), [R(3, 1)], lambda a: np.broadcast_to(a, (2, 3, 4))),
    Case("expand-keep", lambda M, a: a.expand(-1, 4), [R(3, 1)], lambda a: np.broadcast_to(a, (3, 4))),
    Case("broadcast_to", lambda M, a: a.broadcast_to((2, 3)), [R(3)], lambda a: np.broadcast_to(a, (2, 3))),
    Case("broadcast_to-fn", lambda M, a: M.broadcast_to(a, (2, 1, 3)), [R(1, 3)],
         lambda a: np.broadcast_to(a, (2, 1, 3))),
    Case("broadcast_to-0", lambda M, a: M.broadcast_to(a, (0, 3)), [R(1, 3)], lambda a: np.broadcast_to(a, (0, 3))),
    Case("cat-0", lambda M, a, b: M.cat([a, b]), [R(2, 3), R(1, 3)], lambda a, b: np.concatenate([a, b])),
    Case("cat-dim1", lambda M, a, b, c: M.cat((a, b, c), dim=1), [R(2, 1), R(2, 3), R(2, 2)],
         lambda a, b, c: np.concatenate([a, b, c], 1)),
    Case("cat-neg", lambda M, a, b: M.cat([a, b], -1), [R(2, 2), R(2, 3)], lambda a, b: np.concatenate([a, b], -1)),
    Case("cat-size0", lambda M, a, b: M.cat([a, b]), [R(0, 3), R(2, 3)], lambda a, b: np.concatenate([a, b])),
    Case("concatenate", lambda M, a, b: M.concatenate([a, b], axis=1), [R(2, 2), R(2, 1)],
         lambda a, b: np.concatenate([a, b], 1), torch=lambda M, a, b: M.cat([a, b], dim=1)),
    Case("stack", lambda M, a, b: M.stack([a, b]), [R(2, 3), R(2, 3)], lambda a, b: np.stack([a, b])),
    Case("stack-dim-neg", lambda M, a, b: M.stack([a, b], dim=-1), [R(2, 3), R(2, 3)],
         lambda a, b: np.stack([a, b], -1)),
    Case("stack-axis1", lambda M, a, b, c: M.stack([a, b, c], 1), [R(3,), R(3,), R(3,)],
         lambda a, b, c: np.stack([a, b, c], 1)),
    Case("split-int", lambda M, a: a.split(2, dim=1), [R(2, 5)], lambda a: tuple(np.split(a, [2, 4], 1))),
    Case("split-list", lambda M, a: M.split(a, [1, 2]), [R(3, 2)], lambda a: tuple(np.split(a, [1], 0))),
    Case("chunk", lambda M, a: a.chunk(3, dim=-1), [R(2, 6)], lambda a: tuple(np.split(a, 3, -1))),
    Case("chunk-uneven", lambda M, a: a.chunk(2), [R(5, 2)], lambda a: tuple(np.split(a, [3], 0))),
    Case("pad-torch-style", lambda M, a: M.pad(a, (1, 2)), [R(2, 3)], lambda a: np.pad(a, ((0, 0), (1, 2))),
         torch=lambda M, a: M.nn.functional.pad(a, (1, 2))),
    Case("pad-two-dims-value", lambda M, a: M.pad(a, (1, 0, 0, 2), value=1.5), [R(2, 3)],
         lambda a: np.pad(a, ((0, 2), (1, 0)), constant_values=1.5),
         torch=lambda M, a: M.nn.functional.pad(a, (1, 0, 0, 2), value=1.5)),
    Case("pad-numpy-style", lambda M, a: M.pad(a, ((1, 0), (0, 1))), [R(2, 2)],
         lambda a: np.pad(a, ((1, 0), (0, 1))), torch=False),
]

# -- indexing ------------------------------------------------------------------------------------------
IDX = np.array([[0, 2], [2, 2]])
CASES += [
    Case("getitem-int", lambda M, a: a[1], [R(3, 4)], lambda a: a[1]),
    Case("getitem-neg-int", lambda M, a: a[-1, 2], [R(3, 4)], lambda a: a[-1, 2]),
    Case("getitem-slice", lambda M, a: a[1:, ::2], [R(3, 4)], lambda a: a[1:, ::2]),
    Case("getitem-slice-empty", lambda M, a: a[2:2], [R(3, 4)], lambda a: a[2:2]),
    Case("getitem-none", lambda M, a: a[None, :, None, 1], [R(3, 4)], lambda a: a[None, :, None, 1]),
    Case("getitem-ellipsis", lambda M, a: a[..., 1], [R(2, 3, 2)], lambda a: a[..., 1]),
    Case("getitem-ellipsis-none", lambda M, a: a[0, ..., None], [R(2, 3, 2)], lambda a: a[0, ..., None]),
    Case("getitem-list-repeated", lambda M, a: a[[0, 2, 0, 0]], [R(3, 4)], lambda a: a[[0, 2, 0, 0]]),
    Case("getitem-int-tensor-2d", lambda M, a: a[_c(M, IDX, a)], [R(3, 2)], lambda a: a[IDX]),
    Case("getitem-adv-pair", lambda M, a: a[[0, 1, 1], [3, 0, 0]], [R(3, 4)], lambda a: a[[0, 1, 1], [3, 0, 0]]),
    Case("getitem-adv-slice", lambda M, a: a[:, [1, 1, 3]], [R(3, 4)], lambda a: a[:, [1, 1, 3]]),
    Case("getitem-bool-mask", lambda M, a: a[_c(M, MASK, a)], [R(3, 4)], lambda a: a[MASK]),
    Case("getitem-bool-rows", lambda M, a: a[_c(M, np.array([True, False, True]), a)], [R(3, 4)],
         lambda a: a[np.array([True, False, True])]),
    Case("getitem-mask-from-data", lambda M, a: a[a > 0], [NZ(3, 4)], lambda a: a[a > 0]),
]

_IDS = [c.id for c in CASES]
assert len(set(_IDS)) == len(_IDS), "duplicate case ids"


def _to_mdn(arrays, device, requires_grad=True):
    return [mdn.tensor(a, dtype=mdn.float64, device=device, requires_grad=requires_grad) for a in arrays]


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


# ------------------------------------------------------------------------------------------------
# The table, on every device
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_forward_matches_numpy(case, device):
    arrays = case.arrays()
    outs = _as_tuple(case.fn(mdn, *_to_mdn(arrays, device)))
    refs = _as_tuple(case.ref(*[a.copy() for a in arrays]))
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        r = np.asarray(r)
        assert isinstance(o, mdn.Tensor)
        assert o.device == mdn.device(device)
        assert tuple(o.shape) == r.shape, f"{case.id}: shape {tuple(o.shape)} != NumPy {r.shape}"
        assert o.dtype == r.dtype == np.float64, f"{case.id}: dtype {o.dtype} (NumPy {r.dtype})"
        assert o.requires_grad and o.grad_fn is not None
        np.testing.assert_allclose(o.numpy() if device == "cpu" else o.cpu().numpy(), r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_gradcheck(case, device):
    assert gradcheck(lambda *ts: case.fn(mdn, *ts), tuple(_to_mdn(case.arrays(), device)))


@pytest.mark.parametrize("case", [c for c in CASES if c.gg], ids=[c.id for c in CASES if c.gg])
def test_gradgradcheck(case, device):
    assert gradgradcheck(lambda *ts: case.fn(mdn, *ts), tuple(_to_mdn(case.arrays(), device)))


@pytest.mark.parametrize("case", [c for c in CASES if c.torch is not False],
                         ids=[c.id for c in CASES if c.torch is not False])
def test_matches_torch(case):
    """Forward and backward against PyTorch (float64) with the same output gradients."""
    torch = pytest.importorskip("torch")
    arrays = case.arrays()
    tfn = case.fn if case.torch is True else case.torch
    xs = _to_mdn(arrays, "cpu")
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    outs = _as_tuple(case.fn(mdn, *xs))
    touts = _as_tuple(tfn(torch, *ts))
    rng = np.random.default_rng(0)
    vs = [rng.standard_normal(tuple(o.shape)) for o in outs]
    for o, t in zip(outs, touts):
        assert tuple(o.shape) == tuple(t.shape)
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-12)
    gm = mdn.autograd.grad(list(outs), xs, [mdn.tensor(v) for v in vs], allow_unused=True)
    gt = torch.autograd.grad(list(touts), ts, [torch.tensor(v) for v in vs], allow_unused=True)
    for i, (a, b) in enumerate(zip(gm, gt)):
        a = np.zeros(arrays[i].shape) if a is None else a.numpy()
        b = np.zeros(arrays[i].shape) if b is None else b.numpy()
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=f"{case.id}: gradient of input {i}")


# ------------------------------------------------------------------------------------------------
# Ties, non-differentiable results
# ------------------------------------------------------------------------------------------------
def test_max_min_split_gradient_among_ties():
    torch = pytest.importorskip("torch")
    a = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    for which in ("max", "min"):
        for kw, tkw in [({}, {}), ({"dim": 1}, {"dim": 1}),
                        ({"axis": 0, "keepdims": True}, {"dim": 0, "keepdim": True})]:
            x = mdn.tensor(a, requires_grad=True)
            # x.max() and amax/amin split among ties; max(dim) is a named tuple whose gradient goes to the index
            getattr(x, which if not kw else "a" + which)(**kw).sum().backward()
            t = torch.tensor(a, requires_grad=True)
            getattr(t, "a" + which)(**tkw).sum().backward()
            np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy())
    for which in ("maximum", "minimum"):
        x = mdn.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = mdn.tensor([1.0, 0.0, 5.0], requires_grad=True)
        getattr(mdn, which)(x, y).sum().backward()
        tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        ty = torch.tensor([1.0, 0.0, 5.0], requires_grad=True)
        getattr(torch, which)(tx, ty).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
        np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy())


def test_max_dim_returns_values_and_indices():
    # PyTorch's (values, indices) named tuple: `output.max(1)[1]` is the argmax (issue 14)
    x = mdn.tensor([[1.0, 5.0], [7.0, 2.0]])
    values, indices = x.max(dim=1)
    np.testing.assert_array_equal(values.numpy(), [5.0, 7.0])
    np.testing.assert_array_equal(x.max(1)[1].numpy(), [1, 0])
    assert isinstance(x.max(), mdn.Tensor) and x.max().item() == 7.0


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons_return_bool_tensors_without_grad(op, device):
    a = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 2.0]])
    b = np.array([2.0, 2.0, 2.0])
    x = mdn.tensor(a, device=device, requires_grad=True)
    y = mdn.tensor(b, device=device, requires_grad=True)
    pyop = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__"}[op]
    for r, ref in [(getattr(x, pyop)(y), getattr(a, pyop)(b)), (getattr(x, pyop)(2.0), getattr(a, pyop)(2.0)),
                   (getattr(mdn, op)(x, y), getattr(a, pyop)(b))]:
        assert isinstance(r, mdn.Tensor) and r.dtype == np.bool_
        assert not r.requires_grad and r.grad_fn is None
        np.testing.assert_array_equal(r.cpu().numpy(), ref)


@pytest.mark.parametrize("kw", [{}, {"axis": 1}, {"dim": 0}, {"dim": -1, "keepdim": True},
                                {"axis": 0, "keepdims": True}])
@pytest.mark.parametrize("which", ["argmax", "argmin"])
def test_argmax_argmin(which, kw, device):
    torch = pytest.importorskip("torch")
    a = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    x = mdn.tensor(a, device=device, requires_grad=True)
    r = getattr(x, which)(**kw)
    assert not r.requires_grad and r.grad_fn is None and r.dtype.kind == "i"
    tkw = {("dim" if k in ("axis", "dim") else "keepdim"): v for k, v in kw.items()}
    ref = getattr(torch.tensor(a), which)(**tkw).numpy()
    assert tuple(r.shape) == ref.shape
    np.testing.assert_array_equal(r.cpu().numpy(), ref)


# ------------------------------------------------------------------------------------------------
# dtype results: default float32, NumPy promotion between tensors, Python scalars weak
# ------------------------------------------------------------------------------------------------
F32, F64, F16, I64, I32 = (np.dtype(t) for t in ("float32", "float64", "float16", "int64", "int32"))


@pytest.mark.parametrize("make, expected", [
    (lambda: mdn.tensor([1.0, 2.0]), F32),
    (lambda: mdn.tensor(2.5), F32),
    (lambda: mdn.tensor([1, 2]), I64),
    (lambda: mdn.tensor([True, False]), np.dtype(np.bool_)),
    (lambda: mdn.tensor(np.zeros(2)), F64),                  # arrays keep their dtype
    (lambda: mdn.tensor(np.zeros(2, np.float16)), F16),
    (lambda: mdn.zeros(2), F32),
    (lambda: mdn.randn(2), F32),
    (lambda: mdn.arange(3), I64),
    (lambda: mdn.arange(0.0, 1.0, 0.5), F32),
    (lambda: mdn.linspace(0, 1, 3), F32),
    (lambda: mdn.full((2,), 3), I64),
    (lambda: mdn.full((2,), 3.0), F32),
    (lambda: mdn.eye(2), F32),
])
def test_creation_dtypes(make, expected):
    assert make().dtype == expected


@pytest.mark.parametrize("a_dtype, b_dtype", [("float32", "float64"), ("float16", "float32"), ("int32", "int64"),
                                              ("int64", "float32"), ("int32", "float16"), ("bool", "int32"),
                                              ("uint8", "int8"), ("float64", "float64")])
@pytest.mark.parametrize("op", ["add", "mul", "sub"])
def test_tensor_tensor_promotion_is_pytorchs(op, a_dtype, b_dtype, device):
    # PyTorch's rule (docs/semantics.md): a float beats any integer (int64 + float32 is float32, not NumPy's float64)
    torch = pytest.importorskip("torch")
    a = np.array([1, 2]).astype(a_dtype)
    b = np.array([1, 0]).astype(b_dtype)
    if op == "sub" and "bool" in (a_dtype, b_dtype):
        pytest.skip("no boolean subtraction")
    r = getattr(mdn, op)(mdn.tensor(a, device=device), mdn.tensor(b, device=device))
    ref = getattr(torch, op)(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert r.dtype == ref.dtype
    np.testing.assert_array_equal(r.cpu().numpy(), ref)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("expr", ["x + 2", "2 + x", "x - 2.5", "2.5 - x", "x * 3", "3.0 * x", "x / 2", "2 / x",
                                  "x ** 2", "x ** 0.5", "2 ** x", "x.clip(0, 1)",
                                  "mdn.where(x > 1, x, 0.0)", "mdn.maximum(x, 1.5)"])
def test_python_scalars_are_weak_for_float_tensors(expr, dtype, device):
    x = mdn.tensor(np.array([1.0, 2.0], dtype=dtype), device=device)
    assert eval(expr, {"mdn": mdn}, {"x": x}).dtype == np.dtype(dtype), expr


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_python_scalars_with_int_tensors(dtype, device):
    """Python ints keep the integer dtype; a Python float makes the default float dtype (as PyTorch)."""
    torch = pytest.importorskip("torch")
    x = mdn.tensor(np.array([1, 2], dtype=dtype), device=device)
    t = torch.tensor(np.array([1, 2], dtype=dtype))
    for expr in ["x + 1", "2 * x", "x - 1", "1 - x", "x ** 2", "2 ** x"]:
        assert eval(expr, {}, {"x": x}).dtype == np.dtype(dtype), expr
    for expr in ["x + 2.5", "2.5 * x", "x - 0.5", "0.5 - x", "x / 2", "2 / x", "x ** 0.5", "2.5 ** x"]:
        r = eval(expr, {}, {"x": x})
        assert r.dtype == np.float32, expr
        np.testing.assert_allclose(r.cpu().numpy(), eval(expr.replace("x", "t"), {}, {"t": t}).numpy(), rtol=1e-6)


def test_float64_tensor_stays_float64_through_every_op():
    x = mdn.tensor(np.array([[0.5, 1.5], [1.0, 2.0]]), requires_grad=True)
    for y in [x + 1, x * 2.5, x.exp(), x.sum(), x.mean(0), x.var(), x @ x, x.logsumexp(1), x.sigmoid(), x[0],
              x.relu(), mdn.cat([x, x]), x.prod(), x.std(1)]:
        assert y.dtype == np.float64


# ------------------------------------------------------------------------------------------------
# Property tests: broadcasting gradients against NumPy over random shapes
# ------------------------------------------------------------------------------------------------
if st is None:
    def test_property_tests_need_hypothesis():
        pytest.skip("hypothesis is not installed")
else:
    @st.composite
    def _broadcastable_shapes(draw):
        nd = draw(st.integers(0, 3))
        out = draw(st.lists(st.integers(0, 3), min_size=nd, max_size=nd))
        def operand():
            k = draw(st.integers(0, nd))
            return tuple(1 if draw(st.booleans()) else s for s in out[nd - k:])
        return operand(), operand()

    @settings(max_examples=25, deadline=None)
    @given(_broadcastable_shapes(), st.sampled_from(["add", "mul", "sub", "div"]), st.integers(0, 2 ** 16))
    def test_broadcast_binary_gradients_property(shapes, op, seed):
        sa, sb = shapes
        rng = np.random.default_rng(seed)
        a = rng.standard_normal(sa)
        b = rng.uniform(0.5, 2.0, sb)
        x = mdn.tensor(a, requires_grad=True)
        y = mdn.tensor(b, requires_grad=True)
        fwd = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "div": np.divide}[op]
        out = getattr(mdn, op)(x, y)
        ref = fwd(a, b)
        assert tuple(out.shape) == ref.shape and out.dtype == np.float64
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)
        g = rng.standard_normal(ref.shape)
        out.backward(mdn.tensor(g))
        # The analytic reference: elementwise derivative times g, summed over the broadcast axes.
        da = {"add": np.ones_like(ref), "mul": np.broadcast_to(b, ref.shape), "sub": np.ones_like(ref),
              "div": np.broadcast_to(1 / b, ref.shape)}[op] * g
        db = {"add": np.ones_like(ref), "mul": np.broadcast_to(a, ref.shape), "sub": -np.ones_like(ref),
              "div": -np.broadcast_to(a, ref.shape) / np.broadcast_to(b, ref.shape) ** 2}[op] * g

        def reduce_to(v, shape):
            v = v.sum(axis=tuple(range(v.ndim - len(shape)))) if v.ndim > len(shape) else v
            return v.sum(axis=tuple(i for i, s in enumerate(shape) if s == 1), keepdims=True).reshape(shape)
        assert x.grad.shape == sa and y.grad.shape == sb
        np.testing.assert_allclose(x.grad.numpy(), reduce_to(da, sa), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(y.grad.numpy(), reduce_to(db, sb), rtol=1e-10, atol=1e-12)

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
    def test_reduction_gradcheck_property(shape, data):
        ndim = len(shape)
        axis = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                                   st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim,
                                            unique=True).map(tuple)))
        keepdims = data.draw(st.booleans())
        op = data.draw(st.sampled_from(["sum", "mean", "logsumexp", "prod"]))
        a = np.random.default_rng(len(shape)).uniform(0.5, 1.5, shape)
        x = mdn.tensor(a, requires_grad=True)
        out = getattr(x, op)(axis=axis, keepdims=keepdims)
        np_op = {"sum": np.sum, "mean": np.mean, "prod": np.prod, "logsumexp": _np_lse}[op]
        ref = np_op(a, axis=axis, keepdims=keepdims)
        assert tuple(out.shape) == np.shape(ref)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)
        assert gradcheck(lambda t: getattr(t, op)(axis=axis, keepdims=keepdims), (x,))
