"""DLPack exchange of float16 and bfloat16 tensors with PyTorch, both directions, zero-copy."""
import gc

import numpy as np
import pytest

import minidnn as mdn

torch = pytest.importorskip("torch", reason="PyTorch (the DLPack peer in this test) is not installed")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_export_to_torch_shares_memory(name):
    t = mdn.tensor([[1.0, 2.5], [3.0, -4.0]], dtype=getattr(mdn, name)).swapaxes(0, 1)
    tt = torch.from_dlpack(t)
    assert tt.dtype == getattr(torch, name) and tuple(tt.shape) == (2, 2)
    np.testing.assert_array_equal(tt.float().numpy(), t.float().numpy())
    tt[0, 1] = 8.0
    assert float(t[0, 1]) == 8.0
    del t
    gc.collect()
    assert float(tt[0, 1]) == 8.0          # the consumer keeps the memory alive


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_import_from_torch_shares_memory(name):
    src = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).to(getattr(torch, name)).t()
    t = mdn.from_dlpack(src)
    assert t.dtype == getattr(mdn, name) and t.shape == (3, 2)
    np.testing.assert_array_equal(t.float().numpy(), src.float().numpy())
    src[2, 1] = -1.0
    assert float(t[2, 1]) == -1.0
    del src
    gc.collect()
    assert float(t[2, 1]) == -1.0


def test_unconsumed_capsule_is_released():
    capsule = mdn.tensor([1.0], dtype=mdn.bfloat16).__dlpack__()
    del capsule
    gc.collect()
