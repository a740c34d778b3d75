"""The layers with a backend behind them: convolution, pooling, normalisation, activations, dropout, losses.
Everything here is re-exported by ``minidnn.nn``."""
from .activation import *      # noqa: F401,F403
from .conv import *            # noqa: F401,F403
from .dropout import *         # noqa: F401,F403
from .loss import *            # noqa: F401,F403
from .normalization import *   # noqa: F401,F403
from .pooling import *         # noqa: F401,F403
from .padding import *         # noqa: F401,F403
from .upsampling import *      # noqa: F401,F403
from .attention import *       # noqa: F401,F403
from .rnn import *             # noqa: F401,F403
from . import activation, attention, conv, dropout, loss, normalization, padding, pooling, rnn, upsampling

__all__ = (activation.__all__ + conv.__all__ + dropout.__all__ + loss.__all__ + normalization.__all__
           + pooling.__all__ + padding.__all__ + upsampling.__all__ + attention.__all__
           + rnn.__all__)
