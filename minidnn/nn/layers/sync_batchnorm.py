"""SyncBatchNorm: batch normalisation whose statistics are those of the whole global batch (every rank's).

# x: (N, C) or (N, C, *S) on each rank; weight, bias, running_mean, running_var: (C,)
# forward:   one all-reduce of [sum_c x, sum_c x^2, count] (2C + 1 float64 values)   -> mean, var over all ranks
# backward:  one all-reduce of [sum_c dy, sum_c dy (x - mean)] (2C float64 values)   -> the dx of the global batch
#            dweight, dbias stay this rank's (DistributedDataParallel averages them with the other gradients)

With the loss of each rank averaged over its own batch and DDP averaging the gradients, the parameters move
exactly as BatchNorm's would on the concatenated batch (tested).  The sums are accumulated in float64, so the
one-pass variance E[x^2] - E[x]^2 keeps float32 accuracy.  Outside training, or without a process group of more
than one rank, it is BatchNorm.
"""
from __future__ import annotations

import numpy as np

from ... import distributed as dist
from ...autograd import Function
from ...backend.errors import ArgumentError
from .._functions._util import first_order_grads, wrap
from .normalization import _BatchNorm

__all__ = ["SyncBatchNorm"]


def _channel_shape(ndim):
    return (1, -1) + (1,) * (ndim - 2)


class SyncBatchNormFunction(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        a = x.data
        xp = x._xp()
        c = a.shape[1]
        axes = (0,) + tuple(range(2, a.ndim))
        stats = xp.empty(2 * c + 1, dtype=np.float64)
        stats[:c] = a.sum(axis=axes, dtype=np.float64)
        stats[c:2 * c] = xp.square(a, dtype=np.float64).sum(axis=axes)
        stats[2 * c] = a.size // c
        dist._all_reduce_arrays([stats], dist.ReduceOp.SUM, tag="SyncBatchNorm forward")
        n = stats[2 * c]
        mean = stats[:c] / n
        var = xp.maximum(stats[c:2 * c] / n - mean * mean, 0.0)
        inv_std = 1.0 / xp.sqrt(var + eps)
        if running_mean is not None:
            rm, rv = running_mean.data, running_var.data
            rm[...] = ((1.0 - momentum) * rm + momentum * mean).astype(rm.dtype)
            rv[...] = ((1.0 - momentum) * rv + momentum * var * n / xp.maximum(n - 1.0, 1.0)).astype(rv.dtype)
            running_mean._version += 1
            running_var._version += 1
        scale = inv_std if weight is None else inv_std * weight.data
        shift = -mean * scale if bias is None else bias.data - mean * scale
        shape = _channel_shape(a.ndim)
        y = a * scale.astype(a.dtype).reshape(shape) + shift.astype(a.dtype).reshape(shape)
        ctx.stats = (mean, inv_std, n)
        ctx.save_for_backward(x, weight)
        return wrap(y)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        mean, inv_std, n = ctx.stats
        a, dy = x.data, gy.data
        xp = x._xp()
        c = a.shape[1]
        axes = (0,) + tuple(range(2, a.ndim))
        shape = _channel_shape(a.ndim)
        xmu = a - mean.astype(a.dtype).reshape(shape)
        sums = xp.empty(2 * c, dtype=np.float64)
        sums[:c] = dy.sum(axis=axes, dtype=np.float64)
        sums[c:] = (dy * xmu).sum(axis=axes, dtype=np.float64)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dw = (sums[c:] * inv_std).astype(a.dtype) if need_w and weight is not None else None
        db = sums[:c].astype(a.dtype) if need_b else None
        dx = None
        if need_x:
            # this rank's sums -> the global batch's
            dist._all_reduce_arrays([sums], dist.ReduceOp.SUM, tag="SyncBatchNorm backward")
            mean_dy, mean_dy_xmu = sums[:c] / n, sums[c:] / n
            w = inv_std if weight is None else inv_std * weight.data
            k = (inv_std * inv_std * mean_dy_xmu).astype(a.dtype).reshape(shape)
            dx = (dy - mean_dy.astype(a.dtype).reshape(shape) - xmu * k) * w.astype(a.dtype).reshape(shape)
        dx, dw, db = first_order_grads("sync_batch_norm", [dx, dw, db], gy, x, weight)
        return dx, dw, db, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """PyTorch's SyncBatchNorm: BatchNorm over (N, C, *) whose training statistics span every rank's batch."""

    _dims = (2, 3, 4, 5)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None):
        if process_group is not None:
            raise NotImplementedError("SyncBatchNorm: only the default process group exists (process_group=None)")
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def forward(self, input):
        if input.ndim < 2:
            raise ArgumentError(f"SyncBatchNorm: expected at least 2D input (got {input.ndim}D input of shape "
                                f"{tuple(input.shape)})")
        if input.shape[1] != self.num_features:
            raise ArgumentError(f"SyncBatchNorm: input has {input.shape[1]} channels (shape {tuple(input.shape)}) but "
                                f"the layer was built for num_features={self.num_features}")
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        if not (use_batch_stats and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        tracking = self.training and self.track_running_stats and self.num_batches_tracked is not None
        if tracking and self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked.item() + 1)
        out = SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean if tracking else None,
                                          self.running_var if tracking else None, float(factor), float(self.eps))
        if tracking:
            self.num_batches_tracked.add_(1)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """``module`` with every BatchNorm*d replaced by a SyncBatchNorm sharing its parameters and buffers."""
        if process_group is not None:
            raise NotImplementedError("convert_sync_batchnorm: only the default process group exists")
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
            for name in ("weight", "bias"):
                out.register_parameter(name, getattr(module, name))
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                out.register_buffer(name, getattr(module, name))
            out.train(module.training)
        for name, child in list(module._modules.items()):
            if child is not None:
                converted = cls.convert_sync_batchnorm(child)
                if converted is not child:
                    out.add_module(name, converted)
        return out
