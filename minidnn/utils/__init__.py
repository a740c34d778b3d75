"""``minidnn.utils``: PyTorch's ``torch.utils`` paths.  ``minidnn.utils.data`` is ``minidnn.data``."""
from . import data  # noqa: F401

__all__ = ["data"]
