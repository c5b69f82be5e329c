"""The launch configuration of the Triton kernels, in one place for the launches (:mod:`.backend`) and their
ahead-of-time compilation (``benchmarks/triton_cubins.py``, which runs without torch). Plain Python: no imports.

The tile sizes and warps hold every kernel at 0 spilled registers at d = 32 on sm_80 and sm_90 in every dtype
(``python benchmarks/triton_cubins.py`` prints the table; ``tests/ops/test_triton_cubins.py`` holds it). The backward
holds the most at once (the kernel block, its gradient, q, v, grad_out and four m×d tiles), hence its smaller blocks;
they cost no memory traffic, since its partial sums are one per program, not one per block.
"""

__all__ = ['BLOCK_N', 'BLOCK_N_BACKWARD', 'KERNEL_BLOCKS', 'MAX_HEAD_DIM', 'MAX_LANDMARKS', 'NUM_WARPS',
           'PRODUCTS_CODES', 'SHARED_MEMORY_PER_BLOCK', 'SPLIT_PROGRAMS', 'middle_warps', 'padded', 'split_count']

BLOCK_N = 64  # tokens per block of the forward kernels (context, o)
BLOCK_N_BACKWARD = 16  # tokens per block of the backward kernel
NUM_WARPS = 8  # warps per program, every kernel
# The largest m and the largest d and d_v the backend takes: those at which every kernel, in every dtype, fits the
# shared memory a block may ask for on both targets (SHARED_MEMORY_PER_BLOCK). A launch asks for the dynamic shared
# memory of the compiled kernel (its metadata), which grows with the padded tiles: at m, d <= 64 at most 163,840 B;
# d = 128 needs 176,128 B even at m <= 16, and m = 65..128 the m×m kernel's 196,608 B, both over an A100's
# 166,912 (the table: docs/advanced/precision_and_backends.md; tests/ops/test_triton_cubins.py compiles every
# corner for both targets and holds it).
MAX_LANDMARKS = 64
MAX_HEAD_DIM = 64
# the opt-in shared memory per block of the targets the kernels are built for: sm_80 (A100), sm_90 (H100, H200)
SHARED_MEMORY_PER_BLOCK = {80: 166_912, 90: 232_448}
# programs of a reduction over the tokens (the context kernel, the backward), over all (sample, head) groups: a few per
# streaming multiprocessor of a large GPU (132 on an H100/H200), so the partial sums are a few per group, not one per
# block
SPLIT_PROGRAMS = 512
KERNEL_BLOCKS = {'nystrom_fwd_kernel_context': BLOCK_N, 'nystrom_fwd_kernel_o': BLOCK_N,
                 'nystrom_bwd_kernel_dq_dv_dl': BLOCK_N_BACKWARD}
# the kernels' PRODUCTS constant: the dtype of the products with v (float32 accumulation in every case); the same
# values as kernels.PRODUCTS_FLOAT32, PRODUCTS_BFLOAT16, PRODUCTS_FLOAT16
PRODUCTS_CODES = {'float32': 0, 'bfloat16': 1, 'float16': 2}


def padded(n: int) -> int:
    """A size as a tile dimension: the next power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, 1 << (int(n) - 1).bit_length())


def middle_warps(num_landmarks: int) -> int:
    """Warps of the m×m kernel (``nystrom_middle_fwd_kernel``, one program per (sample, head) holding three padded m×m
    float32 tiles): 4 up to m = 32, 8 at 64, 16 at 128, about 16 registers per thread for each tile."""
    return max(4, padded(num_landmarks) // 8)


def split_count(num_tokens: int, block: int, groups: int) -> int:
    """Programs per (sample, head) group of a reduction over ``num_tokens`` tokens in blocks of ``block``: about
    ``SPLIT_PROGRAMS`` in all, at least one per group, at most one per block. A function of the sizes only, so the
    sums (and their rounding) are the same on every run."""
    blocks = -(-int(num_tokens) // int(block))
    return max(1, min(blocks, SPLIT_PROGRAMS // max(1, int(groups))))
