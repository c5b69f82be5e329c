"""The SOFT math written plainly: the one naive reference of the op (as flash-linear-attention keeps a ``naive.py``
beside each op). The backends are checked against it, the FlashAttention rule (:mod:`soft_mm.testing.error_rule`)
takes it as its baseline, and the benchmarks time it as the plain-PyTorch SOFT math."""
from __future__ import annotations

from torch import Tensor

from ..compat import matmul
from ..precision.autocast import no_autocast
from .kernel import gaussian_kernel
from .middle import renamed_soft_norm
from .newton import newton_inverse

__all__ = ['naive_soft_attention']


def naive_soft_attention(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int = 20, soft_norm: bool = False,
                         ridge: float = 0.0, *, normalize: bool | None = None) -> Tensor:
    """:func:`~soft_mm.ops.soft_attention`'s math written plainly, in the inputs' dtype with autocast off.

    ``K1 (A^+ (K1^T v))`` with ``K1 = K(q, landmarks)`` held in full (N×m), ``A = K(landmarks, landmarks)`` and
    ``A^+`` its :func:`~soft_mm.ops.newton_inverse` (``num_iters``, ``ridge``); ``soft_norm=True`` is SOFT-Norm,
    ``D^-1/2 A^+ D^-1/2`` with ``D`` the row sums of the un-ridged ``A``. Same arguments and defaults as
    ``soft_attention``, without its backend, precision policy or tiling: every product runs in the inputs' dtype,
    so in bfloat16 or float16 this is the math written wholly in that dtype, the baseline of the FlashAttention
    rule (a low-precision path's error against float64 must stay within a fraction of this function's error in the
    same precision). ``newton_inverse`` still inverts in float32 (float64 for float64 inputs), as for any caller.
    """
    if normalize is not None:
        soft_norm = renamed_soft_norm('naive_soft_attention', normalize)
    with no_autocast(q.device):
        k1 = gaussian_kernel(q, landmarks)
        kernel_landmarks = gaussian_kernel(landmarks, landmarks)
        inverse = newton_inverse(kernel_landmarks, num_iters, ridge)
        context = matmul(k1.transpose(-2, -1), v)
        if soft_norm:
            scale = kernel_landmarks.sum(-1).rsqrt().unsqueeze(-1)  # D^-1/2 as (B, h, m, 1)
            context = scale * matmul(inverse, scale * context)
        else:
            context = matmul(inverse, context)
        return matmul(k1, context)
