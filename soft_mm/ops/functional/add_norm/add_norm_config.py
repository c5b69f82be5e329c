"""The launch configuration of the fused add + LayerNorm kernels (:mod:`.add_norm_kernels`), in a module of plain
Python (no torch, no triton), so that ``benchmarks/triton_cubins.py`` compiles them exactly as :mod:`.add_norm_launch`
launches them.
"""
from __future__ import annotations

__all__ = ['BACKWARD_PROGRAMS', 'KERNELS', 'LAUNCH_VARIANTS', 'MAX_ADD_NORM_WIDTH', 'TILE_ELEMENTS', 'add_norm_rows',
           'padded_width']

# every kernel of the op (the kernels of add_norm_kernels), by name
KERNELS = ('add_norm_fwd_kernel_y', 'add_norm_bwd_kernel_dx')
MAX_ADD_NORM_WIDTH = 1024  # the widest row the kernels take (SOFT's post-norm blocks: 64-352 channels)
# elements of the (rows, padded width) tile a program holds at a time: at 2,048 the backward spills registers at 512
# channels and more on every target; at 1,024 no kernel spills at any width up to 1,024 on any target
# (tests/ops/test_triton_cubins.py)
TILE_ELEMENTS = 1024
BACKWARD_PROGRAMS = 256  # programs of the backward at most: each sums its rows' share of the weight's and bias's grads
# the kernels' flag sets the models launch (each one compiled kernel): a post-norm block's sum with its branch's bias
# and stochastic-depth scale (the widest code: without a scale a branch compiles less), and the landmark sampler's
# LayerNorm and GELU without a residual
LAUNCH_VARIANTS = {
    'block sum': dict(HAS_RESIDUAL=True, HAS_BRANCH_BIAS=True, HAS_SCALE=True, GELU=False, STORE_SUM=False,
                      HAS_DSUM=False),
    'pre-norm sum': dict(HAS_RESIDUAL=True, HAS_BRANCH_BIAS=True, HAS_SCALE=True, GELU=False, STORE_SUM=True,
                         HAS_DSUM=True),
    'norm + GELU': dict(HAS_RESIDUAL=False, HAS_BRANCH_BIAS=False, HAS_SCALE=False, GELU=True, STORE_SUM=False,
                        HAS_DSUM=False),
}


def padded_width(width: int) -> int:
    """The row width padded to a power of two (at least 16): the kernels' ``CP``, columns beyond ``width`` masked."""
    return max(16, 1 << (int(width) - 1).bit_length())


def add_norm_rows(width: int) -> int:
    """Rows of the token matrix a program takes at a time for rows ``width`` wide (the kernels' ``ROWS``): 16 at 64
    channels, down to 1 at 1,024 (:data:`TILE_ELEMENTS` over the padded width)."""
    return max(1, min(16, TILE_ELEMENTS // padded_width(width)))
