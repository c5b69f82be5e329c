"""The launch configuration of the value conv's Triton kernels (:mod:`.head_conv_kernels`), in one place for the launch
code and for ``benchmarks/triton_cubins.py``, which compiles them without torch: imports nothing."""

__all__ = ['KERNELS', 'MAX_FUSED_HEAD_DIM', 'MAX_FUSED_KERNEL', 'NUM_WARPS', 'block_tokens',
           'padded_head_dim']

# the kernels conv_add launches
KERNELS = ('head_conv_fwd_kernel_y', 'head_conv_bwd_kernel_dw')
# the largest filter conv_add takes (its K * K taps are a loop of the kernels) and the widest head
MAX_FUSED_KERNEL = 9
MAX_FUSED_HEAD_DIM = 128
NUM_WARPS = 4


def padded_head_dim(head_dim: int) -> int:
    """A head's channels rounded up to a power of two (a tile's width)."""
    return 1 << max(int(head_dim) - 1, 0).bit_length()


def block_tokens(padded: int) -> int:
    """Tokens a program for heads ``padded`` channels wide on a GPU: 2,048 values a tile up to 64 channels (64 tokens
    of 32 channels), 1,024 from 128 (8 tokens: at 64 tokens of 128 channels the kernels spilled on sm_75, at 16 on
    sm_120). Where triton's interpreter runs the kernels, a program takes the whole map instead
    (:func:`soft_mm.ops.triton_launch.interpreter_block`): each output is the same sum over the same taps at any
    block, only the filters' partial sums split differently."""
    return (2048 if padded <= 64 else 1024) // padded
