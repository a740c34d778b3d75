"""``minidnn.cuda``: is a GPU usable, how many, synchronize; streams and CUDA graphs with PyTorch's API
(Stream, stream, current_stream, CUDAGraph, graph, make_graphed_callables: see minidnn/cuda/graphs.py); the memory
counters and empty_cache."""
from ..backend import devices as _dev
from .graphs import (
    CUDAGraph,
    Stream,
    current_stream,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
    stream,
)

__all__ = ["is_available", "device_count", "synchronize", "current_device", "set_device", "manual_seed",
           "manual_seed_all", "get_rng_state", "set_rng_state", "initial_seed", "seed", "Stream", "stream",
           "current_stream", "CUDAGraph", "graph", "graph_pool_handle", "make_graphed_callables",
           "is_current_stream_capturing", "empty_cache", "memory_allocated", "memory_reserved"]


def is_available() -> bool:
    """True where CuPy imports and at least one CUDA GPU is visible."""
    return _dev.cuda_is_available()


def device_count() -> int:
    return _dev.cuda_device_count()


def current_device() -> int:
    """The index of the current GPU (torch.cuda.current_device)."""
    return _dev.current_cuda_index()


def set_device(device) -> None:
    """Make GPU ``device`` (an index, "cuda:N" or a device) the current one: "cuda" then means it (each
    data-parallel process calls this with its LOCAL_RANK first)."""
    dev = _dev.device(device)
    if dev.type != "cuda":
        raise ValueError(f"set_device: expected a CUDA device, got {device!r}")
    dev.xp.cuda.Device(dev.index).use()
    _dev._device_cache.pop("cuda", None)       # "cuda" was resolved to the old current device


def synchronize(device=None) -> None:
    """Wait for all work queued on the GPU (no-op without one)."""
    if not is_available():
        return
    dev = _dev.device(device if device is not None else "cuda")
    with dev.xp.cuda.Device(dev.index):
        dev.xp.cuda.Device(dev.index).synchronize()


def _pool(device):
    dev = _dev.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {device!r}")
    return dev.index, dev.xp.get_default_memory_pool()


def empty_cache() -> None:
    """Hand the GPU memory no tensor uses back to the driver (torch.cuda.empty_cache): the scratch buffers and the
    reusable output memory this thread's kernels keep (backend/cuda/workspace.py), the convolution filters' kept
    copies (backend/cuda/conv_filter_keep.py), then every unused block of
    CuPy's memory pool.  Tensors are untouched; the next steps allocate afresh."""
    if not is_available():
        return
    from ..backend.cuda import conv_filter_keep, workspace
    workspace.clear()
    conv_filter_keep.clear()
    _dev.require_cupy().get_default_memory_pool().free_all_blocks()


def memory_allocated(device=None) -> int:
    """Bytes of GPU memory held by arrays in use on ``device`` (torch.cuda.memory_allocated): the memory pool's
    used bytes less the reusable output memory no array holds now (workspace.fresh keeps it for the next step)."""
    from ..backend.cuda import workspace
    index, pool = _pool(device)
    with _dev.require_cupy().cuda.Device(index):
        return pool.used_bytes() - workspace.idle_bytes(index)


def memory_reserved(device=None) -> int:
    """Bytes of GPU memory the memory pool holds on ``device``, in use or cached (torch.cuda.memory_reserved)."""
    index, pool = _pool(device)
    with _dev.require_cupy().cuda.Device(index):
        return pool.total_bytes()


def manual_seed(seed, device="cuda") -> None:
    """Seed one GPU's default generator (minidnn.manual_seed seeds them all and the cpu's)."""
    from .. import random
    random.cuda_manual_seed(seed, device)


def manual_seed_all(seed) -> None:
    from .. import random
    random.cuda_manual_seed_all(seed)


def get_rng_state(device="cuda"):
    """A GPU's default generator state (a 64-byte uint8 cpu Tensor)."""
    from .. import random
    return random.cuda_get_rng_state(device)


def set_rng_state(new_state, device="cuda") -> None:
    from .. import random
    random.cuda_set_rng_state(new_state, device)


def initial_seed(device="cuda") -> int:
    from .. import random
    return random.default_generator(random._cuda_device(device)).initial_seed()


def seed(device="cuda") -> int:
    from .. import random
    return random.default_generator(random._cuda_device(device)).seed()
