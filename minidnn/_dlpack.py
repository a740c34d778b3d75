"""DLPack exchange for bfloat16 CPU arrays, which NumPy's own DLPack support cannot express (it has no bfloat16
type code).  Everything else goes through NumPy's / CuPy's ``__dlpack__`` and ``from_dlpack``.

The structures are DLPack's (dlpack.h, the "dltensor" capsule protocol):

    DLManagedTensor { DLTensor dl_tensor; void* manager_ctx; void (*deleter)(DLManagedTensor*); }
    DLTensor        { void* data; DLDevice device; int32 ndim; DLDataType dtype; int64* shape; int64* strides;
                      uint64 byte_offset; }

Export keeps the array (and the shape/strides buffers) alive in a registry until the consumer calls the deleter;
import wraps the producer's memory in a NumPy array whose lifetime ends by calling the producer's deleter.
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np

__all__ = ["is_bfloat16", "to_capsule", "from_capsule", "capsule_is_bfloat16", "KDL_BFLOAT"]

KDL_CPU = 1
KDL_BFLOAT = 4


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)     # the raw PyObject*: it is being freed
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# The same two calls on a raw PyObject* (inside the capsule destructor no new reference may be taken).
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_GetPointerRaw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

_alive: dict = {}            # address of an exported DLManagedTensor -> what must outlive the consumer


def is_bfloat16(dtype) -> bool:
    return dtype.kind == "V" and dtype.name == "bfloat16"


@_DELETER
def _delete(managed_ptr):
    _alive.pop(ctypes.addressof(managed_ptr.contents), None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # An unconsumed capsule still owns its tensor; a consumer renames it "used_dltensor" and calls the deleter.
    if _IsValidRaw(capsule, b"dltensor"):
        _alive.pop(_GetPointerRaw(capsule, b"dltensor"), None)


def to_capsule(arr):
    """A "dltensor" capsule viewing the CPU bfloat16 array ``arr`` (no copy)."""
    managed = _Managed()
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    strides = (ctypes.c_int64 * max(arr.ndim, 1))(*(s // arr.itemsize for s in arr.strides))
    t = managed.dl_tensor
    t.data = arr.ctypes.data
    t.device = _Device(KDL_CPU, 0)
    t.ndim = arr.ndim
    t.dtype = _DataType(KDL_BFLOAT, 16, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    _alive[address] = (managed, shape, strides, arr)
    return _api.PyCapsule_New(address, b"dltensor", _capsule_destructor)


def capsule_is_bfloat16(capsule) -> bool:
    """Whether an unconsumed "dltensor" capsule holds bfloat16 data (read without consuming it)."""
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        return False
    t = _Managed.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    return (t.dtype.code, t.dtype.bits) == (KDL_BFLOAT, 16)


def from_capsule(capsule, bfloat16):
    """A NumPy bfloat16 array over the memory of a CPU bfloat16 "dltensor" capsule (no copy)."""
    address = _api.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = _Managed.from_address(address)
    t = managed.dl_tensor
    if t.device.device_type != KDL_CPU or (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (KDL_BFLOAT, 16, 1):
        raise BufferError("from_dlpack: only CPU bfloat16 tensors take this path")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = 2
    if t.strides:
        strides = tuple(t.strides[i] * itemsize for i in range(t.ndim))
    else:
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * itemsize for i in range(t.ndim))
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) // itemsize if all(shape) else 0
    raw = (ctypes.c_uint16 * max(span, 1)).from_address(t.data + t.byte_offset)
    base = np.frombuffer(raw, dtype=np.uint16, count=span)
    _api.PyCapsule_SetName(capsule, b"used_dltensor")
    deleter = managed.deleter
    weakref.finalize(raw, lambda: deleter(ctypes.pointer(managed)) if deleter else None)
    arr = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides) if span else np.zeros(shape, np.uint16)
    return arr.view(bfloat16)
