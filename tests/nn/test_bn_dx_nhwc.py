"""Batch norm's dx in channels-last memory for the convolution backward after it (nn/_functions/norm.py
``DX_NHWC``, docs/fusion.md "Batch norm's dx in channels-last memory") on the CPU: the GPU path under
tools/record_launches.py's fake CuPy (launches recorded with null pointers, never run) in a subprocess.

Model steps (the third SGD step's launches): with DX_NHWC on, ResNet-20
(float32 and bfloat16 autocast, NCHW) launches exactly its 18 backward dy staging copies fewer (every 3x3
convolution's; the stem's and the 1x1 shortcuts' stage nothing) and each of the 18 batch-norm backwards that feed
them is the same launch with -DDX_NHWC=1; MobileNet-small, LeNet-5 and channels-last ResNet-20 launch the same.  With
an H100's shared memory (the cluster kernels take the batch-norm backward of ResNet-20's 32- and 64-channel layers in
float32 and all of bfloat16; bn_bwdc has DX_NHWC too) both save all 18.  Layer scenarios: a hook,
retain_grad or autograd.grad on the convolution's output, or the switch off, keep dx as x (the staging copy runs);
otherwise the convolution's own input gradient still comes back NCHW."""
import textwrap

import pytest

from tests.nn._fake_script import FAKE_PROLOGUE, MODEL_STEPS, run_fake_script

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + MODEL_STEPS + textwrap.dedent("""
    def model_step(name, on, amp=False, cl=False, batch=32, smem=None):
        N.DX_NHWC[0] = on
        for n_fwd in train_steps(name, amp, cl, batch, smem, 3):
            pass
        return dict(recs=[list(r[:2]) for r in recs], fwd=n_fwd)

    def layer(case, on=True):
        N.DX_NHWC[0] = on
        N._REMEMBERED.clear()
        DF._smem.clear()
        mdn.manual_seed(0)
        nn = mdn.nn
        conv, bn = nn.Conv2d(32, 32, 3, padding=1, bias=False).to("cuda"), nn.BatchNorm2d(32).to("cuda")
        x = mdn.randn(32, 32, 16, 16).to("cuda").requires_grad_()
        for i in range(3):
            del recs[:]
            h = conv(x)
            if i == 2 and case == "hook":
                h.register_hook(lambda g: g)
            if i == 2 and case == "retain":
                h.retain_grad()
            r = F.relu(bn(h))
            gout = mdn.ones(*r.shape).to("cuda")       # (contiguous: a sum's broadcast gradient is not remembered)
            if i == 2 and case == "grad":
                gh, gx = mdn.autograd.grad(r, [h, x], gout)
            else:
                r.backward(gout)
                gx = x.grad
            x.grad = None
            conv.zero_grad()
            bn.zero_grad()
        names = [r[0] for r in recs]
        return dict(dx_nhwc=sum("-DDX_NHWC=1" in n for n in names),
                    staged=sum(n.startswith("nchw_to_nhwc") for n in names[names.index(next(
                        n for n in names if n.startswith("bn_bwd1"))):]),
                    gx=list(gx.data.strides))

    res = {{}}
    for amp in (False, True):
        res[f"resnet20_{{amp}}_off"] = model_step("resnet20", False, amp)
        res[f"resnet20_{{amp}}_on"] = model_step("resnet20", True, amp)
        res[f"h100_{{amp}}_off"] = model_step("resnet20", False, amp, batch=128, smem=H100)
        res[f"h100_{{amp}}_on"] = model_step("resnet20", True, amp, batch=128, smem=H100)
        for name in ("mobilenet", "lenet5"):
            res[f"{{name}}_{{amp}}_off"] = model_step(name, False, amp)
            res[f"{{name}}_{{amp}}_on"] = model_step(name, True, amp)
    # while a stream captures (faked: a non-default stream that says so), the plain call: launch for launch
    real_stream = fakecp.cuda.get_current_stream
    fakecp.cuda.get_current_stream = lambda *a: types.SimpleNamespace(ptr=1)
    fakecp.cuda.runtime.streamIsCapturing = lambda s: True
    res["capture_off"] = model_step("resnet20", False)
    res["capture_on"] = model_step("resnet20", True)
    fakecp.cuda.get_current_stream = real_stream
    fakecp.cuda.runtime.streamIsCapturing = lambda s: False
    res["cl_off"] = model_step("resnet20", False, cl=True)
    res["cl_on"] = model_step("resnet20", True, cl=True)
    for case in ("none", "hook", "retain", "grad"):
        res["layer_" + case] = layer(case)
    res["layer_off"] = layer("none", False)
    print("RESULT" + json.dumps(res))
""")


@pytest.fixture(scope="module")
def out():
    return run_fake_script(_SCRIPT, ROOT)


def _names(recs):
    return [r[0] for r in recs]


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_resnet20_launches_its_backward_dy_stagings_fewer(out, amp):
    off, on = out[f"resnet20_{amp}_off"], out[f"resnet20_{amp}_on"]
    assert on["fwd"] == off["fwd"] and on["recs"][:on["fwd"]] == off["recs"][:off["fwd"]]
    bwd = off["recs"][off["fwd"]:]
    kept = [r for r in bwd if not r[0].startswith("nchw_to_nhwc")]
    assert len(bwd) - len(kept) == 18 == len(off["recs"]) - len(on["recs"])
    changed = 0
    for a, b in zip(kept, on["recs"][on["fwd"]:]):
        if a != b:
            changed += 1
            assert a[0].startswith("bn_bwd1") and b[0].replace(", '-DDX_NHWC=1'", "") == a[0] and a[1] == b[1]
    assert changed == 18        # the 21 batch norms less the stem's and the two shortcuts'


@pytest.mark.parametrize("amp, saved", [(False, 18), (True, 18)], ids=["fp32", "bf16"])
def test_on_an_h100_the_cluster_route_writes_dx_channels_last_too(out, amp, saved):
    off, on = out[f"h100_{amp}_off"], out[f"h100_{amp}_on"]
    assert any(n.startswith("bn_bwdc") for n in _names(off["recs"]))
    assert len(off["recs"]) - len(on["recs"]) == saved
    assert sum("-DDX_NHWC=1" in n for n in _names(on["recs"])) == saved


@pytest.mark.parametrize("name", ["mobilenet_False", "mobilenet_True", "lenet5_False", "lenet5_True", "cl", "capture"])
def test_other_models_launch_the_same(out, name):
    assert out[name + "_on"] == out[name + "_off"]


def test_a_layer_whose_conv_output_is_unseen_writes_dx_channels_last(out):
    r = out["layer_none"]
    assert r["dx_nhwc"] == 1 and r["staged"] == 0
    assert r["gx"] == [32 * 16 * 16 * 4, 16 * 16 * 4, 16 * 4, 4]      # the conv's own dx: NCHW, as its x
    assert out["layer_off"]["staged"] == 1 and out["layer_off"]["dx_nhwc"] == 0


@pytest.mark.parametrize("case", ["hook", "retain", "grad", "off"])
def test_dx_stays_as_x_where_someone_sees_it_or_the_switch_is_off(out, case):
    r = out["layer_" + case]
    assert r["dx_nhwc"] == 0 and r["staged"] == 1
    assert r["gx"] == [32 * 16 * 16 * 4, 16 * 16 * 4, 16 * 4, 4]


_CAPTURE_CL = FAKE_PROLOGUE + MODEL_STEPS + textwrap.dedent("""
    # a channels-last batch norm's plain backward call (bn_nhwc off: bn_kernels' _BackwardCall, whose dx is laid out
    # back to channels-last) while the stream captures: DX_NHWC's capture rule must not refuse it (the review's crash)
    M.ENABLED = False
    res = {{}}
    mdn.manual_seed(0)
    bn = mdn.nn.BatchNorm2d(32).to("cuda")
    x = mdn.randn(8, 32, 16, 16).to("cuda").to(memory_format=mdn.channels_last).requires_grad_()
    for step in range(3):
        if step == 2:
            fakecp.cuda.get_current_stream = lambda *a: types.SimpleNamespace(ptr=1)
            fakecp.cuda.runtime.streamIsCapturing = lambda s: True
        del recs[:]
        bn(x).sum().backward()
        res[str(step)] = sum(r[0].startswith("bn_") for r in recs)
        x.grad = None
    print("RESULT" + json.dumps(res))
""")


def test_a_channels_last_plain_backward_runs_while_capturing():
    res = run_fake_script(_CAPTURE_CL, ROOT)
    assert res["2"] == res["1"] > 0
