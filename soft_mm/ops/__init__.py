"""Pure tensor math (imports only torch): the SOFT op (``soft/``: Gaussian kernel, Newton–Schulz inverse, SOFT
attention and its naive reference, the backends), the layer kernels of the models (``layers/``), and what both
share: torch-version compat, the graph mode, the custom-op helper and IEEE float32 matmuls."""
from .soft import (
    NEWTON_OP,
    exact_inverse,
    gaussian_kernel,
    naive_soft_attention,
    newton_inverse,
    newton_inverse_macs,
    soft_attention,
)

__all__ = ['NEWTON_OP', 'exact_inverse', 'gaussian_kernel', 'naive_soft_attention', 'newton_inverse',
           'newton_inverse_macs', 'soft_attention']
