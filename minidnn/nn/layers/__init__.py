"""The layers, one file per family (the families of nn/_functions and backend/ where one is behind them):
linear, flatten, sparse (Embedding), convolution, pooling, normalisation, activations, dropout, losses, padding,
upsampling, attention, recurrent.  Everything here is re-exported by ``minidnn.nn``."""
from . import (
           activation,
           attention,
           conv,
           dropout,
           flatten,
           linear,
           loss,
           normalization,
           padding,
           pooling,
           rnn,
           sparse,
           sync_batchnorm,
           upsampling,
)
from .activation import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .flatten import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .padding import *  # noqa: F401,F403
from .pooling import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403
from .sync_batchnorm import *  # noqa: F401,F403
from .upsampling import *  # noqa: F401,F403

__all__ = (activation.__all__ + conv.__all__ + dropout.__all__ + loss.__all__ + normalization.__all__
           + pooling.__all__ + padding.__all__ + upsampling.__all__ + attention.__all__
           + rnn.__all__ + linear.__all__ + flatten.__all__ + sparse.__all__ + sync_batchnorm.__all__)
