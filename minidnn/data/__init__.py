"""Data loading: map-style datasets, a DataLoader with a batched fast path and prefetch, vectorised
transforms, and real datasets (digits, MNIST, Fashion-MNIST, CIFAR-10).  See docs/data.md."""
from . import datasets, transforms                                         # noqa: F401
from .collate import default_collate                                       # noqa: F401
from .dataloader import DataLoader                                         # noqa: F401
from .dataset import Dataset, Subset, TensorDataset, random_split          # noqa: F401

__all__ = ["Dataset", "TensorDataset", "Subset", "random_split", "DataLoader", "default_collate", "transforms",
           "datasets"]
