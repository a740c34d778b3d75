"""minidnn.save / minidnn.load: round trips, devices, safety (no pickle), atomic writes, corrupt files."""
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn
from minidnn.serialization import SerializationError, UnsafeFileError

DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool", "complex64"]


def _nested():
    rng = np.random.default_rng(0)
    tensors = {dt: mdn.tensor((rng.standard_normal((2, 3)) * 10).astype(dt)) for dt in DTYPES}
    return {
        "tensors": tensors,
        "ordered": OrderedDict([("z", 1), ("a", 2)]),
        3: [mdn.randn(4, requires_grad=True), (mdn.zeros(0, 5), None)],
        "scalars": (True, False, None, 0, -7, 2 ** 62, 1.5, float("inf"), "text ✓", ""),
        "numpy": np.arange(6, dtype=np.int32).reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "np_scalar": np.float32(2.5),
        "param": nn.Parameter(mdn.ones(2)),
        "dtype": mdn.float16,
        "device": mdn.device("cpu"),
        "zero_d": mdn.tensor(3.0),
        "nan": float("nan"),
    }


def _assert_same(a, b, where="obj"):
    assert type(a) is type(b) or (isinstance(a, mdn.Tensor) and type(b) is mdn.Tensor), (where, type(a), type(b))
    if isinstance(a, mdn.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad, where
        assert a.device == b.device, where
        np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy(), err_msg=where)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b, where


def test_roundtrip_nested_structures(tmp_path):
    obj = _nested()
    path = tmp_path / "ckpt.mdn"
    mdn.save(obj, path)
    back = mdn.load(path)
    _assert_same(obj, back)
    assert type(back["ordered"]) is OrderedDict and type(back["tensors"]) is dict
    assert type(back["param"]) is mdn.Tensor and back["param"].requires_grad      # a Parameter comes back plain
    assert back["np_scalar"].dtype == np.float32 and isinstance(back["np_scalar"], np.generic)
    assert 3 in back and isinstance(back[3], list) and isinstance(back[3][1], tuple)
    assert back["tensors"]["bool"].dtype == np.bool_
    assert not [p for p in os.listdir(tmp_path) if p != "ckpt.mdn"]      # no temporary file left behind


def test_file_objects_and_str_paths(tmp_path):
    buf = io.BytesIO()
    mdn.save({"w": mdn.arange(5)}, buf)
    buf.seek(0)
    np.testing.assert_array_equal(mdn.load(buf)["w"].numpy(), np.arange(5))
    mdn.save([1, 2], str(tmp_path / "p"))
    assert mdn.load(str(tmp_path / "p")) == [1, 2]


def test_state_dict_roundtrip_into_module(tmp_path):
    src = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 2)))
    src[1].register_buffer("steps", mdn.tensor(7))
    dst = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 2)))
    dst[1].register_buffer("steps", mdn.tensor(0))
    mdn.save({"model": src.state_dict(), "epoch": 3}, tmp_path / "m.mdn")
    ckpt = mdn.load(tmp_path / "m.mdn")
    assert list(ckpt["model"]) == list(src.state_dict())
    dst.load_state_dict(ckpt["model"])
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    assert dst[1].steps.item() == 7


def test_unsupported_objects_are_refused(tmp_path):
    path = tmp_path / "x.mdn"
    mdn.save({"ok": 1}, path)
    with pytest.raises(TypeError, match=r"obj\['bad'\]\[1\] is a set"):
        mdn.save({"ok": 2, "bad": [1, {1, 2}]}, path)
    with pytest.raises(TypeError, match="holds Python objects"):
        mdn.save(np.array([None, 1], dtype=object), path)
    with pytest.raises(TypeError, match="keys must be"):
        mdn.save({(1, 2): 3}, path)
    assert mdn.load(path) == {"ok": 1}                     # a failed save leaves the old file
    assert os.listdir(tmp_path) == ["x.mdn"]               # ... and no temporary file


# ----------------------------------------------------------------------------------------------
# Devices
# ----------------------------------------------------------------------------------------------
def _save_with_recorded_device(path, location):
    """A checkpoint whose tensor claims to come from ``location`` (so cuda files can be tested without a GPU)."""
    buf = io.BytesIO()
    mdn.save({"w": mdn.ones(3)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "minidnn.json":
                meta = json.loads(data)
                meta["root"]["dict"][0][1]["device"] = location
                data = json.dumps(meta).encode()
            dst.writestr(info.filename, data)


def test_map_location_variants(tmp_path):
    path = tmp_path / "cuda.mdn"
    _save_with_recorded_device(path, "cuda:0")
    if not mdn.cuda.is_available():
        with pytest.raises(SerializationError, match=r"saved on 'cuda:0'.*map_location='cpu'") as info:
            mdn.load(path)
        assert str(path) in str(info.value)
    assert mdn.load(path, map_location="cpu")["w"].device.type == "cpu"
    assert mdn.load(path, map_location=mdn.device("cpu"))["w"].device.type == "cpu"
    assert mdn.load(path, map_location={"cuda:0": "cpu"})["w"].device.type == "cpu"
    seen = []
    got = mdn.load(path, map_location=lambda t, loc: seen.append(loc) or t * 2)
    assert seen == ["cuda:0"] and got["w"].numpy().tolist() == [2.0, 2.0, 2.0]


def test_tensors_return_to_their_device(tmp_path, device):
    path = tmp_path / "d.mdn"
    mdn.save({"x": mdn.arange(4, device=device, dtype=mdn.float32)}, path)
    back = mdn.load(path)["x"]
    assert str(back.device).startswith(device)
    assert mdn.load(path, map_location="cpu")["x"].device.type == "cpu"
    np.testing.assert_array_equal(back.cpu().numpy(), np.arange(4))


# ----------------------------------------------------------------------------------------------
# Safety and corruption
# ----------------------------------------------------------------------------------------------
_META_ONE_ARRAY = json.dumps({"format": "minidnn", "version": 1, "root": {"ndarray": "arrays/0.npy"}})


class _Exploit:
    """Unpickling this would create a file: the test checks that it never happens."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_pickled_object_arrays_are_rejected_not_executed(tmp_path):
    sentinel = tmp_path / "pwned"
    evil = np.array([_Exploit(str(sentinel))], dtype=object)
    # 1. A minidnn-looking file whose array entry is a pickle.
    path = tmp_path / "evil.mdn"
    with zipfile.ZipFile(path, "w") as zf:
        with zf.open("arrays/0.npy", "w") as f:
            np.lib.format.write_array(f, evil, allow_pickle=True)
        zf.writestr("minidnn.json", _META_ONE_ARRAY)
    with pytest.raises(UnsafeFileError, match="pickled Python objects") as info:
        mdn.load(path)
    assert str(path) in str(info.value)
    # 2. A NumPy .npz with a pickled array (not a minidnn file at all).
    npz = tmp_path / "evil.npz"
    np.savez(npz, x=evil)
    with pytest.raises(SerializationError, match="not a minidnn checkpoint"):
        mdn.load(npz)
    # 3. A plain pickle file.
    import pickle
    pkl = tmp_path / "evil.pt"
    pkl.write_bytes(pickle.dumps(_Exploit(str(sentinel))))
    with pytest.raises(SerializationError, match="truncated or corrupt"):
        mdn.load(pkl)
    assert not sentinel.exists()


def test_lying_array_header_is_caught_before_allocating(tmp_path):
    path = tmp_path / "huge.mdn"
    header = {"descr": "<f8", "fortran_order": False, "shape": (10 ** 12,)}
    with zipfile.ZipFile(path, "w") as zf:
        with zf.open("arrays/0.npy", "w") as f:
            np.lib.format.write_array_header_1_0(f, header)
            f.write(b"\0" * 64)
        zf.writestr("minidnn.json", _META_ONE_ARRAY)
    with pytest.raises(SerializationError, match="declares 8000000000000 bytes"):
        mdn.load(path)


def test_truncated_files_give_clear_errors(tmp_path):
    path = tmp_path / "t.mdn"
    mdn.save({"a": mdn.randn(1000), "b": [mdn.ones(10, 10)]}, path)
    data = path.read_bytes()
    for cut in [0, 10, len(data) // 3, len(data) // 2, len(data) - 30, len(data) - 1]:
        bad = tmp_path / f"cut{cut}.mdn"
        bad.write_bytes(data[:cut])
        with pytest.raises(SerializationError, match="truncated or corrupt") as info:
            mdn.load(bad)
        assert str(bad) in str(info.value)


def test_flipped_byte_is_caught_by_crc(tmp_path):
    path = tmp_path / "c.mdn"
    mdn.save({"a": mdn.zeros(4096)}, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF                  # inside the array's payload
    path.write_bytes(bytes(data))
    with pytest.raises(SerializationError, match="CRC"):
        mdn.load(path)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        mdn.load(tmp_path / "nope.mdn")


# ----------------------------------------------------------------------------------------------
# Atomic writes under SIGKILL
# ----------------------------------------------------------------------------------------------
_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import minidnn as mdn
    path = sys.argv[1]
    version = 0
    print("ready", flush=True)
    while True:
        version += 1
        mdn.save({"version": version, "a": mdn.full((2_000_000,), float(version)),
                  "b": [np.full(500_000, version, dtype=np.int64)], "tail": "end"}, path)
""")


def _check_complete(path):
    obj = mdn.load(path)
    v = obj["version"]
    assert obj["tail"] == "end"
    assert obj["a"].shape == (2_000_000,) and bool((obj["a"].numpy() == v).all())
    assert obj["b"][0].shape == (500_000,) and bool((obj["b"][0] == v).all())
    return v


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_save_killed_mid_write_leaves_old_or_new_file(tmp_path):
    path = tmp_path / "ckpt.mdn"
    mdn.save({"version": 0, "a": mdn.full((2_000_000,), 0.0), "b": [np.zeros(500_000, dtype=np.int64)],
              "tail": "end"}, path)
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    rng = random.Random(1234)
    versions = []
    deadline = time.monotonic() + 12
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(rng.uniform(0.02, 0.4))
            assert proc.poll() is None, "the writer died on its own"
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        versions.append(_check_complete(path))
        if time.monotonic() > deadline:
            break
    assert max(versions) > 0, "no save ever completed: the test did not exercise anything"
    # What a kill can leave is a stray temporary file, never a damaged target.
    assert all(p.name.startswith((".ckpt.mdn.", "ckpt.mdn", "writer.py")) for p in tmp_path.iterdir())


def test_optimizer_state_on_the_device_round_trips(tmp_path, device):
    """An optimizer's state holds raw arrays of its device (CuPy on the GPU): save/load must keep them,
    on the device they came from, so a training checkpoint works on every device."""
    import minidnn.nn as nn
    model = nn.Linear(3, 2).to(device)
    opt = mdn.optim.Adam(model.parameters(), lr=0.1)
    model(mdn.randn(4, 3, device=device)).sum().backward()
    opt.step()
    path = tmp_path / "opt.mdn"
    mdn.save({"optimizer": opt.state_dict()}, path)
    back = mdn.load(path)["optimizer"]
    for idx, state in opt.state_dict()["state"].items():
        for name, value in state.items():
            got = back["state"][idx][name]
            if hasattr(value, "shape"):
                assert type(got) is type(value), (name, type(got), type(value))
                np.testing.assert_array_equal(mdn.tensor(got).numpy(), mdn.tensor(value).numpy())
            else:
                assert got == value
    fresh = mdn.optim.Adam(model.parameters(), lr=0.1)
    fresh.load_state_dict(back)
