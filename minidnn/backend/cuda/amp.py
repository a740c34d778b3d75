"""Loss-scale update for mixed precision in one launch (the GPU form of backend/amp.py's ``update_scale_``).

Shape legend: scale (1,) float32, growth_tracker (1,) int32, found_inf (k,) float32 (one entry per optimizer).
Tiling: one block of 32 threads; the warp sums found_inf (k is the number of optimizers, a handful), lane 0 applies
PyTorch's rule (back off on overflow; after growth_interval clean steps grow, if the grown scale is finite) and
every lane zeroes its found_inf entries for the next iteration.  Nothing is read back to the host: capturable.
"""
from __future__ import annotations

import numpy as np

from . import launch as _launch

__all__ = ["update_scale_", "SOURCE"]

SOURCE = r"""
extern "C" __global__ void amp_update_scale(float* scale, int* growth_tracker, float* found_inf, const int k,
                                            const double growth_factor, const double backoff_factor,
                                            const int growth_interval)
{
    float any = 0.0f;
    for (int i = threadIdx.x; i < k; i += 32) any += found_inf[i];
    for (int off = 16; off > 0; off >>= 1) any += __shfl_xor_sync(0xffffffffu, any, off);
    if (threadIdx.x == 0) {
        if (any != 0.0f) {
            *scale = (float)((double)(*scale) * backoff_factor);
            *growth_tracker = 0;
        } else {
            const int successful = *growth_tracker + 1;
            if (successful == growth_interval) {
                const float grown = (float)((double)(*scale) * growth_factor);
                if (isfinite(grown)) *scale = grown;
                *growth_tracker = 0;
            } else {
                *growth_tracker = successful;
            }
        }
    }
    __syncwarp();
    for (int i = threadIdx.x; i < k; i += 32) found_inf[i] = 0.0f;
}
"""


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    kernel = _launch.get_kernel(SOURCE, "amp_update_scale", ("-std=c++14",))
    with _launch.on_device(scale.data.device_id):
        _launch.launch(kernel, (1,), (32,), (scale, growth_tracker, found_inf, np.int32(found_inf.size),
                                             np.float64(growth_factor), np.float64(backoff_factor),
                                             np.int32(growth_interval)))
