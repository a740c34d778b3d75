"""``Parameter``: a leaf Tensor that a Module registers as learnable."""
from __future__ import annotations

from ..tensor import Tensor, _make_array

__all__ = ["Parameter", "Buffer"]


class Parameter(Tensor):
    """A Tensor that requires grad by default and is registered when assigned to a Module attribute."""

    __slots__ = ()

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = []
        # A Parameter shares storage with the tensor it wraps, as in PyTorch (no copy).
        self._adopt(data.data if isinstance(data, Tensor) else _make_array(data, None, None), requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    _wrap_like = Tensor.__dict__["_wrap_like"]      # Tensor's staticmethod: a plain Tensor around the array, in one
    #                                                 frame (AccumulateGrad keeps a slot's gradient as is for it)


class Buffer(Tensor):
    """Marks a tensor as a Module buffer when assigned as an attribute (PyTorch 2.5's nn.Buffer)."""

    __slots__ = ("persistent",)

    def __init__(self, data, persistent=True):
        self._adopt(data.data if isinstance(data, Tensor) else _make_array(data, None, None))
        self.persistent = persistent
