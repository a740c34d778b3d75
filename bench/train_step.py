"""Training-step time of the example models, minidnn beside PyTorch, from one run.

The PyTorch twin of each model is built from the SAME source (minidnn/models.py) with its layer
names bound to torch.nn, so both frameworks train exactly the same architecture (the parameter
counts are checked).  One step = forward, cross-entropy, backward, optimizer step: SGD(momentum 0.9) and
Adam(lr 1e-3), each library's default implementation (minidnn: its fused multi-tensor step; PyTorch: foreach), in
strict fp32 and in TF32 (convolutions and matrix products on both sides) -- every combination from one run.
Reported: median ms per step and the implied time per CIFAR-sized epoch (50,000 images).

    python bench/train_step.py [--device cuda] [--steps 30] [--models lenet5,resnet20,mobilenet]
                               [--optimizers sgd,adam] [--math fp32,tf32] [--tf32] [--micro]

Timing: the two frameworks' steps alternate every 2 steps (``paired_medians``): the device host's speed moved by up
to 1.6x within a minute (session 9, run 3: minidnn alone, no PyTorch in the process, 3.03 then 4.79 ms for the same
MobileNet step), so only steps timed side by side compare.

Kernels per step (GPU): every kernel the step puts on the device, counted for BOTH frameworks by the same tool,
PyTorch's profiler (CUPTI sees every kernel of the process, CuPy's included); beside it, minidnn's own launches
through backend/cuda/launch.py (its CUDA kernels; the rest are CuPy's and cuBLAS's).  ``--micro`` adds a table of
the step kernels of issue 10 (batch norm, pooling, cross-entropy, softmax, ReLU backward) beside PyTorch's ops.
"""
from __future__ import annotations

import argparse
import inspect
import re
import statistics
import time

import minidnn as mdn
import minidnn.models

try:
    import torch
except ImportError:
    torch = None

EPOCH_IMAGES = 50_000
CONFIGS = {     # name: (constructor call, input shape per image, batch size)
    "lenet5": ("LeNet5(num_classes=10, in_channels=1, input_size=32)", (1, 32, 32), 64),
    "resnet20": ("resnet20(num_classes=10)", (3, 32, 32), 128),
    "mobilenet": ("MobileNetSmall(num_classes=10, in_channels=3)", (3, 32, 32), 128),
}


def torch_models():
    """minidnn/models.py executed with its layer names bound to torch.nn: the PyTorch twins."""
    src = inspect.getsource(minidnn.models)
    src = re.sub(r"^from \.nn import \((.|\n)*?\)\n", "", src, flags=re.M)
    src = re.sub(r"^from \.nn import .*\n", "", src, flags=re.M)
    namespace = {name: getattr(torch.nn, name) for name in
                 ("AdaptiveAvgPool2d", "BatchNorm2d", "Conv2d", "Flatten", "Identity", "Linear", "MaxPool2d",
                  "Module", "ReLU", "Sequential")}
    namespace["init"] = torch.nn.init
    exec(compile(src, "models.py (torch twin)", "exec"), namespace)
    return namespace


def set_math(tf32):
    """The same math on both sides (PyTorch's cuDNN convolutions default to TF32: strict fp32 must be asked for);
    PyTorch with cudnn.benchmark (its fastest eager), minidnn with its default algorithm heuristics."""
    mdn.backends.cudnn.allow_tf32 = bool(tf32)
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(tf32)
        torch.backends.cudnn.benchmark = True


def _median_ms(step, sync, steps):
    for _ in range(20):     # 5 left the first model's median 45% high on the H200 (GPU clocks, pools)
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# --pipelined K (0: off): time each turn's K steps with one synchronisation at its end, the median of those turns' ms
# per step -- a training loop that never waits for the GPU, whose next step's host work runs under the previous
# step's device tail -- instead of a synchronisation after every step (the default, and every figure before session
# 12).  Both frameworks are timed the same way either way.
PIPELINED = [0]


def paired_medians(runs, steps, rounds=None, warmup=20, pipelined=None):
    """Median ms per step of each ``(step, sync)`` in ``runs``, timed in alternation: ``rounds`` rounds, each
    timing ``steps // rounds`` steps of every run in turn (the order rotated each round), so that a slow patch of
    the host -- other processes, clocks -- lands on every run alike.  Timed one after the other, the same code's
    eager medians moved by up to 2x between runs on the shared device host; the ratios are what is compared.
    ``rounds`` None: steps // 2 (every run takes 2 steps a turn).  ``pipelined`` K > 0 (None: PIPELINED[0]): turns
    of K steps, each timed whole with one synchronisation at its end (one sample a turn: its ms per step)."""
    pipelined = PIPELINED[0] if pipelined is None else pipelined
    if pipelined:
        rounds = max(1, steps // pipelined)
    rounds = rounds or max(1, steps // 2)
    for step, sync in runs:
        for _ in range(warmup):     # 5 left the first model's median 45% high on the H200 (GPU clocks, pools)
            step()
        sync()
    times = [[] for _ in runs]
    per = pipelined or max(1, steps // rounds)
    for r in range(rounds):
        order = list(range(len(runs)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            step, sync = runs[i]
            sync()
            if pipelined:
                t0 = time.perf_counter()
                for _ in range(per):
                    step()
                sync()
                times[i].append((time.perf_counter() - t0) * 1e3 / per)
                continue
            for _ in range(per):
                t0 = time.perf_counter()
                step()
                sync()
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def make_step(lib, models, ctor, shape, batch, device, optimizer="sgd"):
    """(step, model, optimizer): one training step (SGD with momentum, or Adam) of the model ``ctor`` builds from
    the namespace ``models`` (that library's model classes) on a fixed random batch; ``lib`` is minidnn or torch
    (the same API here).  Shared by the benchmarks that time steps (train_step.py, host_overhead.py)."""
    lib.manual_seed(0)
    model = eval(ctor, models).to(device)
    opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if optimizer == "sgd" else \
        lib.optim.Adam(model.parameters(), lr=1e-3)
    x = lib.randn(batch, *shape, device=device)
    y = lib.randint(0, 10, (batch,), device=device)
    cross_entropy = lib.nn.functional.cross_entropy

    def step():
        loss = cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step, model, opt


def bench_pair(twins, ctor, shape, batch, device, steps, optimizer="sgd"):
    """minidnn's and PyTorch's (ms, parameter count, kernel counts) for one model, the steps timed in alternation
    (``paired_medians``); PyTorch's entry is (None, None, (None, None)) where ``twins`` is None."""
    libs = [(mdn, vars(minidnn.models))] + ([(torch, twins)] if twins is not None else [])
    built = []
    for lib, models in libs:
        step, model, _ = make_step(lib, models, ctor, shape, batch, device, optimizer)
        sync = lib.cuda.synchronize if device != "cpu" else (lambda: None)
        built.append((lib, step, sync, sum(p.numel() for p in model.parameters())))
    medians = paired_medians([(step, sync) for _, step, sync, _ in built], steps)
    out = [(ms, n, kernels_per_step(lib, step, sync) if device != "cpu" else (None, None))
           for ms, (lib, step, sync, n) in zip(medians, built)]
    return out[0], (out[1] if len(out) > 1 else (None, None, (None, None)))


def kernels_per_step(lib, step, sync, steps=3):
    """(device kernels per step from PyTorch's profiler or None, minidnn's launch.py launches per step or None)."""
    own = None
    if lib is mdn:
        from minidnn.backend.cuda import launch
        sync()
        start = launch.launch_count()
        for _ in range(steps):
            step()
        sync()
        own = (launch.launch_count() - start) / steps
    total = None
    if torch is not None and torch.cuda.is_available():
        try:
            from torch.profiler import ProfilerActivity, profile
            sync()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    step()
                sync()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                       and not e.name.lower().startswith(("memcpy", "memset"))]
            total = len(kernels) / steps
        except Exception as exc:        # no CUPTI on this machine: say so, keep the timings
            print(f"(kernel count unavailable: {type(exc).__name__}: {exc})")
    return total, own


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if mdn.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--models", default=",".join(CONFIGS))
    ap.add_argument("--batch-size", type=int, default=None, help="override every model's batch size")
    ap.add_argument("--micro", action="store_true", help="also time the step kernels beside PyTorch's ops")
    ap.add_argument("--micro-only", action="store_true", help="only the kernel table")
    ap.add_argument("--tf32", action="store_true", help="TF32 only (same as --math tf32)")
    ap.add_argument("--math", default="fp32,tf32", help="strict fp32 and/or TF32 (fp32,tf32)")
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--pipelined", type=int, default=0, metavar="K",
                    help="time turns of K steps with one synchronisation each (default 0: one after every step)")
    args = ap.parse_args(argv)
    PIPELINED[0] = args.pipelined
    maths = ["tf32"] if args.tf32 else ["fp32"] if args.device == "cpu" else args.math.split(",")
    if args.micro_only:
        set_math(False)
        micro(args.device)
        return
    use_torch = torch is not None and (args.device == "cpu" or torch.cuda.is_available())
    twins = torch_models() if use_torch else None
    rows = []
    for math_ in maths:
        set_math(math_ == "tf32")
        for opt in args.optimizers.split(","):
            for name in args.models.split(","):
                ctor, shape, batch = CONFIGS[name]
                batch = args.batch_size or batch
                (m_ms, m_params, m_counts), (t_ms, t_params, t_counts) = bench_pair(twins, ctor, shape, batch,
                                                                                      args.device, args.steps, opt)
                if use_torch:
                    assert t_params == m_params, f"{name}: the twins differ ({m_params} vs {t_params} parameters)"
                rows.append((name, opt, math_, batch, m_params, m_ms, t_ms, m_counts, t_counts))
    timing = (f"median of {args.steps} (the two frameworks' steps alternating every 2 steps)" if not args.pipelined
              else f"{args.steps} steps in turns of {args.pipelined} alternating between the frameworks, one "
              "synchronisation a turn: the median turn's ms per step")
    print(f"training step (fwd + loss + bwd + optimizer step), {args.device}, the same math on both sides, torch "
          f"cudnn.benchmark, {timing}")
    print(f"{'model':10} {'opt':>4} {'math':>5} {'batch':>5} {'params':>8} {'minidnn ms':>11} {'torch ms':>9} "
          f"{'ratio':>6} {'minidnn s/epoch':>16} {'torch s/epoch':>14}")
    for name, opt, math_, batch, params, m_ms, t_ms, _, _ in rows:
        per_epoch = EPOCH_IMAGES / batch / 1e3
        t_cols = (f"{t_ms:9.2f} {m_ms / t_ms:5.2f}x {m_ms * per_epoch:16.1f} {t_ms * per_epoch:14.1f}" if t_ms
                  else f"{'n/a':>9} {'':>6} {m_ms * per_epoch:16.1f} {'n/a':>14}")
        print(f"{name:10} {opt:>4} {math_:>5} {batch:5d} {params:8d} {m_ms:11.2f} {t_cols}")
    if args.device != "cpu":
        def fmt(v):
            return "n/a" if v is None else f"{v:.0f}"
        print("\nkernels per step (device kernels from PyTorch's profiler, both frameworks; minidnn's own CUDA "
              "kernels through launch.py)")
        print(f"{'model':10} {'opt':>4} {'math':>5} {'minidnn':>8} {'torch':>8} {'minidnn launch.py':>18}")
        for name, opt, math_, _, _, _, _, (m_total, m_own), (t_total, _) in rows:
            print(f"{name:10} {opt:>4} {math_:>5} {fmt(m_total):>8} {fmt(t_total):>8} {fmt(m_own):>18}")
    if args.micro and args.device != "cpu":
        micro(args.device)


# ---- per-kernel table: the step kernels of issue 10 beside PyTorch's ops ----------------------------------------

def _event_ms(fn, reps=30, warmup=5, sync_cp=True):
    """Median ms of ``fn`` by CUDA events around each call (host launch cost included when it dominates)."""
    import cupy as cp
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


def _torch_ms(fn, reps=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def micro(device):
    import cupy as cp
    import numpy as np

    import minidnn.backend as B
    rng = np.random.default_rng(0)
    f32 = np.float32
    have_torch = torch is not None and torch.cuda.is_available()
    rows = []

    def add(name, nbytes, m_fn, t_fn):
        m = _event_ms(m_fn)
        t = _torch_ms(t_fn) if have_torch and t_fn is not None else None
        rows.append((name, nbytes, m, t))

    def both(a):
        g = cp.asarray(a)
        return g, (torch.as_tensor(a, device="cuda") if have_torch else None)

    for shape in ((128, 64, 8, 8), (128, 16, 32, 32), (64, 64, 56, 56)):
        n, c = shape[:2]
        x, xt = both(rng.standard_normal(shape).astype(f32))
        dy, dyt = both(rng.standard_normal(shape).astype(f32))
        w, wt = both(np.ones(c, f32))
        b, bt = both(np.zeros(c, f32))
        rm, rmt = both(np.zeros(c, f32))
        rv, rvt = both(np.ones(c, f32))
        size = x.size * 4
        _, m, i = B.batch_normalization_forward_training(None, "spatial", x, w, b, 0.1, rm, rv, 1e-5)
        t_fwd = t_bwd = None
        if have_torch:
            def t_fwd():
                return torch.nn.functional.batch_norm(xt, rmt, rvt, wt, bt, True, 0.1, 1e-5)
            sm, si = torch.ops.aten.native_batch_norm(xt, wt, bt, rmt, rvt, True, 0.1, 1e-5)[1:]
            def t_bwd():
                return torch.ops.aten.native_batch_norm_backward(dyt, xt, wt, rmt, rvt, sm, si, True, 1e-5,
                                                                 [True, True, True])
        add(f"bn fwd train {shape}", 3 * size,
            lambda: B.batch_normalization_forward_training(None, "spatial", x, w, b, 0.1, rm, rv, 1e-5), t_fwd)
        add(f"bn bwd {shape}", 5 * size,
            lambda: B.batch_normalization_backward(None, "spatial", x, dy, w, m, i, 1e-5), t_bwd)
        add(f"bn+relu fwd {shape}", 3 * size,
            lambda: B.batch_normalization_forward_training_ex(None, "spatial", "bn_activation", x, None, w, b, 0.1,
                                                              rm, rv, 1e-5),
            (lambda: torch.relu(torch.nn.functional.batch_norm(xt, rmt, rvt, wt, bt, True, 0.1, 1e-5)))
            if have_torch else None)
        relu = B.ActivationDescriptor("relu")
        add(f"relu bwd {shape}", 3 * size, lambda: B.activation_backward(None, relu, None, dy, x),
            (lambda: torch.ops.aten.threshold_backward(dyt, xt, 0.0)) if have_torch else None)
        pool = B.PoolingDescriptor("max", 2, 0, 2)
        y, arg = B.pooling_forward(None, pool, x, return_argmax=True)
        dyp = cp.asarray(rng.standard_normal(y.shape).astype(f32))
        t_pf = t_pb = None
        if have_torch:
            def t_pf():
                return torch.nn.functional.max_pool2d_with_indices(xt, 2, 2)
            yt, it = torch.nn.functional.max_pool2d_with_indices(xt, 2, 2)
            dypt = torch.as_tensor(dyp.get(), device="cuda")
            def t_pb():
                return torch.ops.aten.max_pool2d_with_indices_backward(dypt, xt, [2, 2], [2, 2], [0, 0], [1, 1],
                                                                       False, it)
        add(f"maxpool2 fwd {shape}", size * 5 // 4 + y.size, lambda: B.pooling_forward(None, pool, x,
                                                                                     return_argmax=True), t_pf)
        add(f"maxpool2 bwd {shape}", size * 5 // 4 + y.size,
            lambda: B.pooling_backward(None, pool, y, dyp, x, argmax=arg), t_pb)
    gap = B.PoolingDescriptor("average_count_include_padding", 8, 0, 8)
    x, xt = both(rng.standard_normal((128, 64, 8, 8)).astype(f32))
    add("global avgpool fwd (128, 64, 8, 8)", x.size * 4, lambda: B.pooling_forward(None, gap, x),
        (lambda: torch.nn.functional.adaptive_avg_pool2d(xt, 1)) if have_torch else None)
    for n, c in ((128, 10), (4096, 1000)):
        x, xt = both(rng.standard_normal((n, c)).astype(f32))
        t, tt = both(rng.integers(0, c, n))
        loss, lse, den = B.softmax_cross_entropy_forward(None, x, t)
        one = cp.ones((), f32)
        t_f = t_b = None
        if have_torch:
            def t_f():
                return torch.nn.functional.cross_entropy(xt, tt)
            xg = xt.clone().requires_grad_(True)
            lt = torch.nn.functional.cross_entropy(xg, tt)
            def t_b():
                return torch.autograd.grad(lt, xg, retain_graph=True)
        add(f"cross-entropy fwd ({n}, {c})", x.size * 4, lambda: B.softmax_cross_entropy_forward(None, x, t), t_f)
        add(f"cross-entropy bwd ({n}, {c})", x.size * 8,
            lambda: B.softmax_cross_entropy_backward(None, x, t, one, lse, den), t_b)
        add(f"log-softmax fwd ({n}, {c})", x.size * 8, lambda: B.softmax_forward(None, "log", None, x, axis=1),
            (lambda: torch.log_softmax(xt, 1)) if have_torch else None)
    host_rows = []
    x, _ = both(rng.standard_normal((128, 64, 8, 8)).astype(f32))
    dy, _ = both(rng.standard_normal((128, 64, 8, 8)).astype(f32))
    w, b, rm, rv = (cp.asarray(v) for v in (np.ones(64, f32), np.zeros(64, f32), np.zeros(64, f32), np.ones(64, f32)))
    _, m, i = B.batch_normalization_forward_training(None, "spatial", x, w, b, 0.1, rm, rv, 1e-5)
    t, _ = both(rng.integers(0, 10, 128))
    logits = cp.asarray(rng.standard_normal((128, 10)).astype(f32))
    relu = B.ActivationDescriptor("relu")
    pool = B.PoolingDescriptor("max", 2, 0, 2)
    for label, fn in (("bn fwd train", lambda: B.batch_normalization_forward_training(None, "spatial", x, w, b, 0.1,
                                                                                      rm, rv, 1e-5)),
                      ("bn bwd", lambda: B.batch_normalization_backward(None, "spatial", x, dy, w, m, i, 1e-5)),
                      ("relu bwd", lambda: B.activation_backward(None, relu, None, dy, x)),
                      ("maxpool fwd", lambda: B.pooling_forward(None, pool, x, return_argmax=True)),
                      ("cross-entropy fwd", lambda: B.softmax_cross_entropy_forward(None, logits, t))):
        host_rows.append((label, *host_profile(fn)))
    print("\nstep kernels (median ms per call by CUDA events, host launch cost included; GB/s = bytes of the "
          "one-pass floor / time)")
    print(f"{'op':44} {'minidnn ms':>10} {'GB/s':>7} {'torch ms':>9} {'GB/s':>7} {'ratio':>6}")
    for name, nbytes, m, t in rows:
        tcols = f"{t:9.4f} {nbytes / t / 1e6:7.0f} {m / t:5.2f}x" if t else f"{'n/a':>9} {'':>7} {'':>6}"
        print(f"{name:44} {m:10.4f} {nbytes / m / 1e6:7.0f} {tcols}")
    print("\nhost time per call (no synchronisation; (128, 64, 8, 8) float32) and where it goes (cProfile, tottime)")
    for label, us, top in host_rows:
        print(f"{label}: {us:.1f} us per call")
        for line in top:
            print("    " + line)


def host_profile(fn, n=300, top=8):
    """(host microseconds per call, the ``top`` functions by own time per call) for a GPU primitive call."""
    import cProfile
    import os
    import pstats

    import cupy as cp
    for _ in range(10):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) / n * 1e6
    cp.cuda.Device().synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    cp.cuda.Device().synchronize()
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return us, [f"{tt / n * 1e6:6.1f} us  {nc // n:3d}x {func} ({os.path.basename(path)}:{line})"
                for (path, line, func), (cc, nc, tt, ct, callers) in rows]


if __name__ == "__main__":
    main()
