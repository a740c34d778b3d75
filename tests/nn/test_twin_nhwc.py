"""The twin's NHWC shadow (nn/_functions/norm.py ``TWIN_NHWC``, docs/fusion.md "The twin's NHWC shadow") on the CPU:
the GPU path under tools/record_launches.py's fake CuPy (launches recorded with null pointers, never run) in a
subprocess.

Model steps: with TWIN_NHWC on, ResNet-20 (b16, and b128 with an H100's shared memory -- the cluster kernels' bn_fwdc
--, float32 and bfloat16 autocast, NCHW) launches no forward staging copy of x from its fourth step on (each 3x3
convolution's input is a batch-norm or add twin's ReLU output, whose kernel writes the shadow the convolution reads),
and every other launch is the switch-off step's, the twin kernels the same launches with -DTWIN_NHWC=1 and one more
array; MobileNet-small, LeNet-5 and channels-last ResNet-20 launch the same; under a (faked) capturing stream the
step launches as with the switch off.  Layer scenarios: a batch norm + ReLU before a staged convolution gets its
shadow on the fourth step; an in-place change of the ReLU output before the convolution (``h.add_(0)`` under
no_grad) makes the convolution stage again, and after TWIN_MISSES unused shadows the twin stops writing them."""
import textwrap

import pytest

from tests.nn._fake_script import FAKE_PROLOGUE, MODEL_STEPS, run_fake_script

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + MODEL_STEPS + textwrap.dedent("""
    def staged(names):
        return sum(n.startswith("nchw_to_nhwc") for n in names)

    def model_step(name, on, amp=False, cl=False, batch=16, smem=None, steps=5):
        N.TWIN_NHWC[0] = on
        per_step = []
        for n_fwd in train_steps(name, amp, cl, batch, smem, steps):
            names = [r[0] for r in recs]
            per_step.append([staged(names[:n_fwd]), sum("-DTWIN_NHWC=1" in n for n in names)])
        return dict(recs=[list(r) for r in recs], fwd=n_fwd, per_step=per_step)

    def layer(inplace=False, on=True, steps=7):
        N.TWIN_NHWC[0] = on
        N._REMEMBERED.clear()
        DF._smem.clear()
        mdn.manual_seed(0)
        nn = mdn.nn
        conv0, bn = nn.Conv2d(32, 32, 3, padding=1, bias=False).to("cuda"), nn.BatchNorm2d(32).to("cuda")
        conv1 = nn.Conv2d(32, 32, 3, padding=1, bias=False).to("cuda")
        x = mdn.randn(32, 32, 16, 16).to("cuda").requires_grad_()
        out = []
        for i in range(steps):
            del recs[:]
            h = F.relu(bn(conv0(x)))
            n0 = len(recs)
            if inplace:
                with mdn.no_grad():
                    h.add_(0)
            r = conv1(h)
            names = [r_[0] for r_ in recs]
            r.backward(mdn.ones(*r.shape).to("cuda"))
            out.append([staged(names[n0:]), sum("-DTWIN_NHWC=1" in n for n in names), len(recs)])
            for p in (x, *conv0.parameters(), *bn.parameters(), *conv1.parameters()):
                p.grad = None
        return out

    res = {{}}
    for amp in (False, True):
        res[f"resnet20_{{amp}}_off"] = model_step("resnet20", False, amp)
        res[f"resnet20_{{amp}}_on"] = model_step("resnet20", True, amp)
        res[f"h100_{{amp}}_off"] = model_step("resnet20", False, amp, batch=128, smem=H100, steps=4)
        res[f"h100_{{amp}}_on"] = model_step("resnet20", True, amp, batch=128, smem=H100, steps=4)
        for name in ("mobilenet", "lenet5"):
            res[f"{{name}}_{{amp}}_off"] = model_step(name, False, amp, steps=4)
            res[f"{{name}}_{{amp}}_on"] = model_step(name, True, amp, steps=4)
    # while a stream captures (faked: a non-default stream that says so), the twin alone: launch for launch
    real_stream = fakecp.cuda.get_current_stream
    fakecp.cuda.get_current_stream = lambda *a: types.SimpleNamespace(ptr=1)
    fakecp.cuda.runtime.streamIsCapturing = lambda s: True
    res["capture_off"] = model_step("resnet20", False)
    res["capture_on"] = model_step("resnet20", True)
    fakecp.cuda.get_current_stream = real_stream
    fakecp.cuda.runtime.streamIsCapturing = lambda s: False
    res["cl_off"] = model_step("resnet20", False, cl=True, steps=4)
    res["cl_on"] = model_step("resnet20", True, cl=True, steps=4)
    res["layer"] = layer()
    res["layer_inplace"] = layer(True)
    res["layer_off"] = layer(on=False)
    print("RESULT" + json.dumps(res))
""")


@pytest.fixture(scope="module")
def out():
    return run_fake_script(_SCRIPT, ROOT)


def _same_but_shadow(a, b):
    """Launch b is launch a with -DTWIN_NHWC=1 (and the add's SH_C / SH_HW) and one more (null) array first-packed."""
    if a == b:
        return False
    name = b[0].replace(", '-DTWIN_NHWC=1'", "")
    if name.startswith("act_bwd"):
        name = name.split(", '-DSH_C=")[0] + ")"
    assert name == a[0] and "-DTWIN=1" in a[0], (a[0], b[0])
    assert a[1] == b[1] and b[2] == "0" * 16 + a[2], (a, b)
    return True


@pytest.mark.parametrize("prefix, n_x", [("resnet20", 16), ("h100", 18)])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_resnet20_stages_no_forward_x_from_the_fourth_step(out, amp, prefix, n_x):
    """(b16: the two smallest 3x3 convolutions stage nothing either way; the filters' copies are kept from the
    third (float32) or fourth (bfloat16) step: conv_filter_keep.)"""
    off, on = out[f"{prefix}_{amp}_off"], out[f"{prefix}_{amp}_on"]
    assert off["per_step"][-1] == [n_x, 0] and all(s[1] == 0 for s in off["per_step"])
    assert on["per_step"][:3] == off["per_step"][:3]
    assert on["per_step"][3:] == [[0, n_x]] * (len(on["per_step"]) - 3), on["per_step"]
    # the rest of the last step: the switch-off step's launches, the twins' with the shadow
    fwd_off = [r for r in off["recs"][:off["fwd"]] if not r[0].startswith("nchw_to_nhwc")]
    assert on["fwd"] == len(fwd_off) == off["fwd"] - n_x and len(on["recs"]) == len(off["recs"]) - n_x
    assert sum(_same_but_shadow(a, b) for a, b in zip(fwd_off, on["recs"][:on["fwd"]])) == n_x
    assert on["recs"][on["fwd"]:] == off["recs"][off["fwd"]:]


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_on_an_h100_the_cluster_forward_writes_the_shadow(out, amp):
    on = out[f"h100_{amp}_on"]
    assert any(r[0].startswith("bn_fwdc") and "-DTWIN_NHWC=1" in r[0] for r in on["recs"])


@pytest.mark.parametrize("name", ["mobilenet_False", "mobilenet_True", "lenet5_False", "lenet5_True", "cl", "capture"])
def test_other_models_and_a_capturing_stream_launch_the_same(out, name):
    assert out[name + "_on"] == out[name + "_off"]


def test_a_layer_takes_the_shadow_from_the_fourth_step(out):
    # step 1: the full path (remembered after it); 2: the fused ReLU settled; 3: the twin, which the convolution
    # stages (the entry learns); 4 on: the shadow, nothing staged.  (Filter copies: staged on steps 1-2, then kept.)
    assert [s[:2] for s in out["layer"]] == [[2, 0], [2, 0], [1, 0]] + [[0, 1]] * 4
    assert [s[:2] for s in out["layer_off"]] == [[2, 0], [2, 0]] + [[1, 0]] * 5
    assert [s[2] for s in out["layer"][3:]] == [out["layer_off"][-1][2] - 1] * 4


def test_an_in_place_change_of_the_relu_output_stages_again_and_stops_the_shadow(out):
    # shadows written on steps 4-6, none taken (x changed in place); TWIN_MISSES (3) unused: no more shadows
    assert [s[:2] for s in out["layer_inplace"]] == [[2, 0], [2, 0], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]]


_CAPTURED_CONV = FAKE_PROLOGUE + MODEL_STEPS + textwrap.dedent("""
    # conv1 captured on its own (a partial capture) after eager steps whose shadows it took: its input, an eager
    # twin, has a shadow written outside the capture, which a replay would read as it is -- it must stage instead
    from minidnn.nn._functions import conv as C
    N.TWIN_NHWC[0] = True
    taken = []
    real_outcome = C._shadow_outcome

    def outcome(node, carry):
        o = node.sh
        taken.append(o[1] is not None and carry.xs is o[1])
        return real_outcome(node, carry)
    C._shadow_outcome = outcome
    mdn.manual_seed(0)
    nn = mdn.nn
    conv0, bn = nn.Conv2d(32, 32, 3, padding=1, bias=False).to("cuda"), nn.BatchNorm2d(32).to("cuda")
    conv1 = nn.Conv2d(32, 32, 3, padding=1, bias=False).to("cuda")
    x = mdn.randn(32, 32, 16, 16).to("cuda").requires_grad_()
    out = []
    real_stream = fakecp.cuda.get_current_stream
    for i in range(6):
        h = F.relu(bn(conv0(x)))
        if i == 5:
            fakecp.cuda.get_current_stream = lambda *a: types.SimpleNamespace(ptr=1)
            fakecp.cuda.runtime.streamIsCapturing = lambda s: True
        n0 = len(taken)
        del recs[:]
        y = conv1(h)
        out.append([sum(r[0].startswith("nchw_to_nhwc") for r in recs), any(taken[n0:])])
        fakecp.cuda.get_current_stream = real_stream
        fakecp.cuda.runtime.streamIsCapturing = lambda s: False
        y.backward(mdn.ones(*y.shape).to("cuda"))
        for p in (x, *conv0.parameters(), *bn.parameters(), *conv1.parameters()):
            p.grad = None
    print("RESULT" + json.dumps(out))
""")


def test_a_captured_convolution_stages_its_input_instead_of_an_eager_shadow():
    out = run_fake_script(_CAPTURED_CONV, ROOT)
    assert out[4] == [0, True]          # eager: the shadow taken (from the fourth step), nothing staged
    assert out[5] == [2, False]         # captured: x staged (and the filter: nothing kept while capturing)
