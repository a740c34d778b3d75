"""Issue 9's convolution benchmark: minidnn's CUDA convolution kernels beside cuDNN, per layer and direction, strict
fp32 and TF32, with TFLOP/s and % of peak.  The implementation is bench/conv_kernels.py (its docstring explains the
columns); this name runs it with the same arguments.

    python bench/conv_gpu.py [--reps 20] [--match depthwise]
"""
import os
import runpy
import sys

if __name__ == "__main__":
    sys.argv[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_kernels.py")
    runpy.run_path(sys.argv[0], run_name="__main__")
