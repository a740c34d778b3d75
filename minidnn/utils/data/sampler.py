"""``torch.utils.data.sampler``'s path: the samplers of ``minidnn.data.sampler``."""
from ...data.sampler import *  # noqa: F401,F403
from ...data.sampler import __all__  # noqa: F401
