"""DataLoader, datasets, collation and random_split."""
import collections
import gc
import threading
import time

import numpy as np
import pytest

import minidnn as mdn
from minidnn.data import DataLoader, Dataset, Subset, TensorDataset, default_collate, random_split
from minidnn.data.collate import collate_arrays


def _xy(n=10):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n, dtype=np.int64)
    return x, y


class CountingDataset(Dataset):
    """A per-sample dataset (no vectorised get_batch of its own) that counts its __getitem__ calls."""

    def __init__(self, n=10):
        self.x, self.y = _xy(n)
        self.calls = 0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.calls += 1
        return self.x[i], int(self.y[i])


class PlainSequence:
    """Not a Dataset: only __getitem__ and __len__, as any Python sequence of samples."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return mdn.tensor(self.x[i]), self.y[i]


def _epoch(loader):
    return [tuple(t.numpy().copy() for t in batch) for batch in loader]


@pytest.mark.parametrize("n,bs,drop_last,expected", [(10, 3, False, 4), (10, 3, True, 3), (9, 3, False, 3),
                                                     (2, 5, True, 0), (2, 5, False, 1)])
def test_len_and_batch_sizes(n, bs, drop_last, expected):
    loader = DataLoader(TensorDataset(*_xy(n)), batch_size=bs, drop_last=drop_last)
    batches = _epoch(loader)
    assert len(loader) == expected == len(batches)
    sizes = [len(b[1]) for b in batches]
    assert sum(sizes) == (n // bs * bs if drop_last else n)
    assert all(s == bs for s in sizes[:-1])


def test_sequential_order_and_dtypes():
    x, y = _xy(10)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    xb, yb = next(iter(loader))
    assert isinstance(xb, mdn.Tensor) and xb.dtype == np.float32 and yb.dtype == np.int64
    np.testing.assert_array_equal(xb.numpy(), x[:4])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in _epoch(loader)]), y)


def test_shuffle_reproducible_and_new_each_epoch():
    ds = TensorDataset(*_xy(50))
    a = DataLoader(ds, batch_size=7, shuffle=True, seed=3)
    b = DataLoader(ds, batch_size=7, shuffle=True, generator=np.random.default_rng(3))
    epochs_a = [np.concatenate([y for _, y in _epoch(a)]) for _ in range(3)]
    epochs_b = [np.concatenate([y for _, y in _epoch(b)]) for _ in range(3)]
    for ea, eb in zip(epochs_a, epochs_b):
        np.testing.assert_array_equal(ea, eb)                  # same seed -> same sequence of epochs
        np.testing.assert_array_equal(np.sort(ea), np.arange(50))   # each epoch a permutation
    assert not np.array_equal(epochs_a[0], epochs_a[1])        # a new order each epoch
    c = DataLoader(ds, batch_size=7, shuffle=True, seed=4)
    assert not np.array_equal(np.concatenate([y for _, y in _epoch(c)]), epochs_a[0])


def test_shuffle_follows_manual_seed():
    ds = TensorDataset(*_xy(30))
    mdn.manual_seed(11)
    first = np.concatenate([y for _, y in _epoch(DataLoader(ds, batch_size=5, shuffle=True))])
    mdn.manual_seed(11)
    second = np.concatenate([y for _, y in _epoch(DataLoader(ds, batch_size=5, shuffle=True))])
    np.testing.assert_array_equal(first, second)


def test_generator_and_seed_together_rejected():
    with pytest.raises(ValueError, match="not both"):
        DataLoader(TensorDataset(*_xy()), shuffle=True, seed=1, generator=np.random.default_rng(1))


def test_fast_path_fetches_whole_batch_with_one_index(monkeypatch):
    ds = TensorDataset(*_xy(10))
    seen = []
    original = TensorDataset.get_batch
    monkeypatch.setattr(TensorDataset, "get_batch", lambda self, idx: (seen.append(np.asarray(idx)),
                                                                        original(self, idx))[1])
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: pytest.fail("per-sample fetch used"))
    batches = _epoch(DataLoader(ds, batch_size=4, shuffle=True, seed=0))
    assert [len(s) for s in seen] == [4, 4, 2]
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(10))
    assert len(batches) == 3


def test_fast_path_matches_per_sample_path():
    x, y = _xy(23)
    fast = _epoch(DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True, seed=9))
    slow_ds = CountingDataset(23)
    slow = _epoch(DataLoader(slow_ds, batch_size=5, shuffle=True, seed=9))
    generic = _epoch(DataLoader(PlainSequence(x, y), batch_size=5, shuffle=True, seed=9))
    assert slow_ds.calls == 23
    for f, s, g in zip(fast, slow, generic):
        for a, b, c in zip(f, s, g):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)


def test_collate_fn_receives_samples():
    ds = CountingDataset(6)
    loader = DataLoader(ds, batch_size=4, collate_fn=lambda samples: (len(samples), default_collate(samples)))
    batch = next(iter(loader))
    assert batch[0] == 4 and batch[1][0].shape == (4, 3)


def test_tensordataset_indexing():
    x, y = _xy(8)
    ds = TensorDataset(mdn.tensor(x), y)
    xi, yi = ds[3]
    assert xi.shape == (3,) and int(yi.item()) == 3
    xb, yb = ds[np.array([5, 1, 1])]
    np.testing.assert_array_equal(xb.numpy(), x[[5, 1, 1]])
    np.testing.assert_array_equal(yb.numpy(), [5, 1, 1])
    with pytest.raises(ValueError, match="same first dimension"):
        TensorDataset(x, y[:-1])


Point = collections.namedtuple("Point", "image label")


def test_default_collate_nested_structures():
    samples = [{"image": np.full((2, 2), i, np.float32), "meta": (i, float(i), f"s{i}"), "flag": i % 2 == 0,
                "pair": [np.int16(i), mdn.tensor([i, i])]} for i in range(3)]
    batch = default_collate(samples)
    assert batch["image"].shape == (3, 2, 2) and batch["image"].dtype == np.float32
    ints, floats, strings = batch["meta"]
    assert ints.dtype == np.int64 and floats.dtype == np.float32 and strings == ["s0", "s1", "s2"]
    assert batch["flag"].dtype == np.bool_
    assert isinstance(batch["pair"], list) and batch["pair"][0].dtype == np.int16
    np.testing.assert_array_equal(batch["pair"][1].numpy(), [[0, 0], [1, 1], [2, 2]])
    points = collate_arrays([Point(np.zeros(2), 1), Point(np.ones(2), 2)])
    assert isinstance(points, Point) and points.image.shape == (2, 2) and points.label.tolist() == [1, 2]


def test_default_collate_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"different shapes"):
        default_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(TypeError, match="NoneType"):
        default_collate([None, None])


# -- prefetch -----------------------------------------------------------------------------------
def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "minidnn-data-prefetch"]


def _wait_no_prefetch_threads(timeout=2.0):
    deadline = time.monotonic() + timeout
    while _prefetch_threads() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return not _prefetch_threads()


@pytest.mark.parametrize("prefetch", [True, 1, 3])
def test_prefetch_gives_identical_batches(prefetch):
    ds = TensorDataset(*_xy(37))
    kwargs = dict(batch_size=4, shuffle=True)
    plain = DataLoader(ds, seed=5, **kwargs)
    ahead = DataLoader(ds, seed=5, prefetch=prefetch, **kwargs)
    for _ in range(2):
        for a, b in zip(_epoch(plain), _epoch(ahead), strict=True):
            for u, v in zip(a, b):
                np.testing.assert_array_equal(u, v)
    assert _wait_no_prefetch_threads()


def test_prefetch_early_break_stops_thread():
    loader = DataLoader(TensorDataset(*_xy(1000)), batch_size=1, prefetch=2)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert _wait_no_prefetch_threads()
    it = iter(loader)
    next(it)
    it.close()                                   # explicit close works too
    assert not it._prefetcher._thread.is_alive()
    with pytest.raises(StopIteration):
        next(it)


class FailingDataset(CountingDataset):
    def __getitem__(self, i):
        if i == 7:
            raise KeyError(f"sample {i} is broken")
        return super().__getitem__(i)


def test_prefetch_propagates_worker_exception():
    loader = DataLoader(FailingDataset(10), batch_size=2, prefetch=2)
    got = []
    with pytest.raises(KeyError, match="sample 7 is broken"):
        for xb, _ in loader:
            got.append(xb)
    assert len(got) == 3                         # batches before the broken one arrive first
    assert _wait_no_prefetch_threads()


# -- random_split / Subset ------------------------------------------------------------------------
@pytest.mark.parametrize("lengths,sizes", [([7, 3], [7, 3]), ([0.5, 0.5], [5, 5]), ([0.34, 0.33, 0.33], [4, 3, 3]),
                                           ([10, 0], [10, 0])])
def test_random_split_sizes_and_disjoint(lengths, sizes):
    ds = TensorDataset(*_xy(10))
    parts = random_split(ds, lengths, seed=0)
    assert [len(p) for p in parts] == sizes
    all_idx = np.concatenate([p.indices for p in parts])
    np.testing.assert_array_equal(np.sort(all_idx), np.arange(10))
    again = random_split(ds, lengths, generator=np.random.default_rng(0))
    for p, q in zip(parts, again):
        np.testing.assert_array_equal(p.indices, q.indices)


def test_random_split_bad_lengths():
    with pytest.raises(ValueError, match=r"sum to the dataset length 10"):
        random_split(TensorDataset(*_xy(10)), [3, 3], seed=0)
    with pytest.raises(ValueError, match="sum to 1"):
        random_split(TensorDataset(*_xy(10)), [0.5, 0.4], seed=0)


def test_subset_batches_through_parent_fast_path():
    x, y = _xy(10)
    sub = Subset(TensorDataset(x, y), [9, 2, 4])
    xb, yb = sub.get_batch(np.array([0, 2]))
    np.testing.assert_array_equal(yb, [9, 4])
    assert int(sub[1][1].item()) == 2
    loader_y = np.concatenate([b[1] for b in _epoch(DataLoader(sub, batch_size=2))])
    np.testing.assert_array_equal(loader_y, [9, 2, 4])
    sub_of_plain = Subset(CountingDataset(10), [1, 3])
    np.testing.assert_array_equal(sub_of_plain.get_batch(np.array([1, 0]))[1], [3, 1])


# -- device placement and loader transforms ----------------------------------------------------------
def test_batches_on_device_with_transform(device):
    x = np.random.default_rng(0).random((12, 1, 4, 4), dtype=np.float32)
    y = np.arange(12)
    from minidnn.data.transforms import Normalize
    loader = DataLoader(TensorDataset(x, y), batch_size=5, device=device, transform=Normalize([0.5], [0.25]),
                        prefetch=True)
    batches = list(loader)
    for xb, yb in batches:
        assert xb.device == mdn.device(device) and yb.device == mdn.device(device)
        assert xb.dtype == np.float32 and yb.dtype == np.int64
    got = np.concatenate([xb.cpu().numpy() for xb, _ in batches])
    np.testing.assert_allclose(got, (x - 0.5) / 0.25, rtol=1.3e-6, atol=1e-5)


def test_transform_on_dict_batch_rejected():
    loader = DataLoader(CountingDataset(4), batch_size=2, collate_fn=lambda s: {"x": collate_arrays(s)[0]},
                        transform=lambda a: a)
    with pytest.raises(TypeError, match="dict"):
        next(iter(loader))


def test_bad_arguments():
    ds = TensorDataset(*_xy())
    with pytest.raises(ValueError, match="batch_size should be a positive integer value or None, got 0"):
        DataLoader(ds, batch_size=0)
    with pytest.raises(ValueError, match="prefetch"):
        DataLoader(ds, prefetch=-1)


def test_tensordataset_of_device_arrays(device):
    x, y = _xy(9)
    ds = TensorDataset(mdn.tensor(x, device=device), mdn.tensor(y, device=device))
    xb, yb = next(iter(DataLoader(ds, batch_size=4, shuffle=True, seed=0, device=device)))
    assert xb.device == mdn.device(device) and yb.device == mdn.device(device)
    np.testing.assert_array_equal(xb.cpu().numpy(), x[yb.cpu().numpy()])
