"""nn's remembered batch-norm calls (nn/_functions/norm.py _REMEMBERED) go with the layer: the table keys on the
tensors' ids and holds only their arrays, and an entry is dropped when the first of its tensors is freed -- a model
dropped in a notebook or a sweep takes its entries (and the parameter arrays they hold) with it.  Run on the GPU path
under tools/record_launches.py's fake CuPy, in a subprocess."""
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import gc, sys, weakref
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)        # CuPy functions the fake lacks: NumPy's, on fake arrays
    import warnings
    warnings.filterwarnings("ignore")
    import minidnn as mdn
    from minidnn.nn import functional as F
    from minidnn.nn._functions import norm as N

    def make():
        bn = mdn.nn.BatchNorm2d(16).to("cuda")
        x = mdn.Tensor._from_array(fakecp.zeros((8, 16, 6, 6), dtype="float32"))
        for _ in range(3):
            F.relu(bn(x))
        return bn
    base = len(N._REMEMBERED)
    a, b = make(), make()
    with_two = len(N._REMEMBERED) - base
    wa = weakref.ref(a.weight)
    del a
    gc.collect()
    after_one = len(N._REMEMBERED) - base
    del b
    gc.collect()
    print(with_two, after_one, len(N._REMEMBERED) - base, wa() is None)
""")


def test_remembered_entries_go_with_their_layer():
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    with_two, after_one, after_both, freed = res.stdout.split()[-4:]
    assert (int(with_two), int(after_one), int(after_both), freed) == (2, 1, 0, "True")
