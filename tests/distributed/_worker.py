"""One rank of the CPU multi-process tests: ``python -m minidnn.distributed.run --nproc-per-node N _worker.py OUT``.
Every scenario records what it saw into OUT/rank<r>.npz (arrays) and OUT/rank<r>.json (everything else); the
tests compare them with single-process references.  A scenario that fails records its error instead of stopping
the others (a rank that died would leave the other ranks waiting)."""
import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenarios as S  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.distributed as dist  # noqa: E402
from minidnn import nn  # noqa: E402
from minidnn.data import DistributedSampler  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

out = {}


def scenario(fn):
    try:
        fn()
    except Exception:
        out[fn.__name__ + ".error"] = traceback.format_exc()
    return fn


dist.init_process_group("cpu")
R, W = dist.get_rank(), dist.get_world_size()
out["env"] = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
out["rank"], out["world"] = R, W


@scenario
def collectives():
    base = np.array([1.5, -2.0, 3.0]) * (R + 1) + R
    for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        t = mdn.tensor(base.copy())
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_{op}"] = t.numpy()
    for op in ("BAND", "BOR", "BXOR", "SUM"):
        t = mdn.tensor(np.array([3, 5, 12], dtype=np.int64) << R)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_int_{op}"] = t.numpy()
    f32 = mdn.tensor(np.full((2, 3), R + 0.5, dtype=np.float32))
    work = dist.all_reduce(f32, async_op=True)
    out["work_wait"] = bool(work.wait())
    out["all_reduce_f32"] = f32.numpy()
    for src in range(W):
        t = mdn.tensor(np.arange(4.0) + 10 * R)
        dist.broadcast(t, src=src)
        out[f"broadcast_{src}"] = t.numpy()
    gathered = [mdn.zeros(2, 2, dtype=mdn.float64) for _ in range(W)]
    dist.all_gather(gathered, mdn.tensor(np.full((2, 2), float(R))))
    out["all_gather"] = np.stack([g.numpy() for g in gathered])
    dist.barrier()
    objs = [None] * W
    dist.all_gather_object(objs, {"rank": R, "name": f"r{R}"})
    out["all_gather_object"] = objs
    lst = [f"from {R}", R] if R == W - 1 else [None, None]
    dist.broadcast_object_list(lst, src=W - 1)
    out["broadcast_object_list"] = lst


@scenario
def mismatches():
    for name, arr in (("shape", np.zeros(3 + R)), ("dtype", np.zeros(3, dtype=np.float32 if R else np.float64))):
        try:
            dist.all_reduce(mdn.tensor(arr))
            out[f"mismatch_{name}"] = "no error"
        except dist.DistributedError as e:
            out[f"mismatch_{name}"] = str(e)
    try:
        if R == 0:
            dist.barrier()
        else:
            dist.broadcast(mdn.zeros(2), src=0)
        out["mismatch_op"] = "no error"
    except dist.DistributedError as e:
        out["mismatch_op"] = str(e)
    dist.barrier()          # the group still works after a reported mismatch


def ddp_run(kind, bucket_cap_mb):
    xs, ys = S.data(W)
    mine = slice(R * S.B, (R + 1) * S.B)
    model = S.mlp(seed=R)           # every rank starts elsewhere: the wrapper broadcasts rank 0's parameters
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    out[f"ddp_{kind}_start"] = S.params_of(model)
    opt = S.make_optimizer(ddp.parameters(), kind)
    losses = S.train(ddp, opt, xs[:, mine], ys[:, mine])
    out[f"ddp_{kind}_params"] = S.params_of(model)
    out[f"ddp_{kind}_losses"] = losses
    out[f"ddp_{kind}_layout"] = [[str(x) for x in b] for b in ddp.bucket_layout]
    return ddp, opt


@scenario
def ddp_sgd_fused():
    ddp, opt = ddp_run("sgd_fused", bucket_cap_mb=200 / 2 ** 20)      # ~200-byte buckets: several per model
    out["state_dict_keys"] = sorted(ddp.state_dict())
    # overlap: record how many gradients exist when each bucket's all-reduce starts
    seen = []
    real = dist._all_reduce_arrays

    def spy(arrays, op=dist.ReduceOp.SUM, tag=None, side_stream=False):
        seen.append(sum(p.grad is not None for p in ddp.parameters()))
        return real(arrays, op, tag, side_stream)
    dist._all_reduce_arrays = spy
    try:
        xs, ys = S.data(W)
        loss = F.cross_entropy(ddp(mdn.tensor(xs[0, :S.B])), mdn.tensor(ys[0, :S.B]))
        opt.zero_grad()
        loss.backward()
    finally:
        dist._all_reduce_arrays = real
    out["overlap_grads_at_reduce"] = seen
    out["overlap_params"] = len(list(ddp.parameters()))


@scenario
def ddp_sgd_unfused():
    ddp_run("sgd_unfused", bucket_cap_mb=200 / 2 ** 20)


@scenario
def ddp_adam():
    ddp_run("adam", bucket_cap_mb=25)


@scenario
def no_sync():
    xs, ys = S.data(W, steps=2, seed=1)
    mine = slice(R * S.B, (R + 1) * S.B)
    model = S.mlp(seed=R)
    ddp = DDP(model)
    opt = S.make_optimizer(ddp.parameters(), "sgd_fused")
    opt.zero_grad()
    with ddp.no_sync():
        F.cross_entropy(ddp(mdn.tensor(xs[0, mine])), mdn.tensor(ys[0, mine])).backward()
    out["no_sync_local_grad"] = [p.grad.numpy().copy() for p in model.parameters()]
    F.cross_entropy(ddp(mdn.tensor(xs[1, mine])), mdn.tensor(ys[1, mine])).backward()
    out["no_sync_grad"] = [p.grad.numpy().copy() for p in model.parameters()]
    opt.step()
    out["no_sync_params"] = S.params_of(model)


@scenario
def sync_batchnorm():
    xs = np.random.default_rng(2).standard_normal((S.STEPS, W * S.B, 2, 5, 5)) * 3 + 1
    ys = np.random.default_rng(3).integers(0, 3, (S.STEPS, W * S.B))
    mine = slice(R * S.B, (R + 1) * S.B)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(S.conv_bn(seed=R))
    out["syncbn_types"] = [type(m).__name__ for m in model.modules()]
    ddp = DDP(model)
    opt = S.make_optimizer(ddp.parameters(), "sgd_fused")
    logits0 = ddp(mdn.tensor(xs[0, mine]))
    out["syncbn_logits0"] = logits0.numpy().copy()
    S.train(ddp, opt, xs[:, mine], ys[:, mine])
    out["syncbn_params"] = S.params_of(model)
    out["syncbn_buffers"] = [b.numpy().copy() for b in model.buffers()]


@scenario
def find_unused():
    xs, ys = S.data(W, steps=2, seed=4)
    mine = slice(R * S.B, (R + 1) * S.B)
    model = S.Branches(seed=R)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=1e-5)
    opt = S.make_optimizer(ddp.parameters(), "sgd_fused")
    for k in range(2):
        loss = F.cross_entropy(ddp(mdn.tensor(xs[k, mine]), use_b=(R != 0)), mdn.tensor(ys[k, mine]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    out["unused_params"] = S.params_of(model)
    out["unused_c_grad_is_none"] = [p.grad is None for p in model.c.parameters()]


@scenario
def unfinished_reduction():
    xs, ys = S.data(W, steps=2, seed=5)
    model = S.Branches(seed=0)
    ddp = DDP(model)
    loss = F.cross_entropy(ddp(mdn.tensor(xs[0, :S.B])), mdn.tensor(ys[0, :S.B]))
    loss.backward()
    try:
        ddp(mdn.tensor(xs[1, :S.B]))
        out["unfinished"] = "no error"
    except RuntimeError as e:
        out["unfinished"] = str(e)


@scenario
def different_models():
    model = nn.Linear(3, 2 + (R == W - 1))
    try:
        DDP(model)
        out["different_models"] = "no error"
    except RuntimeError as e:
        out["different_models"] = str(e)


@scenario
def buffers_broadcast():
    model = S.conv_bn(seed=R)
    model[1].running_mean.data[...] = R + 1.0
    DDP(model)
    out["buffer_after_wrap"] = model[1].running_mean.numpy().copy()


@scenario
def sampler():
    ds = list(range(11))
    for drop_last in (False, True):
        s = DistributedSampler(ds, shuffle=True, seed=7, drop_last=drop_last)
        epochs = []
        for epoch in range(2):
            s.set_epoch(epoch)
            epochs.append(list(s))
        out[f"sampler_{drop_last}"] = epochs
        out[f"sampler_len_{drop_last}"] = len(s)


dist.destroy_process_group()
outdir = sys.argv[1]
arrays = {}
plain = {}
for k, v in out.items():
    if isinstance(v, np.ndarray):
        arrays[k] = v
    elif isinstance(v, list) and v and all(isinstance(a, np.ndarray) for a in v):
        for i, a in enumerate(v):
            arrays[f"{k}.{i}"] = a
        plain[k + ".len"] = len(v)
    else:
        plain[k] = v
np.savez(os.path.join(outdir, f"rank{R}.npz"), **arrays)
with open(os.path.join(outdir, f"rank{R}.json"), "w") as f:
    json.dump(plain, f, default=repr)
