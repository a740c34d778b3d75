"""minidnn: a minimal deep learning framework with its own reverse-mode autograd.

    import minidnn as mdn
    x = mdn.randn(3, 4, requires_grad=True)
    (x * x).sum().backward()
"""
from __future__ import annotations

# The import order below is the namespace's build order (later star imports override earlier names; the thread
# default is applied before the rest of the package loads), so the import sorter leaves this file alone:
# isort: skip_file

import numpy as _np

from .backend.versioning import __version__   # noqa: E402,F401  (written once, in pyproject.toml)

from .backend.threads import set_num_threads, get_num_threads, _apply_default as _apply_thread_default  # noqa: E402,E501
_apply_thread_default()                     # BLAS/OpenMP threads: half the CPUs unless the user chose (docs/threads.md)
from . import backend                       # noqa: E402,F401
from . import autograd                      # noqa: E402,F401
from .autograd import enable_grad, inference_mode, no_grad, set_grad_enabled, is_grad_enabled  # noqa: E402,F401
from .tensor import *                       # noqa: E402,F401,F403
from .creation import *                     # noqa: E402,F401,F403
from .tensor import Tensor                  # noqa: E402,F401
from . import gradcheck as _gradcheck       # noqa: E402  (numerical checks, above the engine; PyTorch spells them
for _name in ("gradcheck", "gradgradcheck", "GradcheckError"):        # torch.autograd.gradcheck: bound there)
    setattr(autograd, _name, getattr(_gradcheck, _name))
from . import _anomaly_mode                 # noqa: E402  (anomaly mode's switch, above the engine, which keeps the flag;
for _name in _anomaly_mode.__all__:         # PyTorch spells it torch.autograd.detect_anomaly: bound there too)
    setattr(autograd, _name, getattr(_anomaly_mode, _name))
del _name
from . import ops as _ops                   # noqa: E402,F401  (binds the Tensor methods)
from .ops import *                          # noqa: E402,F401,F403
from .ops import softmax, log_softmax       # noqa: E402,F401
from . import cuda                          # noqa: E402,F401
from . import random                        # noqa: E402,F401  (Generator, rng state; see minidnn/random.py)
from .random import (Generator, get_rng_state, set_rng_state, seed, initial_seed, randperm,  # noqa: E402,F401
                     multinomial)
default_generator = random.default_generator()      # the cpu Generator object, as torch.default_generator
Tensor.multinomial = lambda self, num_samples, replacement=False, *, generator=None: multinomial(
    self, num_samples, replacement, generator=generator)

# dtypes under PyTorch's names (NumPy dtype objects).
float16 = half = _np.dtype("float16")
import ml_dtypes as _ml_dtypes             # noqa: E402  (bfloat16 for NumPy and CuPy)
bfloat16 = _np.dtype(_ml_dtypes.bfloat16)
float32 = float = _np.dtype("float32")
float64 = double = _np.dtype("float64")
int8 = _np.dtype("int8")
uint8 = _np.dtype("uint8")
int16 = short = _np.dtype("int16")
int32 = int = _np.dtype("int32")
int64 = long = _np.dtype("int64")
bool = _np.dtype("bool")
complex64 = _np.dtype("complex64")

device = backend.device
from ._memory_format import (channels_last, channels_last_3d, contiguous_format, memory_format,  # noqa: E402,F401
                             preserve_format)
Device = backend.Device
from .serialization import save, load       # noqa: E402,F401
from .summary import summary                # noqa: E402,F401
from . import nn, viz                       # noqa: E402,F401
from . import data                           # noqa: E402,F401
from . import utils                          # noqa: E402,F401  (minidnn.utils.data: PyTorch's import path)
from . import optim                          # noqa: E402,F401
from . import distributions                  # noqa: E402,F401
from . import distributed                    # noqa: E402,F401  (process groups, launcher; docs/distributed.md)
from . import models                        # noqa: E402,F401
from . import backends                      # noqa: E402,F401
from . import amp                           # noqa: E402,F401
from .amp import autocast                   # noqa: E402,F401
from .compile import compile               # noqa: E402,F401


# -- the public namespace: exactly __all__ (dir(minidnn) shows nothing else; tests/test_namespace.py holds it) ------
_SUBMODULES = [
    "amp", "autograd", "backend", "backends", "cuda", "data", "distributed", "distributions", "models", "nn", "optim",
    "random", "serialization", "utils", "viz",
]
__all__ = _SUBMODULES + [
    "BoolTensor", "ByteTensor", "CharTensor", "Device", "DoubleTensor", "FloatTensor", "Generator", "HalfTensor",
    "IntTensor", "LongTensor", "ShortTensor", "Tensor", "abs", "add", "addcdiv", "addcmul", "all", "allclose",
    "amax", "amin", "any", "arange", "argmax", "argmin", "argsort", "as_tensor", "autocast", "bfloat16",
    "bitwise_not", "bmm", "bool", "broadcast_to", "cat", "ceil", "channels_last", "channels_last_3d", "chunk",
    "clamp", "clip", "clone", "compile", "complex64", "concatenate", "contiguous_format", "cos", "cumprod",
    "cumsum", "default_generator", "device", "diag", "div", "dot", "double", "einsum", "empty", "empty_like",
    "enable_grad", "eq", "exp", "expand", "expm1", "eye", "flatten", "flip", "float", "float16", "float32",
    "float64", "floor", "floor_divide", "fmod", "from_dlpack", "from_numpy", "full", "full_like", "gather", "ge",
    "get_default_dtype", "get_num_threads", "get_rng_state", "gt", "half", "index_put", "inference_mode",
    "initial_seed", "int", "int16", "int32", "int64", "int8", "is_grad_enabled", "is_tensor", "isclose", "isfinite",
    "isnan", "kthvalue", "le", "lerp", "linspace", "load", "log", "log1p", "log_softmax", "logical_not",
    "logsumexp", "long", "lt", "manual_seed", "masked_fill", "matmul", "max", "maximum", "mean", "median",
    "memory_format", "min", "minimum", "mm", "mode", "moveaxis", "movedim", "mul", "multinomial", "narrow", "ne",
    "neg", "no_grad", "norm", "ones", "ones_like", "outer", "pad", "permute", "pow", "preserve_format", "prod",
    "rand", "rand_like", "randint", "randn", "randn_like", "randperm", "reciprocal", "relu", "remainder", "repeat",
    "reshape", "return_types", "round", "rsub", "save", "scatter", "scatter_add", "seed", "select",
    "set_default_dtype", "set_grad_enabled", "set_num_threads", "set_rng_state", "short", "sigmoid", "sign", "sin",
    "softmax", "sort", "split", "sqrt", "square", "squeeze", "stack", "std", "sub", "sum", "summary", "swapaxes",
    "t", "take_along_dim", "tanh", "tensor", "tile", "topk", "transpose", "tril", "triu", "true_divide", "uint8",
    "unbind", "unsqueeze", "var", "where", "zeros", "zeros_like",
]
for _name in ("annotations", "elementwise", "gather_scatter", "getitem", "indexing", "legacy", "linalg", "reduction",
              "shape", "sorting", "scatter_into", "rdiv", "rpow", "floordiv", "astype", "sum_to", "to_tensor",
              "transfer", "ops"):
    globals().pop(_name, None)          # internals the star imports above brought in (minidnn._ops stays bound)
del _name


def __dir__():
    return sorted(__all__ + ["__version__"])
