"""Data loading: map-style datasets, samplers, a DataLoader (worker processes, pinned memory, a batched fast
path, prefetch, exact mid-epoch resume), vectorised transforms, and real datasets (digits, MNIST,
Fashion-MNIST, CIFAR-10).  ``minidnn.utils.data`` is the same package under PyTorch's path.  See docs/data.md."""
from . import datasets, transforms  # noqa: F401
from ._worker import WorkerInfo  # noqa: F401
from .collate import default_collate, default_convert  # noqa: F401
from .dataloader import DataLoader, get_worker_info  # noqa: F401
from .dataset import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split  # noqa: F401
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler  # noqa: F401

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "random_split", "DataLoader",
           "default_collate", "default_convert", "get_worker_info", "WorkerInfo", "Sampler", "SequentialSampler",
           "RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler", "transforms",
           "datasets"]

import importlib.util as _importlib_util  # noqa: E402

if _importlib_util.find_spec(__name__ + ".distributed") is not None:     # DistributedSampler, once it is written
    from .distributed import DistributedSampler  # noqa: F401,E402
    __all__.append("DistributedSampler")
