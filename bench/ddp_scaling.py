"""Data-parallel scaling: ResNet-20 training steps with DistributedDataParallel on 1, 2, 4 GPUs (whatever is
visible), per-GPU batch 128, images/s and the speed-up over one GPU; PyTorch's DDP beside it from the same run.

    python bench/ddp_scaling.py                                  # every visible GPU count in 1, 2, 4
    python bench/ddp_scaling.py --gpus 1,2 --steps 30 --modes graphed,eager
    python bench/ddp_scaling.py --device cpu --gpus 1,2 --steps 3 --batch 8      # a smoke run without GPUs

Each (library, mode, GPU count) is one launch of ``python -m minidnn.distributed.run --nproc-per-node N`` over
this file in worker mode: every rank builds the same model (minidnn's ResNet-20; for PyTorch its twin built from
minidnn/models.py's source, see bench/train_step.py), wraps it in its library's DistributedDataParallel (NCCL on
the GPU, gloo/cpu otherwise), warms up, then times ``--steps`` steps with a device synchronisation after each;
rank 0 reports the median step.  images/s = N x batch / median step.  minidnn's "graphed" mode replays each step
from a CUDA graph (minidnn.compile, the bucketed all-reduces captured with the backward); "eager" runs it as
written.  PyTorch runs eagerly with cudnn.benchmark on (as minidnn's benchmark flag on its side).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpus", default=None, help="comma-separated process counts (default: 1,2,4 up to the visible)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps first (the graph capture happens here)")
    p.add_argument("--batch", type=int, default=128, help="images per GPU (per process)")
    p.add_argument("--modes", default="graphed", help="minidnn modes: graphed, eager (comma-separated)")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch's DDP")
    p.add_argument("--timeout", type=float, default=240, help="seconds per launch")
    p.add_argument("--worker", choices=("minidnn", "torch"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="graphed", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return p


# -- one rank -------------------------------------------------------------------------------------------------------
def worker(args):
    local = int(os.environ["LOCAL_RANK"])
    on_gpu = args.device == "cuda"
    if args.worker == "torch":
        import torch as lib
        sys.path.insert(0, HERE)
        from train_step import torch_models
        namespace = torch_models()
        if on_gpu:
            lib.backends.cudnn.benchmark = True
    else:
        import minidnn as lib
        import minidnn.models
        namespace = vars(minidnn.models)
        if on_gpu:
            lib.backends.cudnn.benchmark = True
    import importlib
    ddp_cls = importlib.import_module(lib.__name__ + ".nn.parallel").DistributedDataParallel
    dist = importlib.import_module(lib.__name__ + ".distributed")
    if on_gpu:
        lib.cuda.set_device(local)
    device = f"cuda:{local}" if on_gpu else "cpu"
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lib.manual_seed(0)
    model = eval("resnet20(num_classes=10)", namespace).to(device)
    ddp = ddp_cls(model, device_ids=[local] if on_gpu else None)
    opt = lib.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = lib.randn(args.batch, 3, 32, 32, device=device)
    y = lib.randint(0, 10, (args.batch,), device=device)
    cross_entropy = lib.nn.functional.cross_entropy

    def step(x, y):
        loss = cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss
    if args.worker == "minidnn" and args.mode == "graphed" and on_gpu:
        step = lib.compile(step, warmup=3)
    sync = lib.cuda.synchronize if on_gpu else (lambda: None)
    for _ in range(args.warmup):
        step(x, y)
    sync()
    dist.barrier()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step(x, y)
        sync()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    if rank == 0 and args.result:
        with open(args.result, "w") as f:
            json.dump({"lib": args.worker, "mode": args.mode, "world": world, "batch": args.batch, "ms": ms,
                       "images_per_s": world * args.batch / ms * 1e3}, f)
    dist.destroy_process_group()


# -- the driver -------------------------------------------------------------------------------------------------------
def _visible_gpus():
    try:
        import minidnn as mdn
        return mdn.cuda.device_count() if mdn.cuda.is_available() else 0
    except Exception:
        return 0


def _device_name(device):
    if device != "cuda":
        return "cpu"
    try:
        from minidnn.backend import devices
        cp = devices.require_cupy()
        props = cp.cuda.runtime.getDeviceProperties(0)
        return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:
        return "cuda"


def _torch_usable(device):
    try:
        import torch
        return device == "cpu" or torch.cuda.is_available()
    except ImportError:
        return False


def launch(args, lib, mode, n):
    fd, result = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "minidnn.distributed.run", "--nproc-per-node", str(n), os.path.abspath(__file__),
           "--worker", lib, "--mode", mode, "--result", result, "--device", args.device, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--batch", str(args.batch)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    began = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env, cwd=ROOT)
        ok = proc.returncode == 0 and os.path.getsize(result) > 0
        tail = (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        ok, tail = False, f"timed out after {args.timeout:.0f} s"
    took = time.perf_counter() - began
    try:
        if not ok:
            print(f"  {lib} {mode} x{n}: FAILED ({took:.0f} s)\n{tail}", flush=True)
            return None
        with open(result) as f:
            r = json.load(f)
        print(f"  {lib} {mode} x{n}: {r['ms']:.2f} ms/step, {r['images_per_s']:.0f} images/s  (launch {took:.0f} s)",
              flush=True)
        return r
    finally:
        os.unlink(result)


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.worker:
        return worker(args)
    visible = _visible_gpus() if args.device == "cuda" else 4
    if args.device == "cuda" and visible == 0:
        print("ddp_scaling: no CUDA GPU visible (use --device cpu for a smoke run)")
        return 0
    sizes = [int(s) for s in args.gpus.split(",")] if args.gpus else [n for n in (1, 2, 4) if n <= visible]
    if args.device == "cuda":
        sizes = [n for n in sizes if n <= visible]
    columns = [("minidnn", m) for m in args.modes.split(",") if m]
    if not args.no_torch and _torch_usable(args.device):
        columns.append(("torch", "eager"))
    print(f"ResNet-20 DDP, {args.batch} images per {'GPU' if args.device == 'cuda' else 'process'}, SGD momentum, "
          f"median of {args.steps} steps; device {_device_name(args.device)} ({visible} visible)", flush=True)
    table = {}
    for n in sizes:                 # interleaved: a cut-short run still has both libraries at the first sizes
        for lib, mode in columns:
            table[(lib, mode, n)] = launch(args, lib, mode, n)
    head = f"{'GPUs':>5}" + "".join(f" | {lib + ' ' + mode + ' img/s':>22} {'scale':>6}" for lib, mode in columns)
    print(head)
    print("-" * len(head))
    for n in sizes:
        row = f"{n:>5}"
        for lib, mode in columns:
            r, base = table.get((lib, mode, n)), table.get((lib, mode, sizes[0]))
            if r is None:
                row += f" | {'failed':>22} {'':>6}"
            else:
                speedup = r["images_per_s"] / base["images_per_s"] if base else float("nan")
                row += f" | {r['images_per_s']:>22.0f} {speedup:>5.2f}x"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
