"""Vectorised transforms against per-sample reference loops, on every device."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.backend import devices as _dev
from minidnn.data import transforms as T


def _images(n=6, c=3, h=7, w=9, seed=0):
    return np.random.default_rng(seed).random((n, c, h, w), dtype=np.float32)


def _host(a):
    return _dev.to_device(a, "cpu")


@pytest.mark.parametrize("padding,size", [(0, 5), (2, 7), (3, (4, 9))])
def test_random_crop_equals_per_sample_loop(device, padding, size):
    x = _images()
    crop = T.RandomCrop(size, padding=padding, seed=3)
    out = _host(crop(_dev.to_device(x, device)))
    # Same seed -> same offsets: redraw them and crop sample by sample.
    ref_crop = T.RandomCrop(size, padding=padding, seed=3)
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oy, ox = ref_crop.offsets(len(x), padded.shape[2], padded.shape[3])
    h, w = ref_crop.size
    reference = np.stack([padded[i, :, oy[i]:oy[i] + h, ox[i]:ox[i] + w] for i in range(len(x))])
    np.testing.assert_array_equal(out, reference)
    gathered = T.crop(_dev.to_device(padded, device), _dev.to_device(oy, device), _dev.to_device(ox, device),
                      (h, w))
    np.testing.assert_array_equal(_host(gathered), reference)
    assert len(set(zip(oy.tolist(), ox.tolist()))) > 1          # offsets really differ per sample


def test_random_crop_single_sample_and_errors():
    x = _images(1)[0]
    out = T.RandomCrop(4, padding=1, seed=0)(x)
    assert out.shape == (3, 4, 4)
    with pytest.raises(ValueError, match=r"crop \(20, 20\) is larger than the padded image \(7, 9\)"):
        T.RandomCrop(20)(x)
    with pytest.raises(ValueError, match=r"got shape \(7, 9\)"):
        T.RandomCrop(2)(x[0])


def test_random_horizontal_flip(device):
    x = _images(40)
    out = _host(T.RandomHorizontalFlip(p=0.5, seed=1)(_dev.to_device(x, device)))
    flipped = np.random.default_rng(1).random(40) < 0.5          # the draws the transform makes
    for i in range(40):
        np.testing.assert_array_equal(out[i], x[i, :, :, ::-1] if flipped[i] else x[i])
    assert 0 < flipped.sum() < 40
    np.testing.assert_array_equal(T.RandomHorizontalFlip(p=1.0)(x[0]), x[0, :, :, ::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(p=0.0)(x), x)


def test_normalize_values(device):
    x = _images()
    out = _host(T.Normalize([0.1, 0.2, 0.3], [0.5, 0.25, 2.0])(_dev.to_device(x, device)))
    mean = np.array([0.1, 0.2, 0.3], np.float32)[:, None, None]
    std = np.array([0.5, 0.25, 2.0], np.float32)[:, None, None]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, (x - mean) / std, rtol=1.3e-6, atol=1e-5)
    np.testing.assert_allclose(T.Normalize([0.5], [0.5])(x[0]), (x[0] - 0.5) / 0.5, rtol=1.3e-6, atol=1e-5)
    with pytest.raises(ValueError, match="3 means for an input of shape"):
        T.Normalize([0, 0, 0], [1, 1, 1])(x[:, :2])


def test_to_tensor_layouts():
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    out = T.ToTensor()(hwc)
    assert out.shape == (3, 5, 6) and out.dtype == np.float32
    np.testing.assert_allclose(out, hwc.transpose(2, 0, 1) / 255.0, rtol=1e-6)
    assert T.ToTensor()(hwc[..., 0]).shape == (1, 5, 6)
    batch = rng.integers(0, 256, (4, 5, 6, 3), dtype=np.uint8)
    np.testing.assert_allclose(T.ToTensor()(batch), batch.transpose(0, 3, 1, 2) / 255.0, rtol=1e-6)
    floats = np.ones((2, 2), np.float64) * 7
    np.testing.assert_array_equal(T.ToTensor()(floats), np.full((1, 2, 2), 7, np.float32))


@pytest.mark.parametrize("scale", [2, 4])
def test_upsample_and_resize_nearest(device, scale):
    x = _images(2, 1, 8, 8)
    up = _host(T.Upsample(scale)(_dev.to_device(x, device)))
    np.testing.assert_array_equal(up, x.repeat(scale, axis=2).repeat(scale, axis=3))
    np.testing.assert_array_equal(_host(T.Resize(8 * scale)(_dev.to_device(x, device))), up)
    torch = pytest.importorskip("torch", reason="PyTorch (the test oracle) is not installed: pip install -e '.[dev]'")
    down = T.Resize((5, 3))(x)
    ref = torch.nn.functional.interpolate(torch.from_numpy(x), size=(5, 3), mode="nearest").numpy()
    np.testing.assert_array_equal(down, ref)


def test_compose_on_tensor_and_reproducible():
    x = mdn.tensor(_images(8))

    def pipeline(seed):
        return T.Compose([T.Upsample(2), T.RandomCrop(12, padding=1, seed=seed),
                          T.RandomHorizontalFlip(seed=seed + 1), T.Normalize([0.5] * 3, [0.2] * 3)])

    a, b, c = pipeline(0)(x), pipeline(0)(x), pipeline(5)(x)
    assert isinstance(a, mdn.Tensor) and a.shape == (8, 3, 12, 12)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())
    assert "RandomCrop" in repr(pipeline(0))


def test_random_transforms_take_a_minidnn_generator_and_resume_from_its_state():
    import minidnn as mdn
    x = _images()
    by_seed = T.RandomCrop(5, padding=1, seed=4)(x)
    crop = T.RandomCrop(5, padding=1, generator=mdn.Generator().manual_seed(4))
    np.testing.assert_array_equal(crop(x), by_seed)                 # seed=s is Generator().manual_seed(s)
    flip = T.RandomHorizontalFlip(generator=mdn.Generator().manual_seed(2))
    state = [crop.generator.get_state(), flip.generator.get_state()]
    first = [crop(x), flip(x)]
    crop.generator.set_state(state[0])
    flip.generator.set_state(state[1])
    np.testing.assert_array_equal(crop(x), first[0])
    np.testing.assert_array_equal(flip(x), first[1])
    # without a generator: seeded from minidnn's default generator when built, so manual_seed replays it
    mdn.manual_seed(8)
    a = T.RandomCrop(5, padding=1)(x)
    mdn.manual_seed(8)
    np.testing.assert_array_equal(T.RandomCrop(5, padding=1)(x), a)
    import pytest
    with pytest.raises(TypeError, match="minidnn.Generator or an int"):
        T.RandomCrop(5, generator="3")
