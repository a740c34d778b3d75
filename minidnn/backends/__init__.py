"""``minidnn.backends.cudnn``: process-wide convolution settings, spelled as ``torch.backends.cudnn``.

    minidnn.backends.cudnn.benchmark = True     # find the fastest algorithm once per shape, cache it
    minidnn.backends.cudnn.deterministic = True
    minidnn.backends.cudnn.allow_tf32 = True    # tensor cores (TF32) for float32 on the GPU
"""
from ..backend.handle import cudnn  # noqa: F401  (the flags live with the backend handle)

__all__ = ["cudnn"]
