"""Real datasets: the 8x8 digits bundled in the package (UCI optdigits), MNIST, Fashion-MNIST and CIFAR-10.

Every dataset is an ``ImageDataset``: a ``TensorDataset`` of images (N, C, H, W) and int64 labels with
``.classes``, whose samples and batches come out as float32 in [0, 1] (uint8 storage is converted per
batch, which keeps CIFAR-10 at 150 MB instead of 600 MB) and then through the optional ``transform``.

Files are read from ``root`` (default ``$MINIDNN_DATA`` or ``~/.cache/minidnn/datasets``).  With
``download=True`` missing files are fetched from the official location, checked against their published
MD5 and written atomically (temporary file + ``os.replace``, so an interrupted download never leaves a
truncated file behind).  Without them, a ``DatasetNotFoundError`` says which files to put where and
where to get them.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import struct
import tarfile
import urllib.request

import numpy as np

from ._utils import unwrap, wrap
from .dataset import TensorDataset
from .transforms import to_float

__all__ = ["ImageDataset", "DatasetNotFoundError", "load_digits", "digits_split_indices", "MNIST",
           "FashionMNIST", "CIFAR10", "read_idx", "safe_load_pickle", "default_root"]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing (and were not, or could not be, downloaded)."""


def default_root():
    return os.path.expanduser(os.environ.get("MINIDNN_DATA") or os.path.join("~", ".cache", "minidnn", "datasets"))


class ImageDataset(TensorDataset):
    """Images (N, C, H, W) (uint8 or float) and int64 labels; samples/batches are float32 images in [0, 1].

    ``transform`` (see ``minidnn.data.transforms``) is applied to the float32 images of each sample or batch;
    through a DataLoader it sees whole batches (the fast path).
    """

    def __init__(self, images, targets, classes, transform=None):
        targets = np.asarray(unwrap(targets), dtype=np.int64)
        super().__init__(images, targets)
        if self.tensors[0].ndim != 4:
            raise ValueError(f"ImageDataset: images must be (N, C, H, W), got shape {tuple(self.tensors[0].shape)}")
        self.classes = list(classes)
        self.transform = transform

    @property
    def data(self):
        """The stored images (N, C, H, W), uint8 or float, before conversion."""
        return self.tensors[0]

    @property
    def targets(self):
        return self.tensors[1]

    def get_batch(self, indices):
        images = to_float(self.tensors[0][indices])
        if self.transform is not None:
            images = unwrap(self.transform(images))
        return images, self.tensors[1][indices]

    def __repr__(self):
        return (f"{type(self).__name__}(n={len(self)}, image_shape={tuple(self.data.shape[1:])}, "
                f"classes={len(self.classes)})")


# ----------------------------------------------------------------------------------------------
# Digits (bundled: minidnn/data/digits.npz)
# ----------------------------------------------------------------------------------------------
DIGITS_TEST_SIZE = 360      # of 1797: the 80/20 split of sklearn's train_test_split(test_size=0.2)


def digits_split_indices(n=1797, test_size=DIGITS_TEST_SIZE):
    """(train, test) sorted int64 index arrays of the fixed digits split.

    The order is Knuth's multiplicative hash ``i * 2654435761 mod 2**32`` (a bijection of the indices),
    not a NumPy random permutation: NumPy does not promise the same random stream across versions, integer
    arithmetic is the same on every machine and release.  The first ``test_size`` indices in hash order
    form the test set (every class gets 30-44 of the 360).
    """
    key = (np.arange(n, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(2 ** 32)
    order = np.argsort(key, kind="stable").astype(np.int64)
    return np.sort(order[test_size:]), np.sort(order[:test_size])


def load_digits(split="train", as_tensors=False, root=None, transform=None):
    """The 1797 8x8 handwritten digits (UCI optdigits, as bundled by scikit-learn): 1437 train / 360 test,
    the same split everywhere.

    Returns an ``ImageDataset`` of float32 images (N, 1, 8, 8) scaled to [0, 1] (pixel / 16) and int64 labels
    0-9, or with ``as_tensors=True`` the pair ``(images, labels)`` of Tensors.  ``split``: "train", "test" or
    "all".  ``root`` is accepted for symmetry with the other loaders and unused: the data ship inside
    minidnn (``minidnn/data/digits.npz``, 45 kB; source and licence in ``digits_SOURCE.md`` beside it),
    so this works offline and needs no scikit-learn.
    """
    images, labels = _bundled_digits()
    images = (images.astype(np.float32) / np.float32(16.0))[:, None]
    labels = labels.astype(np.int64)
    train, test = digits_split_indices(len(labels))
    chosen = {"train": train, "test": test, "all": np.arange(len(labels))}.get(split)
    if chosen is None:
        raise ValueError(f"load_digits: split must be 'train', 'test' or 'all', got {split!r}")
    if as_tensors:
        return wrap(np.ascontiguousarray(images[chosen])), wrap(labels[chosen])
    return ImageDataset(images[chosen], labels[chosen], classes=[str(d) for d in range(10)], transform=transform)


DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")


def _bundled_digits():
    """(images uint8 (1797, 8, 8) in 0..16, labels uint8 (1797,)) from the file shipped in the package."""
    try:
        with np.load(DIGITS_FILE, allow_pickle=False) as f:
            return f["images"], f["labels"]
    except FileNotFoundError:
        raise DatasetNotFoundError(f"load_digits: the bundled file {DIGITS_FILE} is missing; reinstall minidnn "
                                   "(pip install -e .) so that package data is installed") from None


# ----------------------------------------------------------------------------------------------
# Files: locate, download, verify
# ----------------------------------------------------------------------------------------------
def _md5(path):
    digest = hashlib.md5()  # noqa: S324  (integrity against the published checksums, not security)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(urls, dest, md5):
    """Fetch the first URL of ``urls`` that works into ``dest``, atomically, after an MD5 check."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    errors = []
    for url in urls:
        tmp = f"{dest}.part-{os.getpid()}"
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "minidnn"})
            with urllib.request.urlopen(request, timeout=60) as response, open(tmp, "wb") as f:
                for block in iter(lambda: response.read(1 << 20), b""):
                    f.write(block)
            actual = _md5(tmp)
            if actual != md5:
                raise OSError(f"MD5 mismatch for {url}: got {actual}, expected {md5}")
            os.replace(tmp, dest)
            return
        except OSError as exc:          # URLError, HTTPError, timeouts and the MD5 check are all OSErrors
            errors.append(f"{url}: {exc}")
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    raise OSError("; ".join(errors))


def _missing_error(name, folder, missing, how_to_get, download_error=None):
    msg = (f"{name}: missing {', '.join(missing)} in {folder}. {how_to_get}, or pass download=True to fetch "
           "them.")
    if download_error is not None:
        msg += f" download=True failed (offline?): {download_error}"
    return DatasetNotFoundError(msg)


# ----------------------------------------------------------------------------------------------
# IDX files (MNIST, Fashion-MNIST)
# ----------------------------------------------------------------------------------------------
# The third magic byte is the element type; IDX stores multi-byte values big-endian.
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path):
    """An IDX file (gzipped or not) as a NumPy array of its shape, in native byte order."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":       # gzip magic, whatever the file is named
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"read_idx: {path} is not an IDX file (magic bytes {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"read_idx: {path} has {len(raw)} bytes, its header (shape {shape}, {dtype}) "
                         f"needs {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


class _IdxImageDataset(ImageDataset):
    """MNIST-format data: ``{train,t10k}-images-idx3-ubyte`` and ``-labels-idx1-ubyte``, gzipped or not."""

    name = ""
    mirrors = ()
    md5s = {}           # of the .gz files, as published
    classes = ()

    def __init__(self, root=None, train=True, download=False, transform=None):
        root = os.path.expanduser(root) if root is not None else default_root()
        self.root = root
        self.folder = os.path.join(root, self.name, "raw")       # torchvision's layout: its downloads are reused
        prefix = "train" if train else "t10k"
        wanted = [f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"]
        paths = self._locate(wanted, download)
        images, labels = read_idx(paths[0]), read_idx(paths[1])
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(f"{self.name}: images {paths[0]} have shape {images.shape} and labels {paths[1]} "
                             f"shape {labels.shape}; expected (N, H, W) and (N,)")
        if labels.size and (labels.min() < 0 or labels.max() >= len(self.classes)):
            raise ValueError(f"{self.name}: labels in {paths[1]} span {labels.min()}..{labels.max()}, expected "
                             f"0..{len(self.classes) - 1}")
        super().__init__(images[:, None], labels, classes=self.classes, transform=transform)

    def _find(self, base):
        for folder in (self.folder, self.root):
            for name in (base, base + ".gz"):
                path = os.path.join(folder, name)
                if os.path.isfile(path):
                    return path
        return None

    def _locate(self, wanted, download):
        download_error = None
        missing = [b for b in wanted if self._find(b) is None]
        if missing and download:
            try:
                for base in missing:
                    gz = base + ".gz"
                    _download([m + gz for m in self.mirrors], os.path.join(self.folder, gz), self.md5s[gz])
            except OSError as exc:
                download_error = exc
        paths = [self._find(b) for b in wanted]
        if None in paths:
            missing = [b + "[.gz]" for b, p in zip(wanted, paths) if p is None]
            urls = [self.mirrors[0] + b + ".gz" for b, p in zip(wanted, paths) if p is None]
            raise _missing_error(self.name, self.folder, missing,
                                 f"Download {' and '.join(urls)} into that folder (gzipped or not)", download_error)
        return paths


class MNIST(_IdxImageDataset):
    """MNIST: 60000 train / 10000 test 28x28 digits -> images (N, 1, 28, 28), labels 0-9."""

    name = "MNIST"
    mirrors = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
    md5s = {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }
    classes = [str(d) for d in range(10)]


class FashionMNIST(_IdxImageDataset):
    """Fashion-MNIST: 60000 train / 10000 test 28x28 clothing images -> (N, 1, 28, 28), 10 classes."""

    name = "FashionMNIST"
    mirrors = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
    md5s = {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot"]


# ----------------------------------------------------------------------------------------------
# CIFAR-10 (pickled batches) and the restricted unpickler
# ----------------------------------------------------------------------------------------------
def _latin1_encode(text, encoding="latin1"):
    """``_codecs.encode`` as Python 3 protocol-2 pickles use it for bytes, limited to that one codec."""
    if encoding.lower().replace("-", "") not in ("latin1", "iso88591"):
        raise pickle.UnpicklingError(f"safe_load_pickle: refusing _codecs.encode with codec {encoding!r}")
    return text.encode("latin1")


def _allowed_globals():
    """(module, name) -> object for everything a pickled dict of NumPy arrays may reference."""
    try:
        from numpy._core import multiarray, numeric  # NumPy >= 2
    except ImportError:                                       # NumPy 1.x
        from numpy.core import multiarray, numeric
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
               ("_codecs", "encode"): _latin1_encode}
    # Pickles name the module of the NumPy that wrote them: numpy.core (1.x, CIFAR's own files) or numpy._core.
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    return allowed


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles plain containers and NumPy arrays, and nothing that could run code.

    Unpickling can call any importable callable (``os.system`` included) by naming it as a global; every
    global goes through ``find_class``, so allowing only NumPy's array/dtype reconstructors (which build an
    array from a shape, a dtype and raw bytes) and a latin-1 ``_codecs.encode`` leaves nothing to call but
    those.  dicts, lists, tuples, str, bytes, ints and floats are built by opcodes, without ``find_class``.
    The allowed names are mapped to the objects directly, never imported by the name the file gives.
    """

    _allowed = None

    def find_class(self, module, name):
        if _SafeUnpickler._allowed is None:
            _SafeUnpickler._allowed = _allowed_globals()
        obj = self._allowed.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"safe_load_pickle: refusing to load global {module}.{name} (only NumPy "
                                         "arrays and plain containers are allowed)")
        return obj


def safe_load_pickle(file, encoding="latin1"):
    """Load a pickle of dicts/lists/str/bytes/numbers/NumPy arrays from a path or binary file, safely.

    ``encoding="latin1"`` reads Python 2 pickles (CIFAR's) with their byte strings as str, as NumPy expects.
    Object arrays are refused too: their elements could only be plain values here, but no dataset needs them.
    """
    if isinstance(file, (str, os.PathLike)):
        with open(file, "rb") as f:
            return safe_load_pickle(f, encoding)
    obj = _SafeUnpickler(file, encoding=encoding).load()
    _reject_object_arrays(obj)
    return obj


def _reject_object_arrays(obj):
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
        raise pickle.UnpicklingError("safe_load_pickle: refusing an object-dtype array")
    if isinstance(obj, dict):
        for v in obj.values():
            _reject_object_arrays(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _reject_object_arrays(v)


class CIFAR10(ImageDataset):
    """CIFAR-10: 50000 train / 10000 test 32x32 colour images -> (N, 3, 32, 32), 10 classes.

    Reads ``{root}/cifar-10-batches-py/data_batch_1..5`` (train) or ``test_batch`` (test), the pickles of the
    official python archive, with ``safe_load_pickle``.
    """

    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    archive_md5 = "c58f30108f718f92721af3b95e74349a"
    base_folder = "cifar-10-batches-py"
    train_files = [f"data_batch_{i}" for i in range(1, 6)]
    test_files = ["test_batch"]
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def __init__(self, root=None, train=True, download=False, transform=None):
        self.root = os.path.expanduser(root) if root is not None else default_root()
        self.folder = os.path.join(self.root, self.base_folder)
        names = self.train_files if train else self.test_files
        download_error = None
        if self._missing(names) and download:
            try:
                self._download_and_extract()
            except OSError as exc:
                download_error = exc
        missing = self._missing(names)
        if missing:
            raise _missing_error("CIFAR10", self.folder, missing,
                                 f"Download {self.url} and extract it in {self.root} (it unpacks to "
                                 f"{self.base_folder}/)", download_error)
        images, labels = [], []
        for name in names:
            batch_images, batch_labels = self._read_batch(os.path.join(self.folder, name))
            images.append(batch_images)
            labels.append(batch_labels)
        super().__init__(np.concatenate(images), np.concatenate(labels), classes=self.classes, transform=transform)

    def _missing(self, names):
        return [n for n in names if not os.path.isfile(os.path.join(self.folder, n))]

    @staticmethod
    def _read_batch(path):
        batch = safe_load_pickle(path)
        if isinstance(batch, dict):
            batch = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in batch.items()}
        if not isinstance(batch, dict) or "data" not in batch or "labels" not in batch:
            raise ValueError(f"CIFAR10: {path} is not a CIFAR batch (a dict with 'data' and 'labels')")
        data = np.asarray(batch["data"])
        labels = np.asarray(batch["labels"], dtype=np.int64)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
            raise ValueError(f"CIFAR10: {path} holds data {data.dtype}{data.shape} and {len(labels)} labels; "
                             "expected uint8 (N, 3072) and N labels")
        # Each row is the red, green and blue 32x32 planes in turn: already channels-first.
        return data.reshape(-1, 3, 32, 32), labels

    def _download_and_extract(self):
        archive = os.path.join(self.root, os.path.basename(self.url))
        if not (os.path.isfile(archive) and _md5(archive) == self.archive_md5):
            _download([self.url], archive, self.archive_md5)
        # Only regular files under cifar-10-batches-py/ are written, each atomically; a crafted member name
        # (absolute, "..", a link) is skipped, so extraction cannot write outside the folder.
        os.makedirs(self.folder, exist_ok=True)
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                parts = member.name.split("/")
                if not member.isfile() or len(parts) != 2 or parts[0] != self.base_folder or parts[1] in ("", ".."):
                    continue
                dest = os.path.join(self.folder, parts[1])
                tmp = f"{dest}.part-{os.getpid()}"
                with tar.extractfile(member) as src, open(tmp, "wb") as out:
                    out.write(src.read())
                os.replace(tmp, dest)
