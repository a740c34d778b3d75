"""The fast path of a seen GPU convolution (nn._functions.conv FAST_PATH, backend.convolution.settle_convolution;
docs/host_overhead.md round 13), on the CPU: the GPU path run under tools/record_launches.py's fake CuPy (NumPy arrays,
launches recorded, never run) in a subprocess, so the fake never meets this test session's modules.

What is checked, per layer shape and mode (NCHW and channels-last, stride 2, groups, depthwise, 1x1, few-channel,
conv1d, bias, bfloat16 autocast, each gradient pattern, inference): with the switch on and off, a warm F.conv2d forward
and backward make the same launches (kernel, options, grid, block, packed arguments, in order) and the same
allocations, return outputs and gradients of the same shape, strides and dtype; with it on every convolution of the
warm step is served by the settled calls (none by the primitives), with it off none is.  Beside: benchmark mode keeps
the full path (the selector's cache counts the same hits either way); clearing the algorithm caches or flipping a
kernel switch settles anew (the same launches as the full path); a misaligned input keys apart; a call the full path
rejects raises the same error with the switch on; a (fake) CUDA-graph capture allocates and launches as the full
path; a handle setting (TF32, deterministic, a workspace limit) is followed.  The bits on a GPU:
test_conv_fast_path_cuda.py.  CPU calls never touch the fast path (checked in this process)."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys, types, collections
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    import numpy as np
    R.numpy_fallback(fakecp)        # CuPy functions the fake lacks: NumPy's, on fake arrays
    import minidnn as mdn
    import minidnn.backend as B
    from minidnn.backend import convolution as CV
    from minidnn.backend.cuda import conv_register as CR
    from minidnn.backend.cuda import workspace as WS
    WS.RECYCLE[0] = False       # the allocations compared are the paths' own (not kept memory reused or not)
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    from minidnn.tensor import Tensor

    served = collections.Counter()
    _run = CV.SettledConvolution.first      # (run goes through first: each settled call counted once)
    def run(self, *a, **k):
        served[self.direction] += 1
        return _run(self, *a, **k)
    CV.SettledConvolution.first = run
    for name in ("convolution_forward", "convolution_backward_data", "convolution_backward_filter"):
        def full(*a, _f=getattr(B, name), **k):
            served["full"] += 1
            return _f(*a, **k)
        setattr(B, name, full)
    allocs = [0]
    _empty = fakecp.empty
    def empty(*a, **k):
        allocs[0] += 1
        return _empty(*a, **k)
    fakecp.empty = empty

    def arr(shape, dtype="float32", misalign=False):
        n = int(np.prod(shape))
        if misalign:                  # a view 4 bytes into its buffer: another 16-byte alignment
            return fakecp.zeros((n + 1,), dtype=dtype)[1:].reshape(shape)
        return fakecp.zeros(shape, dtype=dtype)

    def meta(t):
        if t is None:
            return None
        d = t.data
        # (a channels-last result may own its memory or view an NHWC array: conv_igemm makes it in one step)
        return [list(d.shape), list(d.strides), str(d.dtype), d.base is None or not d.flags.c_contiguous]

    # name: (x shape, w shape, stride, padding, groups, bias, channels-last, x grad, w grad, autocast, conv1d)
    cases = {{
        "s1": ((128, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, False, False, True, True, False, False),
        "s2": ((128, 16, 32, 32), (32, 16, 3, 3), 2, 1, 1, False, False, True, True, False, False),
        "g2": ((64, 32, 32, 32), (32, 16, 3, 3), 1, 1, 2, False, False, True, True, False, False),
        "dw": ((128, 64, 16, 16), (64, 1, 3, 3), 1, 1, 64, False, False, True, True, False, False),
        "dw_s2": ((128, 64, 16, 16), (64, 1, 3, 3), 2, 1, 64, False, False, True, True, False, False),
        "1x1": ((128, 32, 16, 16), (64, 32, 1, 1), 1, 0, 1, False, False, True, True, False, False),
        "few": ((64, 3, 32, 32), (6, 3, 5, 5), 1, 0, 1, False, False, True, True, False, False),
        "bias": ((128, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, True, False, True, True, False, False),
        "cl": ((128, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, False, True, True, True, False, False),
        "cl_s2": ((128, 16, 32, 32), (32, 16, 3, 3), 2, 1, 1, False, True, True, True, False, False),
        "cl_dw": ((128, 64, 16, 16), (64, 1, 3, 3), 1, 1, 64, False, True, True, True, False, False),
        "w_only": ((128, 3, 32, 32), (16, 3, 3, 3), 1, 1, 1, False, False, False, True, False, False),
        "x_only": ((128, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, False, False, True, False, False, False),
        "bf16": ((128, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, False, False, True, True, True, False),
        "bf16_cl": ((128, 16, 32, 32), (32, 16, 3, 3), 2, 1, 1, True, True, True, True, True, False),
        "conv1d": ((64, 32, 512), (32, 32, 3), 1, 1, 1, False, False, True, True, False, True),
    }}

    def layer(spec, misalign=False):
        xs, ws, st, pad, g, bias, cl, xg, wg, amp, one_d = spec
        x = Tensor._from_array(arr(xs, misalign=misalign))
        if cl:
            x = x.to(memory_format=mdn.channels_last)
        w = Tensor._from_array(arr(ws))
        b = Tensor._from_array(arr((ws[0],))) if bias else None
        x.requires_grad, w.requires_grad = xg, wg
        if b is not None:
            b.requires_grad = True
        conv = F.conv1d if one_d else F.conv2d
        def step(grad=True):
            x.grad = w.grad = None
            with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                if grad:
                    y = conv(x, w, b, st, pad, 1, g)
                else:
                    with mdn.no_grad():
                        y = conv(x, w, b, st, pad, 1, g)
            return y
        return x, w, step

    def warm_round(step, backward=True, grad=True):
        for _ in range(2):                  # compiles, plans, settles
            y = step(grad)
            if backward:
                y.backward(Tensor._from_array(fakecp.zeros(y.shape, dtype=str(y.dtype))))
        served.clear(); allocs[0] = 0
        del recs[:]
        y = step(grad)
        fwd = list(recs)
        del recs[:]
        bwd = []
        if backward:
            gy = Tensor._from_array(fakecp.zeros(y.shape, dtype=str(y.dtype)))
            if y.data.strides[1] == y.data.itemsize and y.ndim == 4 and y.shape[1] > 1:
                gy = gy.to(memory_format=mdn.channels_last)
            y.backward(gy)
            bwd = list(recs)
        return fwd, bwd, dict(served), allocs[0], meta(y)

    out = {{}}
    for name, spec in cases.items():
        for on in (False, True):
            C.FAST_PATH[0] = on
            x, w, step = layer(spec)
            fwd, bwd, srv, nalloc, ymeta = warm_round(step)
            out["%s_%d" % (name, on)] = [fwd, bwd, {{str(k): v for k, v in srv.items()}}, nalloc, ymeta, meta(x.grad),
                                        meta(w.grad)]
    # inference (no_grad): the forward alone
    for on in (False, True):
        C.FAST_PATH[0] = on
        x, w, step = layer(cases["s1"])
        fwd, _, srv, nalloc, ymeta = warm_round(step, backward=False, grad=False)
        out["infer_%d" % on] = [fwd, {{str(k): v for k, v in srv.items()}}, nalloc, ymeta]
    C.FAST_PATH[0] = True

    # benchmark mode: the full path (the selector's cache counts its hits); find answers with the heuristic's
    # ranking here (nothing can be timed under the fake)
    from minidnn.backend.algorithm_selection import AlgorithmRegistry
    AlgorithmRegistry.find = lambda self, prob, handle, math_type, run, repeats=3: self.heuristic(prob, handle,
                                                                                               math_type)
    mdn.backends.cudnn.benchmark = True
    small = ((4, 16, 8, 8), (16, 16, 3, 3), 1, 1, 1, False, False, True, True, False, False)
    for on in (False, True):
        C.FAST_PATH[0] = on
        x, w, step = layer(small)
        warm_round(step)
        before = B.convolution_algorithm_cache_info()
        fwd, bwd, srv, nalloc, _ = warm_round(step)
        after = B.convolution_algorithm_cache_info()
        out["bench_%d" % on] = [fwd, bwd, {{str(k): v for k, v in srv.items()}},
                                {{k: after[k][0] - before[k][0] for k in after}}]
    mdn.backends.cudnn.benchmark = None
    B.get_default_handle("cuda:0").benchmark = False
    C.FAST_PATH[0] = True

    # handle settings: TF32, deterministic, a workspace limit (each settles its own calls)
    for setting in ("tf32", "det", "ws"):
        for on in (False, True):
            C.FAST_PATH[0] = on
            h = B.get_default_handle("cuda:0")
            if setting == "tf32":
                mdn.backends.cudnn.allow_tf32 = True
            elif setting == "det":
                mdn.backends.cudnn.deterministic = True
            else:
                h.workspace_limit = 16 << 20        # the tap tables fit, the GEMM reference's im2col does not
            x, w, step = layer(cases["s2"])
            fwd, bwd, srv, _, _ = warm_round(step)
            out["%s_%d" % (setting, on)] = [fwd, bwd, {{str(k): v for k, v in srv.items()}}]
            mdn.backends.cudnn.allow_tf32 = mdn.backends.cudnn.deterministic = None
            h.math_type, h.deterministic, h.workspace_limit = B.MathType.DEFAULT, False, None
    C.FAST_PATH[0] = True

    # a misaligned x keys apart from the aligned one, and takes what the full path takes
    for on in (False, True):
        C.FAST_PATH[0] = on
        x, w, step = layer(cases["s1"])
        warm_round(step)
        x2, w2, step2 = layer(cases["s1"], misalign=True)
        fwd, bwd, srv, _, _ = warm_round(step2)
        out["misaligned_%d" % on] = [fwd, bwd, {{str(k): v for k, v in srv.items()}}]
    C.FAST_PATH[0] = True

    # clearing the algorithm caches, and a kernel switch flipped between calls (the references then run)
    x, w, step = layer(cases["few"])
    warm_round(step)
    n_before = len(C._FAST_CONV)
    B.clear_convolution_algorithm_cache()
    fwd, bwd, srv, _, _ = warm_round(step)
    out["cleared"] = [len(C._FAST_CONV) - n_before, fwd, bwd, {{str(k): v for k, v in srv.items()}}]
    xs = ((2, 3, 8, 8), (4, 3, 3, 3), 1, 1, 1, False, False, True, True, False, False)
    for on in (False, True):
        C.FAST_PATH[0] = on
        x, w, step = layer(xs)
        warm_round(step)
        CR.ENABLED[0] = False
        fwd, bwd, srv, _, _ = warm_round(step)
        CR.ENABLED[0] = True
        out["switch_%d" % on] = [fwd, bwd, {{str(k): v for k, v in srv.items()}}]
    C.FAST_PATH[0] = True

    # a (fake) CUDA-graph capture: scratch buffers come fresh from the graph's pool, as on the full path
    cap = types.SimpleNamespace(ptr=0x99)
    for on in (False, True):
        C.FAST_PATH[0] = on
        x, w, step = layer(cases["s1"])
        warm_round(step)
        fakecp.cuda.get_current_stream = lambda: cap
        fakecp.cuda.runtime.streamIsCapturing = lambda p: p == 0x99
        fwd, bwd, srv, nalloc, _ = warm_round(step)
        fakecp.cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=0)
        out["capture_%d" % on] = [fwd, bwd, {{str(k): v for k, v in srv.items()}}, nalloc]
    C.FAST_PATH[0] = True

    # calls the full path rejects still raise, with the same error, after the signature was seen
    errors = {{}}
    for on in (False, True):
        C.FAST_PATH[0] = on
        x, w, step = layer(cases["s1"])
        warm_round(step)
        got = []
        for bad in ("dtype", "device", "channels"):
            try:
                if bad == "dtype":
                    F.conv2d(x, Tensor._from_array(arr((16, 16, 3, 3), "float64")), None, 1, 1)
                elif bad == "device":
                    F.conv2d(x, mdn.zeros(16, 16, 3, 3), None, 1, 1)
                else:
                    F.conv2d(x, Tensor._from_array(arr((16, 8, 3, 3))), None, 1, 1)
                got.append("no error")
            except Exception as e:
                got.append(type(e).__name__ + ": " + str(e))
        errors[on] = got
    out["errors"] = [errors[False], errors[True]]
    C.FAST_PATH[0] = True
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    script = _SCRIPT.format(root=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


CASES = ["s1", "s2", "g2", "dw", "dw_s2", "1x1", "few", "bias", "cl", "cl_s2", "cl_dw", "w_only", "x_only", "bf16",
         "bf16_cl", "conv1d"]


@pytest.mark.parametrize("name", CASES)
def test_the_fast_path_launches_and_allocates_as_the_full_path(name):
    out = _run()
    f_off, b_off, srv_off, n_off, y_off, gx_off, gw_off = out[f"{name}_0"]
    f_on, b_on, srv_on, n_on, y_on, gx_on, gw_on = out[f"{name}_1"]
    assert f_on and b_on and f_on == f_off and b_on == b_off       # kernel, options, grid, block, packed args
    assert n_on == n_off
    assert (y_on, gx_on, gw_on) == (y_off, gx_off, gw_off)          # shapes, strides, dtypes, fresh arrays
    # on: every convolution of the warm step by the settled calls; off: none
    wanted = {"0": 1}
    if gx_on is not None:
        wanted["1"] = 1
    if gw_on is not None:
        wanted["2"] = 1
    assert srv_on == wanted
    assert srv_off == {"full": len(wanted)}


def test_inference_forward():
    out = _run()
    (f_off, srv_off, n_off, y_off), (f_on, srv_on, n_on, y_on) = out["infer_0"], out["infer_1"]
    assert f_on == f_off and n_on == n_off and y_on == y_off
    assert srv_on == {"0": 1} and srv_off == {"full": 1}


def test_benchmark_mode_keeps_the_full_path():
    out = _run()
    f_off, b_off, srv_off, hits_off = out["bench_0"]
    f_on, b_on, srv_on, hits_on = out["bench_1"]
    assert (f_on, b_on) == (f_off, b_off)
    assert srv_on == srv_off == {"full": 3}
    assert hits_on == hits_off and all(v == 3 for v in hits_on.values())     # every call of the 3 steps asked


@pytest.mark.parametrize("setting", ["tf32", "det", "ws"])
def test_handle_settings_are_followed(setting):
    out = _run()
    f_off, b_off, srv_off = out[f"{setting}_0"]
    f_on, b_on, srv_on = out[f"{setting}_1"]
    assert (f_on, b_on) == (f_off, b_off)
    assert srv_on == {"0": 1, "1": 1, "2": 1} and srv_off == {"full": 3}
    if setting == "tf32":
        assert any("MATH=1" in r[0] for r in f_on)
    else:
        assert all("MATH=1" not in r[0] for r in f_on + b_on)


def test_a_misaligned_input_keys_apart():
    out = _run()
    f_off, b_off, srv_off = out["misaligned_0"]
    f_on, b_on, srv_on = out["misaligned_1"]
    assert (f_on, b_on) == (f_off, b_off)
    assert srv_on == {"0": 1, "1": 1, "2": 1}


def test_cleared_caches_and_flipped_switches_settle_anew():
    out = _run()
    new_entries, fwd, bwd, srv = out["cleared"]
    assert new_entries == 1 and fwd and bwd and srv == {"0": 1, "1": 1, "2": 1}
    f_off, b_off, _ = out["switch_0"]
    f_on, b_on, srv_on = out["switch_1"]
    assert (f_on, b_on) == (f_off, b_off)
    assert all("conv_igemm" not in r[0] and "direct" not in r[0] for r in f_on + b_on)    # the references ran


def test_a_capture_allocates_and_launches_as_the_full_path():
    out = _run()
    f_off, b_off, srv_off, n_off = out["capture_0"]
    f_on, b_on, srv_on, n_on = out["capture_1"]
    assert (f_on, b_on, n_on) == (f_off, b_off, n_off)
    assert srv_on == {"0": 1, "1": 1, "2": 1}


def test_calls_the_full_path_rejects_still_raise_the_same():
    off, on = _run()["errors"]
    assert off == on
    assert all(e != "no error" for e in on)


def test_cpu_calls_never_touch_the_fast_path():
    import minidnn as mdn
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    n0 = len(C._FAST_CONV)
    rng = np.random.default_rng(0)
    x = mdn.tensor(rng.standard_normal((2, 4, 6, 6)).astype(np.float32), requires_grad=True)
    w = mdn.tensor(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), requires_grad=True)
    for _ in range(3):
        y = F.conv2d(x, w, padding=1)
        assert y.grad_fn.seen is None
        y.sum().backward()
    assert len(C._FAST_CONV) == n0
