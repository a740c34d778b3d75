"""On a GPU: the staging transposes (conv_igemm's nchw_to_nhwc, V1 32 x 32 tiles and V2 4-byte words, session 8)
copy NCHW arrays into NHWC memory exactly -- float32, float16, bfloat16; channel counts 1-130 (V2's one-tile and
multi-tile cases), odd C or HW and 2-byte-aligned views (16-bit data: V1), filters as (K, Cg, 1, RS)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

from minidnn.backend.cuda import conv_igemm as K  # noqa: E402

SHAPES = [(128, 16, 32, 32), (64, 32, 16, 16), (32, 64, 8, 8), (4, 130, 6, 6), (2, 3, 32, 32), (3, 96, 7, 10),
          (2, 17, 5, 5), (2, 2, 1, 98), (64, 16, 1, 9), (5, 66, 45, 46)]


@pytest.mark.parametrize("v2", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_staging_copy_is_exact(shape, dtype, v2, monkeypatch):
    dt = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    monkeypatch.setattr(K, "TRANSPOSE_V2", [v2])
    rng = np.random.default_rng(sum(shape))
    host = rng.standard_normal(shape).astype(np.float32).astype(dt)
    for offset in (0, 1):            # 1: a view one element in (2-byte aligned for 16-bit data)
        flat = cp.asarray(np.concatenate([np.zeros(offset, dt), host.reshape(-1)]))
        a = flat[offset:].reshape(shape)
        run = K._transposer(a)
        assert run is not None
        t = K._copy_nhwc(cp, a, run)
        assert t.shape == a.shape and t.transpose(0, 2, 3, 1).flags.c_contiguous
        got = cp.asnumpy(cp.ascontiguousarray(t).view(cp.uint16 if a.itemsize == 2 else cp.uint32))
        want = host.view(np.uint16 if a.itemsize == 2 else np.uint32)
        assert np.array_equal(got, want), (shape, dtype, v2, offset)
        uses_v2 = K.transpose_v2_tile(shape[1], shape[2] * shape[3], a.itemsize, shape[0],
                                      K._launch.sm_count()) is not None and \
            (a.itemsize == 4 or offset == 0)
        assert (run.dims[3] == 256) == uses_v2         # V2: 256-thread blocks; V1: 32 x 8
