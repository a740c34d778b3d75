"""``minidnn.utils.data``: the path PyTorch scripts import from (``from torch.utils.data import DataLoader``).

Every name is ``minidnn.data``'s (the same objects); ``sampler``, ``dataset`` and ``dataloader`` are the
submodules PyTorch has under this path.
"""
from ...data import *  # noqa: F401,F403
from ...data import __all__ as _data_all
from ...data._worker import WorkerInfo, get_worker_info  # noqa: F401
from ...data.collate import default_collate, default_convert  # noqa: F401
from . import dataloader, dataset, sampler  # noqa: F401

__all__ = list(_data_all)                                  # DistributedSampler too, once minidnn.data has it
