"""The convolution descriptor and the resolved problem every convolution algorithm receives.

# x: (N, C, *in)      w: (K, C/G, *kernel)      y: (N, K, *out)        (channels-first index order)
# out[d] = (in[d] + 2*padding[d] - dilation[d]*(kernel[d] - 1) - 1) // stride[d] + 1

``ConvolutionDescriptor`` is what a user builds (cuDNN's cudnnConvolutionDescriptor_t): padding,
stride, dilation, groups, mode and math type, validated once.  ``ConvProblem`` is what the algorithms
see: the descriptor resolved against concrete shapes (every size a tuple, N/C/K/G named), immutable
and hashable so it can key the algorithm cache.  Algorithms only ever compute cross-correlation on
channels-first arrays; the convolution mode and the tensor format are handled before and after them.
"""
from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass

import numpy as np

from ._common import as_tuple
from .errors import BadParamError, IdentityEnum
from .handle import MathType

__all__ = ["ConvolutionMode", "ConvolutionDescriptor", "ConvProblem", "make_problem"]


class ConvolutionMode(IdentityEnum):
    """cuDNN's cudnnConvolutionMode_t.

    CROSS_CORRELATION  y[o] = sum_r x[o*s + r*d] w[r]           (what deep learning calls convolution)
    CONVOLUTION        y[o] = sum_r x[o*s + r*d] w[R-1-r]       (the kernel flipped: true convolution)
    """
    CONVOLUTION = 0
    CROSS_CORRELATION = 1


def _spatial_param(name, value, minimum):
    """An int, or a tuple of ints (one per spatial dim), each >= minimum; named in the error."""
    where = "ConvolutionDescriptor"
    if isinstance(value, (bool, np.bool_)):
        raise BadParamError(f"{where}: {name}={value!r} must be an int or a tuple of ints, not a bool")
    try:
        parsed = operator.index(value)
    except TypeError:
        try:
            parsed = tuple(operator.index(v) for v in value)
        except TypeError:
            raise BadParamError(f"{where}: {name}={value!r} must be an int or a tuple of ints") from None
        if not 1 <= len(parsed) <= 3:
            raise BadParamError(f"{where}: {name}={value!r} must have 1, 2 or 3 entries (one per spatial dim)")
    for v in (parsed if isinstance(parsed, tuple) else (parsed,)):
        if v < minimum:
            raise BadParamError(f"{where}: {name}={value!r} must be >= {minimum}")
    return parsed


class ConvolutionDescriptor:
    """``ConvolutionDescriptor(padding=0, stride=1, dilation=1, groups=1, mode=CROSS_CORRELATION, math_type=None)``

    Each of padding/stride/dilation is an int (the same for every spatial dim: the number of spatial dims
    stays open until the descriptor meets arrays) or a tuple (which fixes it).  Padding is symmetric, as in
    cuDNN.  ``math_type`` None means "use the handle's".  Immutable and hashable.
    """

    __slots__ = ("padding", "stride", "dilation", "groups", "mode", "math_type")

    def __init__(self, padding=0, stride=1, dilation=1, groups=1, mode=ConvolutionMode.CROSS_CORRELATION,
                 math_type=None):
        values = {"padding": _spatial_param("padding", padding, 0),
                  "stride": _spatial_param("stride", stride, 1),
                  "dilation": _spatial_param("dilation", dilation, 1)}
        lengths = {k: len(v) for k, v in values.items() if isinstance(v, tuple)}
        if len(set(lengths.values())) > 1:
            raise BadParamError(f"ConvolutionDescriptor: padding, stride and dilation disagree on the number of "
                                f"spatial dims ({', '.join(f'{k}={values[k]}' for k in lengths)})")
        groups = _spatial_param("groups", groups, 1)
        if isinstance(groups, tuple):
            raise BadParamError(f"ConvolutionDescriptor: groups={groups!r} must be a single int")
        try:
            mode = ConvolutionMode(mode) if not isinstance(mode, str) else ConvolutionMode[mode.upper()]
        except (ValueError, KeyError):
            raise BadParamError(f"ConvolutionDescriptor: mode={mode!r} must be a ConvolutionMode") from None
        try:
            math_type = None if math_type is None else MathType(math_type)
        except ValueError:
            raise BadParamError(f"ConvolutionDescriptor: math_type={math_type!r} must be a MathType or None") from None
        for k, v in dict(values, groups=groups, mode=mode, math_type=math_type).items():
            object.__setattr__(self, k, v)

    def __setattr__(self, name, value):
        raise AttributeError("ConvolutionDescriptor is immutable; build a new one")

    @property
    def spatial_dims(self):
        """The number of spatial dims the tuples fix, or None while it is left open."""
        return next((len(v) for v in (self.padding, self.stride, self.dilation) if isinstance(v, tuple)), None)

    def resolve(self, nd: int, where: str = "ConvolutionDescriptor"):
        """(padding, stride, dilation) as ``nd``-tuples; BadParamError if the tuples fix another rank."""
        return tuple(as_tuple(getattr(self, k), nd, where, k) for k in ("padding", "stride", "dilation"))

    def _key(self):
        return (self.padding, self.stride, self.dilation, self.groups, self.mode, self.math_type)

    def __eq__(self, other):
        return isinstance(other, ConvolutionDescriptor) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        mt = "" if self.math_type is None else f", math_type={self.math_type.name}"
        return (f"ConvolutionDescriptor(padding={self.padding}, stride={self.stride}, dilation={self.dilation}, "
                f"groups={self.groups}, mode={self.mode.name}{mt})")


@dataclass(frozen=True)
class ConvProblem:
    """A convolution with every size resolved, in channels-first order (what the algorithms compute)."""
    N: int
    C: int
    K: int
    groups: int
    in_size: tuple
    kernel: tuple
    out_size: tuple
    padding: tuple
    stride: tuple
    dilation: tuple
    dtype: str

    def __hash__(self):
        # A problem keys several caches on every convolution call: its hash is computed once (the fields are
        # frozen) and kept out of pickles (string hashes differ between processes).
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.N, self.C, self.K, self.groups, self.in_size, self.kernel, self.out_size, self.padding,
                      self.stride, self.dilation, self.dtype))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    @property
    def nd(self):
        return len(self.in_size)

    @property
    def Cg(self):   # input channels per group
        return self.C // self.groups

    @property
    def Kg(self):   # output channels per group
        return self.K // self.groups

    @property
    def itemsize(self):
        return np.dtype(self.dtype).itemsize

    @property
    def x_shape(self):
        return (self.N, self.C, *self.in_size)

    @property
    def w_shape(self):
        return (self.K, self.Cg, *self.kernel)

    @property
    def y_shape(self):
        return (self.N, self.K, *self.out_size)

    @property
    def dilated_kernel(self):
        return tuple((r - 1) * d + 1 for r, d in zip(self.kernel, self.dilation))

    @property
    def padded_size(self):
        return tuple(i + 2 * p for i, p in zip(self.in_size, self.padding))

    @property
    def macs(self):
        """Multiply-adds of one direction (the direct definition): N*K*out*C/G*kernel."""
        return self.N * self.K * math.prod(self.out_size) * self.Cg * math.prod(self.kernel)

    def describe(self):
        return (f"x {self.x_shape}, w {self.w_shape}, padding {self.padding}, stride {self.stride}, "
                f"dilation {self.dilation}, groups {self.groups}, dtype {self.dtype}")

    def taps(self):
        """Yield (tap, x_slices, y_slices) for every kernel tap, without padding anything.

        Tap r pairs output position o with input position i = o*stride + r*dilation - padding.  The
        slices keep only the outputs whose i falls inside the input (the rest would read padding zeros),
        so ``y[..., y_slices] += w[tap] . x[..., x_slices]`` is the whole tap.  Taps that see only padding
        are skipped.
        """
        for tap in itertools.product(*(range(r) for r in self.kernel)):
            xs, ys = [], []
            for r, i_n, o_n, p, s, d in zip(tap, self.in_size, self.out_size, self.padding, self.stride,
                                             self.dilation):
                shift = r * d - p                       # i = o*s + shift
                o_lo = max(0, -(shift // s))             # first o with i >= 0: ceil(-shift / s)
                o_hi = min(o_n, (i_n - 1 - shift) // s + 1)   # one past the last o with i < in
                if o_hi <= o_lo:
                    break
                ys.append(slice(o_lo, o_hi))
                xs.append(slice(o_lo * s + shift, (o_hi - 1) * s + shift + 1, s))
            else:
                yield tap, tuple(xs), tuple(ys)


def output_size(in_size, kernel, padding, stride, dilation):
    return tuple((i + 2 * p - d * (r - 1) - 1) // s + 1
                 for i, r, p, s, d in zip(in_size, kernel, padding, stride, dilation))


def make_problem(where: str, x_shape, w_shape, desc: ConvolutionDescriptor, dtype, x_name="x") -> ConvProblem:
    """Check ``x_shape`` (channels-first) and ``w_shape`` against ``desc`` and resolve the sizes.

    Raises BadParamError naming the shapes and the rule broken, before any computation.
    """
    if not isinstance(desc, ConvolutionDescriptor):
        raise BadParamError(f"{where}: conv_desc must be a ConvolutionDescriptor, got {type(desc).__name__}")
    x_shape, w_shape = tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape)
    if not 3 <= len(x_shape) <= 5:
        raise BadParamError(f"{where}: {x_name} has shape {x_shape} ({len(x_shape)}-D) but must be 3-D, 4-D or "
                            "5-D (N, C, *spatial) for a 1-D, 2-D or 3-D convolution")
    if len(w_shape) != len(x_shape):
        raise BadParamError(f"{where}: {x_name} {x_shape} is {len(x_shape)}-D but w {w_shape} is {len(w_shape)}-D; "
                            "w must be (K, C/groups, *kernel) with one kernel size per spatial dim of x")
    nd = len(x_shape) - 2
    if desc.spatial_dims not in (None, nd):
        raise BadParamError(f"{where}: {desc} fixes {desc.spatial_dims} spatial dims but {x_name} {x_shape} has {nd}")
    padding, stride, dilation = desc.resolve(nd, where)
    (N, C, *in_size), (K, Cg, *kernel), G = x_shape, w_shape, desc.groups
    if min(K, Cg, *kernel) < 1 or C < 1:
        raise BadParamError(f"{where}: {x_name} {x_shape} and w {w_shape} must have at least one channel and "
                            "kernel sizes >= 1")
    if C % G:
        raise BadParamError(f"{where}: {x_name} has {C} channels, which groups={G} does not divide")
    if K % G:
        raise BadParamError(f"{where}: w {w_shape} has K={K} output channels, which groups={G} does not divide")
    if C != Cg * G:
        raise BadParamError(f"{where}: {x_name} has {C} channels but w {w_shape} with groups={G} expects {Cg * G}")
    for d, (i, r, p, dl) in enumerate(zip(in_size, kernel, padding, dilation)):
        if (r - 1) * dl + 1 > i + 2 * p:
            raise BadParamError(
                f"{where}: in spatial dim {d} the dilated kernel spans {(r - 1) * dl + 1} (kernel {r}, dilation "
                f"{dl}) but the padded input has only {i + 2 * p} (size {i} + 2*padding {p}); {x_name} {x_shape}, "
                f"w {w_shape}")
    return ConvProblem(N, C, K, G, tuple(in_size), tuple(kernel),
                       output_size(in_size, kernel, padding, stride, dilation),
                       padding, stride, dilation, np.dtype(dtype).name)
