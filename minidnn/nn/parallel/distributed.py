"""DistributedDataParallel: one model replica per process, gradients averaged over the process group.

    construction     rank 0's parameters and buffers are broadcast to every rank (shapes checked first)
    forward          (broadcast_buffers) rank 0's buffers are broadcast again; the module runs
    backward         each parameter's post-accumulate-grad hook marks it ready; when every parameter of a bucket
                     is ready, that bucket is all-reduced with ReduceOp.AVG right away, while backward goes on

Buckets.  A fused optimizer keeps each (device, dtype)'s gradients in ONE flat buffer (optim/_flat.py), and
backward writes every gradient straight into it; the buckets are then consecutive ranges of that buffer, in its
order, of about ``bucket_cap_mb`` each, and a bucket's all-reduce is a single collective on a slice of it: no
copy in, no copy out.  Backward visits the parameters roughly in reverse, so the last bucket fills first.  The
layout is looked up (``owner_of``) at the first hook of each backward, so the optimizer may be built before or
after the wrapper.  Parameters with no flat buffer (an unfused optimizer, or none yet) go in buckets of
per-parameter gradients, all-reduced as one message (cpu) or one NCCL group.

On a GPU each bucket's all-reduce goes on a communication stream that first waits (an event, no host wait) for the
current stream's work so far, so the GPU overlaps it with the rest of backward; when the last bucket is launched
the current stream waits for the communication stream, so the optimizer's update sees the averaged gradients.
This fork/join is what CUDA graph capture records: a training step with the wrapper can be captured by
``minidnn.cuda.graph`` / ``minidnn.compile`` (each replay all-reduces again).  ``comm_stream=False`` keeps the
collectives on the current stream.  ``no_sync()`` skips the all-reduce for the backward of a
forward run inside it (gradients accumulate locally, the next synchronised backward averages the sum).
"""
from __future__ import annotations

import contextlib
import weakref

import numpy as np

from ... import autograd as _ag
from ... import distributed as dist
from ...backend import devices as _dev
from ...backend.ownership import owner_of
from ...tensor import Tensor
from ..module import Module

__all__ = ["DistributedDataParallel"]


class _Bucket:
    __slots__ = ("members", "flat")

    def __init__(self, members, flat=None):
        self.members = members        # indices into the wrapper's parameter list
        self.flat = flat              # (flat set, start, stop) or None: per-parameter gradients


def _flatten_outputs(out, acc):
    if isinstance(out, Tensor):
        acc.append(out)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _flatten_outputs(o, acc)
    elif isinstance(out, dict):
        for o in out.values():
            _flatten_outputs(o, acc)
    return acc


class DistributedDataParallel(Module):
    """Wrap ``module`` (already on this rank's device) for data-parallel training; PyTorch's arguments.
    ``device_ids``: None for a cpu module, ``[i]`` (or ``["cuda:i"]``) for one on GPU i.
    ``bucket_cap_mb``: bucket size.  ``find_unused_parameters``: walk each forward's graph and treat parameters
    it does not reach as ready (zero gradient where another rank used them).  ``comm_stream`` (minidnn's, NCCL):
    the bucket all-reduces run on a communication stream that forks from the current stream when a bucket is
    ready and joins it when the last bucket is launched, so the GPU computes the rest of backward meanwhile;
    False keeps them on the current stream."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True, process_group=None,
                 bucket_cap_mb=25, find_unused_parameters=False, check_reduction=False, gradient_as_bucket_view=False,
                 static_graph=False, comm_stream=True):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("DistributedDataParallel: the default process group has not been initialized; call "
                               "minidnn.distributed.init_process_group(...) first")
        if process_group is not None:
            raise NotImplementedError("DistributedDataParallel: only the default process group exists "
                                      "(process_group=None)")
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: expected a Module, got {type(module).__name__}")
        if not bucket_cap_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb}")
        params = list(module.parameters())
        trainable = [p for p in params if p.requires_grad]
        if not trainable:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter that "
                               "requires a gradient")
        devices = sorted({str(p.device) for p in params})
        if len(devices) > 1:
            raise ValueError(f"DistributedDataParallel: the module's parameters are on several devices {devices}; "
                             "one process drives one device")
        self.device = _dev.device(devices[0])
        if device_ids is not None:
            if self.device.type == "cpu":
                raise ValueError(f"DistributedDataParallel: device_ids must be None for a module on the cpu, got "
                                 f"{device_ids}")
            if len(device_ids) != 1:
                raise ValueError(f"DistributedDataParallel: device_ids must hold this process's single device, got "
                                 f"{device_ids}")
            want = _dev.device(device_ids[0])
            if want != self.device:
                raise ValueError(f"DistributedDataParallel: device_ids={device_ids} but the module's parameters are on "
                                 f"{self.device}; move the module with .to('{want}') first")
        if dist.get_backend() == "nccl" and self.device.type != "cuda":
            raise ValueError("DistributedDataParallel: the nccl backend needs the module on a GPU (module.to("
                             "'cuda:LOCAL_RANK')); use init_process_group('cpu') for a cpu module")
        self.module = module
        self.broadcast_buffers = bool(broadcast_buffers)
        self.bucket_cap_bytes = int(bucket_cap_mb * (1 << 20))
        self.find_unused_parameters = bool(find_unused_parameters)
        self.require_backward_grad_sync = True
        self.comm_stream = bool(comm_stream)
        self.world_size = dist.get_world_size()
        self._params = trainable
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._index = {id(p): i for i, p in enumerate(trainable)}
        self._layout_key = None
        self._buckets: list = []
        self._bucket_of = np.zeros(len(trainable), dtype=np.int64)
        self._sync_next_backward = False   # set by a synchronised forward, cleared when its backward is reduced
        self._started = False              # the current backward's first hook ran
        self._ready = np.zeros(len(trainable), dtype=bool)
        self._pending: list = []
        self._launched = 0
        self._unused = None                # (locally unused, globally used) masks of the last forward
        self._verify_and_sync(params)
        me = weakref.ref(self)          # the parameters' hooks must not keep the wrapper alive

        def hook(p):
            ddp = me()
            if ddp is not None:
                ddp._on_grad_ready(p)
        self._grad_hooks = [p.register_post_accumulate_grad_hook(hook) for p in trainable]

    # -- construction --------------------------------------------------------------------------------------------------
    def _verify_and_sync(self, params):
        buffers = [b for b in self.module.buffers()]
        mine = [(tuple(p.shape), str(p.dtype)) for p in params] + [(tuple(b.shape), str(b.dtype)) for b in buffers]
        if self.world_size > 1:
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine)
            for r, theirs in enumerate(everyone):
                if theirs != mine:
                    raise RuntimeError(f"DistributedDataParallel: rank {r}'s module differs from rank "
                                       f"{dist.get_rank()}'s ({len(theirs)} vs {len(mine)} parameters and buffers; "
                                       f"first difference: {_first_difference(theirs, mine)}); every rank must build "
                                       "the same model")
            with _ag.no_grad():
                dist._broadcast_arrays([p.data for p in params] + [b.data for b in buffers], 0)
            for t in params + buffers:
                t._version += 1

    # -- forward -------------------------------------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        if self._started:
            names = [self._names.get(id(p), "?") for p, r in zip(self._params, self._ready) if not r]
            self._started = False
            raise RuntimeError(
                "DistributedDataParallel: expected to have finished reduction in the prior iteration before starting a "
                f"new one: parameters {names[:8]}{' ...' if len(names) > 8 else ''} received no gradient in the last "
                "backward. Pass find_unused_parameters=True if parts of the model are not used in every forward, or "
                "make sure every output takes part in the loss")
        if self.broadcast_buffers and self.world_size > 1:
            bufs = [b for b in self.module.buffers()]
            if bufs:
                with _ag.no_grad():
                    dist._broadcast_arrays([b.data for b in bufs], 0)
                for b in bufs:
                    b._version += 1
        out = self.module(*inputs, **kwargs)
        self._sync_next_backward = _ag.is_grad_enabled() and self.require_backward_grad_sync
        if self._sync_next_backward and self.find_unused_parameters:
            self._find_unused(out)
        return out

    def _find_unused(self, out):
        used = np.zeros(len(self._params), dtype=bool)
        edges = [t._edge() for t in _flatten_outputs(out, [])]
        seen, stack = set(), [e[0] for e in edges if e is not None]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if type(node) is _ag.AccumulateGrad:
                i = self._index.get(id(node.variable))
                if i is not None:
                    used[i] = True
                continue
            stack.extend(e[0] for e in node.next_edges if e is not None)
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, np.packbits(used).tobytes())
        global_used = np.zeros(len(self._params), dtype=bool)
        for packed in everyone:
            global_used |= np.unpackbits(np.frombuffer(packed, dtype=np.uint8))[:len(self._params)].astype(bool)
        self._unused = (~used, global_used)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, forwards are not synchronised: their backward leaves the gradients local (accumulated);
        the first synchronised backward after it averages the accumulated sums."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # -- buckets -------------------------------------------------------------------------------------------------------
    def _refresh_layout(self):
        owners = [owner_of(p) for p in self._params]
        key = tuple(None if o is None else (id(o[0]), o[1]) for o in owners)
        if key == self._layout_key:
            return
        module_params = {id(p) for p in self.module.parameters()}
        buckets, loose, sets = [], [], {}
        for i, o in enumerate(owners):
            if o is None:
                loose.append(i)
            else:
                sets.setdefault(id(o[0]), (o[0], {}))[1][o[1]] = i
        for fs, members in sets.values():
            if any(id(q) not in module_params for q in fs.params):
                loose += list(members.values())     # the flat set holds another model's parameters too
                continue
            item = fs.grad.dtype.itemsize
            start, group, n = 0, [], len(fs.params)
            for j in range(n):
                if j in members:
                    group.append(members[j])
                stop = fs.offsets[j + 1] if j + 1 < n else fs.total
                if (stop - fs.offsets[start]) * item >= self.bucket_cap_bytes or j + 1 == n:
                    if group:
                        buckets.append(_Bucket(group, (fs, fs.offsets[start], stop)))
                    start, group = j + 1, []
        group, size = [], 0
        for i in sorted(loose):
            group.append(i)
            size += self._params[i].nbytes
            if size >= self.bucket_cap_bytes:
                buckets.append(_Bucket(group))
                group, size = [], 0
        if group:
            buckets.append(_Bucket(group))
        for b, bucket in enumerate(buckets):
            self._bucket_of[bucket.members] = b
        self._buckets, self._layout_key = buckets, key

    @property
    def bucket_layout(self):
        """Per bucket: ("flat", start, stop, parameter names) or ("params", parameter names) (for tests/debugging)."""
        self._refresh_layout()
        out = []
        for b in self._buckets:
            names = [self._names.get(id(self._params[i]), "?") for i in b.members]
            out.append(("flat", b.flat[1], b.flat[2], names) if b.flat else ("params", names))
        return out

    # -- backward ------------------------------------------------------------------------------------------------------
    def _on_grad_ready(self, p):
        if not self._sync_next_backward:
            return
        if not self._started:
            self._start_backward()
        i = self._index[id(p)]
        if self._ready[i]:
            raise RuntimeError(f"DistributedDataParallel: parameter {self._names.get(id(p), i)} received a gradient "
                               "twice in one backward (a second backward through the same forward, or reentrant "
                               "backward): DistributedDataParallel reduces each parameter once per forward")
        self._mark_ready(i)

    def _start_backward(self):
        self._refresh_layout()
        self._started = True
        self._ready[:] = False
        self._launched = 0
        self._pending = [len(b.members) for b in self._buckets]
        if self._unused is not None:
            locally_unused, globally_used = self._unused
            self._unused = None
            for i in np.flatnonzero(locally_unused):
                if globally_used[i]:
                    self._zero_grad_for(int(i))
                self._mark_ready(int(i))

    def _zero_grad_for(self, i):
        """A parameter this rank did not use but another did: it contributes a zero gradient."""
        p = self._params[i]
        o = owner_of(p)
        if o is not None and self._buckets[self._bucket_of[i]].flat is not None:
            gv = o[0].grad_views[o[1]]
            gv[...] = 0
            p.grad = p._wrap_like(gv)
        else:
            p.grad = p._wrap_like(_dev.array_module(p.data).zeros_like(p.data))

    def _mark_ready(self, i):
        self._ready[i] = True
        b = int(self._bucket_of[i])
        self._pending[b] -= 1
        # Every rank must issue the same collectives in the same order, whatever order its backward produced the
        # gradients in (find_unused_parameters marks some ready early): buckets go strictly last-to-first, a ready
        # bucket waiting for its turn (PyTorch's reducer does the same).
        n = len(self._buckets)
        while self._launched < n and self._pending[n - 1 - self._launched] == 0:
            b = n - 1 - self._launched
            self._reduce(b, self._buckets[b])
            self._launched += 1
        if self._launched == n:
            if self.comm_stream:
                dist._join_side_stream()       # the optimizer (queued next) sees the averaged gradients
            self._started = False
            self._sync_next_backward = False

    def _reduce(self, index, bucket):
        params = [self._params[i] for i in bucket.members]
        if bucket.flat is not None:
            fs, start, stop = bucket.flat
            for p in params:            # a gradient the user replaced moves back into its slot first
                j = owner_of(p)[1]
                gv = fs.grad_views[j]
                if p.grad is not None and p.grad.data is not gv:
                    gv[...] = _dev.to_device(p.grad.data, fs.device)
                    p.grad = p._wrap_like(gv)
            dist._all_reduce_arrays([fs.grad[start:stop]], dist.ReduceOp.AVG, tag=f"DDP bucket {index}",
                                    side_stream=self.comm_stream)
            return
        arrays, owners = [], []
        for p in params:
            g = p.grad
            if g is None:           # globally unused (find_unused_parameters): nothing to average
                continue
            if g.requires_grad or g.grad_fn is not None:
                g = p.grad = g.detach()
            data = g.data
            if not data.flags.c_contiguous or not getattr(data.flags, "writeable", True):
                data = _dev.array_module(data).ascontiguousarray(data).copy()
                p.grad = p._wrap_like(data)
            arrays.append(data)
            owners.append(p)
        if arrays:
            dist._all_reduce_arrays(arrays, dist.ReduceOp.AVG, tag=f"DDP bucket {index}", side_stream=self.comm_stream)
            for p in owners:
                p.grad._version += 1

    def extra_repr(self):
        return f"world_size={self.world_size}, broadcast_buffers={self.broadcast_buffers}"


def _first_difference(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"entry {k}: {x} vs {y}"
    return f"lengths {len(a)} vs {len(b)}"
