"""minidnn.optim: optimizers with a fused flat-buffer step, and learning-rate schedulers (PyTorch's API)."""
from . import lr_scheduler  # noqa: F401
from .adadelta import Adadelta  # noqa: F401
from .adagrad import Adagrad  # noqa: F401
from .adam import Adam, AdamW  # noqa: F401
from .optimizer import Optimizer  # noqa: F401
from .rmsprop import RMSprop  # noqa: F401
from .sgd import SGD  # noqa: F401

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop", "lr_scheduler"]
