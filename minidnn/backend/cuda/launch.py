"""The one place every CUDA kernel of minidnn is compiled and launched.

    kernel = get_kernel(source, "name", options=("-DTILE=64",))   # compiled once per (source, name, options), cached
    launch(kernel, grid, block, args, shared_mem=0, stream=None)   # counted; uses the current CuPy stream

Why one place:
- compile-and-cache: NVRTC runs once per configuration and process (CuPy also keeps its own on-disk cache);
- counting: ``launch_count()`` is the number of kernels minidnn itself launched, so tests and bench/train_step.py can
  report kernels per step (take differences around the step);
- capture safety: nothing here allocates, synchronises or reads device memory back, and the launch goes to CuPy's
  current stream, so a launch inside ``minidnn.cuda.graph`` capture is recorded in the graph.

Only this package (backend/cuda) talks to CuPy's kernel API; ``cupy()`` hands the module to the kernel files.
"""
from __future__ import annotations

import threading

from .. import devices as _dev

__all__ = ["cupy", "get_kernel", "launch", "launch_count", "count_launches", "sm_count"]

_lock = threading.Lock()
_kernels: dict = {}
_launches = 0
_sm: dict = {}


def cupy():
    """The CuPy module (raises minidnn's CudaUnavailableError with install advice where CuPy is missing)."""
    return _dev.require_cupy()


def get_kernel(source: str, name: str, options: tuple = ()):
    """The compiled kernel ``name`` of ``source`` under NVRTC ``options`` (compiled on first use, then cached)."""
    key = (source, name, tuple(options))
    k = _kernels.get(key)
    if k is None:
        cp = cupy()
        with _lock:
            k = _kernels.get(key)
            if k is None:
                k = cp.RawModule(code=source, options=tuple(options)).get_function(name)
                _kernels[key] = k
    return k


def launch(kernel, grid, block, args, shared_mem: int = 0, stream=None) -> None:
    """Launch ``kernel`` on ``grid`` x ``block`` with ``args`` (CuPy arrays and NumPy scalars), counted."""
    global _launches
    if shared_mem >= 48 * 1024:
        # Dynamic shared memory above 48 KiB must be opted into once per kernel.
        kernel.max_dynamic_shared_size_bytes = max(kernel.max_dynamic_shared_size_bytes, int(shared_mem))
    kernel(tuple(grid), tuple(block), tuple(args), shared_mem=int(shared_mem), stream=stream)
    _launches += 1


def count_launches(n: int = 1) -> None:
    """Count launches made through a CuPy primitive that cannot go through ``launch`` (e.g. an ElementwiseKernel)."""
    global _launches
    _launches += n


def launch_count() -> int:
    """Kernels launched by minidnn in this process so far (take differences around a step)."""
    return _launches


def sm_count(device_id: int | None = None) -> int:
    """Streaming multiprocessors of a GPU (cached), for sizing persistent/grid-stride grids."""
    cp = cupy()
    dev = cp.cuda.runtime.getDevice() if device_id is None else int(device_id)
    n = _sm.get(dev)
    if n is None:
        n = _sm[dev] = int(cp.cuda.Device(dev).attributes["MultiProcessorCount"])
    return n
