"""``minidnn.cuda``: is a GPU usable, how many, synchronize."""
from .backend import devices as _dev

__all__ = ["is_available", "device_count", "synchronize", "current_device"]


def is_available() -> bool:
    """True where CuPy imports and at least one CUDA GPU is visible."""
    return _dev.cuda_is_available()


def device_count() -> int:
    return _dev.cuda_device_count()


def current_device() -> int:
    cp = _dev.device("cuda").xp
    return int(cp.cuda.runtime.getDevice())


def synchronize(device=None) -> None:
    """Wait for all work queued on the GPU (no-op without one)."""
    if not is_available():
        return
    dev = _dev.device(device if device is not None else "cuda")
    with dev.xp.cuda.Device(dev.index):
        dev.xp.cuda.Device(dev.index).synchronize()
