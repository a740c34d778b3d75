"""On a GPU: host round 31's cuts (docs/host_overhead.md) give the full path's bits -- the optimizer keeping its
parameters' accumulators (optim.optimizer.HOLD_ACCUMULATORS), the settled backwards' unchecked results
(nn._functions._util.EXACT_GRADS), the convolution's lean key and node (nn._functions.conv.LEAN_CONV), a slot's
gradient kept as .grad (autograd.SLOT_GRAD_AS_IS) and handles by GPU number (backend.handle.BY_GPU).  ResNet-20 and
MobileNet-small, fp32 NCHW and bf16 autocast channels-last, three SGD steps from one start: every parameter and loss
bit-identical and the same launches a step, all on and all off.  The CPU and fake-CuPy checks of each:
test_host31_lean.py."""
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

from minidnn import autograd as AG  # noqa: E402
from minidnn.backend import handle as H  # noqa: E402
from minidnn.nn._functions import _util as U  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402
from minidnn.optim import optimizer as O  # noqa: E402
from tests.nn.test_host30_registered_cuda import assert_same, steps_on_and_off  # noqa: E402

SWITCHES = (O.HOLD_ACCUMULATORS, U.EXACT_GRADS, C.LEAN_CONV, AG.SLOT_GRAD_AS_IS, H.BY_GPU)


@pytest.mark.parametrize("amp_cl", [False, True], ids=["fp32", "bf16_cl"])
@pytest.mark.parametrize("model", ["resnet20", "mobilenet"])
def test_model_steps_bit_identical_on_and_off(model, amp_cl):
    assert_same(*steps_on_and_off(model, amp_cl, SWITCHES))
