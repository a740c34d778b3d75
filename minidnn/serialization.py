"""``minidnn.save`` / ``minidnn.load``: a safe checkpoint format (no pickle anywhere).

The file is a ZIP archive (stored, uncompressed) holding
  * ``minidnn.json``: the structure of the saved object (format name and version, then a tagged tree);
  * ``arrays/<n>.npy``: one NumPy ``.npy`` entry per tensor or array, written and read with
    ``allow_pickle=False``.
Loading therefore never executes code: object arrays (the only way a pickle hides in ``.npy``) are refused,
and the tree can only build dicts, lists, tuples, tensors, arrays, numbers, strings, bools and None.
ZIP's CRC-32 of every entry is checked on reading, so a corrupt file fails loudly instead of loading junk.

Saving to a path is atomic: the archive is written to a temporary file in the same directory, flushed and
fsync'ed, renamed over the target with ``os.replace`` and the directory fsync'ed.  A save killed at any
moment leaves the old file or the new one (plus, at worst, a stray ``.<name>.*.tmp`` file), never a mix.

Tree encoding (JSON): None, bools, ints, floats and strings are themselves; everything else is an object
with one tag: ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"dict": [[key, value], ...], "ordered": bool}``,
``{"tensor": entry, "dtype": "float32", "device": "cuda:0", "requires_grad": bool}``, ``{"ndarray": entry}``,
``{"npscalar": entry}``, ``{"dtype": "float16"}``, ``{"device": "cpu"}``.

Devices (``map_location``) follow PyTorch: by default a tensor returns to the device it was saved from, and
loading a cuda tensor where no GPU is usable raises an error that says to pass ``map_location="cpu"``.
``map_location`` may be a device ("cpu", "cuda:1", a Device), a dict ``{"cuda:0": "cpu"}`` mapping saved
locations (unmapped ones stay), or a callable ``fn(tensor_on_cpu, saved_location) -> Tensor`` (None: default).
Tensors saved from a Parameter come back as plain Tensors (with their ``requires_grad``).
"""
from __future__ import annotations

import io
import json
import os
import zipfile
from collections import OrderedDict

import numpy as np

from .backend import devices as _dev
from .backend.files import write_atomically
from .creation import from_numpy
from .tensor import Tensor

__all__ = ["save", "load", "SerializationError", "UnsafeFileError"]

FORMAT_NAME = "minidnn"
FORMAT_VERSION = 1
MAX_DEPTH = 256        # nesting levels of lists/tuples/dicts: far below Python's recursion limit
_META = "minidnn.json"
_ZIP64_LIMIT = 2 ** 31 - 2 ** 20       # entries near 2 GiB need ZIP64 headers, decided before writing


class SerializationError(RuntimeError):
    """The file is not a minidnn checkpoint, is truncated or corrupt, or holds something unsupported."""


class UnsafeFileError(SerializationError):
    """The file holds a pickled Python object: refused, since unpickling runs arbitrary code."""


# ----------------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------------
class _Writer:
    def __init__(self, zf):
        self.zf = zf
        self.count = 0

    def array(self, arr):
        if arr.dtype.hasobject:
            raise TypeError(f"minidnn.save: an array of dtype {arr.dtype} holds Python objects, which the safe format "
                            "cannot store")
        name = f"arrays/{self.count}.npy"
        self.count += 1
        arr = np.asarray(arr)
        if arr.dtype.kind == "V" and arr.dtype.name == "bfloat16":
            arr = arr.view(np.uint16)       # .npy has no bfloat16: its bits as uint16, the metadata keeps the dtype
        with self.zf.open(name, "w", force_zip64=arr.nbytes > _ZIP64_LIMIT) as f:
            np.lib.format.write_array(f, arr, allow_pickle=False)
        return name

    def encode(self, obj, where="obj", depth=0):
        if obj is None or isinstance(obj, (bool, int, str)):
            return obj
        if depth > MAX_DEPTH:
            raise ValueError(f"minidnn.save: {where[:80]}... is nested more than {MAX_DEPTH} levels deep; the format "
                             f"stores at most {MAX_DEPTH} levels of lists/tuples/dicts")
        if isinstance(obj, float):
            return obj
        if isinstance(obj, Tensor):
            return {"tensor": self.array(obj.numpy()), "dtype": str(obj.dtype), "device": str(obj.device),
                    "requires_grad": bool(obj.requires_grad)}
        if isinstance(obj, np.ndarray):
            return {"ndarray": self.array(obj)}
        if _dev.is_cuda_array(obj):
            # A raw GPU array (an optimizer's state on the GPU): stored like a NumPy array, with its
            # device, and put back there (or where map_location says) by load.
            return {"ndarray": self.array(obj.get()), "device": str(_dev.device_of(obj))}
        if isinstance(obj, np.generic):
            return {"npscalar": self.array(np.asarray(obj))}
        if isinstance(obj, np.dtype):
            return {"dtype": str(obj)}
        if isinstance(obj, _dev.Device):
            return {"device": str(obj)}
        if isinstance(obj, (list, tuple)):
            tag = "tuple" if isinstance(obj, tuple) else "list"
            return {tag: [self.encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)]}
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                if not (k is None or isinstance(k, (str, int, float, bool))):
                    raise TypeError(f"minidnn.save: {where} has a key {k!r} of type {type(k).__name__}; keys must be "
                                    "str, int, float, bool or None")
                items.append([k, self.encode(v, f"{where}[{k!r}]", depth + 1)])
            return {"dict": items, "ordered": isinstance(obj, OrderedDict)}
        raise TypeError(f"minidnn.save: {where} is a {type(obj).__name__}, which the safe format cannot store "
                        "(supported: tensors, numpy arrays, dicts, lists, tuples, numbers, strings, bools, None)")


def _write_archive(obj, fileobj):
    with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        writer = _Writer(zf)
        tree = writer.encode(obj)
        meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "root": tree}
        zf.writestr(_META, json.dumps(meta, allow_nan=True))


def _require_binary(f, op, mode):
    if isinstance(f, io.TextIOBase) or "b" not in getattr(f, "mode", "b"):
        raise TypeError(f"minidnn.{op}: the file object {getattr(f, 'name', f)!r} is open in text mode "
                        f"({getattr(f, 'mode', '?')!r}); checkpoints are binary: open it with {mode!r}")


def save(obj, f) -> None:
    """Save ``obj`` (tensors, numpy arrays, nested dicts/lists/tuples, numbers, strings, bools, None) to ``f``.

    ``f``: a path (written atomically, see the module docstring) or a writable binary file object."""
    if hasattr(f, "write"):
        _require_binary(f, "save", "wb")
        _write_archive(obj, f)
        return
    write_atomically(f, lambda out: _write_archive(obj, out))


# ----------------------------------------------------------------------------------------------
# Decoding
# ----------------------------------------------------------------------------------------------
def _resolve_location(map_location, saved, name):
    """The device a tensor saved on ``saved`` goes to, or a callable to apply (see the module docstring)."""
    if map_location is None:
        target = saved
    elif isinstance(map_location, dict):
        target = map_location.get(saved, saved)
    else:
        target = map_location
    try:
        return _dev.device(target)
    except (ValueError, RuntimeError) as e:
        where = f"was saved on '{saved}'" if target == saved else f"saved on '{saved}' is mapped to '{target}'"
        raise SerializationError(f"minidnn.load: {name}: a tensor {where}, which is not available here ({e}). "
                                 f"Pass map_location='cpu' (or a dict like {{'{saved}': 'cpu'}}) to load it "
                                 "elsewhere.") from None


class _Reader:
    def __init__(self, zf, name, map_location):
        self.zf, self.name, self.map_location = zf, name, map_location

    def array(self, entry):
        """Read one ``.npy`` entry.  The header is checked before anything is allocated: an object dtype
        (a pickle) is refused, and the declared size must equal the entry's size, so a crafted header cannot
        make us allocate terabytes."""
        if not isinstance(entry, str) or not entry.startswith("arrays/"):
            raise SerializationError(f"minidnn.load: {self.name}: bad array reference {entry!r}")
        fmt = np.lib.format
        size = self.zf.getinfo(entry).file_size
        with self.zf.open(entry) as f:
            version = fmt.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise SerializationError(f"minidnn.load: {self.name}: entry '{entry}' has .npy version {version}, "
                                         "which minidnn does not write")
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran_order, dtype = read_header(f)
            if dtype.hasobject:
                raise UnsafeFileError(f"minidnn.load: {self.name}: entry '{entry}' holds pickled Python objects "
                                      f"(dtype {dtype}); refusing to load it (unpickling can run arbitrary code, and "
                                      "minidnn.save never writes pickles, so this file was not written by minidnn or "
                                      "was tampered with)")
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            held = size - f.tell()
            if held != count * dtype.itemsize:
                raise SerializationError(f"minidnn.load: {self.name} is truncated or corrupt: entry '{entry}' declares "
                                         f"{count * dtype.itemsize} bytes of {dtype} {shape} but holds {held}")
            arr = np.empty(count, dtype=dtype)
            view, done = memoryview(arr).cast("B"), 0
            while done < len(view):
                n = f.readinto(view[done:])
                if not n:
                    raise EOFError(f"entry '{entry}' ends after {done} of {len(view)} bytes")
                done += n
            f.read()        # at the end of the entry zipfile checks its CRC-32
        return arr.reshape(shape, order="F" if fortran_order else "C")

    def tensor(self, node):
        arr = self.array(node["tensor"])
        dtype = np.dtype(node["dtype"]) if node["dtype"] is not None else arr.dtype
        if dtype.name == "bfloat16" and arr.dtype == np.uint16:
            arr = arr.view(dtype)
        if arr.dtype != dtype:
            raise SerializationError(f"minidnn.load: {self.name}: entry '{node['tensor']}' has dtype {arr.dtype} but "
                                     f"the metadata says {dtype}")
        saved = node.get("device", "cpu")
        if callable(self.map_location):
            t = self.map_location(from_numpy(arr), saved)
            if t is None:
                t = self._place(arr, _resolve_location(None, saved, self.name))
        else:
            t = self._place(arr, _resolve_location(self.map_location, saved, self.name))
        if node.get("requires_grad"):
            t.requires_grad_(True)
        return t

    @staticmethod
    def _place(arr, dev):
        return from_numpy(arr) if dev.type == "cpu" else Tensor._from_array(_dev.to_device(arr, dev))

    def decode(self, node, depth=0):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if depth > MAX_DEPTH:
            raise SerializationError(f"minidnn.load: {self.name} nests its structure more than {MAX_DEPTH} levels "
                                     "deep, which minidnn.save never writes; refusing it")
        if isinstance(node, dict):
            if "tensor" in node:
                return self.tensor(node)
            if "ndarray" in node:
                if "device" not in node:
                    return self.array(node["ndarray"])
                return self.tensor({"tensor": node["ndarray"], "dtype": None, "device": node["device"]}).data
            if "npscalar" in node:
                return self.array(node["npscalar"])[()]
            if "list" in node:
                return [self.decode(v, depth + 1) for v in node["list"]]
            if "tuple" in node:
                return tuple(self.decode(v, depth + 1) for v in node["tuple"])
            if "dict" in node:
                items = [(k, self.decode(v, depth + 1)) for k, v in node["dict"]]
                return OrderedDict(items) if node.get("ordered") else dict(items)
            if "dtype" in node:
                return np.dtype(node["dtype"])
            if "device" in node:
                return _dev.device(node["device"])
        raise SerializationError(f"minidnn.load: {self.name}: unknown entry in the structure: {str(node)[:200]}")


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **pickle_load_args):
    """Load what ``save`` wrote.  ``f``: a path or a readable binary file object; ``map_location``: see the
    module docstring.  ``weights_only`` (and PyTorch's pickle arguments) are accepted so that scripts written
    for ``torch.load`` run unchanged; they change nothing, because loading never executes code: a checkpoint
    holds only JSON and raw arrays, and no pickle is ever unpickled.  Raises SerializationError (naming the
    file) for a truncated, corrupt or foreign file and UnsafeFileError for a file that holds pickled objects."""
    if hasattr(f, "read"):
        _require_binary(f, "load", "rb")
    name = repr(getattr(f, "name", "<file object>")) if hasattr(f, "read") else repr(os.fspath(f))
    try:
        with zipfile.ZipFile(f, "r") as zf:
            try:
                meta = json.loads(zf.read(_META).decode("utf-8"))
            except KeyError:
                raise SerializationError(f"minidnn.load: {name} is not a minidnn checkpoint (no '{_META}' entry; "
                                         f"entries: {zf.namelist()[:5]})") from None
            if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
                raise SerializationError(f"minidnn.load: {name} is not a minidnn checkpoint (bad '{_META}')")
            if meta.get("version", 0) > FORMAT_VERSION:
                raise SerializationError(f"minidnn.load: {name} has format version {meta.get('version')}; this "
                                         f"minidnn reads up to version {FORMAT_VERSION}: upgrade minidnn")
            return _Reader(zf, name, map_location).decode(meta.get("root"))
    except SerializationError:
        raise
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, KeyError, TypeError,
            UnicodeDecodeError, json.JSONDecodeError, IndexError, RecursionError) as e:
        raise SerializationError(f"minidnn.load: {name} is truncated or corrupt and cannot be loaded "
                                 f"({type(e).__name__}: {e})") from e

