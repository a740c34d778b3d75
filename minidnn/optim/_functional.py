"""The optimizer updates on raw arrays: one readable per-tensor reference and one fused flat-buffer version.

PyTorch's pattern: the optimizer gathers what a step needs and dispatches to
    _single_tensor_sgd / _single_tensor_adam    lists of per-parameter arrays, a plain loop (the reference);
    _fused_sgd / _fused_adam                    FlatParams sets (see _flat.py): one update per set.
Both take the same keyword hyperparameters.  The fused CPU update calls the SAME elementwise core
(`_sgd_update_` / `_adam_update_`) on whole flat slices, so the two agree op for op; the CUDA kernels in
backend/cuda/multi_tensor.py repeat that op order (without FMA contraction).

Every core updates in place with ufunc ``out=`` arguments and at most two scratch arrays.
"""
from __future__ import annotations

from ..backend import devices as _dev

__all__ = ["_single_tensor_sgd", "_fused_sgd", "_single_tensor_adam", "_fused_adam"]


def _cuda_kernels():
    mt = _MULTI_TENSOR[0]
    if mt is None:      # imported on first use (not at import: the CPU never needs it); then one list read a call
        from ..backend.cuda import multi_tensor as mt
        _MULTI_TENSOR[0] = mt
    return mt


_MULTI_TENSOR = [None]


def _uses_kernel(fs):
    return fs.device.type == "cuda" and _cuda_kernels().supports(fs.dtype)


def _grad_piece(fs, a, b):
    """The gradient slice the update reads: as stored, or (master weights) widened to the float32 master's dtype."""
    g = fs.grad[a:b]
    return g.astype(fs.dtype) if g.dtype != fs.dtype else g


def _skip_for_overflow(fs, found_inf):
    """The xp-generic update's overflow check (a host read: free on the CPU; on a GPU only the rare float64 path
    without a kernel pays this sync)."""
    return found_inf is not None and float(found_inf[0]) != 0.0


_CPU_CHUNK = 1 << 15     # elements per pass on the CPU: the ~10 operands of one chunk stay in L2


def _pieces(fs):
    """(start, stop, first_param) of the xp-generic flat update: the runs of parameters with a gradient and one
    step count, cut into cache-sized chunks on the CPU (whole runs on a GPU: each ufunc is a launch there)."""
    chunk = _CPU_CHUNK if fs.device.type == "cpu" else fs.total
    for a, b, j, _ in fs.runs():
        for start in range(a, b, chunk):
            yield start, min(start + chunk, b), j


def _scratch(fs, a, b):
    return [s[:b - a] for s in fs.scratch(2, min(fs.total, _CPU_CHUNK) if fs.device.type == "cpu" else fs.total)]


# ------------------------------------------------------------------------------------------------------------
# SGD
# ------------------------------------------------------------------------------------------------------------
def _sgd_update_(p, g, buf, first, scratch, *, lr, momentum, dampening, weight_decay, nesterov, maximize):
    """p -= lr * d, d = (-)g (+ wd p), through the momentum buffer: PyTorch's SGD on arrays, in place."""
    xp = _dev.array_module(p)
    s1, s2 = scratch
    d = g
    if maximize:
        d = xp.negative(d, out=s1)
    if weight_decay != 0:
        d = xp.add(d, xp.multiply(p, weight_decay, out=s2), out=s1)
    if momentum != 0:
        if first:
            buf[...] = d                       # the first buffer is the gradient itself: no dampening
        else:
            buf *= momentum
            buf += d if dampening == 0 else xp.multiply(d, 1 - dampening, out=s2)
        d = xp.add(d, xp.multiply(buf, momentum, out=s2), out=s1) if nesterov else buf
    p += xp.multiply(d, -lr, out=s2)


def _single_tensor_sgd(params, grads, momentum_buffers, *, lr, momentum, dampening, weight_decay, nesterov,
                       maximize):
    """``momentum_buffers[i]`` None: allocated here (and the caller keeps it) on the first step."""
    for i, p in enumerate(params):
        xp = _dev.array_module(p)
        first = momentum != 0 and momentum_buffers[i] is None
        if first:
            momentum_buffers[i] = xp.empty_like(p)
        scratch = (xp.empty_like(p), xp.empty_like(p))
        _sgd_update_(p, grads[i], momentum_buffers[i], first, scratch, lr=lr, momentum=momentum,
                     dampening=dampening, weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)


def _fused_sgd(flat_sets, *, lr, momentum, dampening, weight_decay, nesterov, maximize, scale=None, found_inf=None):
    """One update per flat set: one CUDA launch, or (CPU) one vectorised pass in cache-sized chunks.
    ``found_inf`` (GradScaler): a non-zero value skips the step (decided on the device by the kernel); with
    ``scale`` the kernel also checks and unscales the gradients itself.  Returns the number of updates."""
    launches = 0
    for fs in flat_sets:
        buf = fs.state_buffer("momentum_buffer") if momentum != 0 else None
        kernel = _uses_kernel(fs)       # (asked once a set: its device and dtype do not change within the step)
        if kernel:
            mt = _cuda_kernels()
            hyper = fs.device_hyper((lr, momentum, dampening, weight_decay))
            mask = () if fs.uniform() else fs.device_mask(mt.vector_width(fs.dtype))
            mt.sgd_flat_step(fs.param, fs.grad, buf, hyper, fs.steps, fs.device_ticket(), *mask,
                             nesterov=nesterov, maximize=maximize, scale=scale, found_inf=found_inf,
                             p_lowp=fs.param_lowp)
        elif _skip_for_overflow(fs, found_inf):
            continue
        else:
            for a, b, j in _pieces(fs):
                _sgd_update_(fs.param[a:b], _grad_piece(fs, a, b), None if buf is None else buf[a:b],
                             fs.steps_host[j] == 0, _scratch(fs, a, b), lr=lr, momentum=momentum,
                             dampening=dampening, weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
                fs.sync_lowp(a, b)
        launches += 1
        fs.advance_steps(on_device=not kernel)
    return launches


# ------------------------------------------------------------------------------------------------------------
# Adam / AdamW
# ------------------------------------------------------------------------------------------------------------
def _adam_update_(p, g, m, v, vmax, step, scratch, *, lr, beta1, beta2, eps, weight_decay, maximize,
                  decoupled_weight_decay):
    """PyTorch's Adam (non-capturable single-tensor form) on arrays, in place; ``step`` is already advanced."""
    xp = _dev.array_module(p)
    s1, s2 = scratch
    if maximize:
        g = xp.negative(g, out=s1)
    if weight_decay != 0:
        if decoupled_weight_decay:
            p *= 1 - lr * weight_decay
        else:
            g = xp.add(g, xp.multiply(p, weight_decay, out=s2), out=s1)
    m += xp.multiply(xp.subtract(g, m, out=s2), 1 - beta1, out=s2)          # m.lerp_(g, 1 - beta1)
    v *= beta2
    v += xp.multiply(xp.multiply(g, g, out=s2), 1 - beta2, out=s2)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
    if vmax is not None:
        xp.maximum(vmax, v, out=vmax)
        v = vmax
    denom = xp.sqrt(v, out=s2)
    denom /= bias_correction2_sqrt
    denom += eps
    p += xp.multiply(xp.divide(m, denom, out=s2), -(lr / bias_correction1), out=s2)


def _single_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, amsgrad, lr, beta1,
                        beta2, eps, weight_decay, maximize, decoupled_weight_decay):
    """``state_steps``: 0-d float32 arrays, advanced here before use (as PyTorch does)."""
    for i, p in enumerate(params):
        xp = _dev.array_module(p)
        state_steps[i] += 1
        _adam_update_(p, grads[i], exp_avgs[i], exp_avg_sqs[i], max_exp_avg_sqs[i] if amsgrad else None,
                      float(state_steps[i]), (xp.empty_like(p), xp.empty_like(p)), lr=lr, beta1=beta1, beta2=beta2,
                      eps=eps, weight_decay=weight_decay, maximize=maximize,
                      decoupled_weight_decay=decoupled_weight_decay)


def _fused_adam(flat_sets, *, amsgrad, lr, beta1, beta2, eps, weight_decay, maximize, decoupled_weight_decay,
                scale=None, found_inf=None):
    """One update per flat set: one CUDA launch, or (CPU) one vectorised pass in cache-sized chunks.
    ``scale``/``found_inf`` as in _fused_sgd.  Returns the number of updates (= flat sets)."""
    launches = 0
    for fs in flat_sets:
        m, v = fs.state_buffer("exp_avg"), fs.state_buffer("exp_avg_sq")
        vmax = fs.state_buffer("max_exp_avg_sq") if amsgrad else None
        kernel = _uses_kernel(fs)       # (asked once a set, as _fused_sgd)
        if kernel:
            mt = _cuda_kernels()
            hyper = fs.device_hyper((lr, beta1, beta2, eps, weight_decay))
            mask = () if fs.uniform() else fs.device_mask(mt.vector_width(fs.dtype))
            mt.adam_flat_step(fs.param, fs.grad, m, v, vmax, hyper, fs.steps, fs.device_ticket(), *mask,
                              amsgrad=amsgrad, maximize=maximize, decoupled=decoupled_weight_decay, scale=scale,
                              found_inf=found_inf, p_lowp=fs.param_lowp)
        elif _skip_for_overflow(fs, found_inf):
            continue
        else:
            for a, b, j in _pieces(fs):
                _adam_update_(fs.param[a:b], _grad_piece(fs, a, b), m[a:b], v[a:b],
                              None if vmax is None else vmax[a:b], float(fs.steps_host[j] + 1), _scratch(fs, a, b),
                              lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, maximize=maximize,
                              decoupled_weight_decay=decoupled_weight_decay)
                fs.sync_lowp(a, b)
        launches += 1
        fs.advance_steps(on_device=not kernel)
    return launches
