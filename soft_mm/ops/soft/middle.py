"""The m×m middle factor of the SOFT op's products ``K1 @ middle @ (K1^T @ v)``, as the backends receive it."""
from __future__ import annotations

import warnings

from torch import Tensor

from ..precision.autocast import ieee_matmul

__all__ = ['Middle', 'renamed_soft_norm']


def renamed_soft_norm(function: str, normalize: bool) -> bool:
    """The value of the op's SOFT-Norm switch given by its deprecated name, ``normalize=``, with a FutureWarning:
    SOFT-Norm is ``soft_norm`` everywhere (the op, the layers, the backbone and the configs)."""
    warnings.warn(f'{function}(normalize=...) is now {function}(soft_norm=...), the name SOFT-Norm has everywhere in '
                  'soft_mm; normalize= will be removed', FutureWarning, stacklevel=3)
    return bool(normalize)


class Middle:
    """The m×m middle factor of the products ``K1 @ middle @ (K1^T @ v)``: ``A^+`` (``inverse``), with SOFT-Norm's
    ``D^-1/2`` (``scale``, ``(B, h, m)``) kept apart, or (``scale`` None) the whole matrix, as a fused kernel
    returns it."""

    def __init__(self, inverse: Tensor, scale: Tensor | None = None) -> None:
        self.inverse, self.scale = inverse, scale

    def matrix(self) -> Tensor:
        """The middle matrix formed explicitly: ``A^+``, or ``D^-1/2 A^+ D^-1/2``."""
        if self.scale is None:
            return self.inverse
        return self.scale.unsqueeze(-1) * self.inverse * self.scale.unsqueeze(-2)

    def apply(self, context: Tensor) -> Tensor:
        """``middle @ context`` in the inverse's dtype, the scaling applied to the m×d factors (``D^-1/2 (A^+ (D^-1/2
        context))``: O(m d) instead of forming the matrix)."""
        context = context.to(self.inverse.dtype)
        if self.scale is None:
            return ieee_matmul(self.inverse, context)
        scale = self.scale.unsqueeze(-1).to(self.inverse.dtype)  # D^-1/2 as (B, h, m, 1)
        return scale * ieee_matmul(self.inverse, scale * context)
