"""Pure tensor math of SOFT (imports only torch): Gaussian kernel, Newton–Schulz inverse, SOFT attention."""
from .attention import soft_attention
from .kernel import gaussian_kernel
from .newton import exact_inverse, newton_inverse

__all__ = ['exact_inverse', 'gaussian_kernel', 'newton_inverse', 'soft_attention']
