"""``minidnn.nn.parallel``: DistributedDataParallel (PyTorch's name; ``DDP`` for short)."""
from .distributed import DistributedDataParallel  # noqa: F401

DDP = DistributedDataParallel

__all__ = ["DistributedDataParallel", "DDP"]
