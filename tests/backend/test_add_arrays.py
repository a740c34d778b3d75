"""backend.tensor_ops.add_arrays: the engine's same-shape adds (a residual block's forward add, the sum of two
gradients of one tensor).  On the GPU, arrays of one shape, dtype and memory order take act_kernels' ADD launch
(one vectorised kernel, summed in float and rounded once); everything else is ``+``.

CPU: the NumPy path, and the ADD kernel compiled for sm_90 without spills (where nvcc is installed).
GPU (cuda): bit-equal to CuPy's ``a + b`` for float32/float16/bfloat16, C-contiguous, channels-last, misaligned and
odd-sized arrays, one launch each; mixed layouts/dtypes fall back to ``+`` with its result.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.tensor_ops import add_arrays


def _dtype(name):
    if name == "bfloat16":
        ml = pytest.importorskip("ml_dtypes")
        return np.dtype(ml.bfloat16)
    return np.dtype(name)


def test_numpy_arrays_add_with_numpy_semantics():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(add_arrays(a, b), a + b)
    c = rng.standard_normal((4, 5))          # broadcasting and promotion: NumPy's own
    out = add_arrays(a, c)
    assert out.dtype == np.float64 and out.shape == a.shape
    np.testing.assert_array_equal(out, a + c)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtname", ["float32", "bfloat16", "float16"])
def test_add_kernel_compiles_without_spills(tmp_path, dtname):
    from minidnn.backend.cuda import act_kernels as AK
    dt = _dtype(dtname)
    cfg = AK.config(dt)
    src = tmp_path / "k.cu"
    defines = [tuple(o[2:].split("=", 1)) for o in AK.options(dt, "ADD", cfg["unroll"], cfg["hint"])
               if o.startswith("-D")]
    src.write_text("".join(f"#define {k} {v}\n" for k, v in defines) + AK.SOURCE)
    r = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k"),
                        str(src)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "warning" not in out, out[-2000:]
    spills = [line for line in out.splitlines() if "spill stores" in line]
    assert len(spills) == 2 and all(" 0 bytes spill stores" in line for line in spills), out


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _launches():
    from minidnn.backend.cuda import launch
    return launch.launch_count()


def _arrays(cp, shape, dt, layout, seed):
    rng = np.random.default_rng(seed)
    host = (rng.standard_normal(shape) * 3).astype(dt)
    if layout == "nchw":
        return cp.asarray(host)
    if layout == "nhwc":
        return cp.ascontiguousarray(cp.asarray(host).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    flat = cp.empty(host.size + 1, dt)       # misaligned: one element past a 256-byte allocation boundary
    flat[1:] = cp.asarray(host.reshape(-1))
    return flat[1:].reshape(shape)


@pytest.mark.cuda
@pytest.mark.parametrize("dtname", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape, layout", [((128, 16, 32, 32), "nchw"), ((128, 16, 32, 32), "nhwc"),
                                           ((3, 5, 7, 9), "nchw"), ((3, 5, 7, 9), "nhwc"),
                                           ((2, 3, 5, 7), "misaligned"), ((1, 1, 1, 1), "nchw")])
def test_gpu_add_bit_equals_cupy(cp, shape, layout, dtname):
    dt = _dtype(dtname)
    a, b = _arrays(cp, shape, dt, layout, 1), _arrays(cp, shape, dt, layout, 2)
    a.ravel()[:1] = float("inf") if a.size > 1 else a.ravel()[:1]     # inf + finite stays inf, as CuPy's
    want = a + b
    before = _launches()
    got = add_arrays(a, b)
    assert _launches() - before == 1
    assert got.dtype == want.dtype and got.shape == want.shape and got.strides == a.strides
    np.testing.assert_array_equal(cp.asnumpy(got).view(np.uint8), cp.asnumpy(want).view(np.uint8))


@pytest.mark.cuda
def test_gpu_mixed_operands_fall_back_to_plus(cp):
    a = _arrays(cp, (4, 8, 6, 6), np.float32, "nchw", 3)
    b = _arrays(cp, (4, 8, 6, 6), np.float32, "nhwc", 4)         # another memory order
    np.testing.assert_array_equal(cp.asnumpy(add_arrays(a, b)), cp.asnumpy(a + b))
    c = cp.asarray(np.float64(2.5) * np.ones((6,)))               # broadcast and promotion
    out = add_arrays(a, c)
    assert out.dtype == (a + c).dtype
    np.testing.assert_array_equal(cp.asnumpy(out), cp.asnumpy(a + c))
