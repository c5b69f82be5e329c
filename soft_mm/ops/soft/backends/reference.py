"""The ``'reference'`` backend: the plain PyTorch math, ``K1`` held in full and autograd's backward.

Every device and dtype, compile and export (a double backward with ``backward='unrolled'``; the implicit inverse is
first order only). The float64 reference of the tests, and what exported graphs hold.
"""
from __future__ import annotations

from torch import Tensor

from ...precision.autocast import ieee_matmul
from ...precision.soft_policy import Precision
from ..dispatch import Backend, register_backend
from ..kernel import gaussian_kernel
from ..middle import Middle

__all__ = ['REFERENCE']


def reference_products(q: Tensor, landmarks: Tensor, v: Tensor, middle: Middle, precision: Precision) -> Tensor:
    """The ``'reference'`` backend: ``K1`` held in full, products in the order ``K1 (middle (K1^T v))``, autograd.

    Mixed precision: ``K1`` in the work dtype (the exponent's terms cancel), then ``K1^T v`` and ``K1 (middle c)``
    with operands in the products dtype and ``c`` accumulated in the work dtype."""
    k1 = gaussian_kernel(q.to(landmarks.dtype), landmarks)  # (B, h, N, m)
    if precision.mixed:
        k1 = k1.to(precision.products)
        context = (k1.transpose(-2, -1) @ v.to(k1.dtype)).to(precision.accumulate)  # (B, h, m, d_v)
    else:
        context = ieee_matmul(k1.transpose(-2, -1), v)  # (B, h, m, d_v)
    return ieee_matmul(k1, middle.apply(context).to(k1.dtype))  # (B, h, N, d_v)


REFERENCE = register_backend(Backend(
    name='reference', priority=0, run=reference_products, devices=('cpu', 'cuda', 'mps', 'xpu', 'meta'),
    compile=True, export=True))
