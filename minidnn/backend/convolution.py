"""Convolution primitives (cuDNN's cudnnConvolution*), on raw NumPy / CuPy arrays.

# x: (N, C, *in)  w: (K, C/G, *kernel)  y: (N, K, *out)  b, db: (K,)    1-D, 2-D or 3-D; G = groups
# format="NHWC": x, y, dx, dy are indexed channels-last, (N, *spatial, C); w and dw keep (K, C/G, *kernel).

Each primitive runs the same steps:
  1. validate every shape, dtype and device before computing (BadParamError naming values and rule);
  2. orient: channels-first views of the arrays (no copy), the kernel flipped for ConvolutionMode.CONVOLUTION;
  3. pick the algorithm from its registry (explicit ``algo``, the cached benchmark winner, or the
     heuristic's choice) -- see algorithm_selection.py; the ops never branch on algorithms;
  4. blend: ``out = alpha * result + beta * out`` (``out`` read only when beta != 0).
The algorithms live in conv_gemm.py (the reference, im2col + GEMM) and conv_algorithms.py.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import autotune as _autotune
from ._common import SeenCalls, accumulation_dtype, begin, blend, check_float, check_out
from .algorithm_selection import AlgoPerf, ConvolutionPreference, Determinism
from .conv_algorithms import (
    BACKWARD_DATA_ALGORITHMS,
    BACKWARD_FILTER_ALGORITHMS,
    FORWARD_ALGORITHMS,
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionFwdAlgo,
)
from .conv_problem import ConvolutionDescriptor, ConvolutionMode, make_problem
from .cuda import conv_igemm as _igemm
from .cuda import conv_register as _cuda_conv
from .cuda import launch as _launch
from .cuda import norm_kernels as _norm_kernels
from .cuda.conv_igemm import direct_backward_filter as _direct_filter
from .cuda.conv_igemm import filter_carry as _filter_carry
from .cuda.conv_igemm import shared_staging as _shared_staging
from .devices import array_module, device_of, is_cuda_array
from .devices import is_floating as _is_floating
from .errors import BadParamError, NotSupportedError, Status
from .handle import get_default_handle, resolve_handle
from .layout import (
    TensorFormat,
    channels_first_perm,
    channels_last_perm,
    from_channels_first,
    resolve_format,
    to_channels_first,
)
from .versioning import deprecated_alias

__all__ = [
    "ConvolutionMode", "ConvolutionDescriptor", "ConvolutionFwdAlgo", "ConvolutionBwdDataAlgo",
    "ConvolutionBwdFilterAlgo", "ConvolutionPreference", "Determinism", "AlgoPerf",
    "get_convolution_forward_output_dim",
    "convolution_forward", "convolution_backward_data", "convolution_backward_filter", "convolution_backward_bias",
    "get_convolution_forward_algorithm_v7", "get_convolution_forward_algorithm", "find_convolution_forward_algorithm",
    "get_convolution_forward_workspace_size",
    "get_convolution_backward_data_algorithm_v7", "get_convolution_backward_data_algorithm",
    "find_convolution_backward_data_algorithm",
    "get_convolution_backward_data_workspace_size",
    "get_convolution_backward_filter_algorithm_v7", "get_convolution_backward_filter_algorithm",
    "find_convolution_backward_filter_algorithm",
    "get_convolution_backward_filter_workspace_size",
    "get_convolution_algorithm_cache", "clear_convolution_algorithm_cache", "convolution_algorithm_cache_info",
    "convolution_shared_staging",
]

_REGISTRIES = (FORWARD_ALGORITHMS, BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS)


# ---- shapes in the caller's format ---------------------------------------------------------------------

def _cf_shape(shape, fmt):
    """A shape indexed in ``fmt`` -> the same shape indexed channels-first."""
    shape = tuple(int(v) for v in shape)
    if fmt is TensorFormat.NHWC and len(shape) >= 3:
        return tuple(shape[i] for i in channels_first_perm(len(shape)))
    return shape


def _fmt_shape(shape_cf, fmt):
    if fmt is TensorFormat.NHWC and len(shape_cf) >= 3:
        return tuple(shape_cf[i] for i in channels_last_perm(len(shape_cf)))
    return tuple(shape_cf)


def _check_dtypes(where, first_name, first, **others):
    """Floating dtypes only, and every array (or dtype) the same as the first."""
    for name, dtype in ((first_name, first), *others.items()):
        if not _is_floating(np.dtype(dtype)):
            raise BadParamError(f"{where}: {name} has dtype {np.dtype(dtype)}, but only floating-point dtypes "
                                "(float16, float32, float64) are supported")
        if np.dtype(dtype) != np.dtype(first):
            raise BadParamError(f"{where}: {first_name} has dtype {np.dtype(first)} but {name} has dtype "
                                f"{np.dtype(dtype)}; they must match")


def _check_dy(where, dy_shape, p, fmt):
    expected = _fmt_shape(p.y_shape, fmt)
    if tuple(dy_shape) != expected:
        raise BadParamError(f"{where}: dy has shape {tuple(dy_shape)} but the convolution of x "
                            f"{_fmt_shape(p.x_shape, fmt)} with w {p.w_shape} (padding {p.padding}, stride {p.stride}, "
                            f"dilation {p.dilation}, groups {p.groups}) has output shape {expected}")


def _format(fmt):
    return resolve_format(None, fmt)


# ---- the problem of each direction, from shapes (cuDNN's argument order) ----------------------------------

def _forward_problem(where, x_shape, w_shape, conv_desc, _unused, dtype, fmt):
    return make_problem(where, _cf_shape(x_shape, fmt), w_shape, conv_desc, dtype)


def _backward_data_problem(where, w_shape, dy_shape, conv_desc, x_shape, dtype, fmt):
    p = make_problem(where, _cf_shape(x_shape, fmt), w_shape, conv_desc, dtype, x_name="x_shape")
    _check_dy(where, dy_shape, p, fmt)
    return p


def _backward_filter_problem(where, x_shape, dy_shape, conv_desc, w_shape, dtype, fmt):
    p = make_problem(where, _cf_shape(x_shape, fmt), w_shape, conv_desc, dtype)
    _check_dy(where, dy_shape, p, fmt)
    return p


def _flip(w, conv_desc):
    """ConvolutionMode.CONVOLUTION is cross-correlation with the kernel flipped on every spatial axis."""
    if conv_desc.mode is ConvolutionMode.CROSS_CORRELATION:
        return w
    return w[(slice(None), slice(None), *(slice(None, None, -1),) * (w.ndim - 2))]


# ---- running an algorithm -------------------------------------------------------------------------------

def _cache_key(registry, handle, p, fmt, math_type):
    return (registry.name, p, fmt, math_type, handle.deterministic, handle.workspace_limit, str(handle.device))


class _Plan:
    """What a validated call settled once its arrays were checked: the problem, the format, the math settings, the
    algorithm cache's key, the algorithm asked for by ``algo`` (checked usable) or None (chosen at each call)."""
    __slots__ = ("p", "fmt", "tf32", "math_type", "key", "algorithm", "half")

    def __init__(self, registry, handle, p, conv_desc, fmt, algo):
        self.p, self.fmt = p, fmt
        self.math_type = handle.effective_math_type(p.dtype, conv_desc.math_type)
        self.tf32 = handle.allows_tf32(p.dtype, conv_desc.math_type)
        self.key = _cache_key(registry, handle, p, fmt, self.math_type)
        self.algorithm = None if algo is None else registry.require(algo, p, handle)
        self.half = np.dtype(p.dtype).itemsize == 2


def _run(algorithm, p, a, b, tf32, out_dtype=None):
    """``algorithm`` on channels-first arrays as a call runs it -- also when find/benchmark times it: float16/bfloat16
    data through an algorithm without half math (``runs_half_natively``) is computed in float32 and rounded once
    at the end (cuDNN's float compute type for half data) -- or not rounded, where ``out_dtype`` is float32 (the
    filter gradient's ``dw_dtype``)."""
    if np.dtype(p.dtype).itemsize == 2 and not algorithm.runs_half_natively(p, a, b):
        result = algorithm.run(p, a.astype(np.float32), b.astype(np.float32), tf32)
        return result if out_dtype == np.float32 else result.astype(p.dtype)
    return algorithm.run(p, a, b, tf32, out_dtype)


def _execute(registry, handle, plan, a, b, result_shape, out_dtype=None):
    """Pick an algorithm and run it on channels-first arrays; returns the raw (unblended) result, in ``out_dtype``
    where it is given (float32 for half data: only the filter gradient asks)."""
    p, tf32 = plan.p, plan.tf32
    with handle.activate():
        algorithm = plan.algorithm
        if algorithm is None and p.N > 0:
            algorithm = registry.choose(p, handle, plan.math_type, plan.key, lambda alg: _run(alg, p, a, b, tf32))
        if p.N == 0:        # an empty batch: nothing to compute (and dw sums over no images: zeros)
            return handle.xp.zeros(result_shape, dtype=a.dtype if out_dtype is None else out_dtype)
        if not plan.half:
            return algorithm.run(p, a, b, tf32)
        return _run(algorithm, p, a, b, tf32, out_dtype)


# ---- the validated-signature shortcut (host cost per call; docs/host_overhead.md) -----------------------------
# A call whose signature -- direction, both inputs' shapes, dtypes and devices, the descriptor, the format, ``algo``,
# the other shape, the handle's device and settings -- passed every check before, with no output buffer and beta 0,
# reuses that call's _Plan: the checks would pass again and give the same problem.  The algorithm is still chosen
# at every call (a dict lookup in the selector's caches, whose hit counters and clearing stay as they were).
# Anything else, and any argument that cannot key a dict, takes the full path, which raises what it always raised.
_PLANS: dict = {}
_PLANS_LIMIT = 4096


def _signature(registry, handle, a1, a2, conv_desc, format, other_shape, algo, out, beta):
    """(handle, key) for the shortcut, or (None, None) when this call must take the full path."""
    if out is not None or not (isinstance(beta, (int, float)) and beta == 0):
        return None, None
    try:
        # devices as cheap tokens (None: a NumPy array); the handle by identity, with the settings a check reads
        d1 = None if type(a1) is np.ndarray else device_of(a1)
        d2 = None if type(a2) is np.ndarray else device_of(a2)
        h = handle if handle is not None else get_default_handle(device_of(a1))
        key = (registry.name, a1.shape, a1.dtype, d1, a2.shape, a2.dtype, d2, conv_desc, format, other_shape, algo,
               h, h.device, h.math_type, h.deterministic, h.workspace_limit)
    except (TypeError, AttributeError, ValueError):
        return None, None
    return h, key


def _remember(key, plan):
    if key is not None:
        if len(_PLANS) >= _PLANS_LIMIT:
            _PLANS.clear()
        _PLANS[key] = plan


def _finish(result, alpha, beta, out, fmt):
    """Blend the channels-first ``result`` into ``out`` (in ``fmt``), or return a fresh contiguous array."""
    if out is not None:
        blend(result, alpha, beta, to_channels_first(out, fmt))
        return out
    result = from_channels_first(result, fmt)
    if alpha == 1 and result.flags.c_contiguous:
        return result           # what blend and ascontiguousarray would return (the same array)
    return array_module(result).ascontiguousarray(blend(result, alpha, beta, None))


# ---- the primitives -----------------------------------------------------------------------------------

def get_convolution_forward_output_dim(conv_desc, x_shape, w_shape, format=None):
    """The shape of y (cuDNN's cudnnGetConvolutionNdForwardOutputDim), in ``format``'s index order."""
    fmt = _format(format)
    p = _forward_problem("get_convolution_forward_output_dim", x_shape, w_shape, conv_desc, None, np.float32, fmt)
    return _fmt_shape(p.y_shape, fmt)


def _prepare(where, handle, conv_desc, format, problem, first, second, other_shape, out=None):
    """Steps 1 of every direction: handle and devices, dtypes, the format, the validated problem.

    ``first`` and ``second`` are the (name, array) inputs in cuDNN's order, ``other_shape`` the shape of
    the array being computed (None for forward), ``out`` the (name, array) output buffer if any.
    """
    (name1, a1), (name2, a2) = first, second
    handle, _ = begin(handle, where, **{name1: a1, name2: a2}, **dict([out] if out else []))
    _check_dtypes(where, name1, a1.dtype, **{name2: a2.dtype})
    fmt = _format(format)
    return handle, problem(where, a1.shape, a2.shape, conv_desc, other_shape, a1.dtype, fmt), fmt


def _planned(registry, where, handle, conv_desc, format, problem, first, second, other_shape, algo, out, beta,
             out_shape, out_dtype=None):
    """(handle, _Plan) of a call: the remembered plan of its signature, or the full checks (``_prepare``, the output
    buffer against ``out_shape(problem, fmt)`` and ``out_dtype``, default the inputs') and a new plan, remembered."""
    h, key = _signature(registry, handle, first[1], second[1], conv_desc, format, other_shape, algo, out[1], beta)
    try:
        plan = _PLANS.get(key)
    except TypeError:           # an argument that cannot key a dict: the full path
        plan = key = None
    if plan is None:
        h, p, fmt = _prepare(where, handle, conv_desc, format, problem, first, second, other_shape, out)
        check_out(where, out[0], out[1], out_shape(p, fmt), first[1].dtype if out_dtype is None else out_dtype, beta)
        plan = _Plan(registry, h, p, conv_desc, fmt, algo)
        _remember(key, plan)
    return h, plan


def convolution_forward(handle, x, w, conv_desc, algo=None, alpha=1.0, beta=0.0, y=None, format=None):
    """y = alpha * conv(x, w) + beta * y."""
    h, plan = _planned(FORWARD_ALGORITHMS, "convolution_forward", handle, conv_desc, format, _forward_problem,
                       ("x", x), ("w", w), None, algo, ("y", y), beta, lambda p, fmt: _fmt_shape(p.y_shape, fmt))
    result = _execute(FORWARD_ALGORITHMS, h, plan, to_channels_first(x, plan.fmt), _flip(w, conv_desc),
                      plan.p.y_shape)
    return _finish(result, alpha, beta, y, plan.fmt)


def forward_choice(handle, x, w, conv_desc, algo=None, format=None):
    """(handle, plan, algorithm, x channels-first, w as applied) of the convolution_forward call with these
    arguments, without running it: the algorithm it would run (``algo``, or the handle's selection through the same
    caches; None for an empty batch).  The fused forward primitives (conv_fused.py) pick their kernel from it, so
    that fused and unfused calls agree on the algorithm."""
    h, plan = _planned(FORWARD_ALGORITHMS, "convolution_forward", handle, conv_desc, format, _forward_problem,
                       ("x", x), ("w", w), None, algo, ("y", None), 0.0, lambda p, fmt: _fmt_shape(p.y_shape, fmt))
    a, b = to_channels_first(x, plan.fmt), _flip(w, conv_desc)
    algorithm, p = plan.algorithm, plan.p
    if algorithm is None and p.N > 0:
        with h.activate():
            algorithm = FORWARD_ALGORITHMS.choose(p, h, plan.math_type, plan.key,
                                                  lambda alg: _run(alg, p, a, b, plan.tf32))
    return h, plan, algorithm, a, b


def convolution_backward_data(handle, w, dy, conv_desc, x_shape, algo=None, alpha=1.0, beta=0.0, dx=None,
                              format=None):
    """dx = alpha * (d conv / d x)^T dy + beta * dx, for an x of shape ``x_shape`` (in ``format``)."""
    h, plan = _planned(BACKWARD_DATA_ALGORITHMS, "convolution_backward_data", handle, conv_desc, format,
                       _backward_data_problem, ("w", w), ("dy", dy), x_shape, algo, ("dx", dx), beta,
                       lambda p, fmt: _fmt_shape(p.x_shape, fmt))
    result = _execute(BACKWARD_DATA_ALGORITHMS, h, plan, _flip(w, conv_desc), to_channels_first(dy, plan.fmt),
                      plan.p.x_shape)
    return _finish(result, alpha, beta, dx, plan.fmt)


def convolution_backward_filter(handle, x, dy, conv_desc, w_shape, algo=None, alpha=1.0, beta=0.0, dw=None,
                                format=None, dw_dtype=None):
    """dw = alpha * (d conv / d w)^T dy + beta * dw; dw has shape ``w_shape`` = (K, C/G, *kernel).

    ``dw_dtype`` (not cuDNN's; autocast's weight gradients, docs/amp.md): float32 with float16/bfloat16 x and dy
    returns dw in float32 -- the algorithms' float32 sums written unrounded (the CUDA kernels store them as they
    are; an algorithm that cannot is cast once) -- instead of rounding dw to the data's dtype.  None or the data's
    own dtype: the plain call."""
    if dw_dtype is not None:
        dw_dtype = _filter_gradient_dtype(x, dy, dw_dtype)
    h, plan = _planned(BACKWARD_FILTER_ALGORITHMS, "convolution_backward_filter", handle, conv_desc, format,
                       _backward_filter_problem, ("x", x), ("dy", dy), w_shape, algo, ("dw", dw), beta,
                       lambda p, fmt: p.w_shape, dw_dtype)
    result = _execute(BACKWARD_FILTER_ALGORITHMS, h, plan, to_channels_first(x, plan.fmt),
                      to_channels_first(dy, plan.fmt), plan.p.w_shape, dw_dtype)
    # The algorithms computed the gradient of the kernel as applied (flipped in CONVOLUTION mode).
    return _finish(_flip(result, conv_desc), alpha, beta, dw, TensorFormat.NCHW)


def _filter_gradient_dtype(x, dy, dw_dtype):
    """``dw_dtype`` checked: float32 for float16/bfloat16 data; the data's own dtype means the plain call (None)."""
    where = "convolution_backward_filter"
    try:
        dt = np.dtype(dw_dtype)
    except TypeError:
        raise BadParamError(f"{where}: dw_dtype={dw_dtype!r} is not a dtype") from None
    data = getattr(x, "dtype", None)
    if dt == data:
        return None
    if dt != np.float32 or data is None or not _is_floating(data) or np.dtype(data).itemsize != 2 \
            or getattr(dy, "dtype", None) != data:
        raise BadParamError(f"{where}: dw_dtype={dt} with x of dtype {data} and dy of dtype "
                            f"{getattr(dy, 'dtype', None)}: a dw dtype other than the data's is float32 for "
                            "float16/bfloat16 x and dy only")
    return dt


def convolution_shared_staging(carry=None):
    """``with convolution_shared_staging():`` the convolution calls inside copy an NCHW activation into NHWC memory
    for the GPU kernels' 16-byte loader (the staging of large problems, docs/conv_kernels.md) once, and the later
    calls that stage the same array reuse that copy: a convolution's backward data and backward filter both read
    dy.  ``carry``: a ``convolution_filter_carry(want_x=True)`` that went around the forward -- its NHWC copy of x
    counts as made inside the block (the filter gradient stages that x).  The results are bit for bit those of the
    calls made outside the block (the same kernels read the same NHWC data); the arrays given to the calls must not
    be written inside the block, nor x since the forward.  Nothing changes on the CPU."""
    return _shared_staging(carry)


# ``convolution_filter_carry()``: a private route from a convolution's forward to its backward data (not cuDNN's API;
# nn's ConvForward uses it, docs/host_overhead.md round 12): ``with carry:`` around ``convolution_forward`` keeps the
# GPU kernels' KRSC copy of the filter (made where the 16-byte loader runs an NCHW filter) in ``carry`` instead of a
# scratch buffer; ``with carry:`` around ``convolution_backward_data`` of the SAME filter array (unchanged since: the
# caller's promise) reads that copy instead of making the (G, Cg, *kernel, Kg) one -- one launch less, the same
# bits.  ``want_x=True``: the forward's NHWC staging copy of x is kept too, for the backward filter inside
# ``convolution_shared_staging(carry)``.  ``keep=(owner, state_of)``: the forward's KRSC copy is the one kept
# across calls for ``owner`` (the Tensor holding w; ``state_of(owner)`` -> (its array, its version)), all kept copies
# refreshed together in one launch (cuda/conv_filter_keep.py).  Calls without it, CPU calls and other algorithms are
# unchanged; the copies live as long as ``carry``.  (The
# class itself: nn makes one per GPU forward, and a wrapper was one more frame.)
convolution_filter_carry = _filter_carry


# ---- settled calls: a seen GPU call replayed without its checks and selection (nn's fast path) ---------------------
# docs/host_overhead.md round 13.  ``settle_convolution`` makes the full path's checks and algorithm choice once for a
# call's signature and returns what it settled: the chosen algorithm's run function, or for the implicit-GEMM kernels
# the kernel module's settled call (conv_igemm.settled_call) itself.  Calling it computes what the primitive computes
# for arrays of that signature (the same kernels, launches and bits), skipping the layers between.  Only the default
# settled case is served -- a CUDA array, no algo, no output buffer, alpha 1 / beta 0, a handle without a stream of its
# own and without ``benchmark`` (whose cache counts its hits: every call keeps asking the selector), a non-empty
# batch, cross-correlation; anything else settles to None and the caller keeps the full path.
_GENERATION = [0]      # bumped by clear_convolution_algorithm_cache: settled calls made before no longer serve


def settled_state():
    """What a settled call's decisions read besides its arrays and handle: the algorithm caches' generation and the
    kernel modules' switches.  A caller that keeps settled calls keeps this in its key (nn's fast path)."""
    return (_GENERATION[0], _cuda_conv.ENABLED[0], _igemm.VEC_ENABLED[0], _igemm.STAGE_ENABLED[0],
            _igemm.STAGE_MIN_MACS, _igemm.DIRECT_MAX_CG, _igemm.DIRECT_DENSE_MAX_MACS, _igemm.TRANSPOSE_V2[0],
            _igemm.SPLITK2[0], _igemm._pointwise.ENABLED[0], _igemm._pointwise.NCHW[0], _igemm.TILE_ENABLED[0],
            _igemm.DW_SETTLE[0], _igemm.DW_CL_SETTLE[0])


class SettledConvolution:
    """One primitive call settled for arrays of one signature -- shapes, strides, dtypes, 16-byte alignment,
    device -- and one handle state and ``settled_state()``; the caller vouches that later arrays have the same
    signature (nn keys its table on all of it).  ``run(a1, a2, carry=None)`` takes the primitive's two inputs (in its
    format) and returns its result, or None where the current device is not the handle's (the full path switches
    device there: the caller takes it).  ``first(...)`` is the same call on the activations' channels-first views
    (whatever their memory order: what ``to_channels_first`` makes of run's) returning the channels-first view of
    run's result -- for a settled NHWC call, the two transposes in and the one out that nn's channels-last
    tensors would otherwise make around ``run`` (docs/host_overhead.md round 22); for NCHW, ``run`` itself.
    ``carry`` (forward, backward data): the filter_carry the call would see
    active, as ``with carry:`` around the primitive (None: whatever is active).  ``into`` (backward data and filter,
    an implicit-GEMM call with a contiguous channels-first result, or backward data's dense channels-last one): an
    array of the result's shape, dtype and memory order (in the method's index order) that the kernel's epilogue
    writes as ``into = result + beta * into`` (beta 0 or 1: a gradient destination,
    minidnn/_grad_dest.py) -- for the direct kernels' filter gradient (few channels a group) with beta 0 only;
    the return value is ``into`` where it was used, a fresh result otherwise."""
    __slots__ = ("direction", "algorithm", "fn", "p", "fmt", "tf32", "out_dtype", "dev", "igemm", "cl", "calls",
                 "cp", "plain", "direct", "keep", "cl_shape", "cl_strides", "out_shape", "nd2")

    def _fits(self, into, a):
        """``into`` may take the direct kernels' filter gradient: a C-contiguous array of dw's shape and dtype."""
        return (into is not None and into.flags.c_contiguous and into.shape == self.out_shape
                and into.dtype == (a.dtype if self.out_dtype is None else self.out_dtype))

    def run(self, a1, a2, carry=None, into=None, beta=0.0):
        fmt = self.fmt
        if fmt is TensorFormat.NCHW:
            return self.first(a1, a2, carry, into, beta)
        d = self.direction
        a = a1 if d == 1 else to_channels_first(a1, fmt)
        b = a2 if d == 0 else to_channels_first(a2, fmt)
        cf = to_channels_first(into, fmt) if into is not None and d == 1 else into
        r = self.first(a, b, carry, cf, beta)
        if r is None or d == 2:
            return r
        return into if r is cf and into is not None else from_channels_first(r, fmt)

    def _out(self, result):
        """What ``first`` returns for the kernels' channels-first ``result``: ``_finish``'s result (a contiguous
        array in the call's format), seen channels-first -- ``result`` itself where it is dense channels-last memory
        of an NHWC call (``_finish`` returns its NHWC view as it is)."""
        d, fmt = self.direction, self.fmt
        if d == 2 or fmt is TensorFormat.NCHW:
            return _finish(result, 1.0, 0.0, None, TensorFormat.NCHW)
        if result.strides == self.cl_strides and result.shape == self.cl_shape:
            return result
        return to_channels_first(_finish(result, 1.0, 0.0, None, fmt), fmt)

    def first(self, a, b, carry=None, into=None, beta=0.0):
        cp = self.cp
        if cp.cuda.runtime.getDevice() != self.dev:
            return None
        d, p = self.direction, self.p
        if self.igemm is None:
            fn = self.fn
            if fn is None:          # half data the algorithm rounds through float32 or casts: _execute's _run
                result = _run(self.algorithm, p, a, b, self.tf32, self.out_dtype)
            elif self.direct is not None:      # the direct kernels' route, settled (conv_igemm.settle_direct)
                return self.direct(a, b, into if d == 2 and not beta and self._fits(into, a) else None)
            elif into is not None and not beta and fn is _direct_filter and self._fits(into, a):
                # the direct kernels' filter gradient written into a gradient slot (beta 0; their ``out``)
                return fn(p, a, b, self.tf32, out=into, out_dtype=self.out_dtype)
            elif self.out_dtype is None:        # ConvAlgorithm.run's choice of run function, made once
                result = fn(p, a, b, self.tf32)
            else:
                result = fn(p, a, b, self.tf32, out_dtype=self.out_dtype)
            return self._out(result)
        # implicit_forward / implicit_backward_data / implicit_backward_filter, with the kernel module's settled call
        if into is not None and not (d and self.plain and into.shape == self.out_shape):
            # backward data into a dense channels-last destination: the layout of its fresh result (the kernel's
            # plan reads the activations' layout; the output's is the one it allocates)
            if not (d == 1 and self.keep and into.strides == self.cl_strides and into.shape == self.cl_shape
                    and into.dtype == b.dtype):
                into = None
        # backward filter into a channels-last (KRSC memory) gradient slot: the VEC loader writes it so (DWKRSC);
        # where this call runs another loader (its settling raises ValueError: slots 4-7 then hold False), a fresh
        # dw as before
        krsc = d == 2 and into is not None and not into.flags.c_contiguous
        if krsc and self.calls[4] is False:
            into, krsc = None, False
        if d == 2:
            result = out = cp.empty(self.out_shape, dtype=a.dtype if self.out_dtype is None else self.out_dtype) \
                if into is None else into
            carry = None
        else:
            result = _igemm._new_like_layout(cp, self.out_shape, b.dtype if d else a.dtype, self.cl,
                                             a.data.device_id) if into is None else into
            out = result if self.nd2 else result[:, :, None, :]
            if carry is None:
                carry = _igemm._scope.carry
            if d == 1 and carry is not None:
                carry = _igemm._carried(a, carry)
        slot = carry is not None and d == 1
        if into is None or not beta:
            beta = 0.0
        index = slot + 2 * (beta != 0) + 4 * krsc
        call = self.calls[index]
        if call is None:
            precomp, atomic = self.igemm
            try:
                call = self.calls[index] = _igemm.settled_call(cp, d, p, a, b, out, self.tf32, precomp, beta=beta,
                                                               atomic=atomic, carried=slot)
            except ValueError:
                if not krsc:
                    raise
                self.calls[4:] = [False] * 4
                return self.first(a, b, carry)
        call(cp, a, b, out, (), carry)
        if self.plain or self.keep:     # a contiguous channels-first result, or a dense channels-last one of an
            return result               # NHWC call: what _out returns for it (the same array, one view fewer)
        return self._out(result)


_SETTLE = (
    (FORWARD_ALGORITHMS, "convolution_forward", _forward_problem, ("x", "w", "y"),
     lambda p, fmt: _fmt_shape(p.y_shape, fmt)),
    (BACKWARD_DATA_ALGORITHMS, "convolution_backward_data", _backward_data_problem, ("w", "dy", "dx"),
     lambda p, fmt: _fmt_shape(p.x_shape, fmt)),
    (BACKWARD_FILTER_ALGORITHMS, "convolution_backward_filter", _backward_filter_problem, ("x", "dy", "dw"),
     lambda p, fmt: p.w_shape),
)


def settle_convolution(direction, handle, a1, a2, conv_desc, other_shape=None, format=None, dw_dtype=None):
    """The SettledConvolution of ``convolution_forward(handle, a1, a2, conv_desc, format=format)`` (direction 0),
    ``convolution_backward_data(handle, a1, a2, conv_desc, other_shape, format=format)`` (1) or
    ``convolution_backward_filter(handle, a1, a2, conv_desc, other_shape, format=format, dw_dtype=dw_dtype)`` (2),
    or None where the call is not the default settled case (see above).  Checks as the primitive does (and raises
    what it raises); launches nothing."""
    registry, where, problem, names, out_shape = _SETTLE[direction]
    if not is_cuda_array(a1) or conv_desc.mode is not ConvolutionMode.CROSS_CORRELATION:
        return None
    if dw_dtype is not None:
        dw_dtype = _filter_gradient_dtype(a1, a2, dw_dtype)
    h, plan = _planned(registry, where, handle, conv_desc, format, problem, (names[0], a1), (names[1], a2),
                       other_shape, None, (names[2], None), 0.0, out_shape, dw_dtype)
    dev = _launch.cupy().cuda.runtime.getDevice()
    if h.benchmark or h.stream is not None or plan.p.N == 0 or h.device.index != dev:
        return None
    p, fmt, tf32 = plan.p, plan.fmt, plan.tf32
    a = a1 if direction == 1 else to_channels_first(a1, fmt)
    b = a2 if direction == 0 else to_channels_first(a2, fmt)
    algorithm = registry.choose(p, h, plan.math_type, plan.key, lambda alg: _run(alg, p, a, b, tf32))
    # the run function ConvAlgorithm.run would call (its fast forms' ``applies`` read the problem, the arrays'
    # layout and the switches in settled_state()), and how it is called
    fn = algorithm.resolve(p, a, b)
    if plan.half and not (algorithm.runs_half_natively(p, a, b)
                          and (dw_dtype is None or fn in algorithm.wide_out_runs)):
        fn = None               # half data through a float32 round trip or a cast: _run's general form
    spec = getattr(fn, "igemm", None)
    s = SettledConvolution()
    s.direction, s.algorithm, s.fn, s.p, s.fmt, s.tf32, s.out_dtype, s.dev = \
        direction, algorithm, fn, p, fmt, tf32, dw_dtype, dev
    s.igemm = None if spec is None or spec[0] != direction else spec[1:]
    # the result's memory order: an NHWC call's follows its input's; an NCHW call's is channels-first (its backward
    # data too where dy is channels-last in memory: the 16-byte loader reads that dy as it is, dx is x's layout)
    s.cl = _igemm._channels_last(b if direction == 1 else a) and not (direction == 1 and fmt is TensorFormat.NCHW)
    # the result's channels-first shape (the problem's properties build it per read) and whether the problem is 2-D
    s.out_shape, s.nd2 = (p.y_shape, p.x_shape, p.w_shape)[direction], p.nd == 2
    s.calls = [None] * 8     # by (carried, blending into a destination, a channels-last dw destination)
    s.cp = _launch.cupy()
    s.plain = direction == 2 or (fmt is TensorFormat.NCHW and not s.cl)
    # an NHWC call's forward / backward data result in dense channels-last memory (_new_like_layout): _finish
    # returns its NHWC view as it is, so its channels-first view is the array allocated
    s.keep = s.igemm is not None and direction != 2 and fmt is TensorFormat.NHWC and s.cl and p.nd == 2
    # the dense channels-last strides of a 4-D NHWC call's forward / backward data result (its dtype: the input's)
    s.cl_shape = s.cl_strides = None
    if direction != 2 and fmt is TensorFormat.NHWC and p.nd == 2:
        s.cl_shape = n, c, hh, ww = p.x_shape if direction else p.y_shape
        e = (b if direction else a).dtype.itemsize
        s.cl_strides = (hh * ww * c * e, e, ww * c * e, c * e)
    # the direct kernels' register-tiled route settled too (the route choice made once), for a contiguous
    # channels-first result: what _finish returns as it is
    s.direct = _igemm.settle_direct(direction, p, a, b, dw_dtype) if fn in _DIRECT_RUNS[direction] and s.plain \
        and fmt is TensorFormat.NCHW else None
    if s.direct is None and fmt is TensorFormat.NHWC and fn in _DIRECT_RUNS[direction]:
        # a channels-last depthwise call on conv_dw_nhwc's route, settled (host round 26b); its results are what
        # _out returns as they are (dense channels-last forward / backward data, a contiguous filter gradient)
        s.direct = _igemm.settle_direct_cl(direction, p, a, b, dw_dtype)
    return s


_DIRECT_RUNS = ((_igemm.direct_forward,), (_igemm.direct_backward_data,), (_direct_filter,))


def convolution_backward_bias(handle, dy, alpha=1.0, beta=0.0, db=None, format=None, db_dtype=None):
    """db (K,) = alpha * sum of dy over every axis but the channel axis + beta * db.  ``db_dtype`` (not cuDNN's;
    autocast's bias gradients, docs/amp.md): float32 for float16/bfloat16 dy returns the float32 sums unrounded."""
    if alpha == 1 and beta == 0 and type(dy) is not np.ndarray:
        try:        # a GPU call whose signature passed every check before: straight to the kernels
            key = (handle, dy.shape, dy.strides, dy.dtype, dy.data.device_id, format, db_dtype)
            seen = _BIAS_SEEN.get(key)
        except (TypeError, AttributeError):
            key = seen = None
        if seen is not None and (db is None or _db_fits(db, dy, seen[2])):
            return _norm_kernels.bias_grad(dy.transpose(seen[0]) if seen[0] else dy, seen[1], seen[2], db)
    else:
        key = None
    where = "convolution_backward_bias"
    handle, _ = begin(handle, where, dy=dy, db=db)
    check_float(where, dy=dy)
    if not 3 <= dy.ndim <= 5:
        raise BadParamError(f"{where}: dy has shape {tuple(dy.shape)} ({dy.ndim}-D) but must be 3-D, 4-D or 5-D")
    out_dtype = dy.dtype
    if db_dtype is not None and np.dtype(db_dtype) != dy.dtype:
        if np.dtype(db_dtype) != np.float32 or dy.dtype.itemsize != 2:
            raise BadParamError(f"{where}: db_dtype={np.dtype(db_dtype)} with dy of dtype {dy.dtype}: a db dtype "
                                "other than dy's is float32 for float16/bfloat16 dy only")
        out_dtype = np.dtype(np.float32)
    fmt = _format(format)
    dy_cf = to_channels_first(dy, fmt)
    check_out(where, "db", db, (dy_cf.shape[1],), out_dtype, beta)
    if alpha == 1 and beta == 0 and (db is None or _db_fits(db, dy_cf, out_dtype)) \
            and (fast := _gpu_bias_grad(dy_cf, out_dtype, key, db)) is not None:
        return fast             # backend/cuda/norm_kernels.py: bias_grad (1-2 launches), into db where given
    with handle.activate():
        axes = (0, *range(2, dy.ndim))
        result = dy_cf.sum(axis=axes, dtype=accumulation_dtype(dy.dtype)).astype(out_dtype, copy=False)
        return _finish(result, alpha, beta, db, TensorFormat.NCHW)


# convolution_backward_bias's seen GPU calls: (handle, dy's shape, strides, dtype, device, format, db_dtype) -> (the
# transpose from dy to the memory the kernels sum (or None), the channel axis there, the wide output dtype or None).
# The key holds everything the checks and the kernels' support test read; only alpha 1, beta 0 and no db take it,
# and only calls whose dy is already channels-first indexed (the default format) are remembered.
_BIAS_SEEN = SeenCalls()


def _db_fits(db, dy, wide):
    """Whether the kernels may write db (beta 0) in place: a C-contiguous (C,) array of the output dtype (``wide``,
    or dy's) of dy's array type on dy's device -- what check_out and begin's device check accept, contiguous."""
    try:
        return (type(db) is type(dy) and db.shape == (dy.shape[1],)
                and db.dtype == (dy.dtype if wide is None else wide) and db.flags.c_contiguous
                and db.data.device_id == dy.data.device_id)
    except AttributeError:
        return False


def _gpu_bias_grad(dy_cf, out_dtype=None, key=None, db=None):
    """db by the CUDA column-sum kernels for channels-first dy in NCHW or channels-last memory, else None; ``key``:
    remember the call (see _BIAS_SEEN) -- the channels-first view and the kernels' memory as transposes of dy.
    ``db``: written in place (``_db_fits`` held)."""
    if not is_cuda_array(dy_cf):
        return None
    if dy_cf.flags.c_contiguous:
        mem, axis, perm = dy_cf, 1, ()
    else:
        perm = (0, *range(2, dy_cf.ndim), 1)
        mem, axis = dy_cf.transpose(perm), dy_cf.ndim - 1
    if not _norm_kernels.supports_bias_grad(mem, axis):
        return None
    wide = None if out_dtype == dy_cf.dtype else out_dtype
    if key is not None and dy_cf.shape == key[1] and dy_cf.strides == key[2]:      # dy itself (NCHW indexing)
        _BIAS_SEEN.remember(key, (perm, axis, wide))
    return _norm_kernels.bias_grad(mem, axis, wide, db)


# ---- algorithm selection: heuristics, find, workspace, cache ----------------------------------------------

def _math_type(handle, p, conv_desc):
    return handle.effective_math_type(p.dtype, conv_desc.math_type)


def get_convolution_forward_algorithm_v7(handle, x_shape, w_shape, conv_desc, requested_algo_count=None,
                                         dtype=np.float32, format=None):
    """cudnnGetConvolutionForwardAlgorithm_v7: every algorithm as an AlgoPerf (time -1.0: estimated, not measured),
    the usable ones first, fastest estimate first, within the handle's workspace limit and determinism setting; the
    others after, ``status`` NOT_SUPPORTED with ``reason``.  ``[0].algo`` is the choice; ``requested_algo_count``
    keeps the first n.  Filter on ``memory`` (workspace bytes) to pick under a budget."""
    handle = resolve_handle(handle)
    p = _forward_problem("get_convolution_forward_algorithm_v7", x_shape, w_shape, conv_desc, None, dtype,
                         _format(format))
    ranked = FORWARD_ALGORITHMS.heuristic(p, handle, _math_type(handle, p, conv_desc))
    return ranked[:_count("get_convolution_forward_algorithm_v7", requested_algo_count, len(ranked))]


def get_convolution_backward_data_algorithm_v7(handle, w_shape, dy_shape, conv_desc, x_shape,
                                               requested_algo_count=None, dtype=np.float32, format=None):
    """cudnnGetConvolutionBackwardDataAlgorithm_v7: as get_convolution_forward_algorithm_v7, for
    convolution_backward_data."""
    handle = resolve_handle(handle)
    p = _backward_data_problem("get_convolution_backward_data_algorithm_v7", w_shape, dy_shape, conv_desc, x_shape,
                               dtype, _format(format))
    ranked = BACKWARD_DATA_ALGORITHMS.heuristic(p, handle, _math_type(handle, p, conv_desc))
    return ranked[:_count("get_convolution_backward_data_algorithm_v7", requested_algo_count, len(ranked))]


def get_convolution_backward_filter_algorithm_v7(handle, x_shape, dy_shape, conv_desc, w_shape,
                                                 requested_algo_count=None, dtype=np.float32, format=None):
    """cudnnGetConvolutionBackwardFilterAlgorithm_v7: as get_convolution_forward_algorithm_v7, for
    convolution_backward_filter."""
    handle = resolve_handle(handle)
    p = _backward_filter_problem("get_convolution_backward_filter_algorithm_v7", x_shape, dy_shape, conv_desc,
                                 w_shape, dtype, _format(format))
    ranked = BACKWARD_FILTER_ALGORITHMS.heuristic(p, handle, _math_type(handle, p, conv_desc))
    return ranked[:_count("get_convolution_backward_filter_algorithm_v7", requested_algo_count, len(ranked))]


def _count(op, n, available):
    if n is None:
        return available
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise BadParamError(f"{op}: requested_algo_count must be a positive int, got {n!r}")
    return int(n)


# -- the pre-v7 queries (cuDNN 7 deprecated them, cuDNN 8 removed them): a preference instead of a ranking ---------
def _by_preference(ranked, preference=ConvolutionPreference.PREFER_FASTEST, workspace_limit=None):
    """The old preference-based answer, computed from the _v7 ranking: PREFER_FASTEST keeps it; NO_WORKSPACE
    orders the usable algorithms by workspace (ties by the ranking); SPECIFY_WORKSPACE_LIMIT moves those
    needing more than ``workspace_limit`` bytes to the unusable tail."""
    preference = ConvolutionPreference(preference)
    usable = [a for a in ranked if a.status is Status.SUCCESS]
    rejected = [a for a in ranked if a.status is not Status.SUCCESS]
    if preference is ConvolutionPreference.NO_WORKSPACE:
        usable.sort(key=lambda a: a.memory)
    elif preference is ConvolutionPreference.SPECIFY_WORKSPACE_LIMIT and workspace_limit is not None:
        over = [dataclasses.replace(a, status=Status.NOT_SUPPORTED, reason=(
            f"{a.algo.name} needs {a.memory} bytes of workspace but workspace_limit is {workspace_limit}"))
            for a in usable if a.memory > workspace_limit]
        usable = [a for a in usable if a.memory <= workspace_limit]
        rejected = over + rejected
    return usable + rejected


def _forward_by_preference(handle, x_shape, w_shape, conv_desc, preference=ConvolutionPreference.PREFER_FASTEST,
                           workspace_limit=None, dtype=np.float32, format=None):
    """The pre-v7 query (cudnnGetConvolutionForwardAlgorithm): the _v7 ranking re-ordered by ``preference``."""
    return _by_preference(get_convolution_forward_algorithm_v7(handle, x_shape, w_shape, conv_desc, dtype=dtype,
                                                               format=format), preference, workspace_limit)


def _backward_data_by_preference(handle, w_shape, dy_shape, conv_desc, x_shape,
                                 preference=ConvolutionPreference.PREFER_FASTEST, workspace_limit=None,
                                 dtype=np.float32, format=None):
    """The pre-v7 query (cudnnGetConvolutionBackwardDataAlgorithm): the _v7 ranking re-ordered by ``preference``."""
    return _by_preference(get_convolution_backward_data_algorithm_v7(
        handle, w_shape, dy_shape, conv_desc, x_shape, dtype=dtype, format=format), preference, workspace_limit)


def _backward_filter_by_preference(handle, x_shape, dy_shape, conv_desc, w_shape,
                                   preference=ConvolutionPreference.PREFER_FASTEST, workspace_limit=None,
                                   dtype=np.float32, format=None):
    """The pre-v7 query (cudnnGetConvolutionBackwardFilterAlgorithm): the _v7 ranking re-ordered by
    ``preference``."""
    return _by_preference(get_convolution_backward_filter_algorithm_v7(
        handle, x_shape, dy_shape, conv_desc, w_shape, dtype=dtype, format=format), preference, workspace_limit)


get_convolution_forward_algorithm = deprecated_alias(
    "get_convolution_forward_algorithm", get_convolution_forward_algorithm_v7, since="0.1",
    adapter=_forward_by_preference)
get_convolution_backward_data_algorithm = deprecated_alias(
    "get_convolution_backward_data_algorithm", get_convolution_backward_data_algorithm_v7, since="0.1",
    adapter=_backward_data_by_preference)
get_convolution_backward_filter_algorithm = deprecated_alias(
    "get_convolution_backward_filter_algorithm", get_convolution_backward_filter_algorithm_v7, since="0.1",
    adapter=_backward_filter_by_preference)


def _find(registry, handle, p, conv_desc, a, b, repeats):
    tf32 = handle.allows_tf32(p.dtype, conv_desc.math_type)
    with handle.activate():
        return registry.find(p, handle, _math_type(handle, p, conv_desc), lambda alg: _run(alg, p, a, b, tf32),
                             repeats)


def find_convolution_forward_algorithm(handle, x, w, conv_desc, format=None, repeats=3):
    """Run and time every usable forward algorithm on these arrays (cuDNN's cudnnFindConvolutionForwardAlgorithm):
    a list of AlgoPerf sorted by time in ms (median of ``repeats`` after a warm-up), unusable ones last."""
    handle, p, fmt = _prepare("find_convolution_forward_algorithm", handle, conv_desc, format, _forward_problem,
                              ("x", x), ("w", w), None)
    return _find(FORWARD_ALGORITHMS, handle, p, conv_desc, to_channels_first(x, fmt), _flip(w, conv_desc), repeats)


def find_convolution_backward_data_algorithm(handle, w, dy, conv_desc, x_shape, format=None, repeats=3):
    """Like find_convolution_forward_algorithm, for convolution_backward_data."""
    handle, p, fmt = _prepare("find_convolution_backward_data_algorithm", handle, conv_desc, format,
                              _backward_data_problem, ("w", w), ("dy", dy), x_shape)
    return _find(BACKWARD_DATA_ALGORITHMS, handle, p, conv_desc, _flip(w, conv_desc), to_channels_first(dy, fmt),
                 repeats)


def find_convolution_backward_filter_algorithm(handle, x, dy, conv_desc, w_shape, format=None, repeats=3):
    """Like find_convolution_forward_algorithm, for convolution_backward_filter."""
    handle, p, fmt = _prepare("find_convolution_backward_filter_algorithm", handle, conv_desc, format,
                              _backward_filter_problem, ("x", x), ("dy", dy), w_shape)
    return _find(BACKWARD_FILTER_ALGORITHMS, handle, p, conv_desc, to_channels_first(x, fmt),
                 to_channels_first(dy, fmt), repeats)


def _workspace(registry, where, p, algo):
    algorithm = registry.get(algo)
    reason = algorithm.unsupported_reason(p)
    if reason is not None:
        raise NotSupportedError(f"{where}: {algorithm.algo} cannot run {p.describe()}: {reason}")
    return algorithm.workspace_size(p)


def get_convolution_forward_workspace_size(handle, x_shape, w_shape, conv_desc, algo, dtype=np.float32,
                                           format=None):
    """Bytes of scratch memory ``algo`` needs beyond x, w and y (NotSupportedError if it cannot run)."""
    where = "get_convolution_forward_workspace_size"
    p = _forward_problem(where, x_shape, w_shape, conv_desc, None, dtype, _format(format))
    return _workspace(FORWARD_ALGORITHMS, where, p, algo)


def get_convolution_backward_data_workspace_size(handle, w_shape, dy_shape, conv_desc, x_shape, algo,
                                                 dtype=np.float32, format=None):
    """Bytes of scratch memory backward-data ``algo`` needs beyond w, dy and dx for this problem
    (cudnnGetConvolutionBackwardDataWorkspaceSize; shapes as given to convolution_backward_data, ``format`` NCHW or
    NHWC); NotSupportedError if the algorithm cannot run it."""
    where = "get_convolution_backward_data_workspace_size"
    p = _backward_data_problem(where, w_shape, dy_shape, conv_desc, x_shape, dtype, _format(format))
    return _workspace(BACKWARD_DATA_ALGORITHMS, where, p, algo)


def get_convolution_backward_filter_workspace_size(handle, x_shape, dy_shape, conv_desc, w_shape, algo,
                                                   dtype=np.float32, format=None):
    """Bytes of scratch memory backward-filter ``algo`` needs beyond x, dy and dw for this problem
    (cudnnGetConvolutionBackwardFilterWorkspaceSize; shapes as given to convolution_backward_filter, ``format`` NCHW or
    NHWC); NotSupportedError if the algorithm cannot run it."""
    where = "get_convolution_backward_filter_workspace_size"
    p = _backward_filter_problem(where, x_shape, dy_shape, conv_desc, w_shape, dtype, _format(format))
    return _workspace(BACKWARD_FILTER_ALGORITHMS, where, p, algo)


def get_convolution_algorithm_cache() -> dict:
    """What handle.benchmark chose so far: {key: AlgoPerf}.  A key is (direction, problem, format,
    math type, deterministic, workspace_limit, device); the problem holds shapes, dtype and descriptor."""
    entries = {}
    for registry in _REGISTRIES:
        entries.update(registry.cache.snapshot())
    return entries


def clear_convolution_algorithm_cache(persistent: bool = False) -> None:
    """Forget every benchmark choice and heuristic choice (and reset the hit/miss counters) and the autotune
    report.  The on-disk autotune cache is read again at the next benchmark miss, as a new process would;
    ``persistent=True`` deletes its files too (autotune.clear_autotune_cache_files), so everything is timed again."""
    for registry in _REGISTRIES:
        registry.cache.clear()
        registry._heuristic_choice.clear()
    _PLANS.clear()
    _GENERATION[0] += 1
    _autotune.forget(persistent)


def convolution_algorithm_cache_info() -> dict:
    """{direction: (hits, misses, entries)} of the benchmark cache."""
    return {r.name: (r.cache.hits, r.cache.misses, len(r.cache)) for r in _REGISTRIES}
