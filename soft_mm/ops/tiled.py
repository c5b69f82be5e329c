"""Token-tiled Nyström products ``K1 @ middle @ K1^T @ v`` with a backward that recomputes the kernel tiles.

The N×m kernel ``K1 = K(q, landmarks)`` of SOFT is built tile by tile: the tokens are cut into tiles of
``tile_size`` rows and each ``tile_size × m`` block of ``K1`` is one matmul plus two in-place element-wise passes on
a small tensor. Two passes over the tiles give the forward (``ctx = K1^T v`` accumulated, then
``out = K1 (middle ctx)`` per tile) and two the backward (``K1^T grad_out`` accumulated, then the per-tile gradients
of q, v and the summed gradient of the landmarks). The tiles of the first pass are kept for the second (measured
1.8x faster for the forward than rebuilding them, 1.3x for forward+backward), but nothing N×m is saved for the
backward, which rebuilds the tiles from q and the landmarks: the memory held between forward and backward is that of
the inputs plus O(m d), and the N×m tiles live only within one forward or one backward. Compared with the untiled
products this removes the N×m temporaries of every element-wise step (distance, clamp, exp and their gradients),
which at large N are page-faulted in afresh on every call, and keeps the time linear in N.

Each kernel block costs one matmul and two in-place element-wise passes (clamp and exp): with the rows of q
augmented to ``[q, -|q|^2 / 2, 1]`` and those of the landmarks to ``[l, 1, -|l|^2 / 2]`` their product is the
exponent ``-|q - l|^2 / 2`` itself (see :func:`soft_mm.ops.kernel.augment_kernel_rows`). The augmented rows of q
are built per tile, so no N×(d + 2) copy of q is made (at large N every fresh allocation is page-faulted in, which
costs about as much as writing it twice).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .kernel import augment_kernel_cols, augment_kernel_rows

__all__ = ['DEFAULT_TILE_SIZE', 'tiled_nystrom_products']

# Tokens per tile: a 4096 × 49 float32 block per head is 0.8 MB, and the Python loop over tiles costs little next to
# the matmuls (measured at 67k and 267k tokens: 4096 and 8192 within noise of each other, 1024 and 2048 slower).
DEFAULT_TILE_SIZE = 4096


def _kernel_tile(q_aug_tile: Tensor, landmarks_aug_t: Tensor) -> Tensor:
    """``exp(-0.5 * max(|q_i - l_j|^2, 0))`` for one tile: ``(G, T, d + 2) @ (G, d + 2, m) -> (G, T, m)``."""
    return torch.bmm(q_aug_tile, landmarks_aug_t).clamp_max_(0.0).exp_()


def _tiles(q: Tensor, tile_size: int) -> Iterator[tuple[slice, Tensor]]:
    """``(token slice, augmented q rows (G, T, d + 2))`` for each tile of ``q (G, N, d)``."""
    neg_half_sq_norms = -0.5 * q.pow(2).sum(-1, keepdim=True)  # (G, N, 1)
    for start in range(0, q.shape[1], tile_size):
        tile = slice(start, start + tile_size)
        yield tile, augment_kernel_rows(q[:, tile], neg_half_sq_norms[:, tile])


class _TiledNystromProducts(torch.autograd.Function):
    """``K1 @ middle @ K1^T @ v`` over token tiles; backward recomputes each kernel tile (first-order only)."""

    @staticmethod
    def forward(ctx, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, tile_size: int) -> Tensor:
        landmarks_aug = augment_kernel_cols(landmarks)
        landmarks_aug_t = landmarks_aug.transpose(-2, -1)
        context = v.new_zeros(v.shape[0], landmarks.shape[1], v.shape[2])  # K1^T v, (G, m, d_v)
        kernel_tiles = []  # held from the first pass to the second only, never saved for the backward
        for tile, q_aug in _tiles(q, tile_size):
            kernel = _kernel_tile(q_aug, landmarks_aug_t)
            kernel_tiles.append((tile, kernel))
            context.baddbmm_(kernel.transpose(-2, -1), v[:, tile])
        mixed = torch.bmm(middle, context)  # middle K1^T v, (G, m, d_v)
        out = v.new_empty(v.shape)
        for tile, kernel in kernel_tiles:
            torch.bmm(kernel, mixed, out=out[:, tile])
        del kernel_tiles
        ctx.save_for_backward(q, landmarks, landmarks_aug, v, middle, context, mixed)
        ctx.tile_size = tile_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None]:
        q, landmarks, landmarks_aug, v, middle, context, mixed = ctx.saved_tensors
        tile_size, head_dim = ctx.tile_size, q.shape[2]
        grad_out = grad_out.to(v.dtype)
        landmarks_aug_t = landmarks_aug.transpose(-2, -1)
        # Pass 1: the gradient of `mixed` is K1^T grad_out.
        grad_mixed = torch.zeros_like(mixed)
        kernel_tiles = []  # (tile, augmented q rows, kernel tile), rebuilt here and held until pass 2
        for tile, q_aug in _tiles(q, tile_size):
            kernel = _kernel_tile(q_aug, landmarks_aug_t)
            kernel_tiles.append((tile, q_aug, kernel))
            grad_mixed.baddbmm_(kernel.transpose(-2, -1), grad_out[:, tile])
        grad_middle = torch.bmm(grad_mixed, context.transpose(-2, -1))
        grad_context = torch.bmm(middle.transpose(-2, -1), grad_mixed)
        # Pass 2: grad K1 = grad_out mixed^T + v grad_context^T; grad v = K1 grad_context; through the exponent
        # s = -|q - l|^2 / 2 (grad_s = grad_K1 * K1): grad q_i = sum_j grad_s_ij (l_j - q_i), grad l_j likewise.
        mixed_t, grad_context_t = mixed.transpose(-2, -1), grad_context.transpose(-2, -1)
        grad_q, grad_v = torch.empty_like(q), torch.empty_like(v)
        # sum_i grad_s_ij [q_i, -|q_i|^2 / 2, 1]: columns :d and d + 1 give grad l (the middle one is unused)
        landmark_sums = q.new_zeros(q.shape[0], landmarks.shape[1], head_dim + 2)
        for tile, q_aug, kernel in kernel_tiles:
            grad_kernel = torch.bmm(grad_out[:, tile], mixed_t).baddbmm_(v[:, tile], grad_context_t)
            torch.bmm(kernel, grad_context, out=grad_v[:, tile])
            grad_exponent = grad_kernel.mul_(kernel)  # (G, T, m)
            # grad_s [l, 1, -|l|^2 / 2]: columns :d and d give sum_j grad_s_ij l_j and sum_j grad_s_ij
            row_sums = torch.bmm(grad_exponent, landmarks_aug)
            torch.addcmul(row_sums[..., :head_dim], q[:, tile], row_sums[..., head_dim:head_dim + 1], value=-1.0,
                          out=grad_q[:, tile])
            landmark_sums.baddbmm_(grad_exponent.transpose(-2, -1), q_aug)
        grad_landmarks = landmark_sums[..., :head_dim] - landmarks * landmark_sums[..., head_dim + 1:]
        return grad_q, grad_landmarks, grad_v, grad_middle, None


def tiled_nystrom_products(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor,
                           tile_size: int = DEFAULT_TILE_SIZE) -> Tensor:
    """``K1 @ middle @ (K1^T @ v)`` with ``K1 = gaussian_kernel(q, landmarks)``, computed tile by tile over tokens.

    Equal to the untiled products up to rounding (float64: ~1e-15 relative), for outputs and for the gradients of
    all four inputs; the backward rebuilds the kernel tiles and is first-order only (double backward raises).
    Runs in the dtype of the inputs (the caller promotes them and disables autocast); device-neutral.

    Args:
        q: ``(G, N, d)`` scaled queries (G = batch × heads).
        landmarks: ``(G, m, d)`` scaled landmarks.
        v: ``(G, N, d_v)`` values.
        middle: ``(G, m, m)`` the inner matrix (``A^+``, or ``D^-1/2 A^+ D^-1/2`` for SOFT-Norm).
        tile_size: tokens per tile, an int >= 1.

    Returns:
        ``(G, N, d_v)``.
    """
    if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
        raise ValueError(f'tiled_nystrom_products: tile_size must be an int >= 1, got {tile_size!r}')
    if q.ndim != 3 or landmarks.ndim != 3 or v.ndim != 3 or middle.ndim != 3:
        raise ValueError('tiled_nystrom_products: q, landmarks, v and middle must be 3-d (G, rows, cols), got '
                         f'{tuple(q.shape)}, {tuple(landmarks.shape)}, {tuple(v.shape)}, {tuple(middle.shape)}')
    num_landmarks = landmarks.shape[1]
    if middle.shape != (q.shape[0], num_landmarks, num_landmarks):
        raise ValueError(f'tiled_nystrom_products: middle must have shape (G, m, m) = '
                         f'({q.shape[0]}, {num_landmarks}, {num_landmarks}), got {tuple(middle.shape)}')
    return _TiledNystromProducts.apply(q, landmarks, v, middle, tile_size)
