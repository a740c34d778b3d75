"""One rank of the multi-GPU tests (test_nccl_cuda.py): NCCL collectives across the GPUs, then data-parallel
training (eager, CUDA-graphed, SyncBatchNorm) whose per-rank losses and final parameters go to OUT/rank<r>.npz."""
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenarios as S  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.distributed as dist  # noqa: E402
from minidnn import nn  # noqa: E402
from minidnn.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

local = int(os.environ["LOCAL_RANK"])
ON_CPU = os.environ.get("MINIDNN_GPU_WORKER_ON_CPU") == "1"      # a dry run of this script's logic without GPUs
if not ON_CPU:
    mdn.cuda.set_device(local)
dist.init_process_group("cpu" if ON_CPU else "nccl")
R, W = dist.get_rank(), dist.get_world_size()
dev = "cpu" if ON_CPU else f"cuda:{local}"
out, errors = {}, []
try:
    base = np.array([1.5, -2.0, 3.0], dtype=np.float32) * (R + 1)
    for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        t = mdn.tensor(base, device=dev)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_{op}"] = t.cpu().numpy()
    t = mdn.tensor(np.arange(4.0) + 10 * R, device=dev)
    dist.broadcast(t, src=W - 1)
    out["broadcast"] = t.cpu().numpy()
    parts = [mdn.zeros(2, device=dev) for _ in range(W)]
    dist.all_gather(parts, mdn.full((2,), float(R), device=dev))
    out["all_gather"] = np.stack([p.cpu().numpy() for p in parts])
    dist.barrier()
    steps, batch = 8, 16
    xs, ys = S.image_data(W, steps, batch)
    mine = slice(R * batch, (R + 1) * batch)
    for name, compiled, sync_bn, comm_stream in (("eager", False, False, True), ("graphed", True, False, True),
                                                 ("syncbn", False, True, True), ("current_stream", True, False, False)):
        model = S.small_cnn(seed=R, batchnorm=sync_bn)
        if sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = model.to(dev)
        # bucket_cap_mb=0.002: a few buckets even for this small model
        ddp = DDP(model, device_ids=None if ON_CPU else [local], bucket_cap_mb=0.002, comm_stream=comm_stream)
        out[f"{name}_losses"] = np.array(S.gpu_train(ddp, xs[:, mine], ys[:, mine], dev, compiled=compiled))
        for i, p in enumerate(model.parameters()):
            out[f"{name}_param{i}"] = p.cpu().numpy()
        out[f"{name}_buckets"] = np.array(len(ddp.bucket_layout))
except Exception:
    errors.append(traceback.format_exc())
    print(errors[-1], file=sys.stderr, flush=True)
dist.destroy_process_group()
np.savez(os.path.join(sys.argv[1], f"rank{R}.npz"), errors=np.array(errors, dtype=object), **out)
sys.exit(1 if errors else 0)
