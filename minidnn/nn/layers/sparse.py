"""Embedding: a lookup table, ``weight[indices]``, differentiable through indexing."""
from __future__ import annotations

from ...autograd import no_grad
from ...backend.errors import ArgumentError, DimensionError, DTypeError
from ...creation import empty
from ...creation import tensor as _tensor
from ...tensor import Tensor
from .. import init
from ..module import Module
from ..parameter import Parameter

__all__ = ["Embedding"]


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) picked by integer indices of any shape.

    ``padding_idx``: that row starts at zero and never receives a gradient (it stays a fixed "pad" vector);
    ``max_norm``: looked-up rows whose ``norm_type`` norm exceeds it are renormalised in place first;
    ``scale_grad_by_freq``: each row's gradient is divided by its count in the batch (PyTorch's arguments, in
    PyTorch's order; ``sparse=True`` is refused: gradients are dense)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight=None, _freeze: bool = False, device=None, dtype=None):
        super().__init__()
        if sparse:
            raise ArgumentError("Embedding: sparse=True (sparse gradients) is not supported; gradients are dense")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, float(norm_type), bool(scale_grad_by_freq)
        self.sparse = False
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ArgumentError(f"padding_idx {padding_idx} must be within num_embeddings {num_embeddings}")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        if _weight is None:
            self.weight = Parameter(empty(num_embeddings, embedding_dim, device=device, dtype=dtype),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ArgumentError(f"Embedding: _weight has shape {tuple(_weight.shape)}, expected "
                                 f"{(num_embeddings, embedding_dim)}")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self):
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx: int | None = None,
                        max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = False):
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                   scale_grad_by_freq=scale_grad_by_freq, sparse=sparse, _weight=embeddings, _freeze=freeze)

    def forward(self, indices):
        if not isinstance(indices, Tensor):
            indices = _tensor(indices)
        if indices.dtype.kind not in "iu":
            raise DTypeError(f"Embedding: indices must be an integer tensor, got dtype {indices.dtype}")
        if indices.device.type == "cpu" and indices.numel():
            # PyTorch: IndexError on the CPU (a device-side assert on a GPU, where checking would need a host sync).
            lo, hi = int(indices.data.min()), int(indices.data.max())
            if lo < 0 or hi >= self.num_embeddings:
                bad = lo if lo < 0 else hi
                raise DimensionError(f"Embedding: index out of range in self: index {bad} for num_embeddings="
                                     f"{self.num_embeddings} (valid: 0 to {self.num_embeddings - 1})")
        if self.max_norm is not None or self.scale_grad_by_freq:
            from ..functional import embedding
            return embedding(indices, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                             self.scale_grad_by_freq)
        out = self.weight[indices]
        if self.padding_idx is not None and out.requires_grad:
            # Zero the output gradient where the index is the pad: the pad row then gets no gradient,
            # while the forward value is the row as stored (PyTorch's semantics).
            keep = (indices != self.padding_idx).astype(out.dtype).unsqueeze(-1)
            out.register_hook(lambda g: g * keep)
        return out

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2.0:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        return s
