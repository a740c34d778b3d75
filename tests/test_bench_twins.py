"""bench/train_step.py (and amp_step.py) time PyTorch twins built by executing minidnn/models.py with torch.nn bound
to the layer names: the comparison is only fair while that source stays plain PyTorch-style code.  Here the twins
must build from the current source, have the same parameter shapes as minidnn's models, and -- given minidnn's
weights -- compute the same outputs (PyTorch CPU as the oracle)."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import train_step  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402


@pytest.mark.parametrize("name", sorted(train_step.CONFIGS))
def test_twin_matches_model(name):
    ctor, shape, _ = train_step.CONFIGS[name]
    ns = train_step.torch_models()
    mdn.manual_seed(0)
    ours = eval(ctor, vars(minidnn.models))
    twin = eval(ctor, ns)
    ours.eval()
    twin.eval()
    sd = ours.state_dict()
    assert sorted(sd) == sorted(twin.state_dict()), (sorted(sd), sorted(twin.state_dict()))
    twin.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in sd.items()})
    x = np.random.default_rng(0).standard_normal((2, *shape)).astype(np.float32)
    with torch.no_grad():
        want = twin(torch.from_numpy(x)).numpy()
    got = ours(mdn.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
