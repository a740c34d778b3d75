"""Process-group backends on raw arrays: the CPU one (through the rendezvous star, NumPy reductions) and NCCL
(CuPy's ``cupy.cuda.nccl`` bindings, launched on the current stream so a CUDA graph can capture them).

Both take lists of arrays so that several tensors travel as one message (CPU) or one NCCL group (GPU): the
fallback gradient buckets and the buffer broadcasts of DistributedDataParallel use that.
"""
from __future__ import annotations

import os
from enum import Enum

import numpy as np

from ..backend import devices as _dev
from .rendezvous import DistributedError

__all__ = ["ReduceOp", "CpuBackend", "NcclBackend"]


class ReduceOp(Enum):
    """PyTorch's reduction names (``dist.ReduceOp.SUM``...)."""
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


def _describe(arrays):
    return ", ".join(f"{tuple(a.shape)}/{a.dtype}" for a in arrays)


def check_reduce_dtypes(arrays, op, what):
    for a in arrays:
        kind = np.dtype(a.dtype).kind
        if op is ReduceOp.AVG and kind not in "fc":
            raise TypeError(f"{what}: ReduceOp.AVG needs floating point tensors, got {a.dtype} (use SUM and divide)")
        if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and kind not in "iub":
            raise TypeError(f"{what}: ReduceOp.{op.name} needs integer or bool tensors, got {a.dtype}")


def _reduce(op, parts):
    """Elementwise reduction of ``parts`` (one array per rank) in rank order, so every run sums the same way."""
    acc = np.array(parts[0], copy=True)
    for p in parts[1:]:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            acc += p
        elif op is ReduceOp.PRODUCT:
            acc *= p
        elif op is ReduceOp.MIN:
            np.minimum(acc, p, out=acc)
        elif op is ReduceOp.MAX:
            np.maximum(acc, p, out=acc)
        elif op is ReduceOp.BAND:
            np.bitwise_and(acc, p, out=acc)
        elif op is ReduceOp.BOR:
            np.bitwise_or(acc, p, out=acc)
        else:
            np.bitwise_xor(acc, p, out=acc)
    if op is ReduceOp.AVG:
        acc /= len(parts)
    return acc


def _to_host(a):
    return np.ascontiguousarray(_dev.to_device(a, "cpu"))


def _write_back(dst, host):
    if _dev.is_cuda_array(dst):
        dst[...] = _dev.array_module(dst).asarray(host)
    else:
        dst[...] = host


class CpuBackend:
    """Collectives through rank 0 of the rendezvous star; GPU arrays go through host copies (as gloo does)."""

    name = "cpu"

    def __init__(self, store):
        self.store = store
        self.rank, self.world_size = store.rank, store.world_size

    def all_reduce(self, arrays, op, tag=None, side_stream=False):
        meta = {"op": "all_reduce", "reduce": op.name, "tensors": _describe(arrays), "site": tag}
        hosts = [_to_host(a) for a in arrays]

        def combine(payloads):
            result = [_reduce(op, [p[i] for p in payloads]) for i in range(len(arrays))]
            return [result] * len(payloads)
        for dst, res in zip(arrays, self.store.exchange(meta, hosts, combine)):
            _write_back(dst, res)

    def broadcast(self, arrays, src):
        meta = {"op": "broadcast", "src": src, "tensors": _describe(arrays)}
        hosts = [_to_host(a) for a in arrays] if self.rank == src else None
        result = self.store.exchange(meta, hosts, lambda payloads: [payloads[src]] * len(payloads))
        if self.rank != src:
            for dst, res in zip(arrays, result):
                _write_back(dst, res)

    def all_gather(self, outputs, array):
        meta = {"op": "all_gather", "tensors": _describe([array])}
        parts = self.store.exchange(meta, _to_host(array), lambda payloads: [payloads] * len(payloads))
        for dst, part in zip(outputs, parts):
            _write_back(dst, part)

    def barrier(self):
        self.store.exchange({"op": "barrier"}, None, lambda payloads: [None] * len(payloads))

    def join_side_stream(self):
        """Nothing runs asynchronously here."""

    def close(self):
        pass


# NCCL's enum values (nccl.h), the same numbers cupy.cuda.nccl exports as NCCL_FLOAT32, NCCL_SUM, ...
_NCCL_DTYPES = {"int8": 0, "uint8": 1, "bool": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
                "float32": 7, "float64": 8, "bfloat16": 9}
_NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3, ReduceOp.AVG: 4}


def nccl_module():
    """CuPy's NCCL bindings (a submodule cupy does not import by itself), or a clear error."""
    import importlib

    from ..backend.cuda.launch import cupy
    cupy()
    nccl = importlib.import_module("cupy.cuda.nccl")
    if not getattr(nccl, "available", True):
        raise RuntimeError("backend 'nccl': CuPy found no NCCL library (install the nvidia-nccl wheel matching "
                           "your CUDA, or use backend='cpu')")
    return nccl


def nccl_unique_id():
    """Rank 0's NCCL id, shared with the other ranks by the rendezvous."""
    return nccl_module().get_unique_id()


class NcclBackend:
    """One NCCL communicator over the process group.  Every collective is launched on the current CuPy stream of
    the communicator's device (stream-ordered after the kernels that produced its input, capturable in a CUDA
    graph).  With MINIDNN_DISTRIBUTED_DEBUG=DETAIL each call is first checked across ranks through the store."""

    name = "nccl"

    def __init__(self, store, device_index):
        from ..backend.cuda.launch import cupy
        self.cp = cupy()
        self.nccl = nccl_module()
        self.store = store
        self.rank, self.world_size = store.rank, store.world_size
        self.device = int(device_index)
        self.debug = os.environ.get("MINIDNN_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"
        self._side, self._forked = None, False        # the communication stream (created on first use)
        uid = store.shared["nccl_id"]
        with self.cp.cuda.Device(self.device):
            try:
                self.comm = self.nccl.NcclCommunicator(self.world_size, uid, self.rank)
            except TypeError:       # CuPy versions differ: the id as a tuple of signed chars, or as bytes
                other = (bytes(c & 0xFF for c in uid) if isinstance(uid, tuple)
                         else tuple(c - 256 if c > 127 else c for c in uid))
                self.comm = self.nccl.NcclCommunicator(self.world_size, other, self.rank)

    def _check(self, what, arrays, meta):
        for a in arrays:
            if not _dev.is_cuda_array(a):
                raise TypeError(f"{what}: the nccl backend needs CUDA tensors, got a cpu array {tuple(a.shape)}/"
                                f"{a.dtype} (use backend='cpu' for cpu tensors)")
            if int(a.device.id) != self.device:
                raise ValueError(f"{what}: tensor on cuda:{a.device.id} but this rank's communicator is on "
                                 f"cuda:{self.device} (call minidnn.cuda.set_device(LOCAL_RANK) before "
                                 "init_process_group)")
            if not a.flags.c_contiguous:
                raise ValueError(f"{what}: NCCL needs contiguous tensors, got shape {tuple(a.shape)} with strides "
                                 f"{a.strides}")
            if str(a.dtype) not in _NCCL_DTYPES:
                raise TypeError(f"{what}: NCCL has no {a.dtype} type")
        if self.debug:
            self.store.exchange(dict(meta, op=what), None, lambda payloads: [None] * len(payloads))

    def _stream(self):
        return self.cp.cuda.get_current_stream().ptr

    def _ordered_stream(self):
        """The current stream, after it waited for side-stream collectives still in flight: the GPU then runs
        every collective of this communicator in the order they were issued, on every rank (SyncBatchNorm's
        backward all-reduce between DDP's bucket all-reduces, say)."""
        self.join_side_stream()
        return self._stream()

    def _grouped(self, arrays, launch):
        with self.cp.cuda.Device(self.device):
            if len(arrays) > 1:
                self.nccl.groupStart()
            try:
                for a in arrays:
                    launch(a, _NCCL_DTYPES[str(a.dtype)])
            finally:
                if len(arrays) > 1:
                    self.nccl.groupEnd()

    def all_reduce(self, arrays, op, tag=None, side_stream=False):
        """``side_stream``: run on this rank's communication stream, after the work queued on the current stream so
        far (an event, no host wait), so that the kernels queued next on the current stream overlap with it;
        ``join_side_stream`` makes the current stream wait for it again.  Both are capturable (the fork/join of
        streams that CUDA graph capture records)."""
        if op not in _NCCL_OPS:
            raise ValueError(f"all_reduce: NCCL has no ReduceOp.{op.name} (it has SUM, AVG, PRODUCT, MIN, MAX)")
        self._check("all_reduce", arrays, {"reduce": op.name, "tensors": _describe(arrays), "site": tag})
        with self.cp.cuda.Device(self.device):
            s = self._fork() if side_stream else self._ordered_stream()
        self._grouped(arrays, lambda a, dt: self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, dt, _NCCL_OPS[op], s))

    def _fork(self):
        cp = self.cp
        if self._side is None:
            self._side = cp.cuda.Stream(non_blocking=True)
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(cp.cuda.get_current_stream())
        self._side.wait_event(ready)
        self._forked = True
        return self._side.ptr

    def join_side_stream(self):
        if not self._forked:
            return
        cp = self.cp
        with cp.cuda.Device(self.device):
            done = cp.cuda.Event(disable_timing=True)
            done.record(self._side)
            cp.cuda.get_current_stream().wait_event(done)
        self._forked = False

    def broadcast(self, arrays, src):
        self._check("broadcast", arrays, {"src": src, "tensors": _describe(arrays)})
        s = self._ordered_stream()
        self._grouped(arrays, lambda a, dt: self.comm.broadcast(a.data.ptr, a.data.ptr, a.size, dt, src, s))

    def all_gather(self, outputs, array):
        self._check("all_gather", [array] + list(outputs), {"tensors": _describe([array])})
        with self.cp.cuda.Device(self.device):
            recv = self.cp.empty((self.world_size,) + tuple(array.shape), dtype=array.dtype)
            self.comm.allGather(array.data.ptr, recv.data.ptr, array.size, _NCCL_DTYPES[str(array.dtype)],
                                self._ordered_stream())
            for dst, part in zip(outputs, recv):
                dst[...] = part

    def barrier(self):
        with self.cp.cuda.Device(self.device):
            one = self.cp.ones(1, dtype=self.cp.float32)
            self.all_reduce([one], ReduceOp.SUM)
            self.cp.cuda.get_current_stream().synchronize()
        if float(one[0]) != self.world_size:
            raise DistributedError(f"barrier: expected {self.world_size} ranks, counted {float(one[0])}")

    def close(self):
        comm, self.comm = self.comm, None
        if comm is not None:
            with self.cp.cuda.Device(self.device):
                self.cp.cuda.get_current_stream().synchronize()
                comm.destroy()
