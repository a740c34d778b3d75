"""Pointwise activations (cuDNN's cudnnActivationForward / cudnnActivationBackward).

# x, y, dy, dx: any shape, all the same shape and dtype (elementwise)

Each mode is one row of ``_MODES``: its function f(x) and its derivative f'(x), both written once
for NumPy and CuPy.  Backward computes dx = alpha * f'(x) * dy + beta * dx from **x** for every mode:
``y`` is accepted for cuDNN's argument order but not needed, because a y written with alpha/beta
blending is no longer f(x), and one source of truth keeps the reference simple.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from ._common import SeenCalls, begin, blend, check_float, check_out, check_same, numpy_call_key, parse_enum, seen_plan
from .cuda import act_kernels  # the GPU fast path's kernels: imported once here, not per call (importing needs no GPU)
from .devices import is_cuda_array
from .errors import BadParamError, IdentityEnum
from .layout import in_memory_order

__all__ = ["ActivationMode", "ActivationDescriptor", "activation_forward", "activation_backward"]


class ActivationMode(IdentityEnum):
    """cudnnActivationMode_t: which elementwise function activation_forward/backward compute; ``coef`` is each mode's
    parameter as noted beside it (ceiling, alpha, slope, beta or bound)."""
    RELU = "relu"                  # max(x, 0)
    SIGMOID = "sigmoid"            # 1 / (1 + exp(-x))
    TANH = "tanh"
    CLIPPED_RELU = "clipped_relu"  # min(max(x, 0), coef)                 coef = ceiling (required)
    ELU = "elu"                    # x if x > 0 else coef * (exp(x) - 1)  coef = alpha (default 1)
    IDENTITY = "identity"
    LEAKY_RELU = "leaky_relu"      # x if x > 0 else coef * x             coef = negative slope (default 0.01)
    GELU = "gelu"                  # x * Phi(x), exact erf form
    GELU_TANH = "gelu_tanh"        # PyTorch's approximate="tanh" form
    SWISH = "swish"                # x * sigmoid(coef * x)                coef = beta (default 1: SiLU)
    SOFTPLUS = "softplus"          # log(1 + exp(coef * x)) / coef       coef = beta (default 1)
    HARDTANH = "hardtanh"          # min(max(x, -coef), coef)             coef = bound (default 1)
    RELU6 = "relu6"                # min(max(x, 0), 6)


# Default coef per mode where the mode uses one; None marks "must be given".
_DEFAULT_COEF = {ActivationMode.CLIPPED_RELU: None, ActivationMode.ELU: 1.0, ActivationMode.LEAKY_RELU: 0.01,
                 ActivationMode.SWISH: 1.0, ActivationMode.SOFTPLUS: 1.0, ActivationMode.HARDTANH: 1.0}
_POSITIVE_COEF = (ActivationMode.CLIPPED_RELU, ActivationMode.SOFTPLUS, ActivationMode.HARDTANH)


@dataclasses.dataclass(frozen=True)
class ActivationDescriptor:
    """An activation mode and its coefficient.

    ``coef=None`` takes the mode's default (ELU 1.0, LEAKY_RELU 0.01, SWISH 1.0, SOFTPLUS 1.0,
    HARDTANH 1.0); CLIPPED_RELU needs an explicit ceiling.  Modes without a coefficient ignore it.
    """
    mode: ActivationMode
    coef: float | None = None

    def __post_init__(self):
        mode = parse_enum("ActivationDescriptor", ActivationMode, self.mode, "mode")
        object.__setattr__(self, "mode", mode)
        coef = self.coef if self.coef is not None else _DEFAULT_COEF.get(mode, 0.0)
        if coef is None:
            raise BadParamError(f"ActivationDescriptor: mode {mode.name} needs coef (the clipping ceiling)")
        coef = float(coef)
        if not math.isfinite(coef) or (mode in _POSITIVE_COEF and coef <= 0):
            raise BadParamError(f"ActivationDescriptor: mode {mode.name} needs a finite coef > 0, got {coef}")
        object.__setattr__(self, "coef", coef)


def _erf(xp, x):
    """erf for NumPy (SciPy where installed) or CuPy (cupyx).  NumPy itself has no erf."""
    if xp is np:
        try:
            from scipy.special import erf
        except ImportError:     # slow but exact fallback: SciPy is not a hard dependency
            return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)
        return erf(x)
    from cupyx.scipy.special import erf
    return erf(x)


def _sigmoid(xp, x):
    return 0.5 * (1 + xp.tanh(0.5 * x))     # equals 1/(1+exp(-x)) and never overflows


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_TANH_C = 0.044715


def _gelu(xp, x, c):
    return 0.5 * x * (1 + _erf(xp, x / math.sqrt(2)))


def _gelu_grad(xp, x, c):
    # d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
    return 0.5 * (1 + _erf(xp, x / math.sqrt(2))) + x * xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _gelu_tanh(xp, x, c):
    return 0.5 * x * (1 + xp.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_C * x ** 3)))


def _gelu_tanh_grad(xp, x, c):
    t = xp.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_C * x ** 3))
    dinner = _SQRT_2_OVER_PI * (1 + 3 * _GELU_TANH_C * x * x)
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * dinner


def _swish_grad(xp, x, c):
    s = _sigmoid(xp, c * x)
    return s + c * x * s * (1 - s)


# NumPy's float maximum runs its SIMD loop only when both operands are arrays with unit strides: against the scalar 0
# it took ~19 us at 32x6x16x16 float32, against contiguous zeros ~6.  A C-ordered float32/64 ndarray therefore meets
# slices of a read-only zeros buffer (one per dtype, _ZCHUNK elements), chunk by chunk into a C-ordered result (what
# np.maximum(x, 0) returns for such an x).  Bitwise the same: maximum returns its second operand, +0, on +-0 ties,
# and x's own NaN where x is NaN, in both loops.
_ZCHUNK = 1 << 16
_ZEROS: dict = {}


def _relu(xp, x, c):
    if xp is not np or type(x) is not np.ndarray or x.dtype.char not in "fd" or x.size < 256 \
            or not x.flags.c_contiguous:
        return xp.maximum(x, 0)
    z = _ZEROS.get(x.dtype)
    if z is None:
        z = np.zeros(_ZCHUNK, x.dtype)
        z.flags.writeable = False
        _ZEROS[x.dtype] = z
    n = x.size
    if n <= _ZCHUNK:
        return np.maximum(x, z[:n].reshape(x.shape))
    y = np.empty(x.shape, x.dtype)
    xf, yf = x.reshape(-1), y.reshape(-1)
    for i in range(0, n, _ZCHUNK):
        j = min(n, i + _ZCHUNK)
        np.maximum(xf[i:j], z[:j - i], out=yf[i:j])
    return y


def _between(x, lo, hi):
    """1 strictly inside (lo, hi), 0 at or beyond the bounds; NaN counts as inside (PyTorch's hardtanh_backward)."""
    return ~((x <= lo) | (x >= hi))


# mode -> (f(xp, x, coef), f'(xp, x, coef)); derivatives at kinks follow PyTorch (relu'(0) = 0, ...).
_MODES = {
    ActivationMode.IDENTITY: (lambda xp, x, c: x, lambda xp, x, c: xp.ones_like(x)),
    # relu' is 0 where x <= 0, else 1: a NaN input passes its gradient on, as in PyTorch's threshold_backward
    ActivationMode.RELU: (_relu, lambda xp, x, c: xp.logical_not(x <= 0).astype(x.dtype)),
    ActivationMode.SIGMOID: (lambda xp, x, c: _sigmoid(xp, x),
                             lambda xp, x, c: _sigmoid(xp, x) * (1 - _sigmoid(xp, x))),
    ActivationMode.TANH: (lambda xp, x, c: xp.tanh(x), lambda xp, x, c: 1 - xp.tanh(x) ** 2),
    ActivationMode.CLIPPED_RELU: (lambda xp, x, c: xp.clip(x, 0, c),
                                  lambda xp, x, c: _between(x, 0, c).astype(x.dtype)),
    ActivationMode.RELU6: (lambda xp, x, c: xp.clip(x, 0, 6), lambda xp, x, c: _between(x, 0, 6).astype(x.dtype)),
    ActivationMode.HARDTANH: (lambda xp, x, c: xp.clip(x, -c, c), lambda xp, x, c: _between(x, -c, c).astype(x.dtype)),
    # expm1/exp see min(x, 0) so the unused branch of where() cannot overflow
    ActivationMode.ELU: (lambda xp, x, c: xp.where(x > 0, x, c * xp.expm1(xp.minimum(x, 0))),
                         lambda xp, x, c: xp.where(x <= 0, c * xp.exp(xp.minimum(x, 0)), 1).astype(x.dtype)),
    ActivationMode.LEAKY_RELU: (lambda xp, x, c: xp.where(x > 0, x, c * x),
                                lambda xp, x, c: xp.where(x > 0, 1, c).astype(x.dtype)),
    ActivationMode.GELU: (_gelu, _gelu_grad),
    ActivationMode.GELU_TANH: (_gelu_tanh, _gelu_tanh_grad),
    ActivationMode.SWISH: (lambda xp, x, c: x * _sigmoid(xp, c * x), _swish_grad),
    ActivationMode.SOFTPLUS: (lambda xp, x, c: xp.logaddexp(0, c * x) / c, lambda xp, x, c: _sigmoid(xp, c * x)),
}


def _check_desc(where, desc):
    if not isinstance(desc, ActivationDescriptor):
        raise BadParamError(f"{where}: activation_desc must be an ActivationDescriptor, got {type(desc).__name__}")


def activation_forward(handle, activation_desc: ActivationDescriptor, x, alpha=1.0, beta=0.0, y=None):
    """y = alpha * f(x) + beta * y."""
    if type(x) is np.ndarray:   # (one key built: see activation_backward)
        ckey, seen = seen_plan(_CPU_SEEN, _cpu_key("fwd", handle, activation_desc, x, None, None, alpha, beta, y))
        if seen is not None:    # a NumPy call validated before: the formula (in_memory_order is fn(x) for NumPy)
            return blend(_MODES[activation_desc.mode][0](np, x, activation_desc.coef), alpha, beta, None, x.dtype)
        key = None
    else:
        ckey = None
        key, plan = _seen(_gpu_key("fwd", handle, activation_desc, x, None, None, alpha, beta, y))
        if plan is not None:
            return plan(x)      # this exact call validated before: straight to the kernel's plan
    where = "activation_forward"
    handle, xp = begin(handle, where, x=x, y=y)
    _check_desc(where, activation_desc)
    check_float(where, x=x)
    check_out(where, "y", y, x.shape, x.dtype, beta)
    gpu = _gpu_activation(activation_desc, x, None, alpha, beta, y, key)
    if gpu is not None:         # the CUDA kernel (see the GPU fast path block at the end of this file)
        return gpu
    _CPU_SEEN.remember(ckey, True)
    f, _ = _MODES[activation_desc.mode]
    coef = activation_desc.coef
    return blend(in_memory_order(lambda a: f(xp, a, coef), x), alpha, beta, y, x.dtype)


def activation_backward(handle, activation_desc: ActivationDescriptor, y, dy, x, alpha=1.0, beta=0.0, dx=None):
    """dx = alpha * f'(x) * dy + beta * dx   (cuDNN argument order: desc, y, dy, x; y may be None)."""
    if type(x) is np.ndarray:   # (the GPU key is None for a NumPy x, the NumPy key for any other: one key built)
        ckey, seen = seen_plan(_CPU_SEEN, _cpu_key("bwd", handle, activation_desc, x, dy, y, alpha, beta, dx))
        if seen is not None:        # a NumPy call validated before
            return blend(_MODES[activation_desc.mode][1](np, x, activation_desc.coef) * dy, alpha, beta, None,
                         x.dtype)
        key = None
    else:
        ckey = None
        key, plan = _seen(_gpu_key("bwd", handle, activation_desc, x, dy, y, alpha, beta, dx))
        if plan is not None:
            if y is None and dx is None and alpha == 1 and beta == 0:
                _learn_backward(activation_desc, x, dy, key, plan)
            return plan(x, dy)      # this exact call validated before: straight to the kernel's plan
    where = "activation_backward"
    handle, xp = begin(handle, where, y=y, dy=dy, x=x, dx=dx)
    _check_desc(where, activation_desc)
    check_float(where, x=x)
    check_same(where, "x", x, y=y, dy=dy)
    check_out(where, "dx", dx, x.shape, x.dtype, beta)
    gpu = _gpu_activation(activation_desc, x, dy, alpha, beta, dx, key)
    if gpu is not None:         # the CUDA kernel (see the GPU fast path block at the end of this file)
        if y is None and dx is None and alpha == 1 and beta == 0:
            _learn_backward(activation_desc, x, dy, key, _SEEN.get(key))
        return gpu
    _CPU_SEEN.remember(ckey, True)
    _, fprime = _MODES[activation_desc.mode]
    coef = activation_desc.coef
    return blend(in_memory_order(lambda a, g: fprime(xp, a, coef) * g, x, dy), alpha, beta, dx, x.dtype)


# NumPy calls validated before, by what the checks read (the descriptor, blending, every array's shape and dtype; all
# plain ndarrays, handle None or the CPU's, no output array) -> True: the same call again skips begin() and the checks
# (~3 us of a ReLU call's Python).  The formula itself runs every time.
_CPU_SEEN = SeenCalls()


def _cpu_key(kind, handle, desc, x, dy, y, alpha, beta, out):
    return numpy_call_key(handle, out, (kind, desc, alpha, beta), (x, dy, y))


# ----------------------------------------------------------------------------------------------
# GPU fast path (backend/cuda/act_kernels.py), owned by the step-kernels work (issue 10): one launch each way for
# CuPy float32/float64 arrays in C or channels-last order, no blending; None sends the call to the reference above.

# Calls the kernel took, by their full signature (shapes, dtypes, strides, devices, descriptor, blending, the handle
# as passed: None keys as None, x's device deciding) -> the kernel's plan: the same call again skips the validation
# it would pass again and goes straight to the plan (one allocation, one prepared launch; host cost per step).  The
# key is built once per call, from the arguments as given (it was built again after begin() from the resolved
# handle, so a call passing handle=None never matched its remembered key).
_SEEN = SeenCalls()


def _gpu_key(kind, handle, desc, x, dy, y, alpha, beta, out):
    if out is not None or not is_cuda_array(x):
        return None
    try:
        key = (kind, None if handle is None else handle.device, desc, alpha, beta,
               (x.shape, x.dtype, x.strides, x.data.device_id),
               None if dy is None else (dy.shape, dy.dtype, dy.strides, dy.data.device_id),
               None if y is None else (y.shape, y.dtype, y.strides, y.data.device_id))
    except AttributeError:
        return None
    return key


def _seen(key):
    return seen_plan(_SEEN, key)


# The first-order backward of a GPU x on a seen signature (ops.activation's Activation.backward; docs/host_overhead.md
# round 25b).  Its full path is the default handle for x's device -> activation_backward -> the key above -> the
# kernels' plan.  That key reads the handle's device (x's), the descriptor, alpha 1 / beta 0 and no dx or y
# (constants on this path), x's and dy's shapes, dtypes, strides and devices; so does this signature (the
# descriptor by identity: the entry holds it).  activation_backward, when the kernels run such a call, remembers the
# signature with the key and plan (_learn_backward); backward_seen launches that plan after checking _SEEN still
# holds it under the key (a cleared table or changed kernel settings: None, the full path, which learns again).
# BWD_SEEN[0] = False or MINIDNN_ACT_BWD_SEEN=0: off.
BWD_SEEN = [os.environ.get("MINIDNN_ACT_BWD_SEEN", "1") != "0"]
_BWD_SIGS = SeenCalls()


def _bwd_sig(desc, x, dy):
    try:
        return (id(desc), x.shape, x.strides, x.dtype, x.data.device_id, dy.shape, dy.strides, dy.dtype,
                dy.data.device_id)
    except AttributeError:
        return None


def backward_seen(desc, x, dy):
    """dx of a first-order activation backward whose signature learn_backward remembered and whose plan the
    kernels' table still holds; None (nothing ran) otherwise."""
    if not BWD_SEEN[0] or not is_cuda_array(x):
        return None
    entry = _BWD_SIGS.get(_bwd_sig(desc, x, dy))
    if entry is None or entry[0] is not desc:
        return None
    if _SEEN.get(entry[1]) is not entry[2]:         # the table was cleared or re-planned: the full path learns again
        _BWD_SIGS.pop(_bwd_sig(desc, x, dy), None)
        return None
    return entry[2](x, dy)


def _learn_backward(desc, x, dy, key, plan):
    """activation_backward ran (x, dy) on the kernels' ``plan`` with no y, no dx, alpha 1, beta 0 -- the call
    Activation.backward makes: remember its signature for backward_seen."""
    sig = _bwd_sig(desc, x, dy)
    if sig is not None and key is not None:
        _BWD_SIGS.remember(sig, (desc, key, plan))


def _gpu_activation(desc, x, dy, alpha, beta, out, key=None):
    if not (is_cuda_array(x) and alpha == 1 and beta == 0 and out is None):
        return None
    mode = desc.mode.name
    if not act_kernels.supports(mode, x, *(() if dy is None else (dy,))):
        return None
    plan = act_kernels.plan(mode, desc.coef, x, dy is not None)
    _SEEN.remember(key, plan)
    return plan(x) if dy is None else plan(x, dy)
