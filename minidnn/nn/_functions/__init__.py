"""The differentiable ops behind ``minidnn.nn.functional``, one module per family.

Each op is an autograd ``Function`` whose forward calls a ``minidnn.backend`` primitive and saves
only what backward needs, and whose backward calls the matching backward primitive (or, for the
convolution family, other differentiable Functions: that is what gives double backward).
``functional.py`` re-exports the lowercase wrappers under PyTorch's names.
"""
