"""The launch configuration of the SOFT op's Triton kernels (:mod:`.nystrom_kernels`): tile sizes, warps, pipeline
stages per target, the kernels' names and the dtypes they are launched with, in one place for the launches
(:mod:`.nystrom_launch`), the dispatcher's device check (:mod:`.nystrom_limits`) and their ahead-of-time compilation
(``benchmarks/triton_cubins.py``, which runs without torch and loads this file by its path). Plain Python: it imports
only the targets, :mod:`soft_mm.ops.triton_targets` (plain Python too), the one home of the targets and their limits.

The tile sizes, warps and pipeline stages hold every kernel at 0 spilled registers at the published sizes (m = 49,
d = 32) on every target, in every dtype the target runs (``python benchmarks/triton_cubins.py`` prints the table;
``tests/ops/test_triton_cubins.py`` holds it). The backward holds the most at once (the kernel block, its gradient, q,
v, grad_out and four m×d tiles), hence its smaller blocks; they cost no memory traffic, since its partial sums are one
per program, not one per block. The targets with fewer registers' worth of work per thread at the same code take smaller
forward blocks (:data:`TARGET_BLOCKS`); on Blackwell the backward also runs its loop unpipelined (:data:`TARGET_STAGES`:
its 16-token block is already ``tl.dot``'s smallest).
"""
from __future__ import annotations

from ....triton_targets import BLACKWELL_TARGETS

__all__ = ['BLOCK_N', 'BLOCK_N_BACKWARD', 'DEFAULT_STAGES', 'GROUP_KERNELS', 'KERNELS', 'KERNEL_BLOCKS',
           'LAUNCH_DTYPES', 'MAX_HEAD_DIM', 'MAX_LANDMARKS', 'MIDDLE_BACKWARD_KERNELS', 'MIDDLE_KERNELS', 'NUM_WARPS',
           'PRODUCTS_CODES', 'SPLIT_PROGRAMS', 'TARGET_BLOCKS', 'TARGET_STAGES', 'TOKEN_KERNELS', 'kernel_block',
           'kernel_stages', 'middle_warps', 'padded', 'split_count']

BLOCK_N = 64  # tokens per block of the forward kernels (context, o)
BLOCK_N_BACKWARD = 16  # tokens per block of the backward kernel
NUM_WARPS = 8  # warps per program, every kernel
# The largest m and the largest d and d_v the backend takes: those at which every kernel, in every dtype, fits the
# shared memory a block may ask for on an A100 (sm_80) and an H100 (sm_90). A launch asks for the dynamic shared memory
# of the compiled kernel (its metadata), which grows with the padded tiles: at m, d <= 64 at most 163,840 B; d = 128
# needs 176,128 B even at m <= 16, and m = 65..128 the m×m kernel's 196,608 B, both over an A100's 166,912. Targets
# with less shared memory take a call within these limits only where its kernels fit them (:mod:`.nystrom_limits`; the
# table: docs/advanced/precision_and_backends.md; ``python benchmarks/triton_cubins.py --check-table`` compiles every
# corner for every target).
MAX_LANDMARKS = 64
MAX_HEAD_DIM = 64
# programs of a reduction over the tokens (the context kernel, the backward), over all (sample, head) groups: a few per
# streaming multiprocessor of a large GPU (132 on an H100/H200), so the partial sums are a few per group, not one per
# block
SPLIT_PROGRAMS = 512
# the token kernels: a block of tokens a program, launched in every dtype combination of LAUNCH_DTYPES
TOKEN_KERNELS = ('nystrom_fwd_kernel_context', 'nystrom_fwd_kernel_o', 'nystrom_bwd_kernel_dq_dv_dl')
# the m×m kernel and its backward, each in the cubin tables under two names: plain and SOFT-Norm (their SOFT_NORM
# constant)
MIDDLE_KERNELS = (('nystrom_middle_fwd_kernel_mid_inv', False), ('nystrom_middle_fwd_kernel_mid_inv_norm', True))
MIDDLE_BACKWARD_KERNELS = (('nystrom_middle_bwd_kernel_dl', False), ('nystrom_middle_bwd_kernel_dl_norm', True))
# the kernels that finish a split reduction, one program per (sample, head) group, float32: the forward's context and
# middle_context, the backward's m×m and m×d gradients, the landmarks' gradient
GROUP_KERNELS = ('nystrom_fwd_kernel_mc', 'nystrom_bwd_kernel_dmid_dctx', 'nystrom_bwd_kernel_dl_sum')
# every kernel of the op (the kernels of nystrom_kernels), by name
KERNELS = (*TOKEN_KERNELS, MIDDLE_KERNELS[0][0], MIDDLE_BACKWARD_KERNELS[0][0], *GROUP_KERNELS)
KERNEL_BLOCKS = {'nystrom_fwd_kernel_context': BLOCK_N, 'nystrom_fwd_kernel_o': BLOCK_N,
                 'nystrom_bwd_kernel_dq_dv_dl': BLOCK_N_BACKWARD}
# the targets whose blocks differ from KERNEL_BLOCKS: at 64 tokens a block, sm_75's forward kernels spill 152-264 B
# and sm_86/sm_89's context kernel 8 B (float16 products); at 32 none does, and the context kernel's shared memory at
# m = d = 64 halves (114,688 -> 65,536 B in float32 on sm_86, within its 101,376). Blackwell (triton 3.8): sm_120's
# context kernel spills 8 B at 64 (float16 products), none at 32; sm_100's 40 B at 64 and 8 B at 32 (bfloat16 or
# float16 q), none at 16. sm_103 and sm_121 take the blocks of sm_100 and sm_120.
_DATA_CENTRE_BLACKWELL = {'nystrom_fwd_kernel_context': 16}
_GEFORCE_BLACKWELL = {'nystrom_fwd_kernel_context': 32}
TARGET_BLOCKS = {75: {'nystrom_fwd_kernel_context': 32, 'nystrom_fwd_kernel_o': 32},
                 86: {'nystrom_fwd_kernel_context': 32},
                 89: {'nystrom_fwd_kernel_context': 32},
                 100: _DATA_CENTRE_BLACKWELL, 103: _DATA_CENTRE_BLACKWELL,
                 120: _GEFORCE_BLACKWELL, 121: _GEFORCE_BLACKWELL}
# software-pipeline stages of a kernel's loop (triton's num_stages: loads of the next blocks issued ahead), triton's
# default, and the targets that run a kernel with fewer: on Blackwell the backward kernel spills with its loads in
# flight (sm_100: 24-32 B at 2 or 3 stages, bfloat16 or float16 q; sm_120: 8-16 B, bfloat16 q) and none without
DEFAULT_STAGES = 3
_UNPIPELINED_BACKWARD = {'nystrom_bwd_kernel_dq_dv_dl': 1}
TARGET_STAGES = {target: _UNPIPELINED_BACKWARD for target in BLACKWELL_TARGETS}
# (q, v, products) of every launch the precision policy can make, by triton's dtype names: float32 everything;
# bfloat16 or float16 products with q in float32 (under autocast), bfloat16 or float16 (the inputs' dtype, whichever
# products are forced) and v cast to the products' dtype
LAUNCH_DTYPES = (('fp32', 'fp32', 'fp32'),
                 *((q, products, products) for products in ('bf16', 'fp16') for q in ('fp32', 'bf16', 'fp16')))
# the kernels' PRODUCTS constant: the dtype of the products with v (float32 accumulation in every case); the same
# values as nystrom_kernels.PRODUCTS_FLOAT32, PRODUCTS_BFLOAT16, PRODUCTS_FLOAT16
PRODUCTS_CODES = {'float32': 0, 'bfloat16': 1, 'float16': 2}


def padded(n: int) -> int:
    """A size as a tile dimension: the next power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, 1 << (int(n) - 1).bit_length())


def middle_warps(num_landmarks: int) -> int:
    """Warps of the m×m kernel (``nystrom_middle_fwd_kernel_mid_inv``, one program per (sample, head) holding three
    padded m×m float32 tiles): 4 up to m = 32, 8 at 64, 16 at 128, about 16 registers per thread for each tile."""
    return max(4, padded(num_landmarks) // 8)


def split_count(num_tokens: int, block: int, groups: int) -> int:
    """Programs per (sample, head) group of a reduction over ``num_tokens`` tokens in blocks of ``block``: about
    ``SPLIT_PROGRAMS`` in all, at least one per group, at most one per block. A function of the sizes only, so the
    sums (and their rounding) are the same on every run."""
    blocks = -(-int(num_tokens) // int(block))
    return max(1, min(blocks, SPLIT_PROGRAMS // max(1, int(groups))))


def kernel_block(kernel: str, target: int | None) -> int:
    """Tokens per block of ``kernel`` (a name of :data:`TOKEN_KERNELS`) on ``target`` (a capability of
    :data:`soft_mm.ops.triton_targets.TARGETS`; None: the default blocks). Where triton's interpreter runs the
    kernels, the launches take whole maps instead (``nystrom_launch._interpreter_block``)."""
    return TARGET_BLOCKS.get(target, {}).get(kernel, KERNEL_BLOCKS[kernel])


def kernel_stages(kernel: str, target: int | None) -> int:
    """Pipeline stages (triton's ``num_stages``) of ``kernel`` (a name of :data:`TOKEN_KERNELS`) on ``target`` (None:
    the interpreter, which ignores them)."""
    return TARGET_STAGES.get(target, {}).get(kernel, DEFAULT_STAGES)
