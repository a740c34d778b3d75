"""Channels-last convolutions on the settled calls' channels-first entry (``SettledConvolution.first``; docs/
host_overhead.md round 22), under tools/fake_gpu_step.py's fake CuPy in a subprocess: a channels-last ResNet-20
step blends every residual block's input gradient in place (backward data into the pending gradient, beta 1) as the
NCHW step does since round 15 -- the engine adds only the loss's root, as NCHW's --, float32 and bfloat16
autocast; with gradient destinations off the engine adds the nine again; MobileNet-small has no sum either way.
Launches: test_conv_fast_path.py (fast path on = off per layer, channels-last included), test_conv_cl_first.py
(first = run); the bits on a GPU: test_conv_cl_dest_cuda.py."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _counts(model, batch, **env):
    """(leaf copies, gradient sums) of one warm training step (fake_gpu_step.py MODE=copies), in a subprocess."""
    e = dict(os.environ, MODE="copies", PYTHONPATH=str(ROOT), **env)
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "fake_gpu_step.py"), str(ROOT), model, str(batch)],
                         env=e, capture_output=True, text=True, timeout=300)
    m = re.search(r"leaf copies (\d+), gradient sums (\d+)", out.stdout)
    assert m, out.stdout[-2000:] + out.stderr[-2000:]
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_channels_last_resnet_step_sums_as_the_nchw_step(amp):
    nchw = _counts("resnet20", 8, AMP=amp)
    cl = _counts("resnet20", 8, AMP=amp, CL="1")
    assert nchw[1] == 1 and cl[1] == nchw[1]
    assert _counts("resnet20", 8, AMP=amp, CL="1", MINIDNN_GRAD_DEST="0")[1] == 10


def test_channels_last_mobilenet_step_has_no_sum():
    assert _counts("mobilenet", 8, CL="1")[1] == 1
