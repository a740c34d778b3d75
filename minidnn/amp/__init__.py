"""``minidnn.amp``: mixed precision — ``autocast`` (per-op low-precision regions) and ``GradScaler`` (dynamic loss
scaling whose overflow check and unscale run inside the fused optimizer's launch).  PyTorch's ``torch.amp``."""
from .autocast_mode import autocast, get_autocast_dtype, is_autocast_available, is_autocast_enabled
from .grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype", "is_autocast_available"]
