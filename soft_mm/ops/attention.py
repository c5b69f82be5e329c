"""SOFT attention: the Nyström approximation of full Gaussian-kernel attention through m landmark tokens."""
from __future__ import annotations

import torch
from torch import Tensor

from ._precision import compute_dtype, no_autocast
from .kernel import gaussian_kernel
from .newton import newton_inverse
from .pooling import in_graph_capture
from .tiled import DEFAULT_TILE_SIZE, tiled_nystrom_products

__all__ = ['AUTO_TILING_MIN_TOKENS', 'soft_attention']

# With tile_size=None, inputs of more tokens than this take the tiled path; smaller ones the untiled products, which
# are as fast there (their N×m temporaries still fit in cache) and cheaper in Python overhead.
AUTO_TILING_MIN_TOKENS = 2 * DEFAULT_TILE_SIZE


def _check_attention_inputs(q: Tensor, landmarks: Tensor, v: Tensor) -> None:
    for name, tensor in (('q', q), ('landmarks', landmarks), ('v', v)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f'soft_attention: {name} must be a torch.Tensor, got {type(tensor).__name__}')
        if not tensor.is_floating_point():
            raise TypeError(f'soft_attention: {name} must be a floating-point tensor, got {tensor.dtype}')
        if tensor.ndim != 4:
            raise ValueError(f'soft_attention: {name} must have 4 dims (batch, heads, tokens, head_dim), '
                             f'got shape {tuple(tensor.shape)}')
    batch, heads, num_tokens, head_dim = q.shape
    if landmarks.shape[:2] != (batch, heads) or landmarks.shape[-1] != head_dim:
        raise ValueError(f'soft_attention: landmarks must have shape (B, h, m, d) = ({batch}, {heads}, m, {head_dim}) '
                         f'to match q {tuple(q.shape)}, got {tuple(landmarks.shape)}')
    if landmarks.shape[2] == 0:
        raise ValueError('soft_attention: landmarks must hold at least one landmark (m >= 1), got m = 0')
    if v.shape[:3] != (batch, heads, num_tokens):
        raise ValueError(f'soft_attention: v must have shape (B, h, N, d_v) = ({batch}, {heads}, {num_tokens}, d_v) '
                         f'to match q {tuple(q.shape)}, got {tuple(v.shape)}')


def _resolve_tile_size(tile_size: int | None, num_tokens: int) -> int:
    """Tokens per tile for the tiled path, or 0 for the untiled products."""
    if tile_size is not None and (isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 0):
        raise ValueError(f'soft_attention: tile_size must be None (automatic), 0 (untiled) or an int >= 1, '
                         f'got {tile_size!r}')
    if in_graph_capture():  # a recorded graph would freeze the shape-dependent loop over tiles: untiled products
        return 0
    if tile_size is None:
        return DEFAULT_TILE_SIZE if num_tokens > AUTO_TILING_MIN_TOKENS else 0
    return tile_size


def soft_attention(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int = 20, normalize: bool = False,
                   ridge: float = 0.0, backward: str = 'implicit', *, tile_size: int | None = None) -> Tensor:
    """Softmax-free attention ``K1 @ (A^+ @ (K1^T @ v))``, the Nyström approximation of ``S @ v`` with ``S = K(q, q)``.

    ``K(a, b) = exp(-0.5 * ||a_i - b_j||^2)`` is :func:`gaussian_kernel`, ``K1 = K(q, landmarks)`` is N×m and
    ``A = K(landmarks, landmarks)`` is m×m; ``A^+`` is :func:`newton_inverse` of ``A`` (``num_iters``, ``ridge`` and
    ``backward`` are passed on). The product order costs O(N m d + m^2 d) and never forms an N×N or N×m×m tensor.
    Above :data:`AUTO_TILING_MIN_TOKENS` tokens the products run tile by tile (:func:`tiled_nystrom_products`): each
    block of ``K1`` is built, used and dropped in cache and rebuilt in the backward, so no N×m tensor is stored; the
    result equals the untiled products up to rounding. Tracing, ONNX export and ``torch.compile`` always get the
    untiled products, whose graph does not depend on N.
    With every token as a landmark (m = N, well-conditioned A, converged inverse) the result is exactly ``S @ v``.

    The caller must already have scaled ``q`` and ``landmarks`` by ``d ** -0.25``, which turns the unit bandwidth into
    SOFT's ``exp(-||q_i - q_j||^2 / (2 sqrt(d)))``. There is no row normalisation of the kernel (no softmax).

    ``normalize=True`` is SOFT-Norm: ``A^+`` is replaced by ``D^-1/2 A^+ D^-1/2`` with ``D = diag(A 1)``, the row sums
    of the un-ridged ``A`` (applied to the m×d intermediate, so it costs O(m d)).

    Precision: autocast is disabled inside and all arithmetic runs in at least float32 (float64 stays float64): the
    kernel is unnormalised, so ``K1^T v`` sums up to N terms of size ``|v|`` (beyond float16's 65504 at detection
    resolutions), and a low-precision squared distance is amplified by the exp and by the inverse of A. The result is
    cast back to the promoted dtype of the inputs, so float16/bfloat16 inputs give finite float16/bfloat16 outputs.

    Args:
        q: ``(B, h, N, d)`` scaled queries (= keys: SOFT shares the projection).
        landmarks: ``(B, h, m, d)`` scaled landmark (bottleneck) tokens, usually pooled from ``q``; m >= 1.
        v: ``(B, h, N, d_v)`` values (``d_v`` is usually ``d``).
        num_iters: Newton–Schulz iterations for ``A^+``, an int >= 0.
        normalize: apply SOFT-Norm.
        ridge: ``ridge * I`` added to ``A`` before inversion, a float >= 0 (see :func:`newton_inverse`; 1e-3 to 1e-2
            guards against nearly duplicated landmarks).
        backward: ``'implicit'`` (exact-inverse gradient at the final iterate) or ``'unrolled'``.
        tile_size: tokens per tile of the tiled path; ``None`` picks it (tiles of ``DEFAULT_TILE_SIZE`` above
            ``AUTO_TILING_MIN_TOKENS`` tokens, untiled below), ``0`` forces the untiled products (the reference; it
            also supports double backward where the Newton backward does), an int >= 1 forces tiles of that size.

    Returns:
        ``(B, h, N, d_v)`` attention output.
    """
    _check_attention_inputs(q, landmarks, v)
    tile_size = _resolve_tile_size(tile_size, q.shape[2])
    out_dtype = torch.promote_types(torch.promote_types(q.dtype, landmarks.dtype), v.dtype)
    work_dtype = compute_dtype(out_dtype)
    with no_autocast(q.device):
        q, landmarks, v = q.to(work_dtype), landmarks.to(work_dtype), v.to(work_dtype)
        kernel_landmarks = gaussian_kernel(landmarks, landmarks)  # (B, h, m, m)
        kernel_inv = newton_inverse(kernel_landmarks, num_iters=num_iters, ridge=ridge, backward=backward)
        if tile_size:
            out = _tiled_attention(q, landmarks, v, kernel_landmarks, kernel_inv, normalize, tile_size)
        else:
            out = _untiled_attention(q, landmarks, v, kernel_landmarks, kernel_inv, normalize)
    return out.to(out_dtype)


def _tiled_attention(q: Tensor, landmarks: Tensor, v: Tensor, kernel_landmarks: Tensor, kernel_inv: Tensor,
                     normalize: bool, tile_size: int) -> Tensor:
    """The products through :func:`tiled_nystrom_products`, with the m×m middle matrix formed explicitly."""
    if normalize:
        inv_sqrt_row_sums = kernel_landmarks.sum(-1).rsqrt()  # D^-1/2 as (B, h, m)
        middle = inv_sqrt_row_sums.unsqueeze(-1) * kernel_inv * inv_sqrt_row_sums.unsqueeze(-2)
    else:
        middle = kernel_inv
    return tiled_nystrom_products(q, landmarks, v, middle, tile_size)  # in the memory layout of v


def _untiled_attention(q: Tensor, landmarks: Tensor, v: Tensor, kernel_landmarks: Tensor, kernel_inv: Tensor,
                       normalize: bool) -> Tensor:
    """The reference: ``K1`` held in full, products in the order ``K1 (middle (K1^T v))``."""
    k1 = gaussian_kernel(q, landmarks)  # (B, h, N, m)
    context = k1.transpose(-2, -1) @ v  # (B, h, m, d_v)
    if normalize:
        inv_sqrt_row_sums = kernel_landmarks.sum(-1).rsqrt().unsqueeze(-1)  # D^-1/2 as (B, h, m, 1)
        context = inv_sqrt_row_sums * (kernel_inv @ (inv_sqrt_row_sums * context))
    else:
        context = kernel_inv @ context
    return k1 @ context  # (B, h, N, d_v)
