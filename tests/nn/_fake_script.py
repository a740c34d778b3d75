"""Runs a fake-CuPy script (tools/record_launches.py's fake, installed in a fresh interpreter) for the nn tests of GPU
host paths: the script formats ``{root}`` and prints one ``RESULT<json>`` line; returns the decoded result."""
import json
import subprocess
import sys
import textwrap

# The scripts' common opening: the fake installed with null pointers and launches recorded as packed records into
# ``recs`` (CuPy operations the fake runs in NumPy recorded as "cupy"), ``R`` tools/record_launches.py, ``np`` NumPy.
FAKE_PROLOGUE = textwrap.dedent("""
    import json, sys, collections, warnings
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
""")


# After FAKE_PROLOGUE: minidnn with nn's GPU model step under the fake.  ``train_steps(name, ...)`` builds LeNet-5,
# ResNet-20 or MobileNet-small (SGD momentum, cross-entropy; autocast bfloat16 with ``amp``; channels-last with
# ``cl``; ``smem``: bn_nhwc's shared-memory limits faked, e.g. ``H100``) and yields after each step the number of
# records its forward made (``recs`` then holds the whole step's).
MODEL_STEPS = textwrap.dedent("""
    warnings.filterwarnings("ignore")
    sys.path.insert(0, {root!r})
    import types
    import minidnn as mdn
    import minidnn.autograd as AG
    import minidnn.models as MODELS
    from minidnn.backend.cuda import bn_nhwc as M, device_facts as DF
    from minidnn.nn import functional as F
    from minidnn.nn._functions import norm as N
    AG._check_anomaly = lambda *a, **k: None
    # (as tools/fake_gpu_step.py: the engine's copy into a gradient slot, a device copy on a GPU, not recorded)
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    H100 = (233472, 232448)

    def train_steps(name, amp=False, cl=False, batch=16, smem=None, steps=3):
        N._REMEMBERED.clear()
        DF._smem.clear()
        if smem:
            DF._smem[0] = smem
        mdn.manual_seed(0)
        model = {{"resnet20": lambda: MODELS.resnet20(), "mobilenet": lambda: MODELS.MobileNetSmall(),
                  "lenet5": lambda: MODELS.LeNet5(num_classes=10, in_channels=1, input_size=32)}}[name]().to("cuda")
        opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = mdn.randn(batch, 1 if name == "lenet5" else 3, 32, 32).to("cuda")
        labels = mdn.tensor(np.arange(batch) % 10).to("cuda")
        if cl:
            model.to(memory_format=mdn.channels_last)
            x = x.to(memory_format=mdn.channels_last)
        for i in range(steps):
            del recs[:]
            with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x), labels)
            n_fwd = len(recs)
            opt.zero_grad()
            loss.backward()
            opt.step()
            yield n_fwd
""")


# After FAKE_PROLOGUE: ``node(t)``, what a graph node records about tensor ``t`` (its array's layout, and its node's
# class, edges and -- for a Function's node -- needs, input and output metadata, saved versions, fields, bypassed
# nodes), to compare the node a fused or twin path records with the one the plain path records.
NODE_VIEW = textwrap.dedent("""
    def edge(e):
        return None if e is None else [getattr(e[0], "_fn_cls", type(e[0])).__name__, e[1]]

    def node(t):
        n = t.grad_fn
        d = dict(shape=list(t.data.shape), strides=list(t.data.strides), dtype=str(t.data.dtype),
                 rg=t.requires_grad, version=t._version)
        if n is None:
            return d
        cls = getattr(n, "_fn_cls", type(n))
        d.update(cls=cls.__name__, edges=[edge(e) for e in n.next_edges])
        if cls is not type(n):
            d.update(needs=list(n.needs_input_grad), meta=repr(n._input_meta), out=repr(n._out_meta),
                     versions=list(n.versions), fields=sorted(k for k in n.__dict__ if k not in ("seen", "sh")),
                     bypassed=[getattr(b, "_fn_cls", type(b)).__name__ for b in getattr(n, "bypassed", ())])
        return d
""")


def run_fake_script(script: str, root) -> dict:
    r = subprocess.run([sys.executable, "-c", script.format(root=str(root))], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])
