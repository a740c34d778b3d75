"""``minidnn.distributed``: PyTorch's ``torch.distributed`` API for data-parallel training on several processes.

    python -m minidnn.distributed.run --nproc-per-node 2 train.py      # sets RANK, LOCAL_RANK, WORLD_SIZE, ...
    # in train.py
    import minidnn.distributed as dist
    minidnn.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")                                   # or "cpu" ("gloo" is accepted too)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)

Backends: ``"nccl"`` (one NCCL communicator per process, CuPy's bindings, collectives on the current stream:
capturable in a CUDA graph) and ``"cpu"`` (alias ``"gloo"``: messages through rank 0 over the rendezvous' TCP
connections, NumPy reductions in rank order; it checks that every rank called the same collective with the same
shapes and dtypes).  The rendezvous (rendezvous.py) exchanges the NCCL unique id.  See docs/distributed.md.
"""
from __future__ import annotations

import datetime
import os
import pickle
from urllib.parse import urlparse

import numpy as np

from ..backend import devices as _dev
from ._backends import CpuBackend, NcclBackend, ReduceOp, check_reduce_dtypes, nccl_unique_id
from .rendezvous import DEFAULT_TIMEOUT, DistributedError, Store

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "is_available", "is_nccl_available",
           "get_rank", "get_world_size", "get_backend", "barrier", "all_reduce", "broadcast", "all_gather",
           "all_gather_object", "broadcast_object_list", "ReduceOp", "Backend", "DistributedError"]

_BACKENDS = {"nccl": "nccl", "cpu": "cpu", "gloo": "cpu"}


class Backend:
    NCCL = "nccl"
    CPU = "cpu"
    GLOO = "cpu"


class _ProcessGroup:
    def __init__(self, backend, store, rank, world_size):
        self.backend, self.store, self.rank, self.world_size = backend, store, rank, world_size


_group: _ProcessGroup | None = None


def is_available() -> bool:
    return True


def is_nccl_available() -> bool:
    try:
        from ._backends import nccl_module
        nccl_module()
        return True
    except Exception:
        return False


def is_initialized() -> bool:
    return _group is not None


def _require(what):
    if _group is None:
        raise RuntimeError(f"{what}: the default process group has not been initialized; call "
                           "minidnn.distributed.init_process_group(...) first")
    return _group


def _env_int(name, given):
    if given is not None and given >= 0:
        return int(given)
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"init_process_group: {name.lower()} was not given and the environment variable {name} is "
                         "not set (start the script with `python -m minidnn.distributed.run --nproc-per-node N ...`, "
                         f"or pass {name.lower()}=)")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"init_process_group: environment variable {name}={value!r} is not an integer") from None


def _seconds(timeout):
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                       group_name="", pg_options=None, device_id=None):
    """Join the default process group: rank 0 listens on MASTER_ADDR:MASTER_PORT (``init_method="env://"``, the
    default, or ``"tcp://host:port"``), the other ranks connect, and the backend is set up over the result.
    ``rank``/``world_size`` default to the RANK/WORLD_SIZE environment variables.  ``device_id`` (nccl): the GPU
    of this rank; default: the current device, or LOCAL_RANK when it is set (which then becomes current)."""
    global _group
    if _group is not None:
        raise RuntimeError("init_process_group: trying to initialize the default process group twice (call "
                           "destroy_process_group() first)")
    if store is not None or pg_options is not None:
        raise NotImplementedError("init_process_group: store= and pg_options= are not supported; use env:// or tcp://")
    if backend is None:
        backend = "nccl" if _dev.cuda_is_available() else "cpu"
    key = str(backend).lower()
    if key not in _BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r}; minidnn has 'nccl' and 'cpu' "
                         "(alias 'gloo')")
    backend = _BACKENDS[key]
    world_size = _env_int("WORLD_SIZE", world_size)
    rank = _env_int("RANK", rank)
    if world_size < 1:
        raise ValueError(f"init_process_group: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: rank {rank} is out of range for world_size {world_size} "
                         f"(expected 0..{world_size - 1})")
    addr, port = _master(init_method, world_size)
    device_index = None
    shared = None
    if backend == "nccl":
        device_index = _nccl_device(device_id)
        if rank == 0:
            shared = {"nccl_id": nccl_unique_id()}
    st = Store(addr, port, rank, world_size, timeout=_seconds(timeout), shared=shared)
    try:
        impl = NcclBackend(st, device_index) if backend == "nccl" else CpuBackend(st)
    except Exception:
        st.close()
        raise
    _group = _ProcessGroup(impl, st, rank, world_size)


def _master(init_method, world_size):
    if init_method is None or init_method == "env://":
        addr = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        if world_size == 1:                     # nothing to meet: a single process needs no address
            return addr or "127.0.0.1", int(port or 0)
        for name, value in (("MASTER_ADDR", addr), ("MASTER_PORT", port)):
            if value is None:
                raise ValueError(f"init_process_group: init_method='env://' needs the environment variable {name} "
                                 "(the launcher python -m minidnn.distributed.run sets it)")
        return addr, _port(port, "MASTER_PORT")
    url = urlparse(init_method)
    if url.scheme != "tcp" or not url.hostname or url.port is None:
        raise ValueError(f"init_process_group: init_method must be 'env://' or 'tcp://host:port', got {init_method!r}")
    return url.hostname, url.port


def _port(text, name):
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"init_process_group: {name}={text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ValueError(f"init_process_group: {name}={port} is not a port number (1..65535)")
    return port


def _nccl_device(device_id):
    if not _dev.cuda_is_available():
        raise RuntimeError("init_process_group: backend 'nccl' needs a CUDA GPU with CuPy; use backend='cpu'")
    count = _dev.cuda_device_count()
    if device_id is not None:
        dev = _dev.device(device_id)
        if dev.type != "cuda":
            raise ValueError(f"init_process_group: device_id must be a CUDA device for nccl, got {device_id!r}")
        index = dev.index
    elif os.environ.get("LOCAL_RANK") is not None:
        index = int(os.environ["LOCAL_RANK"])
        if index >= count:
            raise RuntimeError(f"init_process_group: LOCAL_RANK={index} but only {count} GPU(s) are visible: start "
                               f"at most {count} processes per node")
    else:
        from .. import cuda
        index = cuda.current_device()
    from .. import cuda
    cuda.set_device(index)
    return index


def destroy_process_group(group=None):
    """Leave the process group (close the communicator and the connections)."""
    global _group
    g, _group = _group, None
    if g is None:
        return
    try:
        g.backend.close()
    finally:
        g.store.close()


def get_rank(group=None) -> int:
    return _require("get_rank").rank


def get_world_size(group=None) -> int:
    return _require("get_world_size").world_size


def get_backend(group=None) -> str:
    return _require("get_backend").backend.name


# -- collectives on tensors -------------------------------------------------------------------------------------------
class _Work:
    """What ``async_op=True`` returns.  NCCL work is ordered on the current stream, CPU work is already done:
    ``wait()`` only has to make later work on the current stream follow it, which stream order already does."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def _array(what, t):
    from ..tensor import Tensor
    if isinstance(t, Tensor):
        return t.data
    if isinstance(t, np.ndarray) or _dev.is_cuda_array(t):
        return t
    raise TypeError(f"{what}: expected a Tensor, got {type(t).__name__}")


def _touched(*tensors):
    for t in tensors:
        if hasattr(t, "_version"):
            t._version += 1


def _check_group(what, group):
    if group is not None:
        raise NotImplementedError(f"{what}: only the default process group exists in minidnn (group=None)")
    return _require(what)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` over all ranks in place (every rank gets the result)."""
    g = _check_group("all_reduce", group)
    if not isinstance(op, ReduceOp):
        raise TypeError(f"all_reduce: op must be a ReduceOp, got {op!r}")
    arr = _array("all_reduce", tensor)
    check_reduce_dtypes([arr], op, "all_reduce")
    g.backend.all_reduce([arr], op)
    _touched(tensor)
    return _Work() if async_op else None


def broadcast(tensor, src=0, group=None, async_op=False):
    """Copy rank ``src``'s ``tensor`` into every rank's ``tensor``."""
    g = _check_group("broadcast", group)
    if not 0 <= src < g.world_size:
        raise ValueError(f"broadcast: src={src} is not a rank of a world of size {g.world_size}")
    g.backend.broadcast([_array("broadcast", tensor)], src)
    _touched(tensor)
    return _Work() if async_op else None


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """``tensor_list[r]`` receives rank r's ``tensor`` (every list entry has tensor's shape and dtype)."""
    g = _check_group("all_gather", group)
    arr = _array("all_gather", tensor)
    outs = [_array("all_gather", t) for t in tensor_list]
    if len(outs) != g.world_size:
        raise ValueError(f"all_gather: tensor_list has {len(outs)} tensors but the world size is {g.world_size}")
    for i, o in enumerate(outs):
        if tuple(o.shape) != tuple(arr.shape) or o.dtype != arr.dtype:
            raise ValueError(f"all_gather: tensor_list[{i}] is {tuple(o.shape)}/{o.dtype} but the input is "
                             f"{tuple(arr.shape)}/{arr.dtype}")
    g.backend.all_gather(outs, arr)
    _touched(*tensor_list)
    return _Work() if async_op else None


def barrier(group=None, async_op=False, device_ids=None):
    """Return once every rank has called barrier."""
    _check_group("barrier", group).backend.barrier()
    return _Work() if async_op else None


# -- collectives on Python objects (through the rendezvous connections, on either backend) -----------------------------
def all_gather_object(object_list, obj, group=None):
    """``object_list[r]`` becomes rank r's ``obj`` (any picklable object)."""
    g = _check_group("all_gather_object", group)
    if len(object_list) != g.world_size:
        raise ValueError(f"all_gather_object: object_list has {len(object_list)} entries but the world size is "
                         f"{g.world_size}")
    data = pickle.dumps(obj)
    parts = g.store.exchange({"op": "all_gather_object"}, data, lambda payloads: [payloads] * len(payloads))
    object_list[:] = [pickle.loads(p) for p in parts]


def broadcast_object_list(object_list, src=0, group=None, device=None):
    """Every rank's ``object_list`` becomes rank ``src``'s (same length on every rank)."""
    g = _check_group("broadcast_object_list", group)
    if not 0 <= src < g.world_size:
        raise ValueError(f"broadcast_object_list: src={src} is not a rank of a world of size {g.world_size}")
    data = pickle.dumps(list(object_list)) if g.rank == src else None
    meta = {"op": "broadcast_object_list", "src": src, "length": len(object_list)}
    result = g.store.exchange(meta, data, lambda payloads: [payloads[src]] * len(payloads))
    object_list[:] = pickle.loads(result)


# -- array-level entry points for minidnn's own layers (DistributedDataParallel, SyncBatchNorm) ----------------------
def _all_reduce_arrays(arrays, op=ReduceOp.SUM, tag=None, side_stream=False):
    """``tag`` names the call site in the cross-rank check (cpu backend; nccl under MINIDNN_DISTRIBUTED_DEBUG).
    ``side_stream`` (nccl): overlap with what the current stream does next, until ``_join_side_stream()``."""
    g = _require("all_reduce")
    check_reduce_dtypes(arrays, op, "all_reduce")
    g.backend.all_reduce(list(arrays), op, tag=tag, side_stream=side_stream)


def _join_side_stream():
    """The current stream waits for the side-stream collectives issued so far (no host wait)."""
    _require("all_reduce").backend.join_side_stream()


def _broadcast_arrays(arrays, src=0):
    _require("broadcast").backend.broadcast(list(arrays), src)
