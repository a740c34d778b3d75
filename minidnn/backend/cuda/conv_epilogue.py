"""The fused GPU path of convolution_bias_activation_forward and scale_bias_activation_convolution_forward: the
implicit-GEMM forward kernel with its EPI=1 epilogue (conv_igemm_source.py), y = act(alpha1 * conv(x', w) + alpha2 *
z + bias) in one launch and one pass over y, where x' = x or (PRO=1, the batch-norm-apply prologue) pact(x * scale[c]
+ shift[c]) applied as x is loaded; optionally (STATS=1) the per-channel sum and sum of squares of y from the same
launch.

# x: (N, C, H, W)  w: (K, C/G, R, S)  z, y: (N, K, P, Q) channels-first views (NCHW or NHWC memory)  bias: (K,)
# scale, shift: (C,) float32   stats: ((K,), (K,)) float32

The rule (``supports``) and the run (``forward``); conv_fused.py asks, and runs the composition of primitives (the
reference) wherever this declines.  Pure Python up to the launch: the rule needs no GPU.
"""
from __future__ import annotations

import os

from . import conv_igemm as K

__all__ = ["ENABLED", "early_reason", "supports", "forward", "FUSED_ALGOS", "PRO_MODES"]

ENABLED = [os.environ.get("MINIDNN_CONV_EPILOGUE", "1") != "0"]    # MINIDNN_CONV_EPILOGUE=0: the composition
FUSED_ALGOS = {"IMPLICIT_GEMM": False, "IMPLICIT_PRECOMP_GEMM": True}   # algorithm -> the kernel reads a tap table


PRO_MODES = K.PRO_ACTS       # the prologue's activations (mode name -> the kernel's PACT code)


def early_reason(mode_name, pro_mode_name=None) -> str | None:
    """The rules known before the algorithm is chosen: the switch, the activation (``mode_name``) and the
    prologue's (``pro_mode_name``; None: no prologue)."""
    if not ENABLED[0]:
        return "switched off (conv_epilogue.ENABLED / MINIDNN_CONV_EPILOGUE=0)"
    if mode_name not in K.EPI_ACTS:
        return f"activation {mode_name}: the epilogue computes {', '.join(K.EPI_ACTS)}"
    if pro_mode_name is not None and pro_mode_name not in PRO_MODES:
        return f"prologue activation {pro_mode_name}: the prologue computes {', '.join(PRO_MODES)}"
    return None


def supports(algorithm_name, p, mode_name, pro_mode_name=None) -> str | None:
    """None if the fused kernel runs this call, else the rule it breaks: ``algorithm_name`` is the forward algorithm
    the plain convolution would run (its name), ``p`` the problem, ``mode_name`` the activation mode's name,
    ``pro_mode_name`` the prologue's (None: no prologue)."""
    why = early_reason(mode_name, pro_mode_name)
    if why is not None:
        return why
    if algorithm_name not in FUSED_ALGOS:
        return (f"the forward algorithm is {algorithm_name}: only the implicit-GEMM kernels (IMPLICIT_GEMM, "
                "IMPLICIT_PRECOMP_GEMM) have the fused epilogue")
    return K.igemm_supports(p)


def forward(p, x, w, algorithm_name, tf32, alpha1, z, alpha2, bias, mode_name, coef, y, z_is_y=False,
            prologue=None, stats=None):
    """y (channels-first view, written) = act(alpha1 * conv(x', w) + alpha2 * z + bias): one launch (plus the NCHW
    staging / filter copies a plain forward of the same arrays makes).  ``z`` None or a channels-first array not
    overlapping y; ``z_is_y``: the residual is y itself (read by the kernel's beta path); ``bias`` None or a
    contiguous (K,) array.  ``prologue``: None (x' = x) or (scale, shift, mode name): x' = act_p(x * scale +
    shift), scale/shift contiguous float32 (C,).  ``stats``: None or (sum, sumsq), contiguous float32 (K,) arrays
    the launch writes (the statistics of y as stored)."""
    pro, scale, shift = (0, None, None) if prologue is None else (PRO_MODES[prologue[2]], prologue[0], prologue[1])
    epi = K.Epilogue(K.EPI_ACTS[mode_name], 0.0 if coef is None else coef, alpha2, z, bias, pro, scale, shift,
                     stats)
    beta = alpha2 if z_is_y else 0.0
    return K.implicit_forward_epilogue(p, x, w, epi, tf32, FUSED_ALGOS[algorithm_name], alpha1, beta, out=y)
