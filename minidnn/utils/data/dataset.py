"""``torch.utils.data.dataset``'s path: the datasets of ``minidnn.data.dataset``."""
from ...data.dataset import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split  # noqa: F401

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "random_split"]
