"""minidnn.load accepts torch.load's keyword arguments (weights_only, mmap, pickle_module) so that scripts run
unchanged; they change nothing because a checkpoint never holds code."""
import numpy as np
import pytest

import minidnn as mdn


@pytest.mark.parametrize("kw", [dict(weights_only=True), dict(weights_only=False), dict(weights_only=None),
                                dict(map_location="cpu", weights_only=True), dict(mmap=False)])
def test_load_accepts_weights_only(tmp_path, kw):
    model = mdn.nn.Linear(3, 2)
    path = tmp_path / "ckpt.pt"
    mdn.save({"model": model.state_dict(), "epoch": 3}, path)
    ck = mdn.load(path, **kw)
    assert ck["epoch"] == 3
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(ck["model"][k].numpy()), v.numpy())


def test_weights_only_is_keyword_only_as_in_pytorch(tmp_path):
    path = tmp_path / "x.pt"
    mdn.save({"a": 1}, path)
    with pytest.raises(TypeError):
        mdn.load(path, None, None, True)
