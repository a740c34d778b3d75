"""A channels-last weight's filter gradient written straight into its channels-last gradient slot (session 8), on
the CPU: the GPU path under tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never run) in a
subprocess.  A channels-last conv layer trained by a fused SGD keeps its weight, gradient and momentum channels-last;
its second step's backward filter launches the implicit-GEMM kernel with DWKRSC=1 into the slot (no copy into it), and
its forward reads the channels-last filter as it is (no filter transpose); with the switch off (CL_DW_SLOT) the
kernel writes a fresh KCRS dw and the engine copies it into the slot.  The bits on a GPU: test_conv_dw_krsc_cuda.py."""
import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    R.numpy_fallback(fakecp)
    import minidnn as mdn
    from minidnn import autograd as A
    from minidnn.nn._functions import conv as C
    copies = []
    _copy = A._copy_into
    A._copy_into = lambda dst, src: (copies.append(tuple(dst.shape)), _copy(dst, src))[1]
    out = {{}}
    for on in (True, False):
        C.CL_DW_SLOT[0] = on
        mdn.manual_seed(0)
        conv = mdn.nn.Conv2d(16, 32, 3, padding=1, bias=False).to("cuda").to(memory_format=mdn.channels_last)
        opt = mdn.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
        x = mdn.randn(8, 16, 16, 16).to("cuda").to(memory_format=mdn.channels_last)
        g = mdn.randn(8, 32, 16, 16).to("cuda").to(memory_format=mdn.channels_last)
        for step in range(3):
            del recs[:], copies[:]
            opt.zero_grad()
            conv(x).backward(g)
            opt.step()
        w = conv.weight
        out[str(on)] = {{"recs": [r[0] for r in recs],
                        "cl": [t.is_contiguous(memory_format=mdn.channels_last) and not t.is_contiguous()
                               for t in (w, w.grad)],
                        "slot": w.grad.data is w._grad_storage, "copies": list(copies)}}
    C.CL_DW_SLOT[0] = True
    print(json.dumps(out))
""")


def test_channels_last_filter_gradient_lands_in_its_slot():
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    on, off = out["True"], out["False"]
    assert on["cl"] == [True, True] and off["cl"] == [True, True]
    wgrad_on = [r for r in on["recs"] if "conv_igemm" in r and "DIR=2" in r]
    wgrad_off = [r for r in off["recs"] if "conv_igemm" in r and "DIR=2" in r]
    assert len(wgrad_on) == len(wgrad_off) == 1
    assert "DWKRSC=1" in wgrad_on[0] and "DWKRSC" not in wgrad_off[0]
    assert wgrad_on[0].replace(", '-DDWKRSC=1'", "") == wgrad_off[0]
    assert not any("nchw_to_nhwc" in r for r in on["recs"])            # the forward reads the filter as it is
    assert on["slot"] and off["slot"]
    assert on["copies"] == [] and off["copies"] == [[32, 16, 3, 3]]       # off: dw copied into the slot
    assert len(off["recs"]) == len(on["recs"])
