"""Dataset loaders on files the tests write themselves; nothing is ever downloaded here."""
import gzip
import hashlib
import io
import os
import pickle
import struct
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import minidnn as mdn
from minidnn.data import DataLoader
from minidnn.data import datasets as D
from minidnn.data import transforms as T


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to reach the network fails as it would offline."""
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network disabled in tests")
    monkeypatch.setattr(urllib.request, "urlopen", offline)


# -- digits ------------------------------------------------------------------------------------------
DIGITS_IMAGES_SHA256 = "8f26b2bd9d135c256808f68f14fdabddde6d9c7f869ae419704b051f0f14b3b3"
DIGITS_LABELS_SHA256 = "8ba4f891220f5e4c9c819638d1602d74b83618f167043c6da52a2a247841ddf0"
def test_digits_split_is_fixed():
    train, test = D.digits_split_indices()
    assert len(train) == 1437 and len(test) == 360
    assert not np.intersect1d(train, test).size
    np.testing.assert_array_equal(np.union1d(train, test), np.arange(1797))
    # The split must never change: these are the exact test indices on every machine and NumPy release.
    digest = hashlib.sha256(test.astype("<i8").tobytes()).hexdigest()
    assert digest == "6f64a41c53b3764a70a75d75bbcd9dbb0daec518b24a18c5980e63cea921350a"


def test_bundled_digits_file_is_the_published_data():
    # The file shipped in the package (minidnn/data/digits.npz): its exact contents, and its source and licence
    # noted beside it.  The hashes are of scikit-learn 1.9.1's copy, which the next test compares when present.
    images, labels = D._bundled_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8 and images.max() == 16
    assert labels.shape == (1797,) and set(np.unique(labels)) == set(range(10))
    assert hashlib.sha256(images.tobytes()).hexdigest() == DIGITS_IMAGES_SHA256
    assert hashlib.sha256(labels.tobytes()).hexdigest() == DIGITS_LABELS_SHA256
    note = (Path(D.DIGITS_FILE).parent / "digits_SOURCE.md").read_text()
    assert "UCI" in note and "CC BY 4.0" in note


def test_bundled_digits_equal_scikit_learns_copy():
    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn not installed (only this cross-check "
                                   "needs it; minidnn ships the digits)")
    sk = datasets.load_digits()
    images, labels = D._bundled_digits()
    np.testing.assert_array_equal(images, sk.images)
    np.testing.assert_array_equal(labels, sk.target)


def test_load_digits_shapes_dtypes_and_values():
    train, test = D.load_digits("train"), D.load_digits("test")
    assert (len(train), len(test)) == (1437, 360)
    assert train.data.shape == (1437, 1, 8, 8) and train.data.dtype == np.float32
    assert train.targets.dtype == np.int64 and train.classes == [str(d) for d in range(10)]
    assert 0.0 <= train.data.min() and train.data.max() == 1.0
    images, labels = D._bundled_digits()
    _, test_idx = D.digits_split_indices()
    np.testing.assert_array_equal(test.data[:, 0] * 16, images[test_idx])
    np.testing.assert_array_equal(test.targets, labels[test_idx])
    assert all(np.bincount(test.targets, minlength=10) >= 25)       # every class is represented
    images, labels = D.load_digits("test", as_tensors=True)
    assert isinstance(images, mdn.Tensor) and images.shape == (360, 1, 8, 8) and labels.dtype == np.int64
    assert len(D.load_digits("all")) == 1797
    with pytest.raises(ValueError, match="'valid'"):
        D.load_digits("valid")


def test_digits_through_loader_with_upsampling():
    ds = D.load_digits("test", transform=T.Upsample(2))
    xb, yb = next(iter(DataLoader(ds, batch_size=32, shuffle=True, seed=0)))
    assert xb.shape == (32, 1, 16, 16) and xb.dtype == np.float32 and yb.dtype == np.int64
    x0, _ = ds[0]
    assert x0.shape == (1, 16, 16)


# -- IDX (MNIST, Fashion-MNIST) -------------------------------------------------------------------
def _idx_bytes(array):
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}
    array = np.asarray(array)
    header = struct.pack(">BBBB", 0, 0, codes[array.dtype], array.ndim) + struct.pack(f">{array.ndim}I",
                                                                                        *array.shape)
    return header + array.tobytes()


def _write(path, payload, gz):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + (".gz" if gz else ""), "wb") as f:
        f.write(gzip.compress(payload) if gz else payload)


def _write_mnist(folder, prefix, n, gz, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    _write(os.path.join(folder, f"{prefix}-images-idx3-ubyte"), _idx_bytes(images), gz)
    _write(os.path.join(folder, f"{prefix}-labels-idx1-ubyte"), _idx_bytes(labels), gz)
    return images, labels


def test_read_idx_dtypes_and_errors(tmp_path):
    values = np.arange(24, dtype=">i4").reshape(2, 3, 4)
    path = str(tmp_path / "ints-idx3")
    _write(path, _idx_bytes(values), gz=True)
    out = D.read_idx(path + ".gz")
    np.testing.assert_array_equal(out, values)
    assert out.dtype == np.int32 and out.dtype.isnative
    _write(str(tmp_path / "floats"), _idx_bytes(np.array([1.5, -2.0], ">f4")), gz=False)
    np.testing.assert_array_equal(D.read_idx(str(tmp_path / "floats")), [1.5, -2.0])
    _write(str(tmp_path / "short"), _idx_bytes(values)[:-5], gz=False)
    with pytest.raises(ValueError, match=r"has 107 bytes, its header \(shape \(2, 3, 4\), >i4\) needs 112"):
        D.read_idx(str(tmp_path / "short"))
    _write(str(tmp_path / "junk"), b"PK\x03\x04zipfile", gz=False)
    with pytest.raises(ValueError, match="not an IDX file"):
        D.read_idx(str(tmp_path / "junk"))


@pytest.mark.parametrize("cls", [D.MNIST, D.FashionMNIST])
@pytest.mark.parametrize("gz", [True, False])
def test_mnist_format_loaders(tmp_path, cls, gz):
    folder = os.path.join(tmp_path, cls.name, "raw")
    images, labels = _write_mnist(folder, "train", 12, gz)
    test_images, test_labels = _write_mnist(folder, "t10k", 5, gz, seed=1)
    train = cls(root=str(tmp_path), train=True)
    test = cls(root=str(tmp_path), train=False)
    assert len(train) == 12 and len(test) == 5 and len(train.classes) == 10
    np.testing.assert_array_equal(train.data[:, 0], images)
    np.testing.assert_array_equal(test.targets, test_labels.astype(np.int64))
    x, y = train[3]
    assert x.shape == (1, 28, 28) and x.dtype == np.float32
    np.testing.assert_allclose(x.numpy()[0], images[3] / 255.0, rtol=1e-6)
    assert int(y.item()) == labels[3]
    xb, yb = next(iter(DataLoader(test, batch_size=4)))
    assert xb.shape == (4, 1, 28, 28) and yb.dtype == np.int64
    np.testing.assert_allclose(xb.numpy()[:, 0], test_images[:4] / 255.0, rtol=1e-6)


def test_mnist_files_directly_in_root(tmp_path):
    _write_mnist(str(tmp_path), "t10k", 3, gz=False)
    assert len(D.MNIST(root=str(tmp_path), train=False)) == 3


def test_mnist_rejects_out_of_range_labels(tmp_path):
    folder = os.path.join(tmp_path, "MNIST", "raw")
    _write(os.path.join(folder, "t10k-images-idx3-ubyte"), _idx_bytes(np.zeros((2, 28, 28), np.uint8)), False)
    _write(os.path.join(folder, "t10k-labels-idx1-ubyte"), _idx_bytes(np.array([1, 12], np.uint8)), False)
    with pytest.raises(ValueError, match=r"span 1\.\.12, expected 0\.\.9"):
        D.MNIST(root=str(tmp_path), train=False)


def test_missing_files_error_says_what_and_where(tmp_path):
    for download in (False, True):           # True: the (disabled) network fails like being offline
        with pytest.raises(D.DatasetNotFoundError) as info:
            D.MNIST(root=str(tmp_path), train=True, download=download)
        msg = str(info.value)
        folder = os.path.join(str(tmp_path), "MNIST", "raw")
        assert f"train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz] in {folder}" in msg
        assert "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz" in msg
        assert ("network disabled" in msg) == download
    with pytest.raises(D.DatasetNotFoundError, match="fashion-mnist.s3-website.eu-central-1.amazonaws.com/t10k"):
        D.FashionMNIST(root=str(tmp_path), train=False)
    with pytest.raises(D.DatasetNotFoundError) as info:
        D.CIFAR10(root=str(tmp_path), train=False)
    assert "test_batch in " + os.path.join(str(tmp_path), "cifar-10-batches-py") in str(info.value)
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in str(info.value)
    assert not any(p.name.startswith(("train", "t10k")) for p in tmp_path.rglob("*"))    # nothing half-written


class _FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_download_checks_md5_and_writes_atomically(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    files = {"t10k-images-idx3-ubyte.gz": gzip.compress(_idx_bytes(rng.integers(0, 256, (2, 28, 28), np.uint8))),
             "t10k-labels-idx1-ubyte.gz": gzip.compress(_idx_bytes(np.array([3, 4], np.uint8)))}
    served = []

    def fake_urlopen(request, timeout=None):
        name = request.full_url.rsplit("/", 1)[1]
        served.append(request.full_url)
        return _FakeResponse(files[name])

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    # Wrong checksums: nothing may be left behind, and the error says why.
    with pytest.raises(D.DatasetNotFoundError, match="MD5 mismatch"):
        D.MNIST(root=str(tmp_path), train=False, download=True)
    raw = tmp_path / "MNIST" / "raw"
    assert list(raw.iterdir()) == []
    monkeypatch.setattr(D.MNIST, "md5s", {k: hashlib.md5(v).hexdigest() for k, v in files.items()})
    ds = D.MNIST(root=str(tmp_path), train=False, download=True)
    assert ds.targets.tolist() == [3, 4]
    assert sorted(p.name for p in raw.iterdir()) == sorted(files)
    assert served[-1].startswith("https://ossci-datasets.s3.amazonaws.com/mnist/")


# -- CIFAR-10 and the safe unpickler ------------------------------------------------------------------
def _write_cifar(folder, name, n, seed, protocol=pickle.DEFAULT_PROTOCOL, bytes_keys=False):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, n).tolist()
    batch = {"batch_label": "testing batch", "labels": labels, "data": data, "filenames": [f"img{i}.png"
                                                                                              for i in range(n)]}
    if bytes_keys:       # how Python 2's pickles read with encoding="bytes" look
        batch = {k.encode(): v for k, v in batch.items()}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        pickle.dump(batch, f, protocol=protocol)
    return data, labels


def test_cifar10_from_batches(tmp_path):
    folder = os.path.join(tmp_path, "cifar-10-batches-py")
    written = [_write_cifar(folder, f"data_batch_{i}", 3, seed=i, protocol=p, bytes_keys=(i == 5))
               for i, p in zip(range(1, 6), (2, 3, 4, 5, 4))]
    test_data, test_labels = _write_cifar(folder, "test_batch", 4, seed=9)
    train = D.CIFAR10(root=str(tmp_path), train=True)
    test = D.CIFAR10(root=str(tmp_path), train=False)
    assert len(train) == 15 and len(test) == 4 and train.classes[0] == "airplane"
    np.testing.assert_array_equal(train.data, np.concatenate([d for d, _ in written]).reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(train.targets, sum((lab for _, lab in written), []))
    x, y = test[1]
    assert x.shape == (3, 32, 32) and x.dtype == np.float32 and int(y.item()) == test_labels[1]
    # A row is the R, G, B planes in turn: channel 1 of image 1 is bytes 1024..2047 of its row.
    np.testing.assert_allclose(x.numpy()[1].ravel(), test_data[1, 1024:2048] / 255.0, rtol=1e-6)
    loader = DataLoader(train, batch_size=8, transform=T.Compose([T.RandomCrop(32, padding=4, seed=0),
                                                                  T.RandomHorizontalFlip(seed=1)]))
    assert [tuple(xb.shape) for xb, _ in loader] == [(8, 3, 32, 32), (7, 3, 32, 32)]


def test_cifar10_rejects_wrong_content(tmp_path):
    folder = os.path.join(tmp_path, "cifar-10-batches-py")
    os.makedirs(folder)
    with open(os.path.join(folder, "test_batch"), "wb") as f:
        pickle.dump({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}, f)
    with pytest.raises(ValueError, match=r"holds data uint8\(2, 100\) and 2 labels"):
        D.CIFAR10(root=str(tmp_path), train=False)


class _Exploit:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_malicious_pickle_is_rejected_without_running(tmp_path):
    marker = tmp_path / "pwned"
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    payload = {"data": np.zeros((1, 3072), np.uint8), "labels": [0], "x": _Exploit(f"touch {marker}")}
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(payload, f)
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load global (posix|nt)\.system"):
        D.CIFAR10(root=str(tmp_path), train=False)
    assert not marker.exists()
    for evil in (pickle.dumps(print), pickle.dumps(np.array([object()], dtype=object))):
        with pytest.raises(pickle.UnpicklingError):
            D.safe_load_pickle(io.BytesIO(evil))


def test_safe_load_pickle_round_trips_plain_data():
    value = {"a": [1, 2.5, "s", b"raw", (True, None)], "arr": np.arange(6, dtype=np.int16).reshape(2, 3)}
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        out = D.safe_load_pickle(io.BytesIO(pickle.dumps(value, protocol=protocol)))
        assert out["a"] == value["a"]
        np.testing.assert_array_equal(out["arr"], value["arr"])
        assert out["arr"].dtype == np.int16
