"""Pure tensor math (imports only torch): the SOFT op (``soft/``: Gaussian kernel, Newton–Schulz inverse, SOFT
attention and its naive reference, the backends), the models' layer functions that are not SOFT's math
(``functional/``), the dtype rules (``precision/``: autocast and IEEE float32 matmuls, the SOFT op's precision
policy), and what they share: torch-version compat, the graph mode, the custom-op helper, the route to the Triton
kernels, the GPUs they are built for and what a kernel knows of triton's interpreter. The FlashAttention rule the tests
hold the op to is :mod:`soft_mm.testing`, above this layer."""
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
