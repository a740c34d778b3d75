"""Status and errors, after cuDNN's status codes.

Every primitive validates its arguments before any computation and raises one of these with a
message naming the offending shapes, dtypes or values and the rule they break.
"""
from __future__ import annotations

import enum

__all__ = ["Status", "ArgumentError", "DTypeError", "DimensionError", "BackendError", "BadParamError",
           "NotSupportedError", "check"]


class IdentityEnum(enum.Enum):
    """The backend's enums: members are singletons compared by identity, so they hash by identity too (C code)
    instead of Enum's ``hash(self._name_)`` in Python -- they key every plan and selector table (~450 hashes per
    ResNet-20 step, docs/host_overhead.md round 8)."""
    __hash__ = object.__hash__


class Status(IdentityEnum):
    """cudnnStatus_t: the status code a backend error carries (SUCCESS, BAD_PARAM, NOT_SUPPORTED)."""
    SUCCESS = 0
    BAD_PARAM = 3
    NOT_SUPPORTED = 9


class ArgumentError(RuntimeError, ValueError):
    """An argument breaks an op's rule (a shape, a size, a value).  PyTorch raises RuntimeError for these and
    Python code expects ValueError: minidnn's is both, so either ``except`` clause catches it."""


class DTypeError(TypeError, RuntimeError):
    """A dtype (or an argument's type) breaks an op's rule: a TypeError that is also the RuntimeError PyTorch
    raises for dtype mismatches."""


class DimensionError(IndexError, ArgumentError):
    """A dim or an index out of range: PyTorch's IndexError, also catchable as RuntimeError/ValueError."""


class BackendError(RuntimeError):
    """The base of the backend's errors (cuDNN's non-success statuses); ``status`` holds the Status of the concrete
    subclass."""
    status = None


class BadParamError(BackendError, ArgumentError):
    """An argument breaks a rule of the primitive (cuDNN's CUDNN_STATUS_BAD_PARAM)."""
    status = Status.BAD_PARAM


class NotSupportedError(BackendError):
    """Valid arguments that this algorithm or device does not implement (CUDNN_STATUS_NOT_SUPPORTED)."""
    status = Status.NOT_SUPPORTED


def check(condition: bool, message: str, error=BadParamError) -> None:
    """Raise ``error(message)`` unless ``condition`` holds."""
    if not condition:
        raise error(message)
