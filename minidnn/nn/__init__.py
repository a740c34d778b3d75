"""minidnn.nn: Parameter, Module system, layers, losses (see the layers issue)."""
from .parameter import Parameter, Buffer  # noqa: F401
