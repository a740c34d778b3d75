"""autocast's kept low-precision copy after the model's memory format changes mid-training (session 17 review):
``model.to(memory_format=channels_last)`` after the fused optimizer was built re-lays the parameter's flat slot out
at the next step; the kept bf16 copy's views were made for the old order and handed the conv its weight's values
permuted (no error).  Under the fake CuPy (tools/record_launches.py): the weight the conv receives must equal the
parameter cast to bfloat16, before and after the change, every step."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = f"""
import sys, types, warnings
sys.path.insert(0, {ROOT!r} + "/tools"); sys.path.insert(0, {ROOT!r})
import numpy as np
import record_launches as R
fakecp, L = R._install({ROOT!r})
R.numpy_fallback(fakecp)
warnings.filterwarnings("ignore")
type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
fakecp.cuda.Stream = types.SimpleNamespace
import minidnn as mdn
from minidnn.nn import functional as F
seen = []
cell = [c for n, c in zip(F.conv2d.__code__.co_freevars, F.conv2d.__closure__) if n == "fn"][0]
inner = cell.cell_contents
def spy(*a, **k):
    seen.append(np.array(a[1].data, copy=True))
    return inner(*a, **k)
cell.cell_contents = spy
mdn.manual_seed(0)
conv = mdn.nn.Conv2d(4, 6, 3, padding=1, bias=True).to("cuda")
opt = mdn.optim.SGD(conv.parameters(), lr=0.0, momentum=0.0, fused=True)
x = mdn.randn(2, 4, 5, 5).to("cuda")
out = []
def step():
    with mdn.autocast("cuda", dtype=mdn.bfloat16):
        loss = conv(x.to(dtype=mdn.bfloat16)).float().sum()
    opt.zero_grad(); loss.backward(); opt.step()
    ref = np.array(conv.weight.data).astype(seen[-1].dtype)
    out.append(bool((seen[-1] == ref).all()) and seen[-1].strides[1] == ref.strides[1])
for i in range(3):
    step()
conv.to(memory_format=mdn.channels_last)
for i in range(3):
    step()
print("MATCH", out)
"""


def test_kept_copy_follows_a_relayout():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("MATCH")][-1]
    assert line == "MATCH " + str([True] * 6), line
