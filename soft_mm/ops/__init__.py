"""Pure tensor math of SOFT (imports only torch): Gaussian kernel, Newton–Schulz inverse, SOFT attention and its
naive reference."""
from .attention import soft_attention
from .kernel import gaussian_kernel
from .naive import naive_soft_attention
from .newton import NEWTON_OP, exact_inverse, newton_inverse, newton_inverse_macs

__all__ = ['NEWTON_OP', 'exact_inverse', 'gaussian_kernel', 'naive_soft_attention', 'newton_inverse',
           'newton_inverse_macs', 'soft_attention']
