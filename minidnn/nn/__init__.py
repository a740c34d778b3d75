"""minidnn.nn: Parameter, Module system, containers, layers (layers/, one file per family), init.

Adding a layer: subclass ``Module`` (module.py explains the protocol), export it here.
"""
from .parameter import Parameter, Buffer  # noqa: F401
from . import init  # noqa: F401
from .module import Module, RemovableHandle  # noqa: F401
from .containers import Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict  # noqa: F401
from . import functional  # noqa: F401
from .layers import *  # noqa: F401,F403  (conv, pooling, normalisation, activation, dropout and loss layers)
from . import utils  # noqa: F401,E402
from . import parallel  # noqa: F401,E402  (DistributedDataParallel)
