"""DataLoader with PyTorch's arguments: worker processes (same batches in the same order as in-process,
reproducible per-worker seeds, worker_init_fn, persistent workers, errors, timeout), samplers, batch_size=None,
pin_memory, argument errors as PyTorch raises them, and exact mid-epoch resume through state_dict.

Workers use the 'fork' start method (the default on Linux: a worker starts in milliseconds); one test runs
'spawn' to check that everything a worker needs pickles.  Datasets are tiny: CI has 2 cores."""
import os
import random
import time

import numpy as np
import pytest

import minidnn as mdn
from minidnn.data import transforms as T
from minidnn.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
    get_worker_info,
)

torch = pytest.importorskip("torch")


def _xy(n=23):
    return np.arange(n * 3, dtype=np.float32).reshape(n, 3), np.arange(n, dtype=np.int64)


def _epoch(loader):
    out = []
    for batch in loader:
        out.append([np.asarray(t.numpy()).copy() if isinstance(t, mdn.Tensor) else t for t in batch]
                   if isinstance(batch, (tuple, list)) else np.asarray(batch.numpy()).copy())
    return out


def _equal(a, b):
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return np.array_equal(a, b)


class PerSample(Dataset):
    """A per-sample dataset that draws from every random source a worker seeds."""

    def __init__(self, n=12):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return np.array([i, -1 if info is None else info.id, float(mdn.rand(1).item()), np.random.rand(),
                         random.random()], dtype=np.float64)


class Pid(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return np.array([os.getpid()])


@pytest.mark.parametrize("kwargs", [dict(batch_size=4), dict(batch_size=4, shuffle=True),
                                    dict(batch_size=5, shuffle=True, drop_last=True),
                                    dict(batch_size=3, collate_fn=lambda s: [np.stack([a for a, _ in s]),
                                                                             np.array([b for _, b in s])])])
def test_two_workers_give_the_batches_of_zero_workers(kwargs):
    ds = TensorDataset(*_xy())
    mdn.manual_seed(3)
    plain = _epoch(DataLoader(ds, num_workers=0, **kwargs))
    mdn.manual_seed(3)
    workers = _epoch(DataLoader(ds, num_workers=2, **kwargs))
    assert _equal(plain, workers) and len(plain) == len(DataLoader(ds, **kwargs))


def test_workers_keep_order_when_a_worker_is_slow():
    class Slow(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i < 2:
                time.sleep(0.2)          # worker 0's first batch finishes last
            return np.array([i])
    got = [b.numpy().ravel().tolist() for b in DataLoader(Slow(), batch_size=2, num_workers=2, prefetch_factor=2)]
    assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_worker_seeding_is_reproducible_and_distinct():
    def run(seed):
        mdn.manual_seed(seed)
        return np.concatenate([b.numpy() for b in DataLoader(PerSample(), batch_size=3, num_workers=2)])
    a, b, c = run(0), run(0), run(1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[:, 2:], c[:, 2:])
    assert set(a[:, 1]) == {0, 1}                                        # batches alternate over workers
    w0, w1 = a[a[:, 1] == 0], a[a[:, 1] == 1]
    for col in (2, 3, 4):                                                # minidnn, numpy, python random
        assert not np.intersect1d(w0[:, col], w1[:, col]).size
    assert get_worker_info() is None


def test_worker_seed_is_base_seed_plus_id_and_init_fn_runs():
    seen = []

    class Info(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = get_worker_info()
            return np.array([info.id, info.num_workers, info.seed % (1 << 62), int(os.environ["MDN_INIT"])])

    def init(worker_id):
        os.environ["MDN_INIT"] = str(100 + worker_id)
    g = mdn.Generator().manual_seed(5)
    rows = np.concatenate([b.numpy() for b in DataLoader(Info(), batch_size=1, num_workers=2, generator=g,
                                                         worker_init_fn=init)])
    base = int(mdn.Generator().manual_seed(5)._engine().integers(0, 1 << 63))   # drawn first from the generator
    assert rows[:, 0].tolist() == [0, 1, 0, 1] and (rows[:, 1] == 2).all()
    assert rows[:, 2].tolist() == [(base + w) % (1 << 62) for w in (0, 1, 0, 1)]
    assert rows[:, 3].tolist() == [100, 101, 100, 101]
    del seen


def test_persistent_workers_live_across_epochs():
    loader = DataLoader(Pid(), batch_size=2, num_workers=2, persistent_workers=True)
    first = {int(p) for b in loader for p in b.numpy().ravel()}
    second = {int(p) for b in loader for p in b.numpy().ravel()}
    assert first == second and len(first) == 2 and os.getpid() not in first
    fresh = DataLoader(Pid(), batch_size=2, num_workers=2)
    assert {int(p) for b in fresh for p in b.numpy().ravel()} != {int(p) for b in fresh for p in b.numpy().ravel()}


def test_abandoned_epoch_with_persistent_workers_does_not_leak_batches():
    loader = DataLoader(TensorDataset(*_xy(40)), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    del it
    assert _equal(_epoch(loader), _epoch(DataLoader(TensorDataset(*_xy(40)), batch_size=2)))


def test_persistent_workers_state_carries_the_seed_they_were_started_with():
    loader = DataLoader(PerSample(8), batch_size=2, num_workers=2, persistent_workers=True)
    first = np.concatenate([b.numpy() for b in loader])
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["base_seed"] == loader._pool.base_seed
    fresh = DataLoader(PerSample(8), batch_size=2, num_workers=2)
    fresh.load_state_dict(state)
    rows = np.concatenate([b.numpy() for b in fresh])
    # the resumed worker 0 starts from the seed the persistent worker 0 started from: its first draws match
    assert rows[0][0] == 2 and first[0][0] == 0
    np.testing.assert_array_equal(rows[0][2:], first[0][2:])


def test_a_superseded_persistent_iterator_raises_instead_of_hanging():
    loader = DataLoader(TensorDataset(*_xy(40)), batch_size=2, num_workers=2, persistent_workers=True)
    old = iter(loader)
    next(old)
    new = iter(loader)
    assert len(_epoch(new)) == 20
    with pytest.raises(RuntimeError, match="superseded"):
        for _ in range(20):
            next(old)


def test_worker_exception_is_reraised_with_its_type():
    class Bad(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 3:
                raise KeyError("sample 3 is missing")
            return np.array([i])
    with pytest.raises(KeyError, match="worker process 1.*sample 3 is missing"):
        list(DataLoader(Bad(), batch_size=2, num_workers=2))


def test_dead_worker_and_timeout_are_clear_errors():
    class Dies(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            os._exit(3)

    class Sleeps(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(5)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(DataLoader(Dies(), batch_size=2, num_workers=1))
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds"):
        list(DataLoader(Sleeps(), batch_size=2, num_workers=1, timeout=0.3))
    assert time.monotonic() - began < 4


def test_spawn_start_method():
    ds = TensorDataset(*_xy(10))
    mdn.manual_seed(0)
    spawned = _epoch(DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, multiprocessing_context="spawn"))
    mdn.manual_seed(0)
    assert _equal(spawned, _epoch(DataLoader(ds, batch_size=4, shuffle=True)))


def test_sampler_batch_sampler_and_no_batching():
    x, y = _xy(10)
    ds = TensorDataset(x, y)
    by_sampler = _epoch(DataLoader(ds, batch_size=4, sampler=list(range(9, -1, -1))))
    assert by_sampler[0][1].tolist() == [9, 8, 7, 6]
    by_batches = _epoch(DataLoader(ds, batch_sampler=[[0, 5], [7], [1, 2, 3]]))
    assert [b[1].tolist() for b in by_batches] == [[0, 5], [7], [1, 2, 3]]
    single = list(DataLoader(ds, batch_size=None))
    assert len(single) == 10 and single[3][0].shape == (3,) and int(single[3][1].item()) == 3
    w = DataLoader(ds, batch_size=5, sampler=WeightedRandomSampler([0.0] * 9 + [1.0], 10))
    assert all((b[1].numpy() == 9).all() for b in w)


LOADER_ERRORS = [
    dict(shuffle=True, sampler=[0, 1]), dict(batch_sampler=[[0]], batch_size=2),
    dict(batch_sampler=[[0]], shuffle=True),
    dict(batch_sampler=[[0]], drop_last=True), dict(num_workers=-1), dict(timeout=-1), dict(prefetch_factor=2),
    dict(persistent_workers=True), dict(batch_size=None, drop_last=True),
]


@pytest.mark.parametrize("kwargs", LOADER_ERRORS)
def test_argument_errors_as_pytorch(kwargs):
    with pytest.raises(ValueError):
        torch.utils.data.DataLoader(list(range(4)), **kwargs)
    with pytest.raises(ValueError):
        DataLoader(TensorDataset(np.arange(4)), **kwargs)


def test_bad_dataset_and_samplers_are_type_errors_up_front():
    with pytest.raises(TypeError, match="map-style"):
        DataLoader(5)
    with pytest.raises(TypeError, match="sampler must be iterable"):
        DataLoader(TensorDataset(np.arange(4)), sampler=3)
    with pytest.raises(TypeError, match="batch_sampler must be iterable"):
        DataLoader(TensorDataset(np.arange(4)), batch_sampler=3)
    with pytest.raises(TypeError, match="collate_fn must be callable"):
        DataLoader(TensorDataset(np.arange(4)), collate_fn=3)


def test_pin_memory_without_gpu_warns_and_still_loads():
    if mdn.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = DataLoader(TensorDataset(*_xy(6)), batch_size=4, pin_memory=True)
    assert _equal(_epoch(loader), _epoch(DataLoader(TensorDataset(*_xy(6)), batch_size=4)))


@pytest.mark.cuda
def test_pin_memory_on_cuda():
    from minidnn.backend import pinned
    ds = TensorDataset(*_xy(20))
    pinned_cpu = list(DataLoader(ds, batch_size=8, pin_memory=True))
    assert all(pinned.is_pinned(t.data) for b in pinned_cpu for t in b)
    plain = _epoch(DataLoader(ds, batch_size=8, device="cuda"))
    for workers in (0, 2):
        fast = DataLoader(ds, batch_size=8, device="cuda", pin_memory=True, num_workers=workers)
        batches = list(fast)
        assert all(t.device.type == "cuda" for b in batches for t in b)
        assert _equal([[t.cpu().numpy() for t in b] for b in batches], plain)


def test_gpu_dataset_with_workers_is_refused(device):
    if device == "cpu":
        pytest.skip("needs a GPU dataset")
    ds = TensorDataset(mdn.tensor(_xy(4)[0], device=device))
    with pytest.raises(ValueError, match="GPU arrays"):
        DataLoader(ds, num_workers=2)


# -- exact mid-epoch resume ---------------------------------------------------------------------------------
def _state_roundtrip(sd, tmp_path):
    mdn.save(sd, tmp_path / "loader.mdn")
    return mdn.load(tmp_path / "loader.mdn")


@pytest.mark.parametrize("workers,prefetch", [(0, 0), (0, 2), (2, 0)])
@pytest.mark.parametrize("use_generator", [False, True])
@pytest.mark.parametrize("stop", [0, 1, 4])
def test_loader_state_dict_resumes_exactly(tmp_path, workers, prefetch, use_generator, stop):
    x, y = _xy(30)

    def make(seed_for_generator):
        g = mdn.Generator().manual_seed(seed_for_generator) if use_generator else None
        crop = T.RandomCrop((1, 2), padding=1, generator=mdn.Generator().manual_seed(seed_for_generator))
        return DataLoader(TensorDataset(x.reshape(30, 1, 1, 3), y), batch_size=4, shuffle=True, drop_last=True,
                          num_workers=workers, prefetch=prefetch, generator=g,
                          transform=T.Compose([crop, T.Normalize((0.5,), (2.0,))]))
    mdn.manual_seed(1)
    loader = make(7)
    _epoch(loader)                                  # not the first epoch
    it = iter(loader)
    for _ in range(stop):
        next(it)
    state = _state_roundtrip(loader.state_dict(), tmp_path)
    assert state["batches"] == stop and not state["finished"]
    rng = mdn.get_rng_state()
    rest = _epoch(it)
    following = _epoch(loader)

    mdn.manual_seed(1234)
    resumed = make(99)                              # other seeds: the state alone must decide
    resumed.load_state_dict(state)
    mdn.set_rng_state(rng)
    got = _epoch(resumed)
    assert len(got) == len(rest) == len(loader) - stop
    assert _equal(got, rest)
    assert _equal(_epoch(resumed), following)       # the epochs after it match the uninterrupted ones


def test_loader_state_after_a_finished_epoch_starts_a_new_one():
    loader = DataLoader(TensorDataset(*_xy(8)), batch_size=3)
    _epoch(loader)
    state = loader.state_dict()
    assert state["finished"]
    other = DataLoader(TensorDataset(*_xy(8)), batch_size=3)
    other.load_state_dict(state)
    assert len(_epoch(other)) == 3


def test_loader_load_state_dict_rejects_bad_states():
    loader = DataLoader(TensorDataset(*_xy(8)), batch_size=3, shuffle=True)
    it = iter(loader)
    next(it)
    good = loader.state_dict()
    with pytest.raises(ValueError, match="keys"):
        loader.load_state_dict({"batches": 1})
    with pytest.raises(ValueError, match="only 3"):
        loader.load_state_dict({**good, "batches": 4})
    with pytest.raises(ValueError, match="transform generator states"):
        loader.load_state_dict({**good, "transform": [mdn.Generator().get_state()]})
    with pytest.raises(TypeError, match="no load_state_dict"):
        DataLoader(TensorDataset(*_xy(8)), batch_sampler=[[0, 1], [2]]).load_state_dict(good)
    loader.load_state_dict(good)
    assert len(_epoch(loader)) == 2


def test_resume_without_sampler_state_skips_batches_of_a_deterministic_sampler():
    sampler = BatchSampler(SequentialSampler(range(10)), 3, False)
    loader = DataLoader(TensorDataset(*_xy(10)), batch_sampler=sampler)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = DataLoader(TensorDataset(*_xy(10)), batch_sampler=BatchSampler(SequentialSampler(range(10)), 3, False))
    other.load_state_dict(state)
    assert [b[1].tolist() for b in _epoch(other)] == [[3, 4, 5], [6, 7, 8], [9]]


def test_large_batches_travel_through_shared_memory_and_leave_no_files():
    """Batches over 64 KiB go through /dev/shm files: same values, and every file is gone afterwards (read,
    an abandoned epoch, persistent workers shut down)."""
    import gc
    import glob

    from minidnn.data import _worker
    if _worker._SHM_DIR is None:
        pytest.skip("no /dev/shm")
    x = np.random.default_rng(0).random((40, 3, 32, 32), dtype=np.float32)          # 8 samples = 98 KiB
    ds = TensorDataset(x, np.arange(40))
    mdn.manual_seed(2)
    plain = _epoch(DataLoader(ds, batch_size=8, shuffle=True))
    mdn.manual_seed(2)
    assert _equal(_epoch(DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)), plain)
    loader = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    del it                                                     # abandoned with batches in flight
    assert _equal(_epoch(loader), _epoch(DataLoader(ds, batch_size=8)))
    pids = [w.pid for w in loader._pool._workers]
    del loader
    gc.collect()
    leftovers = [p for pid in pids for p in glob.glob(f"/dev/shm/minidnn-data-{pid}-*")]
    assert leftovers == []


@pytest.mark.cuda
def test_resume_from_a_state_loaded_onto_the_gpu(tmp_path):
    """A checkpoint loaded with map_location="cuda" holds the generator states on the GPU: still resumes."""
    x, y = _xy(24)

    def make():
        crop = T.RandomCrop((1, 2), padding=1, generator=mdn.Generator().manual_seed(3))
        return DataLoader(TensorDataset(x.reshape(24, 1, 1, 3), y), batch_size=4, device="cuda",
                          generator=mdn.Generator().manual_seed(3), shuffle=True, transform=crop)
    loader = make()
    it = iter(loader)
    next(it)
    next(it)
    mdn.save({"loader": loader.state_dict(), "rng": mdn.cuda.get_rng_state()}, tmp_path / "c.mdn")
    rest = [[t.cpu().numpy() for t in b] for b in it]
    state = mdn.load(tmp_path / "c.mdn", map_location="cuda")
    resumed = make()
    resumed.load_state_dict(state["loader"])
    mdn.cuda.set_rng_state(state["rng"])
    assert _equal([[t.cpu().numpy() for t in b] for b in resumed], rest)
