"""A Tensor's ways out of the graph and into the rest of Python: NumPy arrays, Python numbers and lists, DLPack
capsules, iteration and its printed form; its memory layout (``contiguous``) and ``copy_`` across devices; and the
argument parsing of ``to()``, which Module.to shares.

None of this is the engine: these are conveniences over the array (or, for ``contiguous`` and ``copy_``, over the
differentiable ops), so they live above tensor.py, and ops/__init__.py binds the names in ``__all__`` to Tensor as
methods of the same name, beside every other method.
"""
from __future__ import annotations

import numpy as np

from . import _dlpack, _dtypes
from . import _memory_format as _mf
from ._dtypes import _looks_like_dtype
from .autograd import _state
from .backend import devices as _dev
from .backend.errors import DTypeError
from .tensor import Tensor

__all__ = ["numpy", "__array__", "item", "tolist", "__float__", "__int__", "__bool__", "__index__", "__dlpack__",
           "__dlpack_device__", "__iter__", "__repr__", "__reduce_ex__", "contiguous", "is_contiguous", "stride",
           "copy_", "data_ptr"]


# -- to NumPy, Python numbers and lists, DLPack ---------------------------------------------------------------------
def numpy(self):
    """A host NumPy array (a copy for cuda tensors; shares memory for cpu tensors, as in PyTorch)."""
    return self.data.get() if _dev.is_cuda_array(self.data) else self.data


def __array__(self, dtype=None, copy=None):
    a = self.numpy()
    return a.astype(dtype) if dtype is not None else a


def item(self):
    if self.data.size != 1:
        raise RuntimeError(f"item(): a Tensor with {self.data.size} elements cannot be converted to a Python "
                           "number")
    return self.data.reshape(()).item()


def tolist(self):
    return self.numpy().tolist()


def __float__(self):
    return float(self.item())


def __int__(self):
    return int(self.item())


def __bool__(self):
    if self.data.size != 1:
        raise RuntimeError(f"the truth value of a tensor with {self.data.size} elements is ambiguous")
    return bool(self.item())


def __index__(self):
    if self.data.dtype.kind not in "iub" or self.data.size != 1:
        raise DTypeError("only integer tensors of a single element can be converted to an index")
    return int(self.item())


def __dlpack__(self, stream=None, **kwargs):
    if _dlpack.is_bfloat16(self.data.dtype) and self.device.type == "cpu":
        return _dlpack.to_capsule(self.data)        # NumPy's DLPack has no bfloat16 code
    return self.data.__dlpack__(stream=stream, **kwargs) if stream is not None else self.data.__dlpack__(**kwargs)


def __dlpack_device__(self):
    return self.data.__dlpack_device__()


def __iter__(self):
    if self.ndim == 0:
        raise DTypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))


# -- printing and (no) pickling -------------------------------------------------------------------------------------
def __repr__(self):
    body = np.array2string(self.numpy(), separator=", ", prefix="tensor(", precision=4, threshold=200)
    extras = []
    if self.device.type != "cpu":
        extras.append(f"device='{self.device}'")
    if self.data.dtype not in (_dtypes.get_default_dtype(), np.dtype(np.int64), np.dtype(np.bool_)):
        extras.append(f"dtype={self.data.dtype}")
    if self.grad_fn is not None:
        extras.append(f"grad_fn=<{self.grad_fn.name()}>")
    elif self.requires_grad:
        extras.append("requires_grad=True")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"


def __reduce_ex__(self, protocol):
    raise DTypeError("minidnn tensors are not pickled: use minidnn.save (a safe format) or .numpy()")


# -- memory layout, copies across devices, to()'s arguments ---------------------------------------------------------
def contiguous(self, memory_format=_mf.contiguous_format):
    """This tensor if its memory is laid out as ``memory_format`` already, else a (differentiable) copy that is."""
    if _mf.is_in(self.data, memory_format, "contiguous"):
        return self
    out = self.clone()
    out.data = _mf.relayout(out.data, memory_format, "contiguous")
    return out


def is_contiguous(self, memory_format=_mf.contiguous_format):
    """Whether the memory is laid out as ``memory_format`` (row-major by default; channels_last: NHWC order)."""
    return _mf.is_in(self.data, memory_format)


def stride(self, dim=None):
    """The step in elements between neighbours along each axis (a tuple), or along ``dim`` (an int; negative counts
    from the end), as PyTorch's ``Tensor.stride``: (C*H*W, H*W, W, 1) for a contiguous (N, C, H, W) tensor,
    (H*W*C, 1, W*C, C) channels-last, 0 along a broadcast axis."""
    item = self.data.itemsize
    strides = tuple(s // item for s in self.data.strides)
    if dim is None:
        return strides
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"stride(): dim must be an int, got {type(dim).__name__}")
    if not -len(strides) <= dim < max(len(strides), 1) or not strides:
        raise IndexError(f"stride(): dimension {dim} out of range for a {len(strides)}-D tensor of shape "
                         f"{tuple(self.data.shape)}")
    return strides[dim]


def data_ptr(self):
    """The address of the tensor's first element (an int; 0 for an empty tensor), as PyTorch's ``Tensor.data_ptr``:
    views share their base's memory at an offset, and two tensors with equal pointers and layouts alias."""
    a = self.data
    if a.size == 0:
        return 0
    return int(a.data.ptr) if _dev.is_cuda_array(a) else int(a.__array_interface__["data"][0])


def copy_(self, src):
    """Copy ``src`` (broadcast) into this tensor in place; crossing devices is explicit here."""
    if self._check_inplace("copy_") or (isinstance(src, Tensor) and src.requires_grad and _state.grad_enabled):
        return self._inplace("copy_", lambda a, b: b.to(device=a.device).broadcast_to(a.shape).clone(), src)
    s = src.data if isinstance(src, Tensor) else src
    s = _dev.to_device(s, self.device)
    self.data[...] = s
    self._version += 1
    return self


def parse_to_args(args, device=None, dtype=None):
    """The (device, dtype) that ``to(*args)`` asks for: a device, a dtype, both, or another tensor's.
    Shared by Tensor.to and Module.to."""
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif _looks_like_dtype(a):
            dtype = a
        else:
            device = a
    return device, dtype
