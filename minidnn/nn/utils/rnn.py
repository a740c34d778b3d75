"""PyTorch's variable-length sequence helpers: PackedSequence, pack_padded_sequence, pad_packed_sequence,
pad_sequence, pack_sequence (the recurrent layers accept a PackedSequence).

Packed layout (time-major): ``data`` (sum(lengths), *) holds, for t = 0, 1, ..., the step-t rows of the
sequences still running at t, longest sequence first; ``batch_sizes[t]`` counts them (an int64 CPU tensor).
``sorted_indices`` orders the original batch by decreasing length; ``unsorted_indices`` undoes it.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from ...autograd import Function
from ...backend.errors import ArgumentError
from ...creation import tensor as _tensor
from ...ops import cat, stack
from ...tensor import Tensor

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence", "pack_sequence",
           "unpack_sequence"]


class PackedSequence(namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])):
    """(data, batch_sizes, sorted_indices, unsorted_indices), as PyTorch's."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = _tensor(np.argsort(_ints(sorted_indices)))
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        return self._replace(data=self.data.to(*args, **kwargs))

    @property
    def is_cuda(self):
        return self.data.is_cuda

    def is_pinned(self):
        return False


def _ints(x):
    if isinstance(x, Tensor):
        return np.asarray(x.cpu().numpy()).astype(np.int64)
    return np.asarray(x, dtype=np.int64)


class _SplitRows(Function):
    """x (R, ...) -> consecutive row blocks of the given sizes; backward concatenates the block gradients."""

    @staticmethod
    def forward(ctx, x, sizes):
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return tuple(Tensor._from_array(x.data[a:b]) for a, b in zip(offsets[:-1], offsets[1:]))

    @staticmethod
    def backward(ctx, *grads):
        return cat(list(grads), 0), None      # Tensor ops: differentiable again under create_graph


def split_rows(x, sizes):
    """Differentiable split of x's rows into blocks of ``sizes`` (one gradient concatenation in backward)."""
    sizes = [int(s) for s in sizes]
    if x.requires_grad:
        out = _SplitRows.apply(x, sizes)
        return list(out) if isinstance(out, tuple) else [out]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [x[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:])]


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    """Pack a padded batch (T, B, *) (or (B, T, *) with batch_first) of sequences of the given lengths."""
    lengths = _ints(lengths)
    if lengths.ndim != 1:
        raise ArgumentError(f"pack_padded_sequence: lengths must be 1-D, got shape {lengths.shape}")
    B = input.shape[0] if batch_first else input.shape[1]
    if lengths.size != B:
        raise ArgumentError(f"pack_padded_sequence: {lengths.size} lengths for a batch of {B} (input "
                            f"{tuple(input.shape)}, batch_first={batch_first})")
    if lengths.size and lengths.min() <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' that "
                           "is <= 0")
    T = input.shape[1] if batch_first else input.shape[0]
    if lengths.size and lengths.max() > T:
        raise RuntimeError(f"pack_padded_sequence: a length of {lengths.max()} exceeds the padded length {T}")
    if enforce_sorted:
        if (np.diff(lengths) > 0).any():
            raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
                               "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence "
                               "to sidestep this requirement if you do not need ONNX exportability.")
        sorted_indices = None
        order = np.arange(B)
    else:
        order = np.argsort(-lengths, kind="stable")
        sorted_indices = _tensor(order)
    if batch_first:
        input = input.transpose(0, 1)
    lens = lengths[order]
    steps = int(lens[0]) if lens.size else 0
    batch_sizes = np.array([(lens > t).sum() for t in range(steps)], dtype=np.int64)
    x = input[:, order] if sorted_indices is not None else input
    rows = [x[t, :int(bs)] for t, bs in enumerate(batch_sizes)]
    data = cat(rows, 0)
    return PackedSequence(data, _tensor(batch_sizes), sorted_indices,
                          None if sorted_indices is None else _tensor(np.argsort(order)))


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """The inverse of pack_padded_sequence: (padded (T, B, *) or (B, T, *), lengths int64 tensor)."""
    data, batch_sizes = sequence.data, _ints(sequence.batch_sizes)
    T = len(batch_sizes)
    B = int(batch_sizes[0]) if T else 0
    if total_length is not None:
        if total_length < T:
            raise ValueError(f"Expected total_length to be at least the length of the longest sequence in input, "
                             f"but got total_length={total_length} and max sequence length being {T}")
        T_out = int(total_length)
    else:
        T_out = T
    blocks = split_rows(data, batch_sizes)
    from ...creation import full
    steps = []
    tail = tuple(data.shape[1:])
    for t in range(T_out):
        bs = int(batch_sizes[t]) if t < T else 0
        fill = full((B - bs,) + tail, padding_value, dtype=data.dtype, device=data.device)
        steps.append(cat([blocks[t], fill], 0) if bs and bs < B else (blocks[t] if bs else fill))
    padded = stack(steps, 0)                                            # (T, B, *), sorted order
    lengths = np.array([(batch_sizes > b).sum() for b in range(B)], dtype=np.int64)
    if sequence.unsorted_indices is not None:
        unsorted = _ints(sequence.unsorted_indices)
        padded = padded[:, unsorted]
        lengths = lengths[unsorted]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, _tensor(lengths)


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """Stack sequences of shapes (L_i, *) into (L_max, B, *) (or (B, L_max, *)), padding with padding_value."""
    from ...creation import full
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    sequences = list(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    L = max(s.shape[0] for s in sequences)
    rows = []
    for s in sequences:
        n = L - s.shape[0]
        if n:
            fill = full((n,) + tuple(s.shape[1:]), padding_value, dtype=s.dtype, device=s.device)
            s = cat([s, fill] if padding_side == "right" else [fill, s], 0)
        rows.append(s)
    return stack(rows, 0 if batch_first else 1)


def pack_sequence(sequences, enforce_sorted=True):
    """pack_padded_sequence(pad_sequence(sequences), lengths)."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences):
    """The list of sequences a PackedSequence holds, in the original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return [padded[i, :int(n)] for i, n in enumerate(_ints(lengths))]
