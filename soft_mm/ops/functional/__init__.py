"""The layer functions the SOFT models use that are not SOFT's own math (as ``torch.nn.functional`` is to
``torch.nn``): the fused linear + GELU, the residual branch's linear with its sum started in the GEMM, the pooling of
the landmarks as a matmul, the per-head depthwise conv with its faster CPU backward, softmax attention with float32
math for bfloat16 operands in CPU inference, and on the GPU route the residual add + LayerNorm in one Triton kernel
(:mod:`.add_norm`) and the weights cast once per forward (:mod:`.flat_cast`)."""
from .gelu import linear_gelu
from .head_conv import head_depthwise_conv
from .pooling import adaptive_avg_pool2d_matmul, adaptive_avg_pool_tokens
from .residual import linear_residual
from .sdpa import softmax_attention

__all__ = ['adaptive_avg_pool2d_matmul', 'adaptive_avg_pool_tokens', 'head_depthwise_conv', 'linear_gelu',
           'linear_residual', 'softmax_attention']
