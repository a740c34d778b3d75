"""NCCL on real GPUs.  One GPU: a world of one is a real NCCL communicator (every collective, DDP inside a CUDA
graph).  Two or more GPUs: the launcher starts one rank per GPU (at most 4); the loss curve of N ranks with batch B
each equals one GPU's with batch N*B (float32 tolerance), eager, replayed from a CUDA graph, and with
SyncBatchNorm.  Everything here is marked cuda and skips cleanly without a GPU."""
import os
import subprocess
import sys

import _scenarios as S
import numpy as np
import pytest

import minidnn as mdn
import minidnn.distributed as dist
from minidnn.distributed.run import free_port
from minidnn.nn.parallel import DistributedDataParallel as DDP

pytestmark = pytest.mark.cuda
HERE = os.path.dirname(os.path.abspath(__file__))
F32 = dict(rtol=2e-4, atol=2e-5)


def gpus():
    return mdn.cuda.device_count() if mdn.cuda.is_available() else 0


@pytest.fixture
def world_of_one(monkeypatch):
    if gpus() < 1:
        pytest.skip("no CUDA GPU with CuPy on this machine")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    mdn.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_nccl_world_of_one_collectives(world_of_one):
    assert dist.get_backend() == "nccl"
    for dtype in (np.float16, np.float32, np.float64, np.int32, np.int64):
        a = (np.arange(6).reshape(2, 3) - 2).astype(dtype)
        for op in ("SUM", "MAX", "MIN", "PRODUCT") + (("AVG",) if np.dtype(dtype).kind == "f" else ()):
            t = mdn.tensor(a, device="cuda")
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            np.testing.assert_array_equal(t.cpu().numpy(), a, err_msg=f"{op} {dtype}")
    t = mdn.tensor(np.arange(5.0, dtype=np.float32), device="cuda")
    dist.broadcast(t, src=0)
    np.testing.assert_array_equal(t.cpu().numpy(), np.arange(5.0))
    out = [mdn.zeros(5, device="cuda")]
    dist.all_gather(out, t)
    np.testing.assert_array_equal(out[0].cpu().numpy(), np.arange(5.0))
    dist.barrier()
    with pytest.raises(TypeError, match="needs CUDA tensors"):
        dist.all_reduce(mdn.zeros(3))
    with pytest.raises(ValueError, match="NCCL has no ReduceOp.BAND"):
        dist.all_reduce(mdn.tensor(np.ones(3, np.int32), device="cuda"), op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="needs the module on a GPU"):
        DDP(mdn.nn.Linear(2, 2))


@pytest.mark.parametrize("comm_stream", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
def test_ddp_world_of_one_equals_plain_training(world_of_one, compiled, comm_stream):
    """A world of one averages over one rank: the same steps as without the wrapper, eager and from a CUDA
    graph (the bucket all-reduces, on the communication stream or the current one, captured with the backward)."""
    xs, ys = S.image_data(1, 6, 16)
    ref = S.small_cnn(seed=0).to("cuda")
    ref_losses = S.gpu_train(ref, xs, ys, "cuda")
    model = S.small_cnn(seed=0).to("cuda")
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.002, comm_stream=comm_stream)
    losses = S.gpu_train(ddp, xs, ys, "cuda", compiled=compiled)
    assert len(ddp.bucket_layout) >= 2 and all(b[0] == "flat" for b in ddp.bucket_layout)
    np.testing.assert_allclose(losses, ref_losses, **F32)
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.cpu().numpy(), q.cpu().numpy(), **F32)


@pytest.fixture(scope="module")
def multi_gpu(tmp_path_factory):
    n = min(gpus(), 4)
    if n < 2:
        pytest.skip(f"needs >= 2 GPUs, {n} visible")
    out = tmp_path_factory.mktemp("nccl")
    proc = subprocess.run([sys.executable, "-m", "minidnn.distributed.run", "--nproc-per-node", str(n),
                           os.path.join(HERE, "_gpu_worker.py"), str(out)], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(HERE)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return n, [dict(np.load(out / f"rank{r}.npz", allow_pickle=True)) for r in range(n)]


def test_multi_gpu_collectives(multi_gpu):
    n, ranks = multi_gpu
    base = [np.array([1.5, -2.0, 3.0], dtype=np.float32) * (r + 1) for r in range(n)]
    want = {"SUM": np.sum(base, 0), "AVG": np.sum(base, 0) / n, "MAX": np.max(base, 0), "MIN": np.min(base, 0),
            "PRODUCT": np.prod(base, 0)}
    for r, got in enumerate(ranks):
        for op, w in want.items():
            np.testing.assert_allclose(got[f"all_reduce_{op}"], w, rtol=1e-6, err_msg=op)
        np.testing.assert_array_equal(got["broadcast"], np.arange(4.0) + 10 * (n - 1))
        np.testing.assert_array_equal(got["all_gather"], np.stack([np.full(2, float(q)) for q in range(n)]))


@pytest.mark.parametrize("name", ["eager", "graphed", "syncbn", "current_stream"])
def test_multi_gpu_loss_curve_equals_one_gpu_with_the_whole_batch(multi_gpu, name):
    n, ranks = multi_gpu
    xs, ys = S.image_data(n, 8, 16)
    ref = S.small_cnn(seed=0, batchnorm=(name == "syncbn")).to("cuda:0")
    ref_losses = S.gpu_train(ref, xs, ys, "cuda:0")
    curve = np.mean([r[f"{name}_losses"] for r in ranks], axis=0)     # mean of the ranks' means = the batch mean
    np.testing.assert_allclose(curve, ref_losses, **F32)
    for r in ranks:
        assert int(r[f"{name}_buckets"]) >= 2
        for i, q in enumerate(ref.parameters()):
            np.testing.assert_allclose(r[f"{name}_param{i}"], q.cpu().numpy(), rtol=1e-3, atol=1e-4)
