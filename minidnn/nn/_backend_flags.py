"""Process-wide backend settings, like ``torch.backends.cudnn``::

    from minidnn.nn._backend_flags import cudnn      # the lead may expose it as minidnn.backends.cudnn
    cudnn.benchmark = True        # time the convolution algorithms once per shape, cache the winner
    cudnn.deterministic = True    # only algorithms whose result does not depend on execution order
    cudnn.allow_tf32 = True       # MathType.TENSOR_OP on the GPU (TF32 for float32); no effect on the CPU

The functional ops use each thread's default handle (``backend.resolve_handle``); a flag that has
been set is copied onto that handle at every op, so a change takes effect at the next op on every
thread.  A flag left at None leaves the handle's own setting alone (so code that configures
``backend.get_default_handle()`` directly keeps working); a handle passed explicitly to a backend
primitive is never touched.
"""
from __future__ import annotations

from ..backend import MathType

__all__ = ["cudnn", "configure"]


class _CudnnFlags:
    __slots__ = ("benchmark", "deterministic", "allow_tf32")

    def __init__(self):
        self.benchmark = None          # None: not set, the handle's own value stands
        self.deterministic = None
        self.allow_tf32 = None

    def __repr__(self):
        return (f"cudnn(benchmark={self.benchmark}, deterministic={self.deterministic}, "
                f"allow_tf32={self.allow_tf32})")


cudnn = _CudnnFlags()


def configure(handle):
    """Apply the flags that were set to a default handle (cheap attribute writes) and return it."""
    if cudnn.benchmark is not None:
        handle.benchmark = bool(cudnn.benchmark)
    if cudnn.deterministic is not None:
        handle.deterministic = bool(cudnn.deterministic)
    if cudnn.allow_tf32 is not None:
        handle.math_type = MathType.TENSOR_OP if cudnn.allow_tf32 else MathType.DEFAULT
    return handle
