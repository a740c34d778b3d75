"""minidnn.backend: cuDNN-like primitives on raw NumPy / CuPy arrays.

Usable on its own: ``convolution_forward(handle, x, w, conv_desc)`` works on plain arrays with no
Tensor involved.  cuDNN's names (snake_case, no prefix), its x/y/w/b/dx/dy/dw/db naming, handle
first, alpha/beta blending.  See docs/backend.md.
"""
from .activation import *  # noqa: F401,F403
from .autotune import *  # noqa: F401,F403
from .conv_fused import *  # noqa: F401,F403
from .convolution import *  # noqa: F401,F403
from .devices import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403
from .handle import *  # noqa: F401,F403
from .layout import *  # noqa: F401,F403
from .lrn import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .pooling import *  # noqa: F401,F403
from .softmax import *  # noqa: F401,F403
from .tensor_ops import *  # noqa: F401,F403
from .versioning import *  # noqa: F401,F403
