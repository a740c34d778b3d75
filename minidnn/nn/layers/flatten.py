"""Flatten and Unflatten: reshapes as layers (for Sequential models)."""
from __future__ import annotations

from ..module import Module

__all__ = ["Flatten", "Unflatten"]


class Flatten(Module):
    """Merge dims ``start_dim..end_dim`` into one (default: everything but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size`` (one entry may be -1)."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim = dim
        self.unflattened_size = tuple(unflattened_size)

    def forward(self, x):
        dim = self.dim % x.ndim if x.ndim else self.dim
        shape = tuple(x.shape)
        size = self.unflattened_size
        known = 1
        for s in size:
            known *= s if s != -1 else 1
        fits = shape[dim] % known == 0 if -1 in size else shape[dim] == known
        if not fits:
            raise RuntimeError(f"Unflatten: dim {self.dim} of the input (shape {shape}) has size {shape[dim]}, which "
                               f"cannot be split into {size}")
        return x.reshape(shape[:dim] + size + shape[dim + 1:])

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
