"""Private helpers shared by the non-convolution primitives.

Every primitive follows the same three steps, and this module holds the parts that repeat:

1. ``begin``      resolve the handle (None -> the default handle of x's device), check that every array
                  lives on that device, and return the array module ``xp`` (numpy or cupy);
2. ``check_*``    validate shapes, dtypes and output buffers *before* any computation, raising
                  BadParamError that names the values and the rule broken;
3. ``blend``      write ``alpha * value + beta * out`` the cuDNN way (see below).

It also holds the numerics that several families share: one-pass moments (batch/layer/group norm),
the normalisation backward formula, and a zero-padded sliding-window sum (LRN and divisive norm).
"""
from __future__ import annotations

import itertools

import numpy as np

from .devices import CPU as _CPU
from .devices import array_module
from .devices import is_floating as _is_floating
from .errors import BadParamError
from .handle import resolve_handle


def begin(handle, where: str, **arrays):
    """Resolve ``handle`` from the first array given, check every array's device, return (handle, xp)."""
    first = next((a for a in arrays.values() if a is not None), None)
    handle = resolve_handle(handle, first)
    handle.check_arrays(where, **arrays)
    return handle, (array_module(first) if first is not None else handle.xp)


def shape_str(a) -> str:
    return str(tuple(a.shape))


def check_float(where: str, **arrays) -> None:
    """The reference code computes in floating point only (float16/32/64), as cuDNN does."""
    for name, a in arrays.items():
        if a is not None and not _is_floating(np.dtype(a.dtype)):
            raise BadParamError(f"{where}: {name} has dtype {a.dtype}, but only floating-point dtypes "
                                "(float16, float32, float64) are supported")


def check_same(where: str, ref_name: str, ref, **arrays) -> None:
    """Every named array must have the shape and dtype of ``ref`` (e.g. dy like y, dx like x)."""
    for name, a in arrays.items():
        if a is None:
            continue
        if tuple(a.shape) != tuple(ref.shape):
            raise BadParamError(f"{where}: {name} has shape {shape_str(a)} but {ref_name} has shape "
                                f"{shape_str(ref)}; they must match")
        if a.dtype != ref.dtype:
            raise BadParamError(f"{where}: {name} has dtype {a.dtype} but {ref_name} has dtype {ref.dtype}; "
                                "they must match")


def check_ndim(where: str, name: str, a, allowed) -> None:
    if a.ndim not in allowed:
        raise BadParamError(f"{where}: {name} has shape {shape_str(a)} ({a.ndim}-D) but must be "
                            f"{' or '.join(str(n) + '-D' for n in allowed)}")


def check_out(where: str, name: str, out, shape, dtype, beta) -> None:
    """Validate an output buffer before computing.

    cuDNN's blending rule ``out = alpha * value + beta * out`` reads ``out`` only when beta != 0, so
    the buffer is required then; with beta == 0 it is optional and its old contents (even NaN) are
    ignored.
    """
    if out is None:
        if beta != 0:
            raise BadParamError(f"{where}: beta={beta} blends into the existing {name}, so {name} must be given")
        return
    if tuple(out.shape) != tuple(shape):
        raise BadParamError(f"{where}: {name} has shape {shape_str(out)} but the result has shape {tuple(shape)}")
    if out.dtype != np.dtype(dtype):
        raise BadParamError(f"{where}: {name} has dtype {out.dtype} but the result has dtype {np.dtype(dtype)}")


def blend(value, alpha, beta, out, dtype=None):
    """Return ``alpha * value + beta * out``, written into ``out`` when it is given.

    ``value`` is the primitive's plain result.  With ``out`` None a fresh array (of ``dtype``, default
    value's) is returned.  With beta == 0 the old contents of ``out`` are never read, so a NaN left
    there does not leak (0 * NaN would be NaN).
    """
    if alpha != 1:
        value = value * alpha
    if out is None:
        return value.astype(dtype or value.dtype, copy=False)
    if beta == 0:
        out[...] = value
    else:
        out[...] = value + beta * out
    return out


def parse_enum(where: str, cls, value, name: str):
    """``value`` as a member of enum ``cls``: a member, its value, or its name in any case."""
    try:
        return cls[value.upper()] if isinstance(value, str) else cls(value)
    except (KeyError, ValueError):
        raise BadParamError(f"{where}: unknown {name} {value!r}; expected one of {[m.name for m in cls]}") from None


def as_tuple(value, n: int, where: str, name: str) -> tuple:
    """Broadcast an int to ``n`` ints, or check that a sequence has ``n`` entries."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    try:
        t = tuple(int(v) for v in value)
    except TypeError:
        raise BadParamError(f"{where}: {name}={value!r} must be an int or a sequence of ints") from None
    if len(t) != n:
        raise BadParamError(f"{where}: {name}={value!r} has {len(t)} entries but {n} spatial dims are used")
    return t


def accumulation_dtype(dtype):
    """float16/bfloat16 statistics are accumulated in float32 (as cuDNN and PyTorch do); others in their own dtype."""
    return np.dtype(np.float32) if np.dtype(dtype).itemsize == 2 else np.dtype(dtype)


# ----------------------------------------------------------------------------------------------
# Normalisation numerics (batch, layer and group norm share them).

def moments(xp, x, axes):
    """Mean and biased variance of ``x`` over ``axes`` (kept as size-1 dims), in one sweep.

    The naive one-pass formula var = E[x^2] - E[x]^2 loses every digit when |mean| >> std (float32
    data around 1e4 with std 1 gives garbage).  We use the *shifted* one-pass form instead:
    subtract a shift K taken from the data itself (the first element of each reduced slice, which is
    close to the mean for any sensible data) and compute E[d] and E[d^2] of d = x - K in the same
    sweep; then mean = K + E[d] and var = E[d^2] - E[d]^2, whose cancellation is now only relative
    to (mean - K)^2 instead of mean^2.  It stays a single pass over x (two sums of the same stream),
    which is what a fused GPU kernel wants, and matches the two-pass result to rounding in practice.
    """
    acc = accumulation_dtype(x.dtype)
    xa = x.astype(acc, copy=False)
    first = tuple(slice(0, 1) if ax in axes else slice(None) for ax in range(x.ndim))
    shift = xa[first]
    d = xa - shift
    mean_d = d.mean(axis=axes, keepdims=True)
    var = xp.maximum((d * d).mean(axis=axes, keepdims=True) - mean_d * mean_d, 0)
    return shift + mean_d, var


def normalization_backward(xp, xhat, dxhat, inv_std, axes):
    """dx for xhat = (x - mean) * inv_std with mean and variance taken over ``axes``.

    The classic closed form: dx = inv_std * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
    where ``dxhat`` is the gradient reaching xhat (dy times the scale).
    """
    return inv_std * (dxhat - dxhat.mean(axis=axes, keepdims=True)
                      - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))


# ----------------------------------------------------------------------------------------------
# Zero-padded sliding windows.

def tap_offsets(window, stride, out_sizes):
    """Yield (tap number, slices) for every tap of a ``window`` (one entry per trailing dim).

    For tap (k0, k1, ...), ``slices`` picks from a padded array the element each output position
    sees at that tap: ``k + stride * arange(out)``.  A loop over taps (at most a few dozen) keeps
    the per-pixel and per-batch work vectorised; taps are visited in row-major order, so "first
    tap wins" gives the first maximum of a window in row-major order, as PyTorch and cuDNN do.
    """
    for t, ks in enumerate(itertools.product(*(range(k) for k in window))):
        yield t, tuple(slice(k, k + s * (o - 1) + 1, s) for k, s, o in zip(ks, stride, out_sizes))


def pad_axes(xp, x, axes, before, after, value=0):
    """Pad ``x`` by ``before``/``after`` elements on each of ``axes`` (others untouched)."""
    widths = [(0, 0)] * x.ndim
    for ax, b, a in zip(axes, before, after):
        widths[ax] = (b, a)
    if not any(b or a for b, a in widths):
        return x
    return xp.pad(x, widths, mode="constant", constant_values=value)


def window_sum(xp, x, axes, n, before):
    """Sum of ``x`` over a size-``n`` zero-padded window along each of ``axes``.

    Output position i sums input positions i - before ... i - before + n - 1 (on every axis).  The
    adjoint of this map is the same sum with ``before`` replaced by ``n - 1 - before``.
    """
    after = n - 1 - before
    xp_ = pad_axes(xp, x, axes, [before] * len(axes), [after] * len(axes))
    out = xp.zeros_like(x)
    lead = (slice(None),) * min(axes)
    window = [n] * len(axes)
    sizes = [x.shape[ax] for ax in axes]
    # axes must be consecutive for the slices to line up with them
    assert list(axes) == list(range(min(axes), min(axes) + len(axes))), axes
    for _, sl in tap_offsets(window, [1] * len(axes), sizes):
        out += xp_[lead + sl]
    return out


class SeenCalls(dict):
    """A primitive's validated-call cache: a call's signature -> what validating it settled (the format, geometry,
    the kernels' plan).  Bounded: a full table starts again empty."""
    limit = 4096

    def remember(self, key, value):
        if key is not None:
            if len(self) >= self.limit:
                self.clear()
            self[key] = value


def numpy_call_key(handle, out, head, arrays, strides=False):
    """The signature of a primitive's NumPy call for a SeenCalls table: ``head`` (the settings the checks read) and
    each array's shape and dtype (and strides where the checks or the geometry read them); None -- not cached --
    with an output array, a handle not the CPU's, or an argument that is not a plain ndarray (a None array keys as
    None).  Its first array must be one."""
    if out is not None or type(arrays[0]) is not np.ndarray or not (
            handle is None or getattr(handle, "device", None) == _CPU):
        return None
    sig = list(head)
    for a in arrays:
        if a is None:
            sig.append(None)
        elif type(a) is np.ndarray:
            sig.append((a.shape, a.dtype, a.strides) if strides else (a.shape, a.dtype))
        else:
            return None
    return tuple(sig)


def seen_plan(table, key):
    """(key, the plan ``table`` remembers for it, or None) -- the primitives' validated-call caches; (None, None)
    where an argument cannot key a dict (hashed once, by the lookup itself: a separate hash() doubled the cost of
    hashing a descriptor)."""
    if key is None:
        return None, None
    try:
        return key, table.get(key)
    except TypeError:
        return None, None
