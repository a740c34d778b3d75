"""``DistributedSampler``: each of ``num_replicas`` processes reads its own share of a dataset (PyTorch's rules).

    n = len(dataset), R = num_replicas
    num_samples = ceil(n / R)                      (drop_last=False: the list is padded by wrapping around)
                = ceil((n - R) / R)                (drop_last=True and R does not divide n: the tail is dropped)
    total_size  = num_samples * R
    order       = permutation of range(n) seeded by seed + epoch (shuffle) or range(n)
    order       = order + order[:total_size - n] (repeated as often as needed)   or   order[:total_size]
    rank r gets order[r : total_size : R]

Every rank must use the same ``seed`` and call ``set_epoch(epoch)`` at the start of each epoch, so all ranks draw
the same permutation and their shares stay disjoint.  The permutation comes from NumPy's PCG64 seeded with
``seed + epoch`` (PyTorch draws it with torch.randperm: the orders differ, the partition rules are the same).
"""
from __future__ import annotations

import math

import numpy as np

from .sampler import Sampler

__all__ = ["DistributedSampler"]


def _check_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"DistributedSampler: {name} must be an int, got {type(value).__name__}")
    return int(value)


class DistributedSampler(Sampler):
    """Indices of this rank's share of ``dataset``; ``num_replicas``/``rank`` default to the process group's."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None or rank is None:
            from .. import distributed as dist
            if not dist.is_initialized():
                raise RuntimeError("DistributedSampler: num_replicas and rank default to the process group's, but "
                                   "minidnn.distributed.init_process_group has not been called; pass them explicitly")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        num_replicas, rank = _check_int(num_replicas, "num_replicas"), _check_int(rank, "rank")
        if num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.epoch = 0
        self.drop_last, self.shuffle, self.seed = bool(drop_last), bool(shuffle), _check_int(seed, "seed")
        n = len(dataset)
        if self.drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(n).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[:self.total_size]
        assert len(indices) == self.total_size
        mine = indices[self.rank:self.total_size:self.num_replicas]
        assert len(mine) == self.num_samples
        return iter(mine)

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Seed the next ``__iter__``'s shuffle with ``seed + epoch`` (call it on every rank each epoch)."""
        self.epoch = _check_int(epoch, "epoch")
