"""``torch.utils.data.distributed``'s path: ``DistributedSampler``."""
from ...data.distributed import DistributedSampler  # noqa: F401

__all__ = ["DistributedSampler"]
