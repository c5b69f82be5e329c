"""The ``'triton'`` backend: fused Triton kernels (``kernels.py``), their launch configuration (``config.py``) and the
launches, custom ops and backend declaration (``backend.py``)."""
from .backend import (
    MAX_HEAD_DIM,
    MAX_LANDMARKS,
    MIN_TRITON,
    TRITON,
    TRITON_VERSION,
    triton_available,
    triton_nystrom_middle,
    triton_nystrom_products,
    unsupported_reason,
)

__all__ = ['MAX_HEAD_DIM', 'MAX_LANDMARKS', 'MIN_TRITON', 'TRITON', 'TRITON_VERSION', 'triton_available',
           'triton_nystrom_middle', 'triton_nystrom_products', 'unsupported_reason']
