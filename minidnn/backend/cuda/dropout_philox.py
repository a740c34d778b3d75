"""Dropout with a counter-based generator whose state lives on the device (capturable in a CUDA graph).

Shape legend: x, y, dy, dx (n,) any shape walked as flat C-order memory (float32/float64, or float16/bfloat16
stored in 16 bits and computed in float); keep (n,) bool (1 byte: 1 = kept, PyTorch's mask too);
state (2,) uint64 = [key, counter]; ticket (1,) uint32; rec (2,) uint64 = [key, counter] of one call (MASK = 0).

The random stream (unchanged since the first kernel): element i of a call is decided by Philox4x32-10 block
``counter = state[1] + i // 4`` (key = state[0], the 64-bit counter in words 0-1, words 2-3 zero), word i % 4 = r:
kept  <=>  (r >> 8) * 2^-24 >= p (p as float32)  <=>  (r >> 8) >= THRESH = ceil(float32(p) * 2^24).
A call advances state[1] by ceil(n / 4): one Philox block per 4 elements, all four words used.

The 16-bit stream (session 14, DRAW16, on by default after H200 run 5; MINIDNN_DROPOUT_DRAW16=0 restores 24 bits): a
forward of float16 / bfloat16 data decides element i from half-word i % 8 = h of block counter + i // 8 (half-word 2w
the low 16 bits of word w, 2w + 1 the high), kept <=> h * 2^-16 >= float32(p) <=> h >= ceil(float32(p) * 2^16)
(threshold16). Why: the 24-bit stream costs a 16-byte vector of 8 half-precision elements two Philox calls, twice
float32's per byte, and the 16-bit forward was Philox-bound (59% of copy on the H200 against float32's 82%); 16-bit
draws make it one call a vector, float32's ratio (the PTX: 20 -> 10 multiplies by 0xD2511F53 a group). Resolution: the
drop probability drawn is p rounded up to a multiple of 2^-16 (at most 1.53e-5 more). The stream is used only where that
keeps p's statistics (draw16_holds): the drop probability p and the keep probability 1 - p each move by at most
DRAW16_RTOL = 2^-10 of themselves (so does E[y] / x = (1 - p16) / (1 - p)); that is every p in [2^-6, 1 - 2^-6] =
[0.0156, 0.9844], the exact ones (0, 1, multiples of 2^-16) and some near them: p = 0.5 exact, 0.1 -> 0.1000061 (16
bits); 1e-3 (16 bits would give 0.00100708, +0.7%), 1e-5 (1.53e-5, +53%) and 0.999 keep the 24-bit stream, as float32 /
float64 data always do (their 16-byte vectors already cost one call). A call still advances state[1] by ceil(n / 4) (the
blocks past ceil(n / 8) are skipped), so every later call's numbers are those of the 24-bit stream's counters and
switching DRAW16 changes only the 16-bit calls' own masks. A PhiloxReserve records which stream drew it (``draw16``) and
its regenerating backward draws that stream again for any dtype of dy (V = 4: block h / 2, half of its words); the byte
and bit masks hold the decisions themselves, so all three reserves give the same y and dx.

Tiling (dropout_fwd): a grid-stride loop over groups of V elements (V = 4 for 4- and 8-byte data, 8 for 16-bit
data): per group a thread makes V / 4 Philox4x32-10 calls, loads x with 16-byte vectors, writes y with 16-byte
vectors and the V mask bytes with one 4- or 8-byte store (a warp writes 128 or 256 contiguous mask bytes).  UNROLL
groups per iteration, all loads first (the Philox math of one group overlaps the loads of the others).  By default
the grid fits the work exactly (the loop runs once; UNROLL_FWD below: 64 bytes of x a thread); BPS_FWD caps it into
a persistent grid.  dropout_fwd_pipe (session 9, 16-bit data by default: PIPE_FWD, MINIDNN_DROPOUT_PIPE): the
same walk and numbers on a persistent grid of the resident blocks, the next iteration's loads issued before the
current one's Philox math and stores.  The last block to finish (threadFenceReduction ticket, as in
multi_tensor.py) advances state[1], so the next launch -- eager or replayed from a graph -- draws fresh numbers
without any host involvement.
dropout_bwd_tile (the backward): thread t owns elements [t*TILE, t*TILE + TILE) (TILE = 16: one 16-byte load of
16 mask bytes, a warp's 512 contiguous; 16 elements of dy in 16-byte vectors, 4 of them for float32, 2 for 16-bit
data), dx = dy * (keep ? scale : 0) stored the same way; an exact grid, no loop, streaming (evict-first) loads and
stores by default: every byte is touched once.  dropout_bwd: the forward's walk without the generator (kept for the
A/B, TILE_BWD = 0).
Unaligned inputs (a view whose pointer is not 16-byte aligned, a mask not aligned to its vector) and the last
partial group or tile take per-element loads and stores (``vec`` = 0: inputs not aligned).  Products are
x * (keep ? scale : 0), as the reference (so a NaN or inf dropped gives NaN, as in PyTorch), with scale =
1 / (1 - p) rounded to A.
Traffic: forward reads x, writes y and keep (2 x itemsize + 1 bytes per element); backward reads dy and keep,
writes dx: the floor of each.

Fewer bytes than a stored mask (session 13).  RESERVE (MINIDNN_DROPOUT_MASK) picks what the forward keeps; the
default is "bits" (below), chosen on the H200 (session 13 run 3, tools/dropout_ab.py, (128, 64, 56, 56), ms against
PyTorch's byte mask: float32 forward 0.0599 vs 0.0735, backward 0.0514 vs 0.0558; bfloat16 0.0419 vs 0.0454 and
0.0271 vs 0.0315; the byte mask here 0.0647 / 0.0572 / 0.0431 / 0.0332).  "record" stores no mask: the keep
decision of element i is a pure function of (key, counter, i, THRESH), so the forward (the same dropout_fwd /
dropout_fwd_pipe walk compiled with -DMASK=0) writes no mask but a record rec (2,) uint64 = [key, counter] of the
numbers it drew (thread 0 of block 0, from the state every block read: on the device, so a graph replay refreshes
it), returned as a PhiloxReserve; the backward (dropout_bwd_regen / _pipe: the forward's walk and grid over dy,
without the state's advance) reads rec and draws the same Philox blocks again, dx = dy * (keep ? scale : 0) --
bitwise the mask path's y and dx.  Traffic: x + y and dy + dx, 2 x itemsize bytes an element each way (8 for
float32, 4 for 16-bit data: 11% and 20% less than with the mask); the backward's Philox work is the forward's,
which ran at 71% (16-bit data: Philox-bound) to 86% (float32) of copy on an H200 (session 11).  A 1-bit mask
(RESERVE "bits", MINIDNN_DROPOUT_MASK=bits: -DMASK=2, a BitMaskReserve) is the other way to fewer bytes: the
forward's walk ORs each warp's keep bits together with shuffles (pack_bits: element i is bit i % 32 of word i / 32)
and stores n / 8 bytes, dropout_bwd_bits reads them back with dy -- 2 x itemsize + 1/8 bytes an element each way
and no Philox work in the backward (the regeneration's cost where the Philox math does not hide).  ``reserve_mask``
materialises either reserve's mask (tests, inspection).

Host path: a call's launch is settled once per signature (shape, dtype, contiguity, p, scale, device) as a runner
(the allocations, an alignment test, a prepared launch); backend/dropout.py remembers validated calls in ``seen``.

MINIDNN_DROPOUT_V1=1 restores the first kernel (per-element loads and stores, float32/float64 only; 16-bit data
and backward through CuPy), for an A/B on the GPU.  MINIDNN_DROPOUT_UNROLL / _BPS / _HINT ("fwd,bwd" pairs) and
MINIDNN_DROPOUT_TILE set the launch choices below (tools/dropout_bench.py sweeps them); MINIDNN_DROPOUT_TILE=0
MINIDNN_DROPOUT_UNROLL=1,2 MINIDNN_DROPOUT_BPS=8,8 MINIDNN_DROPOUT_HINT=0,0 is the launch before this round.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import devices as _dev
from .._common import SeenCalls
from . import launch as _launch
from .device_facts import beyond_l2
from .storage import STORAGE_HEADER, type_info

__all__ = ["supports", "supports_backward", "dropout_forward", "dropout_backward", "threshold", "SOURCE",
           "PhiloxReserve", "BitMaskReserve", "reserve_mask", "reserve_bytes"]

V1 = os.environ.get("MINIDNN_DROPOUT_V1", "0") == "1"
# Session 13: RESERVE, what the GPU forward keeps for the backward (MINIDNN_DROPOUT_MASK: "bits" (default),
# "0" / "record", "1" / "mask") --
#   "record": no mask; a PhiloxReserve (the 16-byte record of the numbers it drew) that the backward
#            draws again from (MASK = 0 kernels);
#   "mask":  the 1-byte keep mask, as before (MASK = 1);
#   "bits" (the default):  a 1-bit keep mask, a BitMaskReserve (MASK = 2): n / 8 bytes each way, no Philox work in
#            the backward.  H200 run 3: record's backward lost to the byte mask in bfloat16 (0.0365 vs 0.0332 ms,
#            the Philox math does not hide under 2-byte traffic) and on small calls (128 x 256: 3.0 vs 1.3 us); bits
#            won every backward and was within 5-10% of record's forward.
# Read per call (the plan and seen keys hold it), so setting it in one process takes effect at the next forward; a
# reserve made under any setting stays valid for the backward.
RESERVES = ("record", "mask", "bits")
RESERVE = {"1": "mask", "mask": "mask", "0": "record", "record": "record"}.get(
    os.environ.get("MINIDNN_DROPOUT_MASK", "bits"), "bits")
_MASK_DEFINE = {"record": 0, "mask": 1, "bits": 2}
THREADS = 256


def _pair(name, default):
    return tuple(int(v) for v in os.environ.get(name, default).split(","))


# The launch choices, read once (tools/dropout_bench.py sets them and calls clear_plans() to sweep):
#   UNROLL_FWD   groups in flight per thread and iteration; 0 = the rule: 64 bytes of x per thread (4 groups of 16
#                bytes for 2- and 4-byte data, 2 of 32 for float64), halved while the grid would not fill one wave
#                of resident blocks (2048 threads an SM), so a small call still spreads over every SM;
#   BPS_*        blocks per SM at most (a persistent grid-stride loop); 0 = no cap: the grid fits the work exactly
#                (H100 sweep, (128,64,56,56): every capped forward and backward was 3-10% slower than uncapped);
#   HINT_*       cache hints of the vector loads and stores (0 none, 1 streaming loads and stores, 2 streaming
#                stores);
#   TILE_BWD     the backward's elements per thread in dropout_bwd_tile (16: one 16-byte mask load; 8, 4), halved
#                as UNROLL_FWD is while under one wave (never below one 16-byte vector of dy); 0 = the grid-stride
#                dropout_bwd with UNROLL_BWD / BPS_BWD (the previous backward: MINIDNN_DROPOUT_TILE=0
#                MINIDNN_DROPOUT_UNROLL=1,2 MINIDNN_DROPOUT_BPS=8,8 MINIDNN_DROPOUT_HINT=0,0 is the previous launch
#                of both kernels, for a GPU A/B).
UNROLL_FWD, UNROLL_BWD = _pair("MINIDNN_DROPOUT_UNROLL", "0,1")
BPS_FWD, BPS_BWD = _pair("MINIDNN_DROPOUT_BPS", "0,0")
HINT_FWD, HINT_BWD = _pair("MINIDNN_DROPOUT_HINT", "1,1")
# Defaults from session 6's H100 sweep (run 10, docs/measurements/session6_2026-11-26.txt): streaming hints both ways
# (forward (128,64,56,56) 1.09x PyTorch fp32, 1.06x bf16), and a backward tile of one 16-byte vector of dy a thread
# (TILE 4 is raised to that floor: 4 fp32, 8 16-bit; 1.01x PyTorch fp32 and bf16, where 16 a thread ran 0.78x/0.93x).
TILE_BWD = int(os.environ.get("MINIDNN_DROPOUT_TILE", "4"))
# Session 9: the forward of 16-bit data through dropout_fwd_pipe (persistent grid, next loads in flight during the
# Philox math; H200 session 8 run 13: bfloat16 (128, 64, 56, 56) 68% of copy, float32 85%).  PIPE_FWD: "16" (the
# default) 2-byte data only, "1" every dtype, "0" none (dropout_fwd as before); PIPE_UNROLL groups a thread and
# iteration (4: 64 bytes of 16-bit x in flight a thread), PIPE_MINB blocks an SM (the grid and the launch bounds:
# 4 x 256 threads x 64 bytes = 64 KB of loads in flight an SM).  Read at planning time; clear_plans() after a change.
# Session 13: the cache hints above only where the call's two arrays (x and y, dy and dx) exceed the device's L2.
# H200 run 7 (bench/kernels_gpu.py --only dropout, graph replays): (128, 16, 32, 32) float32 forward 0.0080 ms with
# the streaming hints against 0.0072 without, backward 0.0045 against 0.0035 (PyTorch 0.0059 / 0.0037): an array
# that fits L2 is read again soon (the next kernel, the next step) and evict-first throws it out; the large tensor
# keeps them (forward 0.0607 with, 0.0658 without).  HINT_BY_SIZE = False (MINIDNN_DROPOUT_HINT_BY_SIZE=0): the
# hints at every size, as before.
HINT_BY_SIZE = os.environ.get("MINIDNN_DROPOUT_HINT_BY_SIZE", "1") != "0"
PIPE_FWD = os.environ.get("MINIDNN_DROPOUT_PIPE", "16")
PIPE_UNROLL = int(os.environ.get("MINIDNN_DROPOUT_PIPE_UNROLL", "4"))
PIPE_MINB = int(os.environ.get("MINIDNN_DROPOUT_PIPE_MINB", "4"))
# Session 13: under "16" a call of fewer than PIPE_MIN_N elements takes dropout_fwd (the exact grid spread over the
# SMs): the pipe's grid gives each thread PIPE_UNROLL groups, so (128, 256) bfloat16 ran on 4 blocks at 4.0 us
# against PyTorch's 2.4 (H200 run 3) while float32's dropout_fwd took 2.2.  "1" pipes every size (the tests).
PIPE_MIN_N = int(os.environ.get("MINIDNN_DROPOUT_PIPE_MIN_N", str(1 << 20)))
# Session 14: DRAW16 (MINIDNN_DROPOUT_DRAW16=0/1, on by default after H200 run 5: bfloat16 (128, 64, 56, 56) forward
# 0.0427 -> 0.0331 ms, 60% -> 77% of copy, PyTorch 0.0455; float16 alike; backward unchanged) -- the forward of float16
# / bfloat16 data draws the 16-bit stream (the module docstring): one Philox block per 8 elements, as float32's one per
# 4 16-byte vector, where 16-bit thresholds hold p (``draw16_holds``: the drop and keep probabilities each within
# DRAW16_RTOL, relative, of float32(p)'s; MINIDNN_DROPOUT_DRAW16_RTOL).  float32 / float64 keep the 24-bit stream (their
# vectors already cost one Philox block).  Read per call (the plan key holds it, and a runner remembered under the other
# setting hands the call on), so setting it in one process reaches the next forward; a PhiloxReserve says which stream
# it drew (``draw16``) and its backward draws that one again.
_DRAW16_DEFAULT = "1"
_DRAW16_ENV = os.environ.get("MINIDNN_DROPOUT_DRAW16", _DRAW16_DEFAULT)
DRAW16 = _DRAW16_ENV == "1"
DRAW16_RTOL = float(os.environ.get("MINIDNN_DROPOUT_DRAW16_RTOL", str(2.0 ** -10)))
if _DRAW16_ENV not in ("0", "1") or not 0.0 <= DRAW16_RTOL < 1.0:
    raise ValueError(f"MINIDNN_DROPOUT_DRAW16={_DRAW16_ENV!r} must be 0 or 1 and MINIDNN_DROPOUT_DRAW16_RTOL="
                     f"{DRAW16_RTOL} in [0, 1)")
# Session 14: UNROLL_FIT (MINIDNN_DROPOUT_UNROLL_FIT=0/1, on after H200 run 5: (128, 16, 32, 32) float32 forward
# 0.0071 -> 0.0066 ms, PyTorch 0.0060; the large call unchanged) -- the rule above halves
# UNROLL while the grid is under one wave, so a call whose grid at UNROLL u is between half a wave and one (the
# small-CNN row (128, 16, 32, 32) float32: 2 M elements, 1024 blocks of 2 groups on the H200's 1056-block wave) is
# halved into ~1.94 waves (2048 blocks of one group): the second wave starts behind the first one's tail (each block
# ends in a fence and the ticket's atomic) and every thread has one 16-byte load in flight.  PyTorch's kernel for the
# same call is one wave (1056 blocks looping ~2 times).  UNROLL_FIT halves only while the halved grid still fits one
# wave: that call runs 1024 blocks of 2 groups (both loads in flight, half the tickets); a call under half a wave
# spreads as before; calls of a wave or more are unchanged.  Read at planning time (clear_plans() after a change).
UNROLL_FIT = os.environ.get("MINIDNN_DROPOUT_UNROLL_FIT", "1") == "1"
if TILE_BWD not in (0, 4, 8, 16) or not {HINT_FWD, HINT_BWD} <= {0, 1, 2}:
    raise ValueError(f"MINIDNN_DROPOUT_TILE={TILE_BWD} must be 0, 4, 8 or 16 and MINIDNN_DROPOUT_HINT="
                     f"{HINT_FWD},{HINT_BWD} values 0, 1 or 2")

SOURCE = STORAGE_HEADER + r"""
#if STORAGE != 0
#define V 8                                 // elements per group: 16 bytes of 16-bit data
typedef uint2 MaskVec;
#else
#define V 4                                 // 16 bytes of float, 32 of double
typedef unsigned int MaskVec;
#endif
#ifndef HINT
#define HINT 0
#endif
#ifndef TILE
#define TILE 16
#endif
#ifndef MASK
#define MASK 1                              // 1: the reserve is the keep mask; 0: a 2-word record; 2: a bit mask
#endif
#ifndef DRAW16
#define DRAW16 0                            // 1: the 16-bit stream (one Philox block per 8 elements; DRAW16 above)
#endif
// cache hints of the vector loads and stores: 0 none, 1 streaming (evict-first, ld/st.global.cs) loads and
// stores, 2 plain loads and streaming stores
#if HINT == 1
#define LDS(p) __ldcs(p)
#else
#define LDS(p) (*(p))
#endif
#if HINT != 0
#define STS(p, v) __stcs((p), (v))
#else
#define STS(p, v) (*(p) = (v))
#endif
#define PH (V / 4)                          // Philox calls per group
#define NLD (V * (int)sizeof(T) / 16)       // 16-byte vectors per group
union Pack { uint4 raw[NLD]; T v[V]; };
#if WIDE
typedef long long I;                        // group and element indices: 64-bit only where n >= 2^31
#else
typedef unsigned int I;                     // n < 2^31: every element index h * V + j fits
#endif
union Mask { MaskVec raw; unsigned char b[V]; };

// Philox4x32-10 of the counter (ctr, 0) under key (k0, k1): each round two 32x32 -> 64-bit products.
__device__ __forceinline__ uint4 philox(unsigned long long ctr, unsigned int k0, unsigned int k1)
{
    unsigned int c0 = (unsigned int)ctr, c1 = (unsigned int)(ctr >> 32), c2 = 0u, c3 = 0u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
        const unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0, n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
        c1 = (unsigned int)p1; c3 = (unsigned int)p0; c0 = n0; c2 = n2;
    }
    return make_uint4(c0, c1, c2, c3);
}

// x[h*V .. h*V+V) of group h: one or two 16-byte loads when vec and the group is whole, else element by element.
__device__ __forceinline__ Pack load_group(const T* __restrict__ x, I h, I full, long long n, int vec)
{
    Pack a;
    if (vec && h < full) {
        const uint4* p = reinterpret_cast<const uint4*>(x + h * V);
#pragma unroll
        for (int j = 0; j < NLD; ++j) a.raw[j] = LDS(p + j);
    } else {
#pragma unroll
        for (int j = 0; j < NLD; ++j) a.raw[j] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int j = 0; j < V; ++j) if (h * V + j < n) a.v[j] = x[h * V + j];
    }
    return a;
}

__device__ __forceinline__ void store_group(T* __restrict__ y, const Pack& a, I h, I full, long long n)
{
    if (h < full) {                         // the outputs are fresh allocations: always aligned
        uint4* p = reinterpret_cast<uint4*>(y + h * V);
#pragma unroll
        for (int j = 0; j < NLD; ++j) STS(p + j, a.raw[j]);
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) if (h * V + j < n) y[h * V + j] = a.v[j];
    }
}

// Group h of a forward walk: its PH Philox blocks decide the V elements (kept <=> (r >> 8) >= thresh; DRAW16: one
// block's half-words, kept <=> h >= thresh), y = x * (kept ? scale : 0) and the V mask bytes stored (dropout_fwd and
// dropout_fwd_pipe: the same counters and products).
// MODE 0: the V keep bytes stored (MASK = 1); 1: none (MASK = 0: the record forward, the regenerating backward);
// 2: none stored here (MASK = 2: pack_bits stores them).  Returns the group's V keep bits (bit j: element h*V + j).
template <int MODE>
__device__ __forceinline__ unsigned int draw_group(const Pack& in, T* __restrict__ y, unsigned char* __restrict__ keep,
                                                   I h, I full, long long n, unsigned long long base, unsigned int k0,
                                                   unsigned int k1, unsigned int thresh, A scale)
{
    Pack out;
    Mask m;
    unsigned int kb = 0u;
#if DRAW16
    // the 16-bit stream: element e = h*V + j takes half-word e % 8 of Philox block base + e / 8 (half-word 2w + 1 the
    // high 16 bits of word w), kept <=> half-word >= thresh = ceil(p * 2^16).  V = 8: one block, all eight halves;
    // V = 4 (a float32 / float64 dy regenerating a 16-bit forward's record): block h / 2, words 2 (h & 1) and + 1.
    const uint4 r4 = philox(base + (unsigned long long)(V == 8 ? h : h >> 1), k0, k1);
    const bool odd = V == 4 && (h & 1);
    const unsigned int r[4] = {odd ? r4.z : r4.x, odd ? r4.w : r4.y, r4.z, r4.w};
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const bool kept = ((j & 1) ? r[j >> 1] >> 16 : r[j >> 1] & 0xFFFFu) >= thresh;
        m.b[j] = kept ? 1 : 0;
        kb |= (kept ? 1u : 0u) << j;
        out.v[j] = ST(LD(in.v[j]) * (kept ? scale : (A)0));
    }
#else
#pragma unroll
    for (int q = 0; q < PH; ++q) {
        const uint4 r4 = philox(base + (unsigned long long)(h * PH + q), k0, k1);
        const unsigned int r[4] = {r4.x, r4.y, r4.z, r4.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const bool kept = (r[j] >> 8) >= thresh;
            m.b[4 * q + j] = kept ? 1 : 0;
            kb |= (kept ? 1u : 0u) << (4 * q + j);
            out.v[4 * q + j] = ST(LD(in.v[4 * q + j]) * (kept ? scale : (A)0));
        }
    }
#endif
    store_group(y, out, h, full, n);
    if (MODE == 2 && h >= full) {       // the tail group: no bit for an element past n (the word is the reserve)
        const long long r = n - (long long)h * V;
        kb &= r > 0 ? (1u << (unsigned int)r) - 1u : 0u;
    }
    if (MODE != 0) return kb;
    if (h < full) {
        STS(reinterpret_cast<MaskVec*>(keep) + h, m.raw);
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) if (h * V + j < n) keep[h * V + j] = m.b[j];
    }
    return kb;
}

// MODE 2 (MASK = 2, a 1-bit mask: element e is bit e % 32 of word e / 32): the V keep bits of each lane's group h
// into their word.  A warp's lanes hold 32 consecutive groups (h = thread index + u * stride, stride a multiple of
// 32), so 32 / V lanes fill one word: OR-shuffled together, stored by the first of them (a warp stores V
// contiguous words).  The walks bring every lane of a warp with a live group here (warp-uniform loop and test),
// lanes past the end contributing 0 and storing nothing.
__device__ __forceinline__ void pack_bits(unsigned int kb, I h, I groups, unsigned int* __restrict__ bits)
{
    if ((h & ~(I)31) >= groups) return;             // the whole warp is past the end (uniform)
    const int lane = (int)(h & 31), per = 32 / V;
    unsigned int w = kb << (V * (lane % per));
#pragma unroll
    for (int o = 1; o < 32 / V; o <<= 1) w |= __shfl_xor_sync(0xffffffffu, w, o);
    if (lane % per == 0 && h < groups) STS(bits + ((h * V) >> 5), w);
}

// The last block of a forward launch to finish (threadFenceReduction ticket) advances the counter past this call's
// numbers -- one Philox block per 4 elements -- and resets the ticket: every block has read state[1] by then.
__device__ __forceinline__ void advance_counter(unsigned long long* state, unsigned int* ticket,
                                                unsigned long long base, long long n)
{
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        state[1] = base + (unsigned long long)((n + 3) / 4);
        *ticket = 0u;
    }
}

// dropout_fwd's walk of the groups (grid-stride, UNROLL groups in flight a thread), from x to y, under the numbers
// of (k0, k1, base): the forwards' bodies and the regenerating backward's (x = dy, y = dx, no mask).
// MODE 2 keeps a warp together (its loop runs while the warp's first group is live; ``bits``: the 1-bit mask).
template <int MODE>
__device__ __forceinline__ void walk(const T* __restrict__ x, T* __restrict__ y, unsigned char* __restrict__ keep,
                                     const long long n, unsigned long long base, unsigned int k0, unsigned int k1,
                                     const unsigned int thresh, const A scale, const int vec,
                                     unsigned int* __restrict__ bits = nullptr)
{
    const I groups = (I)((n + V - 1) / V), full = (I)(n / V);
    const I stride = (I)gridDim.x * blockDim.x;
    for (I h0 = (I)blockIdx.x * blockDim.x + threadIdx.x; (MODE == 2 ? (h0 & ~(I)31) : h0) < groups;
         h0 += UNROLL * stride) {
        Pack in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            if (h < groups) in[u] = load_group(x, h, full, n, vec);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            unsigned int kb = 0u;
            if (h < groups) kb = draw_group<MODE>(in[u], y, keep, h, full, n, base, k0, k1, thresh, scale);
            if (MODE == 2) pack_bits(kb, h, groups, bits);
        }
    }
}

// dropout_fwd_pipe (session 9; PIPE_FWD): dropout_fwd's walk and numbers on a persistent grid of the resident
// blocks (PMINB an SM), each thread holding the NEXT iteration's loads (PUNROLL groups) while it draws the
// Philox numbers and stores the current ones.  dropout_fwd's exact grid runs in ~3 waves whose threads all load,
// then all compute 2 Philox calls (~140 instructions) a 16-bit group, then store: with every warp computing at
// once DRAM idles, and for 16-bit data the Philox work (~23 instructions an element against 5 bytes of traffic) is
// near the memory time.  Same elements, counters, mask and outputs as dropout_fwd (the cuda test compares them).
#ifndef PMINB
#define PMINB 4
#endif
#ifndef PUNROLL
#define PUNROLL ((sizeof(T) == 8 || WIDE) ? 2 : 4)   // groups a thread and iteration (host: pipe_unroll)
#endif
template <int MODE>
__device__ __forceinline__ void walk_pipe(const T* __restrict__ x, T* __restrict__ y,
                                          unsigned char* __restrict__ keep, const long long n,
                                          unsigned long long base, unsigned int k0, unsigned int k1,
                                          const unsigned int thresh, const A scale, const int vec,
                                          unsigned int* __restrict__ bits = nullptr)
{
    const I groups = (I)((n + V - 1) / V), full = (I)(n / V);
    const I stride = (I)gridDim.x * blockDim.x;
    I h0 = (I)blockIdx.x * blockDim.x + threadIdx.x;
    Pack cur[PUNROLL];
#pragma unroll
    for (int u = 0; u < PUNROLL; ++u) {
        const I h = h0 + u * stride;
        if (h < groups) cur[u] = load_group(x, h, full, n, vec);
    }
    for (; (MODE == 2 ? (h0 & ~(I)31) : h0) < groups; h0 += PUNROLL * stride) {
        Pack nxt[PUNROLL];
#pragma unroll
        for (int u = 0; u < PUNROLL; ++u) {                 // the next iteration's loads, issued before the math
            const I h = h0 + (PUNROLL + u) * stride;
            if (h < groups) nxt[u] = load_group(x, h, full, n, vec);
        }
#pragma unroll
        for (int u = 0; u < PUNROLL; ++u) {
            const I h = h0 + u * stride;
            unsigned int kb = 0u;
            if (h < groups) kb = draw_group<MODE>(cur[u], y, keep, h, full, n, base, k0, k1, thresh, scale);
            if (MODE == 2) pack_bits(kb, h, groups, bits);
        }
#pragma unroll
        for (int u = 0; u < PUNROLL; ++u) cur[u] = nxt[u];
    }
}

// The forwards under every MASK: the reserve argument res is the byte mask (MASK = 1), the bit words (MASK = 2:
// pack_bits, element e is bit e % 32 of res[e / 32]; n / 8 bytes, read back by dropout_bwd_bits with no Philox
// work: forward x + y + n/8, backward dy + n/8 + dx), or the record res = [key, base] (MASK = 0: the numbers this
// launch drew, written by thread 0 of block 0 from the state every block read; no mask; the backward,
// dropout_bwd_regen / _pipe, reads it and draws the same numbers again over the same walk: element i kept <=> word
// i % 4 of Philox block base + i / 4 passes thresh -- bitwise the forward's decisions, whatever V or grid it takes;
// forward x + y, backward dy + dx).
#if MASK == 1
typedef unsigned char Reserve;
#define WALK_MODE 0
#define WALK_KEEP(res) res
#define WALK_BITS(res)
#elif MASK == 2
typedef unsigned int Reserve;
#define WALK_MODE 2
#define WALK_KEEP(res) nullptr
#define WALK_BITS(res) , res
#else
typedef unsigned long long Reserve;
#define WALK_MODE 1
#define WALK_KEEP(res) nullptr
#define WALK_BITS(res)
#endif

extern "C" __global__ void __launch_bounds__(256)
dropout_fwd(const T* __restrict__ x, T* __restrict__ y, Reserve* __restrict__ res,
            unsigned long long* __restrict__ state, unsigned int* __restrict__ ticket, const long long n,
            const unsigned int thresh, const A scale, const int vec)
{
    const unsigned long long key = state[0], base = state[1];
#if MASK == 0
    if (blockIdx.x == 0 && threadIdx.x == 0) { res[0] = key; res[1] = base; }
#endif
    walk<WALK_MODE>(x, y, WALK_KEEP(res), n, base, (unsigned int)key, (unsigned int)(key >> 32), thresh, scale, vec
                    WALK_BITS(res));
    advance_counter(state, ticket, base, n);
}

extern "C" __global__ void __launch_bounds__(256, PMINB)
dropout_fwd_pipe(const T* __restrict__ x, T* __restrict__ y, Reserve* __restrict__ res,
                 unsigned long long* __restrict__ state, unsigned int* __restrict__ ticket, const long long n,
                 const unsigned int thresh, const A scale, const int vec)
{
    const unsigned long long key = state[0], base = state[1];
#if MASK == 0
    if (blockIdx.x == 0 && threadIdx.x == 0) { res[0] = key; res[1] = base; }
#endif
    walk_pipe<WALK_MODE>(x, y, WALK_KEEP(res), n, base, (unsigned int)key, (unsigned int)(key >> 32), thresh, scale,
                         vec WALK_BITS(res));
    advance_counter(state, ticket, base, n);
}

#if MASK == 2
// Thread h owns group h (V elements: one 16-byte vector of dy, two of float64), the group's V bits from one word
// (V divides 32: a group never straddles two); an exact grid, no loop; the tail group and an unaligned dy (vec = 0)
// take element loads.  A warp reads V words of bits (16 or 32 bytes) beside its 512 bytes of dy.
extern "C" __global__ void __launch_bounds__(256)
dropout_bwd_bits(const T* __restrict__ dy, const unsigned int* __restrict__ bits, T* __restrict__ dx,
                 const long long n, const A scale, const int vec)
{
    const I groups = (I)((n + V - 1) / V), full = (I)(n / V);
    const I h = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= groups) return;
    const Pack g = load_group(dy, h, full, n, vec);
    const unsigned int kb = bits[(h * V) >> 5] >> ((unsigned int)(h * V) & 31u);
    Pack out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = ST(LD(g.v[j]) * (((kb >> j) & 1u) ? scale : (A)0));
    store_group(dx, out, h, full, n);
}
#elif MASK == 0
// dx = dy * (keep ? scale : 0), keep regenerated from rec: dropout_fwd's walk (UNROLL, exact grid) and
// dropout_fwd_pipe's (PUNROLL, resident grid), x = dy, y = dx; ``vec``: dy 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256)
dropout_bwd_regen(const T* __restrict__ dy, T* __restrict__ dx, const unsigned long long* __restrict__ rec,
                  const long long n, const unsigned int thresh, const A scale, const int vec)
{
    const unsigned long long key = rec[0], base = rec[1];
    walk<1>(dy, dx, nullptr, n, base, (unsigned int)key, (unsigned int)(key >> 32), thresh, scale, vec);
}

extern "C" __global__ void __launch_bounds__(256, PMINB)
dropout_bwd_regen_pipe(const T* __restrict__ dy, T* __restrict__ dx, const unsigned long long* __restrict__ rec,
                       const long long n, const unsigned int thresh, const A scale, const int vec)
{
    const unsigned long long key = rec[0], base = rec[1];
    walk_pipe<1>(dy, dx, nullptr, n, base, (unsigned int)key, (unsigned int)(key >> 32), thresh, scale, vec);
}
#endif

#if MASK == 1                               // the mask backwards: a MASK = 0 module has no mask
extern "C" __global__ void __launch_bounds__(256)
dropout_bwd(const T* __restrict__ dy, const unsigned char* __restrict__ keep, T* __restrict__ dx, const long long n,
            const A scale, const int vec)
{
    const I groups = (I)((n + V - 1) / V), full = (I)(n / V);
    const I stride = (I)gridDim.x * blockDim.x;
    for (I h0 = (I)blockIdx.x * blockDim.x + threadIdx.x; h0 < groups; h0 += UNROLL * stride) {
        Pack g[UNROLL];
        Mask m[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            if (h < groups) {
                g[u] = load_group(dy, h, full, n, vec);
                if (vec && h < full) {
                    m[u].raw = LDS(reinterpret_cast<const MaskVec*>(keep) + h);
                } else {
#pragma unroll
                    for (int j = 0; j < V; ++j) m[u].b[j] = h * V + j < n ? keep[h * V + j] : 0;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            if (h < groups) {
                Pack out;
#pragma unroll
                for (int j = 0; j < V; ++j) out.v[j] = ST(LD(g[u].v[j]) * (m[u].b[j] ? scale : (A)0));
                store_group(dx, out, h, full, n);
            }
        }
    }
}

// dropout_bwd_tile: thread t owns elements [t*TILE, t*TILE + TILE): one TILE-byte load of the mask (16 bytes: a
// warp reads 512 contiguous mask bytes in one instruction), TLD 16-byte loads of dy, the same stores of dx.  The
// grid fits the tiles exactly (no loop; one tile a thread); the tail tile, and every tile of a call whose dy or
// mask is not aligned (vec = 0), take element loads.  TILE * sizeof(T) >= 16.
#if TILE == 16
typedef uint4 TileMask;
#elif TILE == 8
typedef uint2 TileMask;
#else
typedef unsigned int TileMask;
#endif
#define TLD (TILE * (int)sizeof(T) / 16)
union TPack { uint4 raw[TLD]; T v[TILE]; };
union TMask { TileMask raw; unsigned char b[TILE]; };

extern "C" __global__ void __launch_bounds__(256)
dropout_bwd_tile(const T* __restrict__ dy, const unsigned char* __restrict__ keep, T* __restrict__ dx,
                 const long long n, const A scale, const int vec)
{
    const I t = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec && t < (I)(n / TILE)) {
        TMask m;
        m.raw = LDS(reinterpret_cast<const TileMask*>(keep) + t);
        const uint4* p = reinterpret_cast<const uint4*>(dy) + t * TLD;
        TPack g;
#pragma unroll
        for (int j = 0; j < TLD; ++j) g.raw[j] = LDS(p + j);
#pragma unroll
        for (int j = 0; j < TILE; ++j) g.v[j] = ST(LD(g.v[j]) * (m.b[j] ? scale : (A)0));
        uint4* q = reinterpret_cast<uint4*>(dx) + t * TLD;
#pragma unroll
        for (int j = 0; j < TLD; ++j) STS(q + j, g.raw[j]);
    } else {
        const long long i0 = (long long)t * TILE;
#pragma unroll
        for (int j = 0; j < TILE; ++j)
            if (i0 + j < n) dx[i0 + j] = ST(LD(dy[i0 + j]) * (keep[i0 + j] ? scale : (A)0));
    }
}
#endif  // MASK
"""

# The first kernel (per-element loads and stores, a float compare per element), kept for MINIDNN_DROPOUT_V1=1.
_SOURCE_V1 = r"""
typedef SCALAR T;
__device__ __forceinline__ void philox_round(unsigned int c[4], const unsigned int k[2])
{
    const unsigned int m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
    const unsigned int hi0 = __umulhi(m0, c[0]), lo0 = m0 * c[0];
    const unsigned int hi1 = __umulhi(m1, c[2]), lo1 = m1 * c[2];
    const unsigned int n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
}

extern "C" __global__ void __launch_bounds__(256)
dropout_philox(const T* __restrict__ x, T* __restrict__ y, unsigned char* __restrict__ keep,
               unsigned long long* state, unsigned int* ticket, const long long n, const float p, const T scale)
{
    const unsigned long long key = state[0], base = state[1];
    const long long groups = (n + 3) / 4;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (long long)gridDim.x * blockDim.x) {
        const unsigned long long ctr = base + (unsigned long long)g;
        unsigned int c[4] = {(unsigned int)ctr, (unsigned int)(ctr >> 32), 0u, 0u};
        unsigned int k[2] = {(unsigned int)key, (unsigned int)(key >> 32)};
#pragma unroll
        for (int r = 0; r < 10; ++r) {
            philox_round(c, k);
            k[0] += 0x9E3779B9u; k[1] += 0xBB67AE85u;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long i = 4 * g + j;
            if (i < n) {
                const float u = (float)(c[j] >> 8) * (1.0f / 16777216.0f);
                const bool kept = u >= p;
                keep[i] = kept ? 1 : 0;
                y[i] = kept ? x[i] * scale : (T)0;
            }
        }
    }
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        state[1] = base + (unsigned long long)groups;
        *ticket = 0u;
    }
}
"""

_V1_SCALARS = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def threshold(p: float) -> int:
    """THRESH: the least 24-bit draw ``r >> 8`` that keeps an element, ceil(float32(p) * 2^24) (exact: a float32
    times a power of two is exact in float64).  p = 0 keeps everything (0), a p that rounds to 1 nothing (2^24)."""
    return int(math.ceil(float(np.float32(p)) * 16777216.0))


def threshold16(p: float) -> int:
    """The 16-bit stream's THRESH: the least half-word h that keeps an element, ceil(float32(p) * 2^16) --
    h * 2^-16 >= float32(p) exactly as ``threshold`` for 24 bits.  The drop probability drawn is threshold16(p) / 2^16
    (p rounded up to a multiple of 2^-16); p = 0 keeps everything (0), a p that rounds to 1 nothing (2^16)."""
    return int(math.ceil(float(np.float32(p)) * 65536.0))


def draw16_holds(p: float, rtol=None) -> bool:
    """Whether 16-bit draws keep p's statistics: threshold16(p) / 2^16 moves neither the drop probability float32(p)
    nor the keep probability 1 - float32(p) by more than ``rtol`` (DRAW16_RTOL, 2^-10) of itself.  The same bound
    holds the mean of y: E[y] / x = (1 - p16) / (1 - p) is within rtol of 1.  p = 0, p = 1 and multiples of 2^-16
    are exact; 0.5 exact, 0.1 -> 0.10000610 (+6.1e-5 relative): 16 bits; 1e-3 -> 0.00100708 (+0.71%), 1e-5 ->
    1.526e-5 (+53%), 0.999 (keep 0.001 -> 0.000992, -0.8%): the 24-bit stream.  Every p in [2^-6, 1 - 2^-6] holds at
    2^-10 (the rounding is under 2^-16 = 2^-10 * 2^-6)."""
    q = float(np.float32(p))
    err = threshold16(p) / 65536.0 - q
    return abs(err) <= (DRAW16_RTOL if rtol is None else rtol) * min(q, 1.0 - q)


def uses_draw16(dtype, p) -> bool:
    """Whether the forward of ``dtype`` data with drop probability p draws the 16-bit stream (DRAW16, 2-byte data,
    ``draw16_holds(p)``; never under V1)."""
    return bool(DRAW16) and not V1 and np.dtype(dtype).itemsize == 2 and draw16_holds(p)


def supports(x, p) -> bool:
    """The forward kernel takes x (any p in [0, 1]: p = 0 and p = 1 draw too, so every call advances the stream)."""
    if V1:
        return x.dtype in _V1_SCALARS and x.size > 0 and 0.0 < p < 1.0
    return _dev.is_cuda_array(x) and x.size > 0 and type_info(x.dtype) is not None


def supports_backward(dy, keep) -> bool:
    """The backward kernels take dy with a bool mask of its shape (not under V1), or with a PhiloxReserve of its
    shape (always: only these kernels can read one)."""
    if not (_dev.is_cuda_array(dy) and dy.size > 0 and type_info(dy.dtype) is not None):
        return False
    if type(keep) in OPAQUE:
        return keep.shape == tuple(dy.shape) and keep.device == dy.data.device_id
    return (not V1 and _dev.is_cuda_array(keep) and keep.dtype == np.bool_
            and tuple(keep.shape) == tuple(dy.shape))


class PhiloxReserve:
    """The reserve space of a GPU dropout forward that stored no mask: the numbers it drew, not the mask they made.

    ``record`` is a (2,) uint64 device array the forward kernel writes on the device at every launch (so a CUDA graph
    replay refreshes it, no host read): [Philox key, counter of element 0]; element i (flat C order over ``shape``)
    was kept iff word i % 4 of Philox4x32-10 block counter + i // 4 passes ``threshold`` (the module docstring), or,
    where ``draw16`` (a 16-bit forward under DRAW16), half-word i % 8 of block counter + i // 8 passes
    threshold16(p).  ``p`` is the drop probability it was drawn with.  Opaque to its users, as cuDNN's reserve
    space: ``dropout_backward`` reads it (drawing the stream ``draw16`` names, whatever dy's dtype); ``mask()``
    materialises the bool keep mask (one more launch; for tests and anyone who wants to look at it).  16 bytes of
    device memory (``nbytes``).
    """

    __slots__ = ("record", "shape", "p", "device", "draw16")
    nbytes = 16

    def __init__(self, record, shape, p, device, draw16=False):
        self.record, self.shape, self.p, self.device = record, tuple(shape), float(p), device
        self.draw16 = bool(draw16)

    @property
    def threshold(self) -> int:
        """The THRESH its kernels compare against: threshold16(p) for the 16-bit stream, else threshold(p)."""
        return threshold16(self.p) if self.draw16 else threshold(self.p)

    @property
    def size(self) -> int:
        """Elements the record decides (those of ``shape``)."""
        return math.prod(self.shape)

    def __repr__(self):
        return (f"PhiloxReserve(shape={self.shape}, p={self.p}, device=cuda:{self.device}"
                f"{', draw16=True' if self.draw16 else ''})")

    def mask(self):
        """The bool keep mask of ``shape`` (a new device array): the backward's numbers on ones."""
        return reserve_mask(self)


class BitMaskReserve:
    """The GPU dropout reserve under RESERVE "bits": the keep mask at 1 bit an element (``bits``: uint32 device
    array of ceil(n / 32) words, element i of the flat C order over ``shape`` is bit i % 32 of word i // 32),
    written by the forward kernel.  ``p``: the drop probability (checked against the backward's descriptor).
    Opaque like PhiloxReserve: ``dropout_backward`` reads it; ``mask()`` gives the bool mask."""

    __slots__ = ("bits", "shape", "p", "device")

    def __init__(self, bits, shape, p, device):
        self.bits, self.shape, self.p, self.device = bits, tuple(shape), float(p), device

    size = PhiloxReserve.size

    @property
    def nbytes(self) -> int:
        return 4 * (-(-self.size // 32))

    def __repr__(self):
        return f"BitMaskReserve(shape={self.shape}, p={self.p}, device=cuda:{self.device})"

    def mask(self):
        return reserve_mask(self)


OPAQUE = (PhiloxReserve, BitMaskReserve)        # the GPU reserves that are not a bool mask


def reserve_mask(reserve):
    """The bool keep mask (device array of ``reserve.shape``) that a PhiloxReserve or BitMaskReserve stands for: its
    backward on float32 ones with scale 1 (the products are exactly 1 or 0), then != 0."""
    cp = _launch.cupy()
    with _launch.on_device(reserve.device):
        ones = cp.ones(reserve.shape, dtype=np.float32)
        return backward_runner(ones, reserve, 1.0)(ones, reserve) != 0


def reserve_bytes(x) -> int:
    """Bytes of the reserve the GPU forward returns for x under RESERVE where the kernels take x (not V1): a
    PhiloxReserve's 16, a BitMaskReserve's 4 * ceil(n / 32); else one bool per element."""
    n = int(math.prod(x.shape))
    if V1 or not supports(x, 0.5) or RESERVE == "mask":
        return n
    return PhiloxReserve.nbytes if RESERVE == "record" else 4 * (-(-n // 32))


def _options(dtype, unroll, wide, hint=0, tile=16, pminb=None, mask=1, draw16=False):
    """NVRTC options; ``pminb``: dropout_fwd_pipe's launch (its UNROLL is PUNROLL = ``unroll``, blocks an SM);
    ``mask``: the kernels' reserve, MASK 1 the byte mask (the options before session 13), 0 the record, 2 bits;
    ``draw16``: the 16-bit stream (-DDRAW16=1; the 24-bit stream's options are those before session 14)."""
    scalar, accum, storage, _ = type_info(dtype)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DUNROLL={unroll}",
            f"-DWIDE={int(wide)}", f"-DHINT={hint}", f"-DTILE={tile}", "-std=c++14") + (
                (f"-DPMINB={pminb}", f"-DPUNROLL={unroll}") if pminb else ()) + (
                    () if mask == 1 else (f"-DMASK={mask}",)) + (("-DDRAW16=1",) if draw16 else ())


def uses_pipe(dtype, n=None) -> bool:
    """Whether the forward of ``n`` elements of ``dtype`` data takes dropout_fwd_pipe (PIPE_FWD, PIPE_MIN_N)."""
    return not V1 and (PIPE_FWD == "1" or (PIPE_FWD == "16" and np.dtype(dtype).itemsize == 2
                                           and (n is None or n >= PIPE_MIN_N)))


def pipe_unroll(itemsize, wide=False):
    """dropout_fwd_pipe's UNROLL: PIPE_UNROLL, halved for float64 (32-byte groups: 4 of them spilled at 64
    registers) and for 64-bit indices (``wide``: n >= 2^31; float16 spilled 16 bytes)."""
    return max(1, PIPE_UNROLL // 2) if itemsize == 8 or wide else PIPE_UNROLL


def pipe_grid(n, itemsize, sms):
    """dropout_fwd_pipe's blocks: the resident ones (PIPE_MINB an SM), fewer where the work is smaller."""
    groups = -(-n // (8 if itemsize == 2 else 4))
    return max(1, min(-(-groups // (THREADS * pipe_unroll(itemsize, n >= 2 ** 31))), sms * PIPE_MINB))


def call_hint(hint, n, itemsize, dev):
    """The cache hint a call of n elements takes: ``hint`` (HINT_FWD / HINT_BWD) where its two arrays exceed the
    device's L2 or the device does not say its L2 size, else 0 (HINT_BY_SIZE)."""
    if not hint or not HINT_BY_SIZE:
        return hint
    return hint if beyond_l2(2 * n * itemsize, dev) else 0


def _wave(dev):
    """Blocks of THREADS that one wave holds: every SM full (2048 threads)."""
    return _launch.sm_count(dev) * (2048 // THREADS)


def forward_unroll(n, itemsize, dev):
    """UNROLL of the forward for n elements (see UNROLL_FWD; UNROLL_FIT: halved only while the halved grid still
    fits one wave)."""
    if UNROLL_FWD:
        return UNROLL_FWD
    v = 8 if itemsize == 2 else 4
    u, groups, wave = max(1, 64 // (v * itemsize)), -(-n // v), _wave(dev)
    while u > 1 and (2 * -(-groups // (THREADS * u)) <= wave if UNROLL_FIT else -(-groups // (THREADS * u)) < wave):
        u //= 2
    return u


def backward_tile(n, itemsize, dev):
    """TILE of dropout_bwd_tile for n elements (see TILE_BWD)."""
    t, floor = TILE_BWD, max(4, 16 // itemsize)
    while t > floor and -(-n // (THREADS * t)) < _wave(dev):
        t //= 2
    return max(t, floor)


def _grid(kernel, n, dtype, dev, unroll, bps):
    """Blocks: enough for every group once, capped at ``bps`` blocks per SM and at what the kernel's registers let
    stay resident (so the grid-stride loop runs in one wave); ``bps`` = 0: no cap (one group set per thread)."""
    groups = -(-n // (8 if dtype.itemsize == 2 else 4))
    need = max(1, -(-groups // (THREADS * unroll)))
    if not bps:
        return (need,)
    regs = getattr(kernel, "num_regs", 0) or 32
    resident = max(1, min(bps, 65536 // (THREADS * (-(-regs // 8) * 8)), 2048 // THREADS))
    return (min(need, _launch.sm_count(dev) * resident),)


class _Plan:
    """A settled launch pair: ``vec`` (every input aligned: vector loads) and ``go`` (element loads), and the
    alignment bits the mask's pointer must clear for ``vec`` (backward)."""
    __slots__ = ("vec", "go", "mask_align")

    def __init__(self, kernel, grid, arrays, scalars, mask_align=0):
        head = [None] * arrays + scalars
        self.vec = _launch.prepare(kernel, grid, (THREADS,), head + [np.int32(1)])
        self.go = _launch.prepare(kernel, grid, (THREADS,), head + [np.int32(0)])
        self.mask_align = mask_align


_plans: dict = {}
# backend/dropout.py's validated GPU calls: (handle, descriptor type, p, the arrays' types, shapes, strides,
# dtypes, devices) -> (the handle's device, the runner); cleared with _plans
seen = SeenCalls()


def clear_plans():
    """Forget every settled launch (after a change of the launch choices above)."""
    _plans.clear()
    seen.clear()


def _acc(dtype):
    return np.float64 if dtype == np.float64 else np.float32


def _plan_fwd(n, dtype, p, scale, dev, mask=1, draw16=False):
    if V1:
        kernel = _launch.get_kernel(_SOURCE_V1, "dropout_philox", (f"-DSCALAR={_V1_SCALARS[dtype]}", "-std=c++14"))
        grid = max(1, min((n + 3) // 4 // THREADS + 1, _launch.sm_count(dev) * 8))
        return _launch.prepare(kernel, (grid,), (THREADS,), [None] * 5 + [np.int64(n), np.float32(p),
                                                                           dtype.type(scale)])
    hint = call_hint(HINT_FWD, n, dtype.itemsize, dev)
    scalars = [np.int64(n), np.uint32(threshold16(p) if draw16 else threshold(p)), _acc(dtype)(scale)]
    if uses_pipe(dtype, n):
        wide = n >= 2 ** 31
        kernel = _launch.get_kernel(SOURCE, "dropout_fwd_pipe", _options(dtype, pipe_unroll(dtype.itemsize, wide), wide,
                                                                          hint, pminb=PIPE_MINB, mask=mask,
                                                                          draw16=draw16))
        return _Plan(kernel, (pipe_grid(n, dtype.itemsize, _launch.sm_count(dev)),), 5, scalars)
    unroll = forward_unroll(n, dtype.itemsize, dev)
    kernel = _launch.get_kernel(SOURCE, "dropout_fwd", _options(dtype, unroll, n >= 2 ** 31, hint, mask=mask,
                                                                 draw16=draw16))
    return _Plan(kernel, _grid(kernel, n, dtype, dev, unroll, BPS_FWD), 5, scalars)


def _plan_bits_bwd(n, dtype, scale, dev):
    """The 1-bit mask's backward: dropout_bwd_bits, one group (16 bytes of dy, 32 of float64) a thread, exact grid."""
    hint = call_hint(HINT_BWD, n, dtype.itemsize, dev)
    kernel = _launch.get_kernel(SOURCE, "dropout_bwd_bits", _options(dtype, 1, n >= 2 ** 31, hint, mask=2))
    groups = -(-n // (8 if dtype.itemsize == 2 else 4))
    return _Plan(kernel, (max(1, -(-groups // THREADS)),), 3, [np.int64(n), _acc(dtype)(scale)])


def _plan_regen(n, dtype, p, scale, dev, draw16=False):
    """The regenerating backward (MASK = 0): the walk and grid the record forward of this call took
    (dropout_bwd_regen_pipe where the forward pipes, else dropout_bwd_regen with the forward's UNROLL rule and
    BPS_BWD), cache hints HINT_BWD; ``draw16``: the record's stream is the 16-bit one (any dtype of dy)."""
    scalars = [np.int64(n), np.uint32(threshold16(p) if draw16 else threshold(p)), _acc(dtype)(scale)]
    wide = n >= 2 ** 31
    hint = call_hint(HINT_BWD, n, dtype.itemsize, dev)
    if uses_pipe(dtype, n):
        kernel = _launch.get_kernel(SOURCE, "dropout_bwd_regen_pipe",
                                    _options(dtype, pipe_unroll(dtype.itemsize, wide), wide, hint,
                                             pminb=PIPE_MINB, mask=0, draw16=draw16))
        return _Plan(kernel, (pipe_grid(n, dtype.itemsize, _launch.sm_count(dev)),), 3, scalars)
    unroll = forward_unroll(n, dtype.itemsize, dev)
    kernel = _launch.get_kernel(SOURCE, "dropout_bwd_regen", _options(dtype, unroll, wide, hint, mask=0,
                                                                       draw16=draw16))
    return _Plan(kernel, _grid(kernel, n, dtype, dev, unroll, BPS_BWD), 3, scalars)


def _plan_bwd(n, dtype, scale, dev):
    scalars = [np.int64(n), _acc(dtype)(scale)]
    hint = call_hint(HINT_BWD, n, dtype.itemsize, dev)
    if TILE_BWD:
        tile = backward_tile(n, dtype.itemsize, dev)
        kernel = _launch.get_kernel(SOURCE, "dropout_bwd_tile", _options(dtype, 1, n >= 2 ** 31, hint, tile))
        return _Plan(kernel, (max(1, -(-n // (tile * THREADS))),), 3, scalars, tile - 1)
    kernel = _launch.get_kernel(SOURCE, "dropout_bwd", _options(dtype, UNROLL_BWD, n >= 2 ** 31, hint))
    return _Plan(kernel, _grid(kernel, n, dtype, dev, UNROLL_BWD, BPS_BWD), 3, scalars,
                 7 if dtype.itemsize == 2 else 3)


def _forward_runner(shape, dtype, contiguous, p, scale, dev, reserve_kind="mask", draw16=False):
    """run(x, state, ticket) -> (y, keep) for arrays x of this signature: a call is a device test, the
    allocations, one alignment test and the plan's prepared launch (only the pointers packed).  ``reserve_kind``
    "record": (y, PhiloxReserve) -- the record (2 uint64) allocated in place of the mask; "bits": (y,
    BitMaskReserve) -- ceil(n / 32) words.  ``draw16``: the 16-bit stream (uses_draw16 when settled); a call made
    after DRAW16 changed goes to the runner of the new setting (backend/dropout.py remembers this one)."""
    n = math.prod(shape)
    plan = _plan_fwd(n, dtype, p, scale, dev, _MASK_DEFINE[reserve_kind], draw16)
    watch = not V1 and dtype.itemsize == 2 and draw16_holds(p)      # DRAW16 decides this call's stream
    cp = _launch.cupy()
    empty, get_device, device, ascontiguous, bool_ = (cp.empty, cp.cuda.runtime.getDevice, cp.cuda.Device,
                                                      cp.ascontiguousarray, np.bool_)
    if V1:
        def run(x, state, ticket):
            with _launch.on_device(dev):
                x = x if contiguous else ascontiguous(x)
                y, keep = empty(shape, dtype=dtype), empty(shape, dtype=bool_)
                plan(x, y, keep, state, ticket)
            return y, keep
        return run
    vec, go = plan.vec, plan.go
    # the array the kernel writes beside y, and the reserve made of it: the byte mask itself, a PhiloxReserve of the
    # 2-word record, a BitMaskReserve of ceil(n / 32) words
    words, wdtype, reserve = {"mask": (shape, bool_, None),
                              "record": ((2,), np.uint64, lambda *a: PhiloxReserve(*a, draw16)),
                              "bits": ((-(-n // 32),), np.uint32, BitMaskReserve)}[reserve_kind]

    def run(x, state, ticket):
        if watch and DRAW16 != draw16:
            return forward_runner(x, p, scale, reserve_kind)(x, state, ticket)
        if get_device() != dev:
            with device(dev):
                return run(x, state, ticket)
        if not contiguous:
            x = ascontiguous(x)
        y, res = empty(shape, dtype=dtype), empty(words, dtype=wdtype)
        (go if x.data.ptr & 15 else vec)(x, y, res, state, ticket)
        return y, (res if reserve is None else reserve(res, shape, p, dev))
    return run


def _backward_runner(shape, dtype, contiguous, keep_contiguous, scale, dev):
    """run(dy, keep) -> dx for arrays of this signature (see _forward_runner)."""
    plan = _plan_bwd(math.prod(shape), dtype, scale, dev)
    cp = _launch.cupy()
    empty, get_device, device, ascontiguous = cp.empty, cp.cuda.runtime.getDevice, cp.cuda.Device, cp.ascontiguousarray
    vec, go, align = plan.vec, plan.go, plan.mask_align

    def run(dy, keep):
        if get_device() != dev:
            with device(dev):
                return run(dy, keep)
        if not contiguous:
            dy = ascontiguous(dy)
        if not keep_contiguous:
            keep = ascontiguous(keep)
        dx = empty(shape, dtype=dtype)
        (go if (dy.data.ptr & 15) or (keep.data.ptr & align) else vec)(dy, keep, dx)
        return dx
    return run


def _regen_runner(shape, dtype, contiguous, p, scale, dev, bits=False, draw16=False):
    """run(dy, reserve) -> dx for arrays dy of this signature and a PhiloxReserve of p and stream ``draw16`` (a
    reserve of the other stream goes to its own runner: backend/dropout.py's remembered calls do not key on it);
    ``bits``: a BitMaskReserve; see _forward_runner."""
    n = math.prod(shape)
    plan = _plan_bits_bwd(n, dtype, scale, dev) if bits else _plan_regen(n, dtype, p, scale, dev, draw16)
    cp = _launch.cupy()
    empty, get_device, device, ascontiguous = cp.empty, cp.cuda.runtime.getDevice, cp.cuda.Device, cp.ascontiguousarray
    vec, go = plan.vec, plan.go

    def run(dy, reserve):
        if not bits and reserve.draw16 != draw16:
            return regen_runner(dy, reserve, scale)(dy, reserve)
        if get_device() != dev:
            with device(dev):
                return run(dy, reserve)
        if not contiguous:
            dy = ascontiguous(dy)
        dx = empty(shape, dtype=dtype)
        launch = go if dy.data.ptr & 15 else vec
        if bits:
            launch(dy, reserve.bits, dx)            # dropout_bwd_bits(dy, bits, dx)
        else:
            launch(dy, dx, reserve.record)          # dropout_bwd_regen(dy, dx, rec)
        return dx
    return run


def forward_runner(x, p, scale, reserve=None):
    """The settled run(x, state, ticket) for arrays of x's shape, dtype, contiguity and device (once per such
    signature, (p, scale) and reserve kind: ``reserve`` None = RESERVE, else one of RESERVES; V1 always stores the
    byte mask)."""
    kind = "mask" if V1 else (RESERVE if reserve is None else reserve)
    if kind not in RESERVES:
        raise ValueError(f"dropout reserve {kind!r} must be one of {RESERVES}")
    key = ("f", x.shape, x.dtype, x.flags.c_contiguous, p, scale, x.data.device_id, kind, uses_draw16(x.dtype, p))
    return _launch.planned(_plans, key, _forward_runner, *key[1:])


def regen_runner(dy, reserve, scale):
    """The settled run(dy, reserve) for dy's signature and a PhiloxReserve or BitMaskReserve (see forward_runner)."""
    bits = type(reserve) is BitMaskReserve
    key = ("r", dy.shape, dy.dtype, dy.flags.c_contiguous, None if bits else reserve.p, scale, dy.data.device_id,
           bits, not bits and reserve.draw16)
    return _launch.planned(_plans, key, _regen_runner, *key[1:])


def backward_runner(dy, keep, scale):
    """The settled run(dy, keep) for arrays of dy's and keep's signature (see forward_runner); ``keep`` a bool mask,
    a PhiloxReserve (then the regenerating backward) or a BitMaskReserve."""
    if type(keep) in OPAQUE:
        return regen_runner(dy, keep, scale)
    key = ("b", dy.shape, dy.dtype, dy.flags.c_contiguous, keep.flags.c_contiguous, scale, dy.data.device_id)
    return _launch.planned(_plans, key, _backward_runner, *key[1:])


def dropout_forward(x, p, scale, state, ticket, reserve=None):
    """(y, reserve) for a GPU array ``x`` (a non-contiguous one is copied first); ``state``/``ticket`` are the
    engine's device arrays; reserve: a PhiloxReserve, the bool keep mask or a BitMaskReserve as RESERVE (or
    ``reserve``) says.  One launch, settled once per (shape, dtype, contiguity, p, scale, device, reserve kind); y
    and a mask come out C-contiguous."""
    return forward_runner(x, p, scale, reserve)(x, state, ticket)


def dropout_backward(dy, keep, scale):
    """dx = dy * (keep ? scale : 0) for a GPU array dy and its keep mask (non-contiguous ones are copied first) or
    PhiloxReserve / BitMaskReserve of its shape (the caller has checked it matches: backend/dropout.py); one
    launch."""
    return backward_runner(dy, keep, scale)(dy, keep)


if __name__ == "__main__":      # the sources nvcc compile-checks: python -m minidnn.backend.cuda.dropout_philox DIR
    import sys
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for name in ("float32", "float64", "float16", "bfloat16"):
        import ml_dtypes
        scalar, accum, storage, _ = type_info(np.dtype(getattr(ml_dtypes, name, None) or name))
        _launch.write_source(os.path.join(out, f"dropout_{name}.cu"), SOURCE,
                             (f"SCALAR={scalar}", f"ACCUM={accum}", f"STORAGE={storage}", "UNROLL=1", "WIDE=0",
                              "HINT=1", "TILE=16"))
