"""Host (Python) time of a training step, minidnn beside PyTorch, on tiny CPU shapes; optionally broken down.

The eager GPU step is host-bound (docs/host_overhead.md): the time between kernel launches is Python that also runs
on the CPU path (argument checks, descriptors, problem validation, algorithm lookup, Function.apply, the backward
engine, module calls, the optimizer).  With batch 2 and 8x8 images the NumPy compute is a small part of a CPU step,
so the step time here is mostly that host code.  One step = forward, cross-entropy, zero_grad, backward,
SGD(momentum 0.9) step, as in bench/train_step.py (same models, same PyTorch twins).

``--breakdown`` wraps the framework's functions with a timer that charges each call's *own* time (its time minus
the wrapped calls it made) to a category: the module calls, the functional layer, Function.apply, the backend
primitives (the convolution's dispatch apart from its NumPy compute), the backward engine, the optimizer...
The timer adds about 0.3 µs per wrapped call; the table says the instrumented total beside the plain one.

    python bench/host_overhead.py [--models lenet5,resnet20,mobilenet] [--steps 200] [--breakdown] [--device cuda]

On a GPU (``--device cuda``) the kernels run asynchronously: the step is timed to a synchronize, and the breakdown's
categories are host time, the CuPy launches and allocations of each layer included.
"""
from __future__ import annotations

import argparse
import collections
import gc
import inspect
import os
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(__file__))
from train_step import make_step as _make_step  # noqa: E402
from train_step import torch, torch_models  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402

CONFIGS = {     # name: (constructor call, input shape per image); batch 2
    "lenet5": ("LeNet5(num_classes=10, in_channels=1, input_size=8)", (1, 8, 8)),
    "resnet20": ("resnet20(num_classes=10)", (3, 8, 8)),
    "mobilenet": ("MobileNetSmall(num_classes=10, in_channels=3)", (3, 8, 8)),
}
BATCH = 2


def make_step(lib, models, name, device="cpu"):
    """(step, optimizer) of model ``name`` at batch BATCH on tiny images (train_step.make_step)."""
    ctor, shape = CONFIGS[name]
    step, _, opt = _make_step(lib, models, ctor, shape, BATCH, device)
    return step, opt


def time_step(step, steps, rounds=5, sync=None):
    """The fastest of ``rounds`` medians of ``steps`` steps, in ms of this process's CPU time (the machine is
    shared: CPU time leaves out the time the process waited for a core, and the minimum of medians is the least
    disturbed figure).  Single-threaded on both sides, so CPU time is the host time of the step."""
    for _ in range(20):
        step()
    medians = []
    clock = time.process_time if sync is None else time.perf_counter      # a GPU: wall time to a synchronize
    for _ in range(rounds):
        times = []
        gc.collect()
        for _ in range(max(1, steps // rounds)):
            t0 = clock()
            step()
            if sync is not None:
                sync()
            times.append(clock() - t0)
        medians.append(statistics.median(times) * 1e3)
    return min(medians)


# ---- the breakdown ------------------------------------------------------------------------------------------

class Timer:
    """Own-time accounting: each wrapped call charges (its time - its wrapped callees' time) to its category."""

    def __init__(self):
        self.own = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)
        self.stack = []

    def wrap(self, category, fn):
        stack, own, calls, clock = self.stack, self.own, self.calls, time.perf_counter

        def timed(*args, **kwargs):
            frame = [0.0]
            stack.append(frame)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                stack.pop()
                own[category] += dt - frame[0]
                calls[category] += 1
                if stack:
                    stack[-1][0] += dt
        timed.__wrapped_by_timer__ = fn
        return timed


_COMPUTE_MODULES = ("conv_cpu", "conv_gemm", "conv_algorithms", "conv_fused", "pooling_cpu")


def _public(mod, qual):
    """Whether ``qual`` is a public name of module ``mod`` (its __all__), or a method of a public class."""
    module = sys.modules.get(mod)
    names = getattr(module, "__all__", None)
    return names is None or qual.split(".", 1)[0] in names


def _category(fn):
    """The category of a framework function, from where it is defined; None: not wrapped (its time is its
    caller's).  Only public functions are wrapped, so small helpers do not pay the timer's cost."""
    mod = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", "")
    if "<" in qual:
        return None
    if mod == "minidnn.autograd":
        return {"Function.apply": "autograd: Function.apply", "FunctionCtx.backward": "autograd: FunctionCtx.backward",
                "_run_backward": "autograd: backward engine", "AccumulateGrad.accumulate": "autograd: accumulate grad",
                "backward": "autograd: backward engine"}.get(qual)
    if mod.startswith(("minidnn.nn._functions", "minidnn.nn.functional")):
        if qual.endswith((".forward", ".backward")):
            return "nn Function bodies (forward/backward)"
        if qual == "handle_for":
            return "handle lookup"
        return "nn functional (checks, descriptors)" if _public(mod, qual) and "." not in qual else None
    if mod.startswith("minidnn.ops"):
        if qual.endswith(".backward"):
            return "tensor ops (add, reshape, sum, ...)"
        return "tensor ops (add, reshape, sum, ...)" if _public(mod, qual) and "." not in qual else None
    if mod.startswith("minidnn.backend"):
        family = mod.rsplit(".", 1)[-1]
        if family in _COMPUTE_MODULES or mod.startswith("minidnn.backend.cuda") or "." in qual \
                or not _public(mod, qual) or family in ("devices", "handle", "layout", "_common"):
            return None
        if family in ("convolution", "conv_problem"):
            return "backend: convolution dispatch"
        return {"normalization": "backend: batch norm", "pooling": "backend: pooling",
                "activation": "backend: activation", "softmax": "backend: softmax, cross-entropy"}.get(
                    family, "backend: other")
    if mod.startswith("minidnn.optim"):
        return "optimizer" if qual.endswith((".step", ".zero_grad")) else None
    if mod.startswith(("minidnn.nn.module", "minidnn.nn.layers", "minidnn.nn.containers", "minidnn.models")):
        if qual.endswith((".forward", ".__call__", "._call_forward")):
            return "module __call__ + layer forward"
    return None


def instrument(opt):
    """Wrap the framework's functions (module namespaces, class dicts, the conv algorithms' run functions);
    returns the Timer."""
    timer = Timer()
    wrapped = {}

    def wrapper_for(fn, category):
        w = wrapped.get(id(fn))
        if w is None:
            w = wrapped[id(fn)] = (fn, timer.wrap(category, fn))
        return w[1]

    def visit_namespace(ns, setter, in_class=False):
        for name, value in list(ns.items()):
            if name.startswith("__") and name not in ("__call__", "__add__", "__radd__", "__mul__", "__rmul__",
                                                      "__sub__", "__truediv__", "__getitem__", "__neg__"):
                continue
            raw = value
            kind = None
            if in_class and isinstance(value, staticmethod):
                raw, kind = value.__func__, staticmethod
            elif in_class and isinstance(value, classmethod):
                raw, kind = value.__func__, classmethod
            if not isinstance(raw, types.FunctionType) or hasattr(raw, "__wrapped_by_timer__"):
                continue
            category = _category(raw)
            if category is None:
                continue
            w = wrapper_for(raw, category)
            setter(name, kind(w) if kind else w)

    modules = [m for name, m in sorted(sys.modules.items()) if name.startswith("minidnn") and m is not None]
    for m in modules:
        visit_namespace(vars(m), lambda n, v, m=m: setattr(m, n, v))
        for cls in list(vars(m).values()):
            if inspect.isclass(cls) and (cls.__module__ or "").startswith("minidnn") and cls.__module__ == m.__name__:
                visit_namespace(dict(vars(cls)), lambda n, v, cls=cls: setattr(cls, n, v), in_class=True)
    # Tensor's bound methods (ops bound onto the class)
    visit_namespace(dict(vars(mdn.Tensor)), lambda n, v: setattr(mdn.Tensor, n, v), in_class=True)
    # The convolution algorithms' compute (reference and fast forms): NumPy work, apart from the dispatch.
    from minidnn.backend import conv_algorithms as algorithms
    compute = "backend: convolution compute (NumPy)"
    for registry in (algorithms.FORWARD_ALGORITHMS, algorithms.BACKWARD_DATA_ALGORITHMS,
                     algorithms.BACKWARD_FILTER_ALGORITHMS):
        for alg in registry:
            if alg._run is not None:
                alg._run = timer.wrap(compute, alg._run)
            alg.fast_paths = [(d, applies, timer.wrap(compute, run)) for d, applies, run in alg.fast_paths]
    opt.step = timer.wrap("optimizer", opt.step)
    opt.zero_grad = timer.wrap("optimizer", opt.zero_grad)
    return timer


def breakdown(name, steps, device="cpu"):
    """{category: µs per step} and the instrumented step time (ms).  On a GPU the kernels run asynchronously, so
    each category's time is its host time (the launches included) as long as the GPU keeps up."""
    step, opt = make_step(mdn, vars(minidnn.models), name, device)
    timer = instrument(opt)
    root = timer.wrap("other (step glue, untracked)", step)
    for _ in range(20):
        root()
    timer.own.clear()
    timer.calls.clear()
    t0 = time.perf_counter()
    for _ in range(steps):
        root()
    total = (time.perf_counter() - t0) / steps * 1e3
    return {k: (v / steps * 1e6, timer.calls[k] / steps) for k, v in timer.own.items()}, total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lenet5,resnet20,mobilenet")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="cpu", help="cpu (CPU time per step) or cuda (wall time to a synchronize)")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--breakdown-only", help=argparse.SUPPRESS)     # one model's breakdown (a fresh process each)
    args = ap.parse_args(argv)
    if args.breakdown_only:
        return print_breakdown(args.breakdown_only, args.steps, args.device)
    names = args.models.split(",")
    gpu = args.device != "cpu"
    twins = torch_models() if torch is not None else None
    mdn.set_num_threads(1)
    if torch is not None:
        torch.set_num_threads(1)
    clock = "wall time to a synchronize" if gpu else "CPU time"
    print(f"host time per training step, {args.device}, batch {BATCH}, 8x8 images, one thread (ms of {clock}, "
          "fastest median of 5 rounds)")
    print(f"{'model':10} {'minidnn':>9} {'torch':>9} {'ratio':>7}")
    for name in names:
        m = time_step(make_step(mdn, vars(minidnn.models), name, args.device)[0], args.steps,
                      sync=mdn.cuda.synchronize if gpu else None)
        t = time_step(make_step(torch, twins, name, args.device)[0], args.steps,
                      sync=torch.cuda.synchronize if gpu else None) if twins else None
        ratio = f"{m / t:6.2f}x" if t else "   n/a"
        print(f"{name:10} {m:9.3f} {t if t else float('nan'):9.3f} {ratio}")
    if args.breakdown:      # wrapping is for good: one process per model
        for name in names:
            subprocess.run([sys.executable, __file__, "--breakdown-only", name, "--steps", str(args.steps),
                            "--device", args.device], check=True)


def print_breakdown(name, steps, device="cpu"):
    rows, total = breakdown(name, steps, device)
    print(f"\n{name}: own time per step by category (instrumented step {total:.3f} ms, {device})")
    print(f"{'category':45} {'µs/step':>9} {'calls/step':>10} {'µs/call':>8}")
    for cat, (us, calls) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        print(f"{cat:45} {us:9.1f} {calls:10.1f} {us / max(calls, 1):8.2f}")


if __name__ == "__main__":
    main()
