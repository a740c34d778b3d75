"""``torch.utils.data.dataloader``'s path: ``DataLoader``, ``default_collate``, ``default_convert``,
``get_worker_info``."""
from ...data.collate import default_collate, default_convert  # noqa: F401
from ...data.dataloader import DataLoader, get_worker_info  # noqa: F401

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]
