"""minidnn.nn: Parameter, Module system, containers, layers (layers/, one file per family), init.

Adding a layer: subclass ``Module`` (module.py explains the protocol), export it here.
"""
from . import (
    functional,  # noqa: F401
    init,  # noqa: F401
    parallel,  # noqa: F401,E402  (DistributedDataParallel)
    utils,  # noqa: F401,E402
)
from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential  # noqa: F401
from .layers import *  # noqa: F401,F403  (conv, pooling, normalisation, activation, dropout and loss layers)
from .layers.misc import *  # noqa: F401,F403  (PixelShuffle, Unfold/Fold, Bilinear, ...)
from .module import Module, RemovableHandle  # noqa: F401
from .parameter import Buffer, Parameter  # noqa: F401
