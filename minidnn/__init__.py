"""minidnn: a minimal deep learning framework with its own reverse-mode autograd.

    import minidnn as mdn
    x = mdn.randn(3, 4, requires_grad=True)
    (x * x).sum().backward()
"""
from __future__ import annotations

import numpy as _np

__version__ = "0.1.0"

from ._threads import set_num_threads, get_num_threads, _apply_default as _apply_thread_default  # noqa: E402
_apply_thread_default()                     # BLAS/OpenMP threads: half the CPUs unless the user chose (docs/threads.md)
from . import backend                       # noqa: E402,F401
from . import autograd                      # noqa: E402,F401
from .autograd import enable_grad, inference_mode, no_grad, set_grad_enabled, is_grad_enabled  # noqa: E402,F401
from .tensor import *                       # noqa: E402,F401,F403
from .tensor import Tensor                  # noqa: E402,F401
from . import ops as _ops                   # noqa: E402  (binds the Tensor methods)
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
from . import models                        # noqa: E402,F401
from . import backends                      # noqa: E402,F401
from . import amp                           # noqa: E402,F401
from .amp import autocast                   # noqa: E402,F401
from .compile import compile               # noqa: E402,F401
