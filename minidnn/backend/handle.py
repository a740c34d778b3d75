"""The handle: one device, one stream, and the settings every primitive reads.

Like ``cudnnHandle_t`` it is passed first to every primitive.  Where none is passed, the
primitive uses the calling thread's default handle for the device its arrays live on.
"""
from __future__ import annotations

import contextlib
import os
import threading

import numpy as np

from . import devices as _dev
from .devices import is_floating as _is_floating
from .errors import BadParamError, IdentityEnum

__all__ = ["MathType", "Handle", "get_default_handle", "resolve_handle", "create", "destroy", "cudnn",
           "configured_default_handle"]


class MathType(IdentityEnum):
    """Whether tensor cores may be used (cuDNN's cudnnMathType_t).

    DEFAULT      strict fp32: float32 data is computed in float32 (no TF32).
    TENSOR_OP    tensor cores allowed: TF32 for float32 matrix products on the GPU, fp16/bf16 inputs as given.
    TENSOR_OP_ALLOW_CONVERSION   like TENSOR_OP, and float32 data may be down-converted for tensor cores.
    FMA          plain FMA math, never tensor cores (same as DEFAULT here).
    On the CPU every mode falls back to DEFAULT: NumPy has no reduced-precision matrix units.
    """
    DEFAULT = "default"
    TENSOR_OP = "tensor_op"
    TENSOR_OP_ALLOW_CONVERSION = "tensor_op_allow_conversion"
    FMA = "fma"


class Handle:
    """``Handle(device="cpu"|"cuda:N", stream=None)`` plus the settings:

    math_type        MathType.DEFAULT (strict fp32) or a tensor-core mode; see ``effective_math_type``.
    deterministic    only algorithms whose results do not depend on execution order.
    benchmark        time every supported convolution algorithm once per configuration and cache the winner.
    workspace_limit  bytes of scratch memory an algorithm may use (None: no limit).
    """

    def __init__(self, device=None, stream=None, math_type=MathType.DEFAULT, deterministic=False,
                 benchmark=False, workspace_limit=None):
        self.device = _dev.device(device)
        self.xp = self.device.xp
        if stream is not None and self.device.type == "cpu":
            raise BadParamError("Handle: a stream was given for device 'cpu'; streams exist only on CUDA devices")
        self.stream = stream
        self.math_type = MathType(math_type)
        self.deterministic = bool(deterministic)
        self.benchmark = bool(benchmark)
        if workspace_limit is not None and workspace_limit < 0:
            raise BadParamError(f"Handle: workspace_limit must be >= 0 bytes or None, got {workspace_limit}")
        self.workspace_limit = workspace_limit
        # activate() where nothing needs switching (the CPU; a CUDA handle whose device is current and which has no
        # stream of its own): ``with h.activate() as h``
        self._cpu_context = contextlib.nullcontext(self)

    def __repr__(self):
        return (f"Handle(device='{self.device}', math_type={self.math_type.name}, deterministic={self.deterministic}, "
                f"benchmark={self.benchmark}, workspace_limit={self.workspace_limit})")

    def effective_math_type(self, dtype=np.float32, math_type=None) -> MathType:
        """The math type actually used for ``dtype``: tensor-core modes fall back to DEFAULT on the CPU,
        and for dtypes other than float32/float16/bfloat16 (float64 is always computed in float64)."""
        mt = MathType(math_type) if math_type is not None else self.math_type
        if self.device.type == "cpu" or mt in (MathType.DEFAULT, MathType.FMA):
            return MathType.DEFAULT
        if not _is_floating(np.dtype(dtype)) or np.dtype(dtype).itemsize == 8:
            return MathType.DEFAULT
        return mt

    def allows_tf32(self, dtype=np.float32, math_type=None) -> bool:
        return (np.dtype(dtype) == np.float32
                and self.effective_math_type(dtype, math_type) is not MathType.DEFAULT)

    def activate(self):
        """Make this handle's device and stream current inside the block (a context manager; on the CPU a shared
        one that does nothing, so the primitives' hot path does not build a generator per call)."""
        if self.device.type == "cpu":
            return self._cpu_context
        if self.stream is None and self.xp.cuda.runtime.getDevice() == self.device.index:
            return self._cpu_context      # already current (the common case): nothing to switch, no generator
        return self._activate_cuda()

    @contextlib.contextmanager
    def _activate_cuda(self):
        with self.xp.cuda.Device(self.device.index):
            if self.stream is None:
                yield self
            else:
                with self.stream:
                    yield self

    def synchronize(self):
        if self.device.type == "cuda":
            with self.xp.cuda.Device(self.device.index):
                (self.stream or self.xp.cuda.get_current_stream()).synchronize()

    def check_arrays(self, where: str, **arrays):
        """Raise if any named array does not live on this handle's device."""
        dev = self.device
        for name, a in arrays.items():
            if a is None:
                continue
            d = _dev.device_of(a)
            if d is not dev and d != dev:
                raise _dev.DeviceMismatchError(
                    f"{where}: {name} is on device '{d}' but the handle is on '{self.device}'")


class _Handles(threading.local):
    def __init__(self):
        self.by_device = {}         # Device -> this thread's default Handle
        self.by_gpu = {}            # GPU number -> the same Handles as by_device's cuda devices (BY_GPU)


# Host round 31: configured_default_handle finds a CuPy array's handle by the GPU number its memory pointer holds
# (``by_gpu``, filled with by_device), not through device_of's Device object and its Python __hash__ (nn's handle_for:
# ~44 calls a ResNet-20 step, two frames each).  Switch: BY_GPU[0] = False (or MINIDNN_HANDLE_BY_GPU=0 at import).
BY_GPU = [os.environ.get("MINIDNN_HANDLE_BY_GPU", "1") != "0"]


_local = _Handles()


def get_default_handle(device=None) -> Handle:
    """The calling thread's default handle for ``device`` (created on first use)."""
    dev = device if type(device) is _dev.Device else _dev.device(device) if device is not None else _dev.CPU
    h = _local.by_device.get(dev)
    if h is None:
        h = _local.by_device[dev] = Handle(dev)
        if dev.type == "cuda" and dev.index is not None:
            _local.by_gpu[dev.index] = h
    return h


def resolve_handle(handle, *arrays) -> Handle:
    """``handle`` itself, or the default handle for the device of the first array given."""
    if handle is not None:
        return handle
    for a in arrays:
        if a is not None and hasattr(a, "shape"):
            h = _local.by_device.get(_dev.device_of(a))     # the common case: one dict lookup, no further call
            return h if h is not None else get_default_handle(_dev.device_of(a))
    return get_default_handle()


def create(device=None, stream=None, **settings) -> Handle:
    """cuDNN's cudnnCreate: same as ``Handle(...)``."""
    return Handle(device, stream, **settings)


def destroy(handle: Handle) -> None:
    """cuDNN's cudnnDestroy: handles hold no resources beyond Python objects; kept for symmetry."""
    handle.stream = None


# -- process-wide settings, spelled as torch.backends.cudnn (minidnn.backends.cudnn is this object) ---------------
class _CudnnFlags:
    """``benchmark`` (time the convolution algorithms once per shape, cache the winner), ``deterministic`` (only
    algorithms whose result does not depend on execution order), ``allow_tf32`` (MathType.TENSOR_OP on the GPU:
    TF32 for float32; no effect on the CPU).  None means "not set": the handle's own value stands.
    ``fusion`` (default True): nn ops run the backend's fused GPU kernels where one exists (cross_entropy as one
    softmax-cross-entropy kernel each way); False runs the unfused composition, for debugging or comparison."""
    __slots__ = ("benchmark", "deterministic", "allow_tf32", "fusion")

    def __init__(self):
        self.benchmark = None
        self.deterministic = None
        self.allow_tf32 = None
        self.fusion = True

    def __repr__(self):
        return (f"cudnn(benchmark={self.benchmark}, deterministic={self.deterministic}, "
                f"allow_tf32={self.allow_tf32}, fusion={self.fusion})")


cudnn = _CudnnFlags()


def configured_default_handle(*arrays) -> Handle:
    """The calling thread's default handle for the arrays' device with the ``cudnn`` flags that were set copied
    onto it (cheap attribute writes, at every op, so a change reaches every thread's next op).  A handle passed
    explicitly to a primitive is never touched, and code configuring ``get_default_handle()`` directly keeps its
    settings for every flag left at None."""
    handle = None
    if len(arrays) == 1 and hasattr(arrays[0], "shape"):     # the common call (nn's handle_for): one array
        a, cp = arrays[0], _dev._cupy
        if cp is not None and type(a) is cp.ndarray and BY_GPU[0]:
            handle = _local.by_gpu.get(a.data.device_id)
        else:
            handle = _local.by_device.get(_dev.device_of(a))
    if handle is None:
        handle = resolve_handle(None, *arrays)
    if cudnn.benchmark is not None:
        handle.benchmark = bool(cudnn.benchmark)
    if cudnn.deterministic is not None:
        handle.deterministic = bool(cudnn.deterministic)
    if cudnn.allow_tf32 is not None:
        handle.math_type = MathType.TENSOR_OP if cudnn.allow_tf32 else MathType.DEFAULT
    return handle
