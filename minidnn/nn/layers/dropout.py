"""Dropout layers: active in training mode only (``module.train()`` / ``module.eval()``)."""
from __future__ import annotations

from ...backend.errors import ArgumentError
from .. import functional as F
from ..module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d"]


class Dropout(Module):
    """Zero elements with probability p during training, scaling the others by 1/(1-p); identity in eval."""
    _fn = staticmethod(F.dropout)

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return self._fn(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    """Zero whole channels of (N, C, L)."""
    _fn = staticmethod(F.dropout1d)


class Dropout2d(Dropout):
    """Zero whole channels of (N, C, H, W)."""
    _fn = staticmethod(F.dropout2d)


class Dropout3d(Dropout):
    _fn = staticmethod(F.dropout3d)
