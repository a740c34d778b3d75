"""The process group's entry checks, the rendezvous' failures, the launcher's failure propagation, and
DistributedSampler against PyTorch's (no multi-process work here except the launcher tests)."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import minidnn as mdn
import minidnn.distributed as dist
from minidnn.data import DistributedSampler
from minidnn.distributed.run import free_port
from minidnn.nn.parallel import DistributedDataParallel as DDP

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    yield monkeypatch
    dist.destroy_process_group()


@pytest.mark.parametrize("call", [
    lambda: dist.get_rank(), lambda: dist.get_world_size(), lambda: dist.barrier(),
    lambda: dist.all_reduce(mdn.zeros(2)), lambda: dist.broadcast(mdn.zeros(2), 0),
    lambda: dist.all_gather([mdn.zeros(2)], mdn.zeros(2)), lambda: DDP(mdn.nn.Linear(2, 2)),
    lambda: DistributedSampler(range(4))])
def test_calls_before_init_process_group_fail_clearly(call):
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        call()


@pytest.mark.parametrize("kwargs, match", [
    (dict(world_size=0, rank=0), "world_size must be >= 1"),
    (dict(world_size=2, rank=2), "rank 2 is out of range for world_size 2"),
    (dict(world_size=2, rank=-3), "environment variable RANK"),
    (dict(world_size=2, rank=0), "MASTER_ADDR"),
    (dict(world_size=1, rank=0, backend="mpi"), "unknown backend 'mpi'"),
    (dict(world_size=2, rank=0, init_method="file:///tmp/x"), "'env://' or 'tcp://host:port'"),
])
def test_bad_arguments(clean_env, kwargs, match):
    kwargs.setdefault("backend", "cpu")
    with pytest.raises(ValueError, match=match):
        dist.init_process_group(**kwargs)
    assert not dist.is_initialized()


def test_world_of_one_runs_every_collective(clean_env):
    dist.init_process_group("gloo", rank=0, world_size=1)
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "cpu"
    with pytest.raises(RuntimeError, match="twice"):
        dist.init_process_group("cpu", rank=0, world_size=1)
    t = mdn.tensor([1.0, 2.0])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])
    with pytest.raises(TypeError, match="AVG needs floating point"):
        dist.all_reduce(mdn.tensor([1, 2]), op=dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match="src=1 is not a rank"):
        dist.broadcast(t, src=1)
    with pytest.raises(ValueError, match="tensor_list has 2 tensors but the world size is 1"):
        dist.all_gather([mdn.zeros(2), mdn.zeros(2)], t)
    with pytest.raises(ValueError, match=r"tensor_list\[0\] is \(3,\)"):
        dist.all_gather([mdn.zeros(3)], t)
    out = [mdn.zeros(2)]
    dist.all_gather(out, t)
    np.testing.assert_array_equal(out[0].numpy(), t.numpy())
    dist.barrier()
    with pytest.raises(ValueError, match="device_ids must be None for a module on the cpu"):
        DDP(mdn.nn.Linear(2, 2), device_ids=[0])
    dist.destroy_process_group()
    assert not dist.is_initialized()


def test_rendezvous_times_out_naming_the_missing_ranks(clean_env):
    port = free_port()
    start = time.monotonic()
    with pytest.raises(dist.DistributedError, match=r"waiting for rank\(s\) \[1, 2\]"):
        dist.init_process_group("cpu", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=3, timeout=0.5)
    assert time.monotonic() - start < 5
    with pytest.raises(dist.DistributedError, match="could not reach rank 0"):
        dist.init_process_group("cpu", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=3, timeout=0.3)
    assert not dist.is_initialized()


def _launch(tmp_path, body, nproc=2, timeout=60):
    script = tmp_path / "job.py"
    script.write_text(body)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "minidnn.distributed.run", "--nproc-per-node", str(nproc),
                           str(script), "a1", "--flag"], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return proc, time.monotonic() - start


def test_launcher_stops_every_rank_when_one_fails(tmp_path):
    """Rank 1 dies with code 3 while rank 0 would run for a minute: the launcher stops rank 0 and exits 3."""
    proc, took = _launch(tmp_path, "import os, sys, time\n"
                                   "assert sys.argv[1:] == ['a1', '--flag']\n"
                                   "if os.environ['RANK'] == '1': sys.exit(3)\n"
                                   "time.sleep(60)\n")
    assert proc.returncode == 3, proc.stderr
    assert "rank 1 exited with code 3" in proc.stderr
    assert took < 30


def test_launcher_rank_waiting_in_a_collective_is_released(tmp_path):
    """A rank blocked in a collective whose peer crashed is terminated too (nonzero exit, no hang)."""
    proc, took = _launch(tmp_path, "import os, sys\n"
                                   "import minidnn as mdn, minidnn.distributed as dist\n"
                                   "dist.init_process_group('cpu')\n"
                                   "if dist.get_rank() == 1: raise SystemExit(5)\n"
                                   "dist.all_reduce(mdn.zeros(3))\n")
    assert proc.returncode != 0
    assert took < 30


def test_launcher_arguments(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "minidnn.distributed.run", "--nproc-per-node", "0", "x.py"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "--nproc-per-node must be >= 1" in proc.stderr


# -- DistributedSampler -----------------------------------------------------------------------------------------------


def _torch_sampler():
    # PyTorch is the oracle for the partition rules; without it only these tests skip.
    data = pytest.importorskip("torch.utils.data", reason="PyTorch is the oracle for DistributedSampler's rules")
    return data.DistributedSampler


@pytest.mark.parametrize("n", [1, 5, 10, 11, 17])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_without_shuffle_equals_torch(n, replicas, drop_last):
    TorchSampler = _torch_sampler()
    for rank in range(replicas):
        ours = DistributedSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = TorchSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
        assert ours.num_samples == theirs.num_samples and ours.total_size == theirs.total_size


@pytest.mark.parametrize("n, replicas, drop_last", [(10, 3, False), (10, 3, True), (3, 7, False), (16, 4, False)])
def test_sampler_with_shuffle_follows_torchs_rules(n, replicas, drop_last):
    """The permutation's generator differs from torch's; the padding and partition rules are checked exactly by
    rebuilding torch's procedure on our permutation."""
    TorchSampler = _torch_sampler()
    for epoch in range(3):
        shares = []
        for rank in range(replicas):
            s = DistributedSampler(range(n), replicas, rank, shuffle=True, seed=11, drop_last=drop_last)
            s.set_epoch(epoch)
            shares.append(list(s))
            assert list(s) == shares[-1]                   # deterministic for a given epoch
        t = TorchSampler(range(n), replicas, 0, drop_last=drop_last)
        perm = list(np.random.default_rng(11 + epoch).permutation(n))
        full = (perm * (1 + t.total_size // n))[:t.total_size] if not drop_last else perm[:t.total_size]
        for rank in range(replicas):
            assert shares[rank] == full[rank:t.total_size:replicas]
            assert len(shares[rank]) == t.num_samples
        assert sorted(set(i for s in shares for i in s)) == (sorted(set(perm[:t.total_size])) if drop_last
                                                             else list(range(n)))
    e0 = DistributedSampler(range(50), 2, 0, seed=1)
    e1 = DistributedSampler(range(50), 2, 0, seed=1)
    e1.set_epoch(1)
    assert list(e0) != list(e1)


def test_sampler_bad_arguments():
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"):
        DistributedSampler(range(4), num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        DistributedSampler(range(4), num_replicas=0, rank=0)
    with pytest.raises(TypeError, match="rank must be an int"):
        DistributedSampler(range(4), num_replicas=2, rank=1.0)


def test_sampler_in_a_dataloader():
    from minidnn.data import DataLoader, TensorDataset
    ds = TensorDataset(np.arange(10, dtype=np.float32))
    seen = []
    for rank in range(2):
        loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, 2, rank, shuffle=False))
        seen += [float(v) for (b,) in loader for v in b.numpy()]
    assert sorted(seen) == list(map(float, range(10)))


def test_example_trains_data_parallel_on_the_cpu(tmp_path):
    """examples/train_resnet_cifar.py --nproc 2 re-launches itself; only rank 0 prints and saves."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_resnet_cifar.py"), "--synthetic",
                           "--epochs", "1", "--limit", "2", "--batch-size", "4", "--nproc", "2", "--out",
                           str(tmp_path), "--no-progress"], capture_output=True, text=True, timeout=120,
                          cwd=os.path.join(ROOT, "examples"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and "2 ranks x 4 images" in lines[0] and lines[1].startswith("test accuracy: ")
    assert (tmp_path / "checkpoint.mdn").is_file()
