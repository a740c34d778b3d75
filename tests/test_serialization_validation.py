"""save/load refuse bad input clearly and leave files untouched: text-mode file objects, nesting deeper than the
format allows, crafted deeply nested checkpoints (no bare RecursionError)."""
import os
import zipfile

import pytest

import minidnn as mdn
from minidnn.serialization import MAX_DEPTH, SerializationError


def _nested(depth):
    root = cur = []
    for _ in range(depth):
        nxt = []
        cur.append(nxt)
        cur = nxt
    return root


def test_text_mode_file_objects_are_refused(tmp_path):
    path = tmp_path / "ckpt.pt"
    with open(path, "w") as f:
        with pytest.raises(TypeError, match="text mode.*'wb'"):
            mdn.save({"a": 1}, f)
    assert path.read_bytes() == b""
    mdn.save({"a": 1}, path)
    with open(path, "r") as f:
        with pytest.raises(TypeError, match="text mode.*'rb'"):
            mdn.load(f)


def test_nesting_limit_on_save_writes_nothing(tmp_path):
    path = tmp_path / "deep.pt"
    mdn.save(_nested(MAX_DEPTH - 1), path)          # within the limit: round-trips
    assert mdn.load(path) == _nested(MAX_DEPTH - 1)
    os.unlink(path)
    with pytest.raises(ValueError, match=f"more than {MAX_DEPTH} levels"):
        mdn.save(_nested(5000), path)
    assert not path.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("depth", [MAX_DEPTH + 5, 100_000])
def test_crafted_deep_checkpoint_is_a_clear_error(tmp_path, depth):
    path = tmp_path / "crafted.pt"
    mdn.save({"a": 1}, path)
    with zipfile.ZipFile(path) as zf:
        meta_name = zf.namelist()[0]
    tree = '{"list": [' * depth + ']}' * depth
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(meta_name, '{"format": "minidnn", "version": 1, "root": %s}' % tree)
    with pytest.raises(SerializationError):
        mdn.load(path)
