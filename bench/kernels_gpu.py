"""The training-step kernels of issue 10 one by one: minidnn's time and achieved bandwidth beside PyTorch's op.

    python bench/kernels_gpu.py [--sizes large,small,large2,large3] [--dtypes float32,bfloat16] [--only ln,gn]
                                [--trials 7] [--timing eager|graph|both]

For each kernel (batch norm training forward/backward, fused bn + ReLU and bn + add + ReLU, max/average pooling
forward/backward, global average pooling, softmax, log-softmax, cross-entropy forward/backward, bias add and its
gradient, dropout, layer norm, group norm, ReLU) on a large tensor and on a small-CNN-sized one, each row's call
(the backend primitive on CuPy arrays; PyTorch's equivalent op) is timed two ways, in two column groups:
  eager  (host + device)  CUDA events around `reps` back-to-back eager calls, divided by reps; the median of
         `trials` such timings.  A call shorter than its host cost (our Python + CuPy launch ~15-25 us, PyTorch's
         dispatch ~5-15 us) measures the host: the GPU waits for the next launch.
  graph  (device)  the same `reps` calls captured ONCE into a CUDA graph, after 3 warm-up rounds -- minidnn's
         through bench/graphs.py's `_capture` (minidnn.cuda.graph: CuPy stream capture on a side stream into a
         private memory pool); PyTorch's through torch.cuda.CUDAGraph on the one non-default stream every PyTorch
         op of the table runs on (its backward ops run on their forward's stream: see Timer.graph) -- then CUDA
         events around one replay of the graph, divided by reps; the median of `trials` replays.  Host time
         drops out for BOTH frameworks: what is left is the kernels' own time plus the GPU's ~1 us gap between
         consecutive graph kernels (charged to both sides alike).  A call that cannot be captured (it
         synchronises with the host, or calls a library that refuses capture) shows its EAGER time in the graph
         columns, marked "e", and the reason is listed under the table.
Columns of each group:
  ms           one call's time, as above (minidnn "mdn ms"; PyTorch "torch ms": eager, cudnn.benchmark on,
               backward by torch.autograd.grad of that op alone).
  GB/s, %copy  the op's compulsory traffic (every input read once, every output written once: the floor, not what
               a kernel happens to move) over minidnn's time, and that against the device-to-device copy
               bandwidth measured in the same run (a 256 MiB cudaMemcpyAsync: 2 x bytes / time).
  vs torch     PyTorch's time / minidnn's in the same group (> 1: minidnn faster).
  k/call       kernels minidnn launched per call through backend/cuda/launch.py (CuPy's own are not counted).
  target       issue 10's: a memory-bound kernel on a large tensor at >= 70% of copy bandwidth and faster than
               PyTorch ("ok"), else what is missing; judged on the GRAPH columns where both sides were captured
               (the kernels, not the host), else on the eager ones and marked "(eager)".  --timing eager: the
               eager columns only, judged on them (the tables of sessions 6-8); --timing graph: the graph
               columns only.
The bytes of a row are the same in both groups (and as before this column was added).  One run prints the whole
table.  PyTorch is imported here only (it is the yardstick, not a dependency).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import launch as _launch

SIZES = {   # name: (NCHW activation, (rows, classes) logits, (rows, D) layer norm, (N, C) linear)
    "large": ((128, 64, 56, 56), (16384, 1000), (16384, 1024), (16384, 1024)),
    "small": ((128, 16, 32, 32), (128, 10), (2048, 256), (128, 256)),
    # other large tensors (each beyond the H100's / H200's L2), to see the target is not met for one shape only
    "large2": ((32, 256, 56, 56), (4096, 32000), (32768, 768), (32768, 768)),
    "large3": ((256, 32, 56, 56), (65536, 512), (8192, 4096), (8192, 4096)),
}
# session 21's kinds: long-row softmax (language-model vocabularies; softmax_cluster) and segmentation losses
# (cross-entropy over (N, C, H, W) against (N, H, W) targets, softmax over dim 1; loss_kernels' SOURCE_SPATIAL)
LONG_ROWS = {"large": (4096, 50257), "large2": (300, 50257), "large3": (2048, 65536), "small": (64, 32000)}
SEGMENT = {"large": (16, 19, 256, 256), "large2": (32, 21, 128, 128), "large3": (8, 150, 64, 64),
           "small": (4, 21, 32, 32)}


class Timer:
    """Eager and graph timings of one call (CuPy launches or PyTorch ops); see the module docstring."""

    def __init__(self, cp, torch, trials):
        self.cp, self.torch, self.trials = cp, torch, trials

    def _reps(self, fn, sync, now, elapsed):
        fn()
        sync()
        a = now()
        fn()
        b = now()
        ms = max(elapsed(a, b), 1e-3)
        return int(min(200, max(3, 10.0 / ms)))       # ~10 ms per trial

    def _cupy_clock(self):
        cp = self.cp

        def now():
            e = cp.cuda.Event()
            e.record()
            return e

        def elapsed(a, b):
            b.synchronize()
            return cp.cuda.get_elapsed_time(a, b)
        return cp.cuda.Device().synchronize, now, elapsed

    def _torch_clock(self):
        torch = self.torch

        def now():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e

        def elapsed(a, b):
            b.synchronize()
            return a.elapsed_time(b)
        return torch.cuda.synchronize, now, elapsed

    def reps(self, fn, framework):
        """How many back-to-back calls make a ~10 ms trial (from one eager call; at most 200)."""
        return self._reps(fn, *(self._cupy_clock() if framework == "minidnn" else self._torch_clock()))

    def cupy(self, fn, reps=None):
        return self._time(fn, reps, *self._cupy_clock())

    def torch_(self, fn, reps=None):
        return self._time(fn, reps, *self._torch_clock())

    def _time(self, fn, reps, sync, now, elapsed):
        reps = reps or self._reps(fn, sync, now, elapsed)
        times = []
        for _ in range(self.trials):
            a = now()
            for _ in range(reps):
                fn()
            b = now()
            times.append(elapsed(a, b) / reps)
        return statistics.median(times)

    def graph(self, fn, reps, framework):
        """Median ms of one call from replays of a CUDA graph of ``reps`` calls (raises where capture fails); each
        replay is timed with events on the stream it runs on (the current one).  minidnn: bench/graphs.py's
        ``_capture`` (minidnn.cuda.graph: CuPy stream capture into a private pool, warm-up on a side stream).
        PyTorch: torch.cuda.CUDAGraph captured on the CURRENT stream -- main() runs every PyTorch op of the table
        on one side stream (torch_stream): autograd runs a backward op on the stream its forward ran on, so a
        backward whose forward (made once, at setup) ran on another stream than the capture's cannot be captured
        (cudaErrorStreamCaptureImplicit / Isolation; pytorch/pytorch#164302) -- bench/graphs.py's _capture
        captures on a stream of its own, which serves a step captured whole, forward included."""
        def calls():                        # outputs dropped as they come, as in the eager loop
            for _ in range(reps):
                fn()
        if framework == "minidnn":
            here = os.path.dirname(os.path.abspath(__file__))
            if here not in sys.path:
                sys.path.insert(0, here)
            from graphs import _capture  # bench/graphs.py

            import minidnn as lib
            sync, now, elapsed = self._cupy_clock()
            replay = _capture(lib, calls)
        else:
            torch = self.torch
            sync, now, elapsed = self._torch_clock()
            stream = torch.cuda.current_stream()
            for _ in range(3):              # warm-up (workspaces, cudnn.benchmark) on the capture's stream
                calls()
            sync()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                calls()
            replay = g.replay
        try:
            replay()
            sync()
            times = []
            for _ in range(self.trials):
                a = now()
                replay()
                b = now()
                times.append(elapsed(a, b) / reps)
            return statistics.median(times)
        finally:
            del replay                      # the graph and its private memory
            sync()


def torch_stream(torch):
    """The context every PyTorch op of the table runs in: one non-default stream, so backward ops (on their
    forward's stream) can be captured there (see Timer.graph); a no-op without PyTorch or a GPU for it."""
    import contextlib
    if torch is None or not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream())


def open_gpu(trials, who):
    """(cp, torch or None, Timer, copy bandwidth GB/s) for a measuring script, or None (said) without a CUDA GPU.
    PyTorch as the oracle where it has the GPU: cudnn.benchmark on, TF32 off (strict fp32 on both sides)."""
    if not _dev.cuda_is_available():
        print(f"{who}: no CUDA GPU with CuPy here; nothing to measure")
        return None
    cp = _dev.require_cupy()
    try:
        import torch
        if torch.cuda.is_available():
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = False
        else:
            torch = None
    except ImportError:
        torch = None
    timer = Timer(cp, torch, trials)
    return cp, torch, timer, copy_bandwidth(cp, timer)


def copy_bandwidth(cp, timer):
    n = 64 * 1024 * 1024                    # 256 MiB of float32
    src = cp.ones(n, dtype=np.float32)
    dst = cp.empty_like(src)
    ms = timer.cupy(lambda: dst.data.copy_from_device_async(src.data, src.nbytes))
    return 2 * src.nbytes / (ms * 1e-3) / 1e9


def alternate(timer, settings, switch, fn, tfn, rounds):
    """The alternated rounds of the A/B tools (softmax_cluster_ab, cols_ab, ce_sp_ab): each round times every setting
    -- ``switch(s)``, one eager ``fn()`` (plans and compiles outside the capture), then graph replays of ``fn`` -- and
    PyTorch's ``tfn`` (None: none) in turn, the order reversed every other round.  The calls a replay holds are
    counted once per framework, from the first setting's call, so every setting times the same work.  A PyTorch
    capture that fails is said and dropped.  Returns per-round lists: three dicts by setting -- its ms, settings[0]'s
    ms over its, PyTorch's ms over its -- and PyTorch's ms."""
    got = {s: [] for s in settings}
    ratios = {s: [] for s in settings}
    vs_torch = {s: [] for s in settings}
    tms = []
    reps = treps = None
    for r in range(rounds):
        order = list(settings) + (["torch"] if tfn is not None else [])
        this = {}
        for s in (order if r % 2 == 0 else order[::-1]):
            if s == "torch":
                try:
                    treps = treps or timer.reps(tfn, "torch")
                    this[s] = timer.graph(tfn, treps, "torch")
                    tms.append(this[s])
                except Exception as exc:        # noqa: BLE001 -- the A/B goes on without PyTorch
                    print(f"  (PyTorch capture failed: {type(exc).__name__}: {exc})")
                    tfn = None
                continue
            switch(s)
            fn()
            reps = reps or timer.reps(fn, "minidnn")
            this[s] = timer.graph(fn, reps, "minidnn")
            got[s].append(this[s])
        for s in settings:
            ratios[s].append(this[settings[0]] / this[s])
            if "torch" in this:
                vs_torch[s].append(this["torch"] / this[s])
    return got, ratios, vs_torch, tms


def distinct_plans(settings, plan_of):
    """The A/B tools' settings by what they launch: (plans -- ``plan_of(s)`` a setting --, the settings to time -- the
    first of each distinct plan, in order --, {setting: the earlier one it plans the same as})."""
    plans, distinct, same = {}, [], {}
    for s in settings:
        plans[s] = plan_of(s)
        twin = next((u for u in distinct if plans[u] == plans[s]), None)
        if twin is None:
            distinct.append(s)
        else:
            same[s] = twin
    return plans, distinct, same


def ab_lines(head, settings, got, ratios, vs_torch, tms, nbytes, bw, same=None, note=None):
    """The A/B tools' report of one case (softmax_cluster_ab, cols_ab, ce_sp_ab), from ``alternate``'s lists: a line a
    setting -- the median ms, GB/s and % of the copy bandwidth ``bw`` for the compulsory ``nbytes``, the spread over
    rounds, the median per-round ratio to the first setting timed, PyTorch's over this one, ``note(s)`` -- where a
    setting planned the same launch as an earlier one (absent from ``got``; ``same[s]``: that one) a line saying so,
    then PyTorch's line.  ``head``: the case's columns (op, dtype, shape) as the tool lays them out."""
    first = next(s for s in settings if s in got)
    lines = []
    for s in settings:
        if s not in got:
            lines.append(f"{head} {s:7s} = {same[s]} (the same launch)")
            continue
        ms = statistics.median(got[s])
        gbs = nbytes / (ms * 1e-3) / 1e9
        vt = f"  torch/this {statistics.median(vs_torch[s]):5.2f}" if vs_torch[s] else ""
        extra = f"  {note(s)}" if note else ""
        lines.append(f"{head} {s:7s} {ms:8.4f} ms {gbs:6.0f} GB/s {100 * gbs / bw:4.0f}% of copy  spread "
                     f"{100 * (max(got[s]) / min(got[s]) - 1):4.1f}%  {first}/this {statistics.median(ratios[s]):5.3f}"
                     f"{vt}{extra}")
    if tms:
        tm = statistics.median(tms)
        gbs = nbytes / (tm * 1e-3) / 1e9
        lines.append(f"{head} {'torch':7s} {tm:8.4f} ms {gbs:6.0f} GB/s {100 * gbs / bw:4.0f}% of copy")
    return lines


def forget_softmax():
    """Forget every settled softmax / cross-entropy launch -- the kernel plans and the primitive's seen-call caches --
    so that a switch flipped on softmax_kernels, softmax_cluster or loss_kernels takes effect on the next call."""
    from minidnn.backend import softmax as smx
    from minidnn.backend.cuda import loss_kernels as lk
    from minidnn.backend.cuda import softmax_kernels as sk
    sk._plans.clear()
    lk._plans.clear()
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()


def ab_start(tool, trials, rounds, how="settings alternated", benchmark=False):
    """The tools' A/B runs' common start (tools/row_ab.py, ce_long_ab.py, norm_s17_ab.py, ktable_ab.py, ln_ab.py):
    None, with a line saying so, where there is no CUDA GPU with CuPy; else (cp, torch or None, a Timer of ``trials``
    replays, the copy bandwidth in GB/s), the device line printed.  ``benchmark``: torch.backends.cudnn.benchmark on."""
    if not _dev.cuda_is_available():
        print(f"{tool}: no CUDA GPU with CuPy here; nothing to measure")
        return None
    cp = _dev.require_cupy()
    try:
        import torch
        if benchmark:
            torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    timer = Timer(cp, torch, trials)
    bw = copy_bandwidth(cp, timer)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; copy bandwidth {bw:.0f} GB/s; "
          f"{rounds} rounds ({how}), graph replays of {trials} trials each")
    return cp, torch, timer, bw


def ab_main(tool, doc, settings_table, ops_table, run_case, argv=None, ops="", shapes="", settings=""):
    """The A/B tools' command line and loop (tools/ce_sp_ab.py, bn_cl_occ_ab.py): --ops, --dtypes, --shapes (NxCx...,
    comma-separated), --rounds, --trials, --settings (names of ``settings_table``, the first the ratios' reference;
    ``ops`` / ``shapes`` / ``settings``: the defaults); ab_start, then ``run_case(timer, cases, op, shape, dtype_name,
    bw, rounds, settings)`` for every dtype, shape and op in that order, PyTorch's ops on one stream.  0, also where
    there is no GPU."""
    import argparse
    ap = argparse.ArgumentParser(prog=tool, description=doc.splitlines()[0])
    ap.add_argument("--ops", default=ops)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--settings", default=settings)
    args = ap.parse_args(argv)
    chosen = [s for s in args.settings.split(",") if s]
    op_list = [o for o in args.ops.split(",") if o]
    if not chosen or any(s not in settings_table for s in chosen) or any(o not in ops_table for o in op_list):
        ap.error(f"--settings of {', '.join(settings_table)}; --ops of {', '.join(ops_table)}")
    shape_list = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    start = ab_start(tool, args.trials, args.rounds, "settings and PyTorch alternated")
    if start is None:
        return 0
    cp, torch, timer, bw = start
    with torch_stream(torch):
        for dtype_name in args.dtypes.split(","):
            cases = Cases(cp, torch, dtype_name)
            for shape in shape_list:
                for op in op_list:
                    run_case(timer, cases, op, shape, dtype_name, bw, args.rounds, chosen)
    return 0


def _np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class Cases:
    """Each case: (kernel name, shape, (minidnn fn, torch fn or None, compulsory bytes), memory-bound?)."""

    def __init__(self, cp, torch, dtype_name):
        self.cp, self.torch = cp, torch
        self.dt = _np_dtype(dtype_name)
        self.tdt = getattr(torch, dtype_name) if torch is not None else None
        self.item = self.dt.itemsize
        self.rng = cp.random.default_rng(0)
        self.pdt = np.float32 if self.item == 2 else self.dt    # 16-bit data: float32 parameters, as cuDNN
        self.tdev = "cuda"

    def x(self, shape):
        f = self.rng.standard_normal(shape, dtype=np.float32)
        if self.dt.itemsize == 2 and self.dt.kind == "V":       # bfloat16: the top 16 bits of the float32 draw
            try:
                return (f.view(np.uint32) >> 16).astype(np.uint16).view(self.dt)
            except Exception:
                return self.cp.asarray(self.cp.asnumpy(f).astype(self.dt))
        return f.astype(self.dt)

    def full(self, shape, value, dtype=None):
        return self.cp.asarray(np.full(shape, value, dtype or self.dt))

    def t(self, shape, grad=False):
        if self.torch is None:
            return None
        return self.torch.randn(shape, device=self.tdev, dtype=self.tdt, requires_grad=grad)

    def tp(self, c, fill=None, same=False):
        torch = self.torch
        pdt = torch.float32 if self.item == 2 and not same else self.tdt
        return torch.ones(c, device=self.tdev, dtype=pdt, requires_grad=True) if fill is None else \
            torch.full((c,), fill, device=self.tdev, dtype=pdt)

    # ---- batch norm -------------------------------------------------------------------------------------------
    def cl(self, a):
        """Channels-last memory of a channels-first CuPy array (the same indexing)."""
        return self.cp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)

    def bn(self, shape, ops="bn", layout="nchw", twopass=False):
        cp, torch = self.cp, self.torch
        c = shape[1]
        x, dy = self.x(shape), self.x(shape)
        z = self.x(shape) if ops == "bn_add_activation" else None
        if layout == "nhwc":
            x, dy, z = self.cl(x), self.cl(dy), None if z is None else self.cl(z)
        scale, bias = cp.ones(c, self.pdt), cp.zeros(c, self.pdt)
        rm, rv = cp.zeros(c, self.pdt), cp.ones(c, self.pdt)
        if ops == "bn":
            def fwd():
                return B.batch_normalization_forward_training(None, "spatial", x, scale, bias, 0.1, rm, rv, 1e-5)
        else:
            def fwd():
                return B.batch_normalization_forward_training_ex(None, "spatial", ops, x, z, scale, bias, 0.1, rm, rv,
                                                                 1e-5)
        y, mean, inv = fwd()
        if ops == "bn":
            def bwd():
                return B.batch_normalization_backward(None, "spatial", x, dy, scale, mean, inv, 1e-5)
        else:
            def bwd():
                return B.batch_normalization_backward_ex(None, "spatial", ops, x, y, dy, scale, mean, inv, 1e-5)
        tf = tb = None
        if torch is not None:
            F = torch.nn.functional
            xt, dyt = self.t(shape, True), self.t(shape)
            zt = self.t(shape) if z is not None else None
            if layout == "nhwc":
                cl = torch.channels_last
                xt = xt.detach().to(memory_format=cl).requires_grad_()
                dyt, zt = dyt.to(memory_format=cl), None if zt is None else zt.to(memory_format=cl)
            wt, bt = self.tp(c), self.tp(c)
            rmt, rvt = self.tp(c, 0.0), self.tp(c, 1.0)

            def tf():
                v = F.batch_norm(xt, rmt, rvt, wt, bt, True, 0.1, 1e-5)
                if zt is not None:
                    v = v + zt
                return F.relu(v) if ops != "bn" else v
            yt = tf()

            def tb():
                return torch.autograd.grad(yt, (xt, wt, bt), dyt, retain_graph=True)
        e = x.size * self.item
        fwd_bytes = {"bn": 2, "bn_activation": 2, "bn_add_activation": 3}[ops] * e
        bwd_bytes = {"bn": 3, "bn_activation": 4, "bn_add_activation": 5}[ops] * e
        name = {"bn": "batch norm", "bn_activation": "bn + relu", "bn_add_activation": "bn + add + relu"}[ops]
        name += " NHWC" if layout == "nhwc" else ""
        if twopass:     # the two-launch kernels (MINIDNN_BN_ONEPASS=0) beside the one-pass ones, for comparison
            from minidnn.backend.cuda import bn_kernels
            name += " 2-launch"

            def off(fn):
                def run():
                    bn_kernels.ONEPASS = False
                    try:
                        return fn()
                    finally:
                        bn_kernels.ONEPASS = True
                return run
            y, mean, inv = off(fwd)()
            fwd, bwd = off(fwd), off(bwd)
        return [(f"{name} fwd (train)", shape, (fwd, tf, fwd_bytes), True),
                (f"{name} bwd", shape, (bwd, tb, bwd_bytes), True)]

    # ---- pooling -----------------------------------------------------------------------------------------------
    def pool(self, shape, mode, window=2, glob=False):
        torch = self.torch
        n, c, h, w = shape
        win = (h, w) if glob else window
        desc = B.PoolingDescriptor(mode, win, 0, win)
        x = self.x(shape)
        is_max = mode == "max"
        if is_max:
            y, am = B.pooling_forward(None, desc, x, return_argmax=True)
        else:
            y, am = B.pooling_forward(None, desc, x), None
        dy = self.x(y.shape)

        def fwd():
            return B.pooling_forward(None, desc, x, return_argmax=is_max)

        def bwd():
            return B.pooling_backward(None, desc, y, dy, x, argmax=am)
        tf = tb = None
        if torch is not None:
            F = torch.nn.functional
            xt = self.t(shape, True)
            if glob:
                def tf():
                    return F.adaptive_avg_pool2d(xt, 1)
            elif is_max:
                def tf():
                    return F.max_pool2d(xt, window, window)
            else:
                def tf():
                    return F.avg_pool2d(xt, window, window)
            yt = tf()
            dyt = torch.randn_like(yt)

            def tb():
                return torch.autograd.grad(yt, xt, dyt, retain_graph=True)
        e, o = x.size * self.item, y.size * self.item
        extra = y.size if is_max else 0           # the argmax map (1 byte per output)
        name = "global avg pool" if glob else ("max pool 2x2" if is_max else "avg pool 2x2")
        return [(f"{name} fwd", shape, (fwd, tf, e + o + extra), True),
                (f"{name} bwd", shape, (bwd, tb, o + extra + e), True)]

    # ---- softmax, log-softmax, cross-entropy -----------------------------------------------------------------
    def softmax(self, shape, algo):
        torch = self.torch
        x = self.x(shape)
        y = B.softmax_forward(None, algo, None, x, axis=-1)
        dy = self.x(shape)

        def fwd():
            return B.softmax_forward(None, algo, None, x, axis=-1)

        def bwd():
            return B.softmax_backward(None, algo, None, y, dy, axis=-1)
        tf = tb = None
        if torch is not None:
            xt, dyt = self.t(shape, True), self.t(shape)
            op = torch.log_softmax if algo == "log" else torch.softmax

            def tf():
                return op(xt, -1)
            yt = tf()

            def tb():
                return torch.autograd.grad(yt, xt, dyt, retain_graph=True)
        e = x.size * self.item
        name = "log-softmax" if algo == "log" else "softmax"
        return [(f"{name} fwd", shape, (fwd, tf, 2 * e), True), (f"{name} bwd", shape, (bwd, tb, 3 * e), True)]

    def cross_entropy(self, shape):
        cp, torch = self.cp, self.torch
        n, c = shape
        x = self.x(shape)
        t = cp.asarray(np.random.default_rng(0).integers(0, c, n))
        loss, lse, den = B.softmax_cross_entropy_forward(None, x, t)
        dloss = self.full((), 1.0)

        def fwd():
            return B.softmax_cross_entropy_forward(None, x, t)

        def bwd():
            return B.softmax_cross_entropy_backward(None, x, t, dloss, lse, den)
        tf = tb = None
        if torch is not None:
            xt = self.t(shape, True)
            tt = torch.randint(0, c, (n,), device=self.tdev)

            def tf():
                return torch.nn.functional.cross_entropy(xt, tt)
            lt = tf()

            def tb():
                return torch.autograd.grad(lt, xt, retain_graph=True)
        e = x.size * self.item
        return [("cross-entropy fwd", shape, (fwd, tf, e + n * 8), True),
                ("cross-entropy bwd", shape, (bwd, tb, 2 * e + n * 12), True)]

    def spatial(self, shape):
        """Segmentation: cross-entropy of (N, C, H, W) logits against (N, H, W) targets, and softmax / log-softmax
        over dim 1 (as tools/spatial_ce_gpu.py)."""
        cp, torch = self.cp, self.torch
        n, c = shape[:2]
        x, dy = self.x(shape), self.x(shape)
        tshape = (n,) + tuple(shape[2:])
        t = cp.asarray(np.random.default_rng(0).integers(0, c, tshape))
        loss, lse, den = B.softmax_cross_entropy_forward(None, x, t)
        dloss = self.full((), 1.0)
        ys = {a: B.softmax_forward(None, a, "channel", x) for a in ("accurate", "log")}
        tf = tb = None
        tfs, tbs = {}, {}
        if torch is not None:
            xt, dyt = self.t(shape, True), self.t(shape)
            tt = torch.randint(0, c, tshape, device=self.tdev)

            def tf():
                return torch.nn.functional.cross_entropy(xt, tt)
            lt = tf()

            def tb():
                return torch.autograd.grad(lt, xt, retain_graph=True)
            for a, op in (("accurate", torch.softmax), ("log", torch.log_softmax)):
                yt = op(xt, 1)
                tfs[a] = lambda op=op: op(xt, 1)
                tbs[a] = lambda yt=yt: torch.autograd.grad(yt, xt, dyt, retain_graph=True)
        e = x.size * self.item
        rows = x.size // c
        lse_bytes = rows * (8 if self.item == 8 else 4)       # the forward writes lse (the backward reads it)
        out = [("spatial ce fwd", shape, (lambda: B.softmax_cross_entropy_forward(None, x, t), tf,
                                          e + rows * 8 + lse_bytes), True),
               ("spatial ce bwd", shape, (lambda: B.softmax_cross_entropy_backward(None, x, t, dloss, lse, den), tb,
                                          2 * e + rows * 12), True)]
        for a in ("accurate", "log"):
            name = "channel log-softmax" if a == "log" else "channel softmax"
            out += [(name + " fwd", shape, (lambda a=a: B.softmax_forward(None, a, "channel", x), tfs.get(a), 2 * e),
                     True),
                    (name + " bwd", shape, (lambda a=a: B.softmax_backward(None, a, "channel", ys[a], dy), tbs.get(a),
                                            3 * e), True)]
        return out

    # ---- bias add and its gradient -----------------------------------------------------------------------------
    def bias(self, shape):
        torch = self.torch
        c = shape[1]
        y, dy = self.x(shape), self.x(shape)
        b = self.full((c,), 1.0)
        bshape = (1, c) + (1,) * (len(shape) - 2)
        dy3 = dy if dy.ndim >= 3 else dy.reshape(dy.shape + (1,))

        def fwd():
            return B.add_tensor(None, 1.0, b, 1.0, y)

        def bwd():
            return B.convolution_backward_bias(None, dy3)

        def cupy_fwd():
            return y + b.reshape(bshape)

        axes = (0,) + tuple(range(2, len(shape)))

        def cupy_bwd():
            return dy.sum(axis=axes)
        tf = tb = None
        if torch is not None:
            yt, dyt = self.t(shape), self.t(shape)
            bt = self.t((c,)).reshape(bshape)

            def tf():
                return yt.add_(bt)

            def tb():
                return dyt.sum(axes)
        e = y.size * self.item
        kind = "conv" if len(shape) == 4 else "linear"
        return [(f"bias add ({kind}, in place)", shape, (fwd, tf, 2 * e), True),
                ("  CuPy y + b (nn path today)", shape, (cupy_fwd, None, 2 * e), False),
                (f"bias grad ({kind})", shape, (bwd, tb, e), True),
                ("  CuPy dy.sum (nn path today)", shape, (cupy_bwd, None, e), False)]

    # ---- dropout -----------------------------------------------------------------------------------------------
    # MB of a row: the bytes minidnn moves on it.  The main rows take the default path (session 13: no stored mask,
    # x + y forward and dy + dx backward, 2 x itemsize bytes an element; MINIDNN_DROPOUT_MASK=1: the mask path, 1
    # byte more; =bits: 1/8 byte more); the "  stored mask" rows time minidnn's mask path (2 x itemsize + 1 bytes
    # an element), which are PyTorch's bytes too (native_dropout stores a 1-byte mask): its %copy is on that row.
    def dropout(self, shape):
        torch = self.torch
        from minidnn.backend.cuda import dropout_philox as DP
        from minidnn.nn._functions.activation import _SeededDropoutDescriptor
        desc = _SeededDropoutDescriptor(0.5)
        x, dy = self.x(shape), self.x(shape)
        store = DP.RESERVE
        y, reserve = B.dropout_forward(None, desc, x)
        DP.RESERVE = "mask"
        try:
            _, mask = B.dropout_forward(None, desc, x)
        finally:
            DP.RESERVE = store

        def fwd():
            return B.dropout_forward(None, desc, x)

        def bwd():
            return B.dropout_backward(None, desc, dy, reserve)

        def fwd_mask():
            DP.RESERVE = "mask"
            try:
                return B.dropout_forward(None, desc, x)
            finally:
                DP.RESERVE = store

        def bwd_mask():
            return B.dropout_backward(None, desc, dy, mask)
        tf = tb = None
        if torch is not None:
            xt, dyt = self.t(shape), self.t(shape)
            _, mt = torch.ops.aten.native_dropout(xt, 0.5, True)

            def tf():
                return torch.ops.aten.native_dropout(xt, 0.5, True)

            def tb():
                return torch.ops.aten.native_dropout_backward(dyt, mt, 2.0)
        e = x.size * self.item
        ours = 2 * e + {"mask": x.size, "bits": -(-x.size // 32) * 4}.get(store, 0)
        return [("dropout fwd (p=0.5)", shape, (fwd, tf, ours), True),
                ("  stored mask (torch's bytes)", shape, (fwd_mask, tf, 2 * e + x.size), False),
                ("dropout bwd", shape, (bwd, tb, ours), True),
                ("  stored mask (torch's bytes)", shape, (bwd_mask, tb, 2 * e + x.size), False)]

    # ---- layer norm, group norm --------------------------------------------------------------------------------
    def norm(self, shape, groups=None):
        cp, torch = self.cp, self.torch
        c = shape[1] if groups else shape[-1]
        x, dy = self.x(shape), self.x(shape)
        w, b = cp.ones(c, self.pdt), cp.zeros(c, self.pdt)
        if groups:
            def fwd():
                return B.group_normalization_forward(None, x, groups, w, b, 1e-5)
            _, mean, rstd = fwd()

            def bwd():
                return B.group_normalization_backward(None, x, dy, groups, w, mean, rstd)
        else:
            def fwd():
                return B.layer_normalization_forward(None, x, w, b, 1, 1e-5)
            _, mean, rstd = fwd()

            def bwd():
                return B.layer_normalization_backward(None, x, dy, w, mean, rstd, 1)
        tf = tb = None
        if torch is not None:
            F = torch.nn.functional
            xt, dyt = self.t(shape, True), self.t(shape)
            wt, bt = self.tp(c, same=True), self.tp(c, same=True)
            if groups:
                def tf():
                    return F.group_norm(xt, groups, wt, bt, 1e-5)
            else:
                def tf():
                    return F.layer_norm(xt, (c,), wt, bt, 1e-5)
            yt = tf()

            def tb():
                return torch.autograd.grad(yt, (xt, wt, bt), dyt, retain_graph=True)
        e = x.size * self.item
        name = f"group norm G={groups}" if groups else "layer norm"
        return [(f"{name} fwd", shape, (fwd, tf, 2 * e), True), (f"{name} bwd", shape, (bwd, tb, 3 * e), True)]

    # ---- ReLU --------------------------------------------------------------------------------------------------
    def relu(self, shape):
        torch = self.torch
        desc = B.ActivationDescriptor("relu")
        x, dy = self.x(shape), self.x(shape)

        def fwd():
            return B.activation_forward(None, desc, x)

        def bwd():
            return B.activation_backward(None, desc, None, dy, x)
        tf = tb = None
        if torch is not None:
            xt, dyt = self.t(shape), self.t(shape)

            def tf():
                return torch.relu(xt)

            def tb():
                return torch.ops.aten.threshold_backward(dyt, xt, 0.0)
        e = x.size * self.item
        return [("relu fwd", shape, (fwd, tf, 2 * e), True), ("relu bwd", shape, (bwd, tb, 3 * e), True)]


BN_EXTRA = {"large": (256, 16, 32, 32)}
KINDS = ("bn", "bn_cl", "bn2", "pool", "softmax", "ce", "bias", "dropout", "ln", "gn", "relu", "softmax_long",
         "spatial")


def build(cases, kind, size):
    act, logits, ln_shape, lin = SIZES[size]
    if kind in ("bn", "bn_cl"):     # NCHW / channels-last; large: also the (256, 16, 32, 32) of a small CNN
        lay = "nhwc" if kind == "bn_cl" else "nchw"
        rows = []
        for shape in (act, BN_EXTRA[size]) if size in BN_EXTRA else (act,):
            rows += cases.bn(shape, layout=lay) + cases.bn(shape, "bn_activation", lay) + \
                cases.bn(shape, "bn_add_activation", lay)
        return rows
    if kind == "bn2":               # the two-launch kernels, for comparison
        return cases.bn(act, twopass=True) + cases.bn(act, layout="nhwc", twopass=True)
    if kind == "pool":
        return cases.pool(act, "max") + cases.pool(act, "average_count_include_padding") + \
            cases.pool(act, "average_count_include_padding", glob=True)
    if kind == "softmax":
        return cases.softmax(logits, "accurate") + cases.softmax(logits, "log")
    if kind == "ce":
        return cases.cross_entropy(logits)
    if kind == "softmax_long":
        return cases.softmax(LONG_ROWS[size], "accurate") + cases.softmax(LONG_ROWS[size], "log")
    if kind == "spatial":
        return cases.spatial(SEGMENT[size])
    if kind == "bias":
        return cases.bias(act) + cases.bias(lin)
    if kind == "dropout":
        return cases.dropout(act)
    if kind == "ln":
        return cases.norm(ln_shape)
    if kind == "gn":
        return cases.norm(act, groups=32 if act[1] >= 32 else 4)
    if kind == "relu":
        return cases.relu(act)
    raise ValueError(kind)


def _capture_reason(exc):
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:160]


def measure(timer, fn, tfn, timing):
    """One row's timings: {"eager": (mdn ms, torch ms or None), "graph": (mdn ms, torch ms or None) with eager
    standing in where a side could not be captured, "failed": [(side, reason)]}; groups not asked for are absent."""
    out = {"failed": []}
    mreps = timer.reps(fn, "minidnn")
    treps = timer.reps(tfn, "torch") if tfn is not None else None
    eager = {}

    def eager_ms(side):                     # measured once, when shown or when it must stand in
        if side not in eager:
            f, reps = (fn, mreps) if side == "minidnn" else (tfn, treps)
            eager[side] = None if f is None else (timer.cupy if side == "minidnn" else timer.torch_)(f, reps)
        return eager[side]
    if timing in ("eager", "both"):
        out["eager"] = (eager_ms("minidnn"), eager_ms("torch"))
    if timing in ("graph", "both"):
        got = []
        for side, f, reps in (("minidnn", fn, mreps), ("torch", tfn, treps)):
            if f is None:
                got.append(None)
                continue
            try:
                got.append(timer.graph(f, reps, side))
            except Exception as exc:        # noqa: BLE001 -- a sync inside: eager stands in, marked
                out["failed"].append((side, _capture_reason(exc)))
                got.append(eager_ms(side))
        out["graph"] = tuple(got)
    return out


def _cells(ms, tms, nbytes, bw, marks):
    """``mdn ms  GB/s  %copy  torch ms  vs torch`` of one group; ``marks``: (minidnn eager?, torch eager?)."""
    gbs = nbytes / (ms * 1e-3) / 1e9
    pct = 100 * gbs / bw
    m = "e" if marks[0] else " "
    tm = "e" if marks[1] else " "
    tcol = f"{tms:9.4f}{tm}" if tms is not None else f"{'':10s}"
    ratio = f"{tms / ms:7.2f}x" if tms is not None else f"{'':8s}"
    return f"{ms:10.4f}{m} {gbs:7.0f} {pct:5.0f}% {tcol} {ratio}", pct


def _verdict(pct, ms, tms):
    misses = ([] if pct >= 70 else ["<70%"]) + ([] if tms is None or ms < tms else ["slower"])
    return "ok" if not misses else " ".join(misses)


GROUP = f"{'mdn ms':>11s} {'GB/s':>7s} {'%copy':>6s} {'torch ms':>10s} {'vs torch':>8s}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="large,small")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--only", default=",".join(KINDS), help="comma list of " + ",".join(KINDS))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--timing", default="both", choices=("eager", "graph", "both"),
                    help="eager calls (host + device), CUDA-graph replays (device), or both column groups")
    args = ap.parse_args(argv)
    gpu = open_gpu(args.trials, "kernels_gpu")
    if gpu is None:
        return 0
    cp, torch, timer, bw = gpu
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; copy bandwidth {bw:.0f} GB/s "
          f"(cudaMemcpyAsync, 256 MiB); PyTorch {torch.__version__ if torch else 'absent'}")
    groups = {"eager": ["eager"], "graph": ["graph"], "both": ["eager", "graph"]}[args.timing]
    lead = f"{'kernel':34s} {'dtype':9s} {'shape':22s} {'MB':>7s}"
    titles = {"eager": "eager calls (host + device)", "graph": "CUDA-graph replay (device)"}
    print(" " * len(lead) + "".join(f" {('-- ' + titles[g] + ' ').ljust(len(GROUP), '-')}" for g in groups))
    head = lead + "".join(f" {GROUP}" for _ in groups) + f" {'k/call':>6s}  target"
    print(head)
    print("-" * len(head))
    failures = []
    with torch_stream(torch):
        run_table(args, cp, torch, timer, bw, groups, failures)
    print("vs torch: PyTorch's time / minidnn's in the same group (> 1: minidnn faster).  MB: compulsory traffic "
          "of one call.")
    if "graph" in groups:
        print("e: that side's call could not be captured in a CUDA graph; its eager time stands in (and the target "
              "is judged on eager times, marked '(eager)').")
        for name, dtype_name, shape, side, why in failures:
            print(f"  capture failed: {name} {dtype_name} {shape} ({side}): {why}")
    return 0


def run_table(args, cp, torch, timer, bw, groups, failures):
    for dtype_name in args.dtypes.split(","):
        cases = Cases(cp, torch, dtype_name)
        for size in args.sizes.split(","):
            for kind in args.only.split(","):
                try:
                    rows = build(cases, kind, size)
                except Exception as exc:        # one broken case must not take the table down
                    print(f"{kind:34s} {dtype_name:9s} {size:22s} setup failed: {type(exc).__name__}: {exc}")
                    continue
                for name, shape, (fn, tfn, nbytes), memory_bound in rows:
                    try:
                        before = _launch.launch_count()
                        fn()
                        launches = _launch.launch_count() - before
                        got = measure(timer, fn, tfn, args.timing)
                    except Exception as exc:
                        print(f"{name:34s} {dtype_name:9s} {str(shape):22s} failed: {type(exc).__name__}: {exc}")
                        continue
                    failed = {side for side, _ in got["failed"]}
                    failures += [(name, dtype_name, shape, side, why) for side, why in got["failed"]]
                    line = f"{name:34s} {dtype_name:9s} {str(shape):22s} {nbytes / 1e6:7.1f}"
                    judged = None
                    for g in groups:
                        ms, tms = got[g]
                        marks = (g == "graph" and "minidnn" in failed, g == "graph" and "torch" in failed)
                        text, pct = _cells(ms, tms, nbytes, bw, marks)
                        line += " " + text
                        judged = (pct, ms, tms, any(marks))
                    verdict = ""
                    if memory_bound and size.startswith("large"):
                        pct, ms, tms, fell_back = judged
                        verdict = _verdict(pct, ms, tms) + (" (eager)" if fell_back else "")
                    print(f"{line} {launches:6d}  {verdict}")
                sys.stdout.flush()
        del cases
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    sys.exit(main())
