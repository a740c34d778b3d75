"""The one place every CUDA kernel of minidnn is compiled and launched.

    kernel = get_kernel(source, "name", options=("-DTILE=64",))   # compiled once per (source, name, options), cached
    launch(kernel, grid, block, args, shared_mem=0, stream=None)   # counted; uses the current CuPy stream

Why one place:
- compile-and-cache: NVRTC runs once per configuration and process (CuPy also keeps its own on-disk cache);
- counting: ``launch_count()`` is the number of kernels minidnn itself launched, so tests and bench/train_step.py can
  report kernels per step (take differences around the step);
- capture safety: nothing here allocates, synchronises or reads device memory back, and the launch goes to CuPy's
  current stream, so a launch inside ``minidnn.cuda.graph`` capture is recorded in the graph;
- host cost: CuPy's ``RawKernel.__call__`` inspects every argument at every call (~0.5 µs each, 19 µs for the
  34 arguments of a convolution kernel on an H200 host, tools/launch_micro.py).  Here the arguments' layout (one
  C struct code per argument: a CuPy array is its 8-byte pointer, a NumPy scalar its own width and alignment, the
  kernel ABI's rules) is worked out once per sequence of argument types; each launch packs the values into that
  layout's buffer and calls ``cuLaunchKernel`` with a pointer to each (8.5 µs for the same 34).  ``prepare`` goes
  further for a launch that repeats with only its arrays changing (a convolution plan): the scalars are packed
  once and a call writes just the pointers.  An argument type with no struct code (a bfloat16 scalar) takes
  CuPy's own path.

Only this package (backend/cuda) talks to CuPy's kernel API; ``cupy()`` hands the module to the kernel files.
"""
from __future__ import annotations

import contextlib
import ctypes
import struct
import threading

import numpy as np

from .. import devices as _dev

__all__ = ["cupy", "get_kernel", "launch", "prepare", "planned", "on_device", "launch_count", "count_launches",
           "sm_count"]

_lock = threading.Lock()
_kernels: dict = {}
_launches = 0
_sm: dict = {}
_layouts: dict = {}       # tuple of argument types -> _Buffer (None: some type has no struct code)
_functions: dict = {}     # (id(kernel), device id) -> (CUfunction handle, shared memory opted into, the kernel)
_PTR = struct.Struct("@Q")
_ARRAY = object()         # the type code of a device array argument: its pointer
_CODES = {np.int8: "b", np.uint8: "B", np.bool_: "?", np.int16: "h", np.uint16: "H", np.int32: "i",
          np.uint32: "I", np.int64: "q", np.uint64: "Q", np.float16: "e", np.float32: "f", np.float64: "d"}


_cp = None


def cupy():
    """The CuPy module (raises minidnn's CudaUnavailableError with install advice where CuPy is missing)."""
    global _cp
    if _cp is None:
        _cp = _dev.require_cupy()
    return _cp


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


class _Buffer:
    """Packed kernel arguments: the bytes of a C struct laid out as the kernel's parameters, and the array of
    pointers to each parameter that ``cuLaunchKernel`` reads (the driver copies the values during the call, so the
    buffer is reused; its lock keeps two threads from packing into it at once)."""
    __slots__ = ("struct", "data", "params", "params_ptr", "lock")

    def __init__(self, layout: struct.Struct, offsets):
        self.struct = layout
        self.data = ctypes.create_string_buffer(max(layout.size, 1))
        base = ctypes.addressof(self.data)
        self.params = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self.params_ptr = ctypes.addressof(self.params)
        self.lock = threading.Lock()


def compile_in_parallel(compile_one, jobs, procs=None) -> int:
    """Run ``compile_one`` (a module-level function: it crosses a process) on each of ``jobs`` in spawned worker
    processes, one a core up to 16: NVRTC builds into CuPy's on-disk cache (CUPY_CACHE_DIR), so that a test or an A/B
    that launches many kernel variants loads cubins instead of compiling one after another.  Returns len(jobs)."""
    import multiprocessing as mp
    import os
    jobs = list(jobs)
    if not jobs:
        return 0
    procs = procs or max(1, min(16, os.cpu_count() or 1, len(jobs)))
    with mp.get_context("spawn").Pool(procs) as pool:
        for _ in pool.imap_unordered(compile_one, jobs):
            pass
    return len(jobs)


def _layout(types):
    """(struct, parameter offsets) for a sequence of argument types (a CuPy array -> its pointer), or None when a
    type has no struct code."""
    codes = []
    for t in types:
        code = "Q" if t is _ARRAY else _CODES.get(t)
        if code is None:
            return None
        codes.append(code)
    offsets, end = [], 0
    for code in codes:       # each parameter at its natural alignment: the '@' struct layout
        size = struct.calcsize(code)
        end = -(-end // size) * size
        offsets.append(end)
        end += size
    return struct.Struct("@" + "".join(codes)), offsets


def _opt_in(kernel, shared_mem):
    """Dynamic shared memory above 48 KiB must be opted into (on the current device's function)."""
    if shared_mem >= 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = max(kernel.max_dynamic_shared_size_bytes, int(shared_mem))


def _function(kernel, shared_mem, dev):
    """The CUfunction handle of ``kernel`` on GPU ``dev``, opted into ``shared_mem`` bytes of dynamic shared memory
    when that is above 48 KiB (once per kernel, device and size)."""
    entry = _functions.get((id(kernel), dev))
    if entry is None or entry[1] < shared_mem:
        _opt_in(kernel, shared_mem)
        # the entry holds the kernel itself, so its id cannot be reused by another kernel while the entry lives
        entry = _functions[(id(kernel), dev)] = (kernel.kernel.ptr, max(int(shared_mem), 0 if entry is None
                                                                         else entry[1]), kernel)
    return entry[0]


def _dims(grid, block, shared_mem):
    g = tuple(grid) + (1, 1)
    b = tuple(block) + (1, 1)
    return (int(g[0]), int(g[1]), int(g[2]), int(b[0]), int(b[1]), int(b[2]), int(shared_mem))


def _go(fn, dims, stream, params_ptr):
    global _launches
    cp = _cp
    s = (stream if stream is not None else cp.cuda.get_current_stream()).ptr
    cp.cuda.driver.launchKernel(fn, *dims, s, params_ptr, 0)
    _launches += 1


def launch(kernel, grid, block, args, shared_mem: int = 0, stream=None) -> None:
    """Launch ``kernel`` on ``grid`` x ``block`` with ``args`` (CuPy arrays and NumPy scalars), counted."""
    global _launches
    cp = cupy()
    nd = cp.ndarray
    types = tuple([_ARRAY if type(a) is nd else type(a) for a in args])
    buf = _layouts.get(types, False)
    if buf is False:
        layout = _layout(types)
        buf = _layouts[types] = None if layout is None else _Buffer(*layout)
    if buf is None:      # an argument type struct cannot pack: CuPy's own launch
        _opt_in(kernel, shared_mem)
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=int(shared_mem), stream=stream)
        _launches += 1
        return
    fn = _function(kernel, shared_mem, cp.cuda.runtime.getDevice())
    values = [a.data.ptr if t is _ARRAY else a for a, t in zip(args, types)]
    with buf.lock:
        buf.struct.pack_into(buf.data, 0, *values)
        _go(fn, _dims(grid, block, shared_mem), stream, buf.params_ptr)


_WRITERS: dict = {}      # number of arrays -> write(pack, data, arrays), made once per count


def _writer(n):
    """``write(pack, data, arrays)``: ``pack(data, 0, *pointers)`` for exactly ``n`` arrays (None -> a null
    pointer), the arrays unpacked into names and read one by one.  Generated per count because that is where a
    prepared launch's Python went: a list comprehension over the arrays cost 0.25-0.35 µs a call more on this
    host (its own frame; 2 to 13 arrays a launch), ~190 launches a ResNet-20 step (docs/host_overhead.md round 27)."""
    w = _WRITERS.get(n)
    if w is None:
        names = "".join(f"a{i}, " for i in range(n))
        ptrs = ", ".join(f"0 if a{i} is None else a{i}.data.ptr" for i in range(n))
        scope: dict = {}
        src = f"def write(pack, data, arrays):\n    ({names}) = arrays\n    pack(data, 0, {ptrs})\n"
        exec(compile(src, f"<launch writer of {n} arrays>", "exec"), scope)     # (the name profiles show)
        w = _WRITERS[n] = scope["write"]
    return w


class Prepared:
    """A launch that repeats with only its arrays changing: ``prepare(kernel, grid, block, args)`` packs the scalar
    arguments once (``args`` as for ``launch``, with ``None`` where an array will go), and calling the result with
    the arrays, in order, writes their pointers (None -> a null pointer) and launches."""
    __slots__ = ("kernel", "dims", "shared_mem", "buf", "slots", "pack_ptrs", "fn", "write")

    def __init__(self, kernel, grid, block, args, shared_mem=0):
        nd = cupy().ndarray
        types = [_ARRAY if a is None or type(a) is nd else type(a) for a in args]
        layout = _layout(types)
        if layout is None:
            raise TypeError(f"prepare: no struct code for {sorted({t.__name__ for t in types if t is not _ARRAY})}")
        self.kernel, self.shared_mem = kernel, int(shared_mem)
        self.dims = _dims(grid, block, shared_mem)
        self.buf = _Buffer(*layout)       # its own buffer: the scalars stay packed in it between calls
        self.slots = [o for o, t in zip(layout[1], types) if t is _ARRAY]
        layout[0].pack_into(self.buf.data, 0, *[0 if t is _ARRAY else a for a, t in zip(args, types)])
        n = len(self.slots)
        # the arrays lead the argument list (every kernel here): all their pointers in one pack
        self.pack_ptrs = struct.Struct(f"@{n}Q").pack_into if self.slots == list(range(0, 8 * n, 8)) else None
        self.write = _writer(n) if self.pack_ptrs is not None else None
        self.fn = (None, None)            # (device, CUfunction) of the last launch

    def __call__(self, *arrays, stream=None):
        if len(arrays) != len(self.slots):
            raise TypeError(f"prepared launch: {len(self.slots)} arrays expected, got {len(arrays)}")
        last, fn = self.fn
        dev = _cp.cuda.runtime.getDevice()
        if last != dev:
            fn = _function(self.kernel, self.shared_mem, dev)
            self.fn = (dev, fn)
        buf = self.buf
        lock = buf.lock
        lock.acquire()          # (not ``with``: its enter / exit calls cost ~0.1 µs more a launch)
        try:
            if self.write is not None:
                self.write(self.pack_ptrs, buf.data, arrays)
            else:
                for off, a in zip(self.slots, arrays):
                    _PTR.pack_into(buf.data, off, 0 if a is None else a.data.ptr)
            _go(fn, self.dims, stream, buf.params_ptr)
        finally:
            lock.release()


def prepare(kernel, grid, block, args, shared_mem: int = 0) -> Prepared:
    """A Prepared launch of ``kernel`` (see Prepared)."""
    return Prepared(kernel, grid, block, args, shared_mem)


def bind_pointers(prepared: Prepared, dev: int):
    """``go(*ptrs)``: ``prepared`` launched on GPU ``dev`` (which must be current at the call) on the current
    stream, its array slots filled from raw pointer integers -- no device lookup, no array attribute reads: for the
    one launch a replayed ``minidnn.compile`` step makes before its graph (host time on every step).  Counted."""
    if prepared.pack_ptrs is None:
        raise ValueError("bind_pointers: the prepared launch's arrays must lead its argument list")
    with on_device(dev):
        fn = _function(prepared.kernel, prepared.shared_mem, dev)
    buf, dims, pack = prepared.buf, prepared.dims, prepared.pack_ptrs
    data, params_ptr, lock = buf.data, buf.params_ptr, buf.lock     # go() keeps buf alive: params_ptr points into it
    cp = cupy()
    launch_kernel, current = cp.cuda.driver.launchKernel, cp.cuda.get_current_stream

    def go(*ptrs, _buf=buf):
        global _launches
        with lock:
            pack(data, 0, *ptrs)
            launch_kernel(fn, *dims, current().ptr, params_ptr, 0)
        _launches += 1
    return go


_PLANS_LIMIT = 4096


def planned(table: dict, key, build, *args):
    """``table[key]``, built as ``build(*args)`` on first use: the kernel modules' caches of settled launches
    (prepared launches, grids, buffer sizes per call signature).  Bounded: a full table starts again empty."""
    plan = table.get(key)
    if plan is None:
        if len(table) >= _PLANS_LIMIT:
            table.clear()
        plan = table[key] = build(*args)
    return plan


_HERE = contextlib.nullcontext()


def on_device(dev: int):
    """``with on_device(id):`` the device context of GPU ``id`` (nothing to switch, and no CuPy context object,
    when it is already current: the common case, ~1 µs saved per kernel call)."""
    cp = cupy()
    return _HERE if cp.cuda.runtime.getDevice() == dev else cp.cuda.Device(dev)


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


def write_source(path: str, source: str, defines=()) -> None:
    """Write a kernel ``source`` to ``path`` with ``#define NAME VALUE`` lines for ``defines`` ("NAME=VALUE"
    strings) prepended: the file nvcc compile-checks (each kernel source module's ``python -m`` entry)."""
    head = "".join("#define {} {}\n".format(*d.split("=", 1)) for d in defines)
    with open(path, "w") as f:
        f.write(head + source)
