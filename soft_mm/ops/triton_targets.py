"""The GPUs every Triton kernel of the package is built for, and their limits, in one place: plain Python (nothing
imported), so that :mod:`soft_mm.ops.triton_route` (which device runs the kernels), the SOFT op's backend (which calls
fit a device) and ``benchmarks/triton_cubins.py`` (which compiles every kernel for every target, without torch, loading
this file by its path) read the same figures.

A target is a compute capability as ``10 * major + minor`` (sm_89 is 89).
"""
from __future__ import annotations

__all__ = ['BFLOAT16_MIN_TARGET', 'BLACKWELL_TARGETS', 'MIN_TRITON', 'SHARED_MEMORY_PER_BLOCK', 'TARGETS',
           'TARGET_GPUS', 'TARGET_MIN_TRITON']

# The oldest triton the kernels are proven with (tools/misc/torch_matrix.sh: triton 3.4 of torch 2.8 passes; triton
# 3.0 of torch 2.4 gives NaN in its interpreter; torch 2.1 ships triton 2.1, which lacks tl.dot's input_precision).
MIN_TRITON = (3, 4)
# The NVIDIA GPUs every kernel is compiled and checked for (benchmarks/triton_cubins.py;
# tests/ops/test_triton_cubins.py: 0 spills at the published sizes): sm_75 Turing, sm_80 / sm_86 Ampere, sm_89 Ada,
# sm_90 Hopper, sm_100 / sm_103 data-centre Blackwell, sm_120 / sm_121 GeForce and workstation Blackwell. A device of
# another capability (a V100, a Jetson Orin's sm_87), and any AMD GPU under ROCm, runs the PyTorch forms.
BLACKWELL_TARGETS = (100, 103, 120, 121)
TARGETS = (75, 80, 86, 89, 90, *BLACKWELL_TARGETS)
# bfloat16 arithmetic from sm_80 (Turing has none)
BFLOAT16_MIN_TARGET = 80
# The oldest triton each target is checked with, where it is newer than MIN_TRITON: the Blackwell targets were compiled
# and checked at 0 spills with triton 3.8 (ptxas 12.9, the first that knows sm_103 and sm_121); with an older triton
# such a device runs the PyTorch forms.
TARGET_MIN_TRITON = {target: (3, 8) for target in BLACKWELL_TARGETS}
# the opt-in shared memory per block of each target (CUDA programming guide, compute capabilities table), bytes: what
# the ahead-of-time tables compare against; a device's own limit is read from the device itself at run time
SHARED_MEMORY_PER_BLOCK = {75: 65_536, 80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448,
                           103: 232_448, 120: 101_376, 121: 101_376}
# GPUs of each target, for messages and docs
TARGET_GPUS = {75: 'T4, RTX 20xx', 80: 'A100, A800', 86: 'RTX 30xx, A10, A40, A6000', 89: 'RTX 40xx, L4, L40S',
               90: 'H100, H200, H20', 100: 'B200, GB200', 103: 'B300, GB300',
               120: 'RTX 50xx, RTX PRO 6000 Blackwell', 121: 'DGX Spark (GB10)'}
