"""The precision policy of the SOFT op: which dtype each step runs in, from device, input dtype and autocast.

The SOFT op has four kinds of arithmetic, with different needs (the errors against float64 behind each choice:
``python benchmarks/precision.py``, docs/advanced/precision_and_backends.md):

* the N×m **products with v** — ``K1^T v`` and ``K1 (M c)`` — run in bfloat16 with float32 accumulation: their
  error stays a third of the same math written wholly in bfloat16;
* the **exponent** ``q . l - |q|^2 / 2 - |l|^2 / 2`` and the ``exp`` stay float32, its dot products included: the
  norm terms cancel against the dot product, so a bfloat16 dot (a bfloat16 GEMM rounds its output to bfloat16)
  multiplies the grad q error, and it grows with ``|q|^2``;
* the **Newton–Schulz** inverse of the m×m kernel and the SOFT-Norm scaling ``D^-1/2`` stay at least float32: the
  inverse amplifies input error by up to cond(A + ridge I) (~5e3 at the ridge floor); they cost O(m^3) and O(m d);
* the **accumulation** of ``K1^T v`` over N tokens is float32 (an unnormalised sum of up to N terms of size ``|v|``).

float16 (inputs, or float16 autocast as mmdet's ``--amp`` on a GPU) gets float16 products with float32 accumulation
where the backend accumulates *and stores* the N-token sums in float32 (the Triton kernels: ``K1^T v`` is summed in
registers and written as float32 partial sums, and each kernel scales its float16 operand tiles by a power of two so
that the m×d factors, which the inverse can make large, stay in float16's range). Elsewhere float16 falls back to
float32 products: ``K1^T v`` can exceed float16's range at detection resolutions, and a GEMM's float16 output
overflows even when it accumulates in float32. float64 runs everything in float64. float32 is IEEE float32
(:func:`soft_mm.ops.precision.ieee_float32_matmuls`): the exponent's cancellation and the inverse's amplification
rule out TF32.
"""
from __future__ import annotations

import dataclasses

import torch

from .autocast import autocast_dtype

__all__ = ['PRECISIONS', 'Precision', 'precision_policy']


@dataclasses.dataclass(frozen=True)
class Precision:
    """Dtypes of the SOFT op's steps (see the module docstring for why each is what it is).

    Attributes:
        products: operand dtype of the N×m products (``q . l``, ``K1^T v``, ``K1 (M c)``).
        accumulate: dtype the products accumulate and return in (the m×d context, the exponent's dot products).
        exponent: dtype of the squared norms, the exponent and its ``exp``.
        inverse: dtype of the Newton–Schulz inverse, the SOFT-Norm scaling and the m×m middle matrix.
    """

    products: torch.dtype
    accumulate: torch.dtype
    exponent: torch.dtype
    inverse: torch.dtype
    fallback: Precision | None = dataclasses.field(default=None, compare=False)
    """What a backend that cannot run these products runs instead (None: such a backend is refused)."""

    @property
    def mixed(self) -> bool:
        """True when the products run in a lower dtype than the rest."""
        return self.products != self.exponent

    def chain(self) -> tuple[Precision, ...]:
        """This policy and its fallbacks, in order of preference."""
        return (self,) + (self.fallback.chain() if self.fallback is not None else ())

    def __str__(self) -> str:
        names = (str(d).replace('torch.', '') for d in (self.products, self.accumulate, self.exponent, self.inverse))
        return 'products {} (accumulate {}), exponent {}, inverse {}'.format(*names)


# The policies a caller may force by name (``soft_attention(..., precision=NAME)``); None picks automatically.
PRECISIONS = ('highest', 'bfloat16', 'float16')
_FULL = {dtype: Precision(dtype, dtype, dtype, dtype) for dtype in (torch.float32, torch.float64)}
_BF16_PRODUCTS = Precision(torch.bfloat16, torch.float32, torch.float32, torch.float32)
_F16_PRODUCTS = Precision(torch.float16, torch.float32, torch.float32, torch.float32)  # forced: no fallback
_F16_PRODUCTS_OR_FLOAT32 = dataclasses.replace(_F16_PRODUCTS, fallback=_FULL[torch.float32])  # automatic


def precision_policy(device_type: str, input_dtype: torch.dtype, precision: str | Precision | None = None,
                     ) -> Precision:
    """The dtypes the SOFT op runs in for inputs of ``input_dtype`` on ``device_type`` under the current autocast state.

    Automatic (``precision=None``): float64 inputs run wholly in float64; bfloat16 inputs, or any non-float64 inputs
    under bfloat16 autocast of their device, get bfloat16 products with float32 exponent, accumulation and inverse;
    float16 inputs, or inputs under float16 autocast, get float16 products likewise where the backend stores its sums
    in float32, with float32 as the fallback elsewhere (:attr:`Precision.fallback`); float32 runs wholly in float32.
    ``'highest'`` forces the float32 (or float64) policy, ``'bfloat16'`` and ``'float16'`` those products (no
    fallback); a :class:`Precision` is used as given.
    """
    if isinstance(precision, Precision):
        return precision
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f'precision={precision!r} is not None (automatic) or one of {PRECISIONS}')
    if input_dtype == torch.float64:
        return _FULL[torch.float64]
    if precision == 'highest':
        return _FULL[torch.float32]
    if precision is not None:
        return _BF16_PRODUCTS if precision == 'bfloat16' else _F16_PRODUCTS
    autocast = autocast_dtype(device_type)
    if torch.bfloat16 in (input_dtype, autocast):
        return _BF16_PRODUCTS
    if torch.float16 in (input_dtype, autocast):
        return _F16_PRODUCTS_OR_FLOAT32
    return _FULL[torch.float32]
