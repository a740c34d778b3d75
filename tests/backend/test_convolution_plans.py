"""The convolution primitives' validated-signature shortcut (convolution.py, _PLANS; docs/host_overhead.md).

A call whose signature passed every check before reuses that call's plan (problem, format, math settings) instead
of validating again.  The shortcut must be invisible: the same bits, a miss whenever anything a check reads
changed, the same error for bad input after a cached call, and cleared with the algorithm cache.
"""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import (
    BadParamError,
    ConvolutionBwdDataAlgo,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    Handle,
    MathType,
    NotSupportedError,
    clear_convolution_algorithm_cache,
    convolution_algorithm_cache_info,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
    to_device,
)
from minidnn.backend import convolution as conv_module

X_SHAPE, W_SHAPE = (2, 3, 7, 6), (4, 3, 3, 3)


@pytest.fixture
def validations(monkeypatch):
    """Counts the full path's validations (conv_module._prepare calls), from an empty cache."""
    clear_convolution_algorithm_cache()
    calls = []
    real = conv_module._prepare

    def counting(where, *args, **kwargs):
        calls.append(where)
        return real(where, *args, **kwargs)
    monkeypatch.setattr(conv_module, "_prepare", counting)
    yield calls
    clear_convolution_algorithm_cache()


def _arrays(device, x_shape=X_SHAPE, w_shape=W_SHAPE, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    return to_device(x, device), to_device(w, device)


def _three_directions(h, x, w, desc):
    y = convolution_forward(h, x, w, desc)
    dx = convolution_backward_data(h, w, y, desc, x.shape)
    dw = convolution_backward_filter(h, x, y, desc, w.shape)
    return [to_device(a, "cpu") for a in (y, dx, dw)]


def test_a_hit_gives_the_same_bits_and_skips_validation(device, validations):
    h = Handle(device)
    x, w = _arrays(device)
    desc = ConvolutionDescriptor(padding=1)
    first = _three_directions(h, x, w, desc)
    assert len(validations) == 3
    second = _three_directions(h, x, w, desc)
    assert len(validations) == 3                     # every direction a hit
    clear_convolution_algorithm_cache()
    third = _three_directions(h, x, w, desc)        # validated again from scratch
    assert len(validations) == 6
    for a, b, c in zip(first, second, third):
        assert a.dtype == b.dtype == c.dtype and a.shape == b.shape == c.shape
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_the_default_handle_and_an_explicit_one_are_different_signatures(validations):
    x, w = _arrays("cpu")
    desc = ConvolutionDescriptor(padding=1)
    a = convolution_forward(None, x, w, desc)
    b = convolution_forward(None, x, w, desc)
    assert len(validations) == 1
    c = convolution_forward(Handle("cpu"), x, w, desc)
    assert len(validations) == 2
    assert np.array_equal(a, b) and np.array_equal(a, c)


@pytest.mark.parametrize("change", ["x shape", "w shape", "dtype", "descriptor", "equal descriptor", "format",
                                    "handle math type", "descriptor math type", "deterministic", "workspace limit",
                                    "algo"])
def test_anything_a_check_reads_changed_is_a_miss(change, validations):
    h = Handle("cpu")
    x, w = _arrays("cpu")
    desc = ConvolutionDescriptor(padding=1)
    convolution_forward(h, x, w, desc)
    assert len(validations) == 1
    fmt = None
    if change == "x shape":
        x, _ = _arrays("cpu", x_shape=(1, 3, 7, 6))
    elif change == "w shape":
        _, w = _arrays("cpu", w_shape=(5, 3, 3, 3))
    elif change == "dtype":
        x, w = _arrays("cpu", dtype=np.float64)
    elif change == "descriptor":
        desc = ConvolutionDescriptor(padding=1, stride=2)
    elif change == "equal descriptor":     # another object, equal: the same signature
        desc = ConvolutionDescriptor(padding=1)
    elif change == "format":
        x, fmt = np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "NHWC"
    elif change == "handle math type":
        h.math_type = MathType.TENSOR_OP
    elif change == "descriptor math type":
        desc = ConvolutionDescriptor(padding=1, math_type=MathType.TENSOR_OP)
    elif change == "deterministic":
        h.deterministic = True
    elif change == "workspace limit":
        h.workspace_limit = 1 << 30
    y = convolution_forward(h, x, w, desc, format=fmt,
                            algo=ConvolutionFwdAlgo.GEMM if change == "algo" else None)
    assert len(validations) == (1 if change == "equal descriptor" else 2)
    # and the result is what a fresh process computes
    clear_convolution_algorithm_cache()
    fresh = convolution_forward(h, x, w, desc, format=fmt, algo=ConvolutionFwdAlgo.GEMM if change == "algo" else None)
    assert np.array_equal(y, fresh)


def _error(fn):
    with pytest.raises((BadParamError, NotSupportedError)) as info:
        fn()
    return type(info.value), str(info.value)


BAD_CALLS = {
    "w channels": lambda h, x, w, d: convolution_forward(h, x, w[:, :2], d),
    "w dtype": lambda h, x, w, d: convolution_forward(h, x, w.astype(np.float64), d),
    "integer x": lambda h, x, w, d: convolution_forward(h, x.astype(np.int32), w.astype(np.int32), d),
    "x rank": lambda h, x, w, d: convolution_forward(h, x[0], w, d),
    "beta without y": lambda h, x, w, d: convolution_forward(h, x, w, d, beta=1.0),
    "y of the wrong shape": lambda h, x, w, d: convolution_forward(h, x, w, d, y=np.zeros((1, 1), np.float32)),
    "not a descriptor": lambda h, x, w, d: convolution_forward(h, x, w, "padding=1"),
    "unknown format": lambda h, x, w, d: convolution_forward(h, x, w, d, format="NCWH"),
    "kernel over the input": lambda h, x, w, d: convolution_forward(h, x[..., :1, :1], w, ConvolutionDescriptor()),
    "unsupported algo": lambda h, x, w, d: convolution_forward(h, x, w, d, algo=ConvolutionFwdAlgo.FFT_TILING),
    "dy shape": lambda h, x, w, d: convolution_backward_data(h, w, x, d, (2, 3, 9, 9)),
    "dw shape": lambda h, x, w, d: convolution_backward_filter(h, x, x, d, (4, 3, 3, 3)),
    "list shape": lambda h, x, w, d: convolution_backward_data(h, w, np.zeros((2, 4, 7, 6), np.float32), d,
                                                              [2, 3, 7, 5]),
}


@pytest.mark.parametrize("bad", sorted(BAD_CALLS))
def test_bad_input_after_cached_calls_raises_the_same_error(bad):
    clear_convolution_algorithm_cache()
    h = Handle("cpu")
    x, w = _arrays("cpu")
    desc = ConvolutionDescriptor(padding=1)
    cold = _error(lambda: BAD_CALLS[bad](h, x, w, desc))
    _three_directions(h, x, w, desc)                 # every direction cached
    _three_directions(h, x, w, desc)
    assert _error(lambda: BAD_CALLS[bad](h, x, w, desc)) == cold
    clear_convolution_algorithm_cache()


def test_an_explicit_algorithm_is_checked_once_and_still_refused_where_it_cannot_run(validations):
    h = Handle("cpu")
    x, w = _arrays("cpu")
    desc = ConvolutionDescriptor(padding=1)
    y = convolution_forward(h, x, w, desc)
    dx = convolution_backward_data(h, w, y, desc, x.shape, algo=ConvolutionBwdDataAlgo.ALGO_0)
    again = convolution_backward_data(h, w, y, desc, x.shape, algo=ConvolutionBwdDataAlgo.ALGO_0)
    assert np.array_equal(dx, again) and len(validations) == 2
    with pytest.raises(NotSupportedError):
        convolution_forward(h, x, w, desc, algo=ConvolutionFwdAlgo.IMPLICIT_GEMM)   # a CUDA kernel, on the CPU
    with pytest.raises(NotSupportedError):
        convolution_forward(h, x, w, desc, algo=ConvolutionFwdAlgo.IMPLICIT_GEMM)


def test_benchmark_mode_still_counts_hits_and_clearing_forgets_the_plans(validations):
    h = Handle("cpu", benchmark=True)
    x, w = _arrays("cpu")
    desc = ConvolutionDescriptor(padding=1)
    convolution_forward(h, x, w, desc)
    convolution_forward(h, x, w, desc)
    convolution_forward(h, x, w, desc)
    assert convolution_algorithm_cache_info()["convolution_forward"] == (2, 1, 1)   # the selector still sees hits
    assert len(validations) == 1 and conv_module._PLANS
    clear_convolution_algorithm_cache()
    assert not conv_module._PLANS
    convolution_forward(h, x, w, desc)
    assert len(validations) == 2
    assert convolution_algorithm_cache_info()["convolution_forward"] == (0, 1, 1)


def test_output_buffers_and_blending_take_the_full_path(validations):
    h = Handle("cpu")
    x, w = _arrays("cpu")
    desc = ConvolutionDescriptor(padding=1)
    y = convolution_forward(h, x, w, desc)
    out = np.ones_like(y)
    convolution_forward(h, x, w, desc, y=out, beta=1.0)
    convolution_forward(h, x, w, desc, y=out)
    assert len(validations) == 3
    np.testing.assert_array_equal(convolution_forward(h, x, w, desc, alpha=2.0), 2 * y)   # alpha: a hit
    assert len(validations) == 3


def test_the_plan_table_is_bounded(monkeypatch, validations):
    monkeypatch.setattr(conv_module, "_PLANS_LIMIT", 3)
    h = Handle("cpu")
    desc = ConvolutionDescriptor(padding=1)
    for n in range(1, 6):
        x, w = _arrays("cpu", x_shape=(n, 3, 5, 5))
        convolution_forward(h, x, w, desc)
        assert len(conv_module._PLANS) <= 3
    assert len(validations) == 5


def test_the_nn_layers_reach_the_same_plan_every_step(validations):
    import minidnn as mdn
    conv = mdn.nn.Conv2d(3, 4, 3, padding=1)
    x = mdn.randn(2, 3, 7, 6, requires_grad=True)
    for _ in range(3):
        conv(x).sum().backward()
    assert len(validations) == 3        # forward, backward data, backward filter: validated on the first step only
    assert B.convolution_forward is convolution_forward


def test_nn_builds_each_descriptor_once_and_still_rejects_bad_settings():
    from minidnn.nn._functions._util import descriptor
    a = descriptor(B.ConvolutionDescriptor, (1, 1), (2, 2), (1, 1), 1)
    assert a is descriptor(B.ConvolutionDescriptor, (1, 1), (2, 2), (1, 1), 1)
    assert a == B.ConvolutionDescriptor(padding=(1, 1), stride=(2, 2), dilation=(1, 1), groups=1)
    assert a is not descriptor(B.ConvolutionDescriptor, (1, 1), (1, 1), (1, 1), 1)
    assert descriptor(B.PoolingDescriptor, "max", (2, 2), (0, 0), (2, 2), True, (1, 1)) is not \
        descriptor(B.PoolingDescriptor, "max", (2, 2), (0, 0), (2, 2), 1, (1, 1))       # typed: True is not 1
    for _ in range(2):      # a failed construction is not remembered
        with pytest.raises(BadParamError, match="stride"):
            descriptor(B.ConvolutionDescriptor, (1, 1), (0, 0), (1, 1), 1)
