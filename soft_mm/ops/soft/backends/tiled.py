"""The ``'tiled'`` backend: token-tiled Nyström products ``K1 @ middle @ K1^T @ v`` with a backward that recomputes
the kernel tiles.

The N×m kernel ``K1 = K(q, landmarks)`` of SOFT is built tile by tile: the tokens are cut into tiles of
``tile_size`` rows and each ``tile_size × m`` block of ``K1`` is one matmul plus two in-place element-wise passes on a
small tensor. Two passes over the tiles give the forward (``ctx = K1^T v`` accumulated, then ``out = K1 (middle ctx)``
per tile) and two the backward (``K1^T grad_out`` accumulated, then the per-tile gradients of q, v and the summed
gradient of the landmarks). The tiles of the first pass are kept for the second (faster than rebuilding them), but
nothing N×m is saved for the backward, which rebuilds the tiles from q and the landmarks: the memory held between
forward and backward is that of the inputs plus O(m d), and the N×m tiles live only within one forward or one backward.
Compared with the untiled products this removes the N×m temporaries of every element-wise step (distance, clamp, exp and
their gradients), which at large N are page-faulted in afresh on every call, and keeps the time linear in N.

Each kernel block costs one matmul and two in-place element-wise passes (clamp and exp): with the rows of q
augmented to ``[q, -|q|^2 / 2, 1]`` and those of the landmarks to ``[l, 1, -|l|^2 / 2]`` their product is the
exponent ``-|q - l|^2 / 2`` itself (see :func:`soft_mm.ops.soft.kernel.augment_kernel_rows`). The augmented rows of q,
their squared norms included, are built per tile in cache, so no N-sized temporary is made at all.

Layout: the inputs may be strided views, and the outputs and gradients take the memory layout of ``v`` and ``q``.
A layer whose q and v are head-split views of token-major ``(B, N, heads * d)`` projections (``(B, h, N, d)`` with
strides ``(N h d, d, h d, 1)``) therefore gets a token-major output, which its output projection reads without a
copy; the tiles of such views are strided matrices that the matmuls read in place.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from ...precision.soft_policy import Precision
from ..dispatch import Backend, register_backend
from ..kernel import augment_kernel_cols, augment_kernel_rows
from ..middle import Middle
from ..products_op import products_op

__all__ = ['AUTO_TILING_MIN_TOKENS', 'DEFAULT_TILE_SIZE', 'TILED', 'tiled_nystrom_products', 'tiled_products_backward']

# Tokens per tile: a 4096 × 49 float32 block per head is 0.8 MB, and the Python loop over tiles costs little next to
# the matmuls (``benchmarks/attention.py``; its runs: docs/benchmarks/README.md).
DEFAULT_TILE_SIZE = 4096
# The automatic threshold: below it the reference's N×m temporaries still fit in cache and the reference is as fast
# with less Python overhead.
AUTO_TILING_MIN_TOKENS = 2 * DEFAULT_TILE_SIZE


def _bmm_into(out: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``out = a @ b``, written in place (``out`` may be a strided view of another dtype than the operands)."""
    if out.dtype == a.dtype:
        return torch.bmm(a, b, out=out)
    return out.copy_(torch.bmm(a, b))


def _bmm_add(acc: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``acc += a @ b``: one fused ``baddbmm`` when the dtypes agree, else the product in the operands' dtype added
    to the (higher-precision) accumulator."""
    if acc.dtype == a.dtype:
        return acc.baddbmm_(a, b)
    return acc.add_(torch.bmm(a, b))


class _TileKernels:
    """Builds the kernel blocks ``exp(-0.5 * max(|q_i - l_j|^2, 0))`` of one sample's token tiles.

    Each block is one matmul of augmented rows (``[q, -|q|^2 / 2, 1] @ [l, 1, -|l|^2 / 2]^T``) and two in-place
    passes, in the work dtype (the exponent's terms cancel, so it stays float32: ``soft_mm.ops.precision``). With
    mixed precision (``products`` lower, e.g. bfloat16) the block is also handed out in ``products`` for the two
    products that use it, ``K1^T v`` and ``K1 (M c)``.
    """

    def __init__(self, landmarks: Tensor, products: torch.dtype) -> None:
        self.work = landmarks.dtype
        self.products = products
        self.landmarks_aug_t = augment_kernel_cols(landmarks).transpose(-2, -1)  # (h, d + 2, m)

    def tiles(self, q: Tensor, tile_size: int) -> Iterator[tuple[slice, Tensor, Tensor, Tensor]]:
        """``(token slice, augmented q rows (h, T, d + 2), kernel block (h, T, m) in the work dtype, the block in
        products)`` for each tile of ``q (h, N, d)``; the tiles (and their squared norms) are built in cache."""
        for start in range(0, q.shape[1], tile_size):
            tile = slice(start, start + tile_size)
            q_aug = augment_kernel_rows(q[:, tile].to(self.work))
            kernel = torch.bmm(q_aug, self.landmarks_aug_t).clamp_max_(0.0).exp_()
            yield tile, q_aug, kernel, kernel.to(self.products)


def _forward(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, tile_size: int, products: torch.dtype,
             ) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, K1^T v, middle K1^T v)`` over token tiles of 4-d inputs (the kernel of the custom op's forward)."""
    work = landmarks.dtype
    context = torch.zeros(*v.shape[:2], landmarks.shape[2], v.shape[3], dtype=work, device=v.device)  # K1^T v
    middle_context = torch.empty_like(context)  # middle K1^T v
    out = torch.empty_like(v)  # v's memory layout
    for b in range(q.shape[0]):
        kernels = _TileKernels(landmarks[b], products)
        kernel_tiles = []  # held from the first pass to the second only, never saved for the backward
        for tile, _, _, kernel_p in kernels.tiles(q[b], tile_size):
            kernel_tiles.append((tile, kernel_p))
            _bmm_add(context[b], kernel_p.transpose(-2, -1), v[b, :, tile].to(products))
        torch.bmm(middle[b], context[b], out=middle_context[b])
        middle_context_p = middle_context[b].to(products)
        for tile, kernel_p in kernel_tiles:
            _bmm_into(out[b, :, tile], kernel_p, middle_context_p)
    return out, context, middle_context


def tiled_products_backward(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor,
                            context: Tensor, middle_context: Tensor, tile_size: int, products: torch.dtype,
                            ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of q, landmarks, v and middle, each kernel tile rebuilt (the custom op's backward kernel; also
    what the Triton backend's backward runs where its kernel cannot launch). Device-neutral; ``landmarks``, ``middle``,
    ``context`` and ``middle_context`` in the work dtype, q and v in it or in ``products``."""
    head_dim = q.shape[3]
    grad_out = grad_out.to(products)
    grad_q, grad_v = torch.empty_like(q), torch.empty_like(v)  # the layouts of q and v
    grad_middle, grad_context = torch.empty_like(middle), torch.empty_like(context)
    # sum_i grad_s_ij [q_i, -|q_i|^2 / 2, 1]: columns :d and d + 1 give grad l (the middle one is unused)
    landmark_sums = torch.zeros(*landmarks.shape[:3], head_dim + 2, dtype=landmarks.dtype, device=q.device)
    for b in range(q.shape[0]):
        kernels = _TileKernels(landmarks[b], products)
        # Pass 1: the gradient of `middle_context` is K1^T grad_out.
        grad_middle_context = torch.zeros_like(middle_context[b])
        kernel_tiles = []  # (tile, q rows, kernel blocks), rebuilt here and held until pass 2
        for tile, q_aug, kernel, kernel_p in kernels.tiles(q[b], tile_size):
            kernel_tiles.append((tile, q_aug, kernel, kernel_p))
            _bmm_add(grad_middle_context, kernel_p.transpose(-2, -1), grad_out[b, :, tile])
        torch.bmm(grad_middle_context, context[b].transpose(-2, -1), out=grad_middle[b])
        torch.bmm(middle[b].transpose(-2, -1), grad_middle_context, out=grad_context[b])
        # Pass 2: grad K1 = grad_out middle_context^T + v grad_context^T; grad v = K1 grad_context; through the exponent
        # s = -|q - l|^2 / 2 (grad_s = grad_K1 * K1): grad q_i = sum_j grad_s_ij (l_j - q_i), grad l likewise.
        middle_context_t = middle_context[b].transpose(-2, -1).to(products)
        grad_context_p = grad_context[b].to(products)
        grad_context_t = grad_context_p.transpose(-2, -1)
        for tile, q_aug, kernel, kernel_p in kernel_tiles:
            grad_kernel = torch.bmm(grad_out[b, :, tile], middle_context_t).to(kernel.dtype)
            _bmm_add(grad_kernel, v[b, :, tile].to(products), grad_context_t)
            _bmm_into(grad_v[b, :, tile], kernel_p, grad_context_p)
            grad_exponent = grad_kernel.mul_(kernel)  # (h, T, m), work dtype
            # sum_j grad_s_ij l_j - q_i sum_j grad_s_ij, in place when grad q has the work dtype
            grad_q_tile = grad_q[b, :, tile]
            work_tile = grad_q_tile if grad_q.dtype == kernel.dtype else None
            work_tile = torch.bmm(grad_exponent, landmarks[b], out=work_tile)
            work_tile.addcmul_(q_aug[..., :head_dim], grad_exponent.sum(-1, keepdim=True), value=-1.0)
            if work_tile is not grad_q_tile:
                grad_q_tile.copy_(work_tile)
            landmark_sums[b].baddbmm_(grad_exponent.transpose(-2, -1), q_aug)
    grad_landmarks = landmark_sums[..., :head_dim] - landmarks * landmark_sums[..., head_dim + 1:]
    return grad_q, grad_landmarks, grad_v, grad_middle


# one custom op pair (soft_mm::tiled_nystrom_products and its backward): torch.compile sees one node
_tiled_products = products_op('tiled_nystrom_products', _forward, tiled_products_backward,
                              'int tile_size, ScalarType products')


def tiled_nystrom_products(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor,
                           tile_size: int = DEFAULT_TILE_SIZE, products: torch.dtype | None = None) -> Tensor:
    """``K1 @ middle @ (K1^T @ v)`` with ``K1 = gaussian_kernel(q, landmarks)``, computed tile by tile over tokens.

    Equal to the untiled products up to rounding (float64: ~1e-15 relative), for outputs and for the gradients of
    all four inputs; the backward rebuilds the kernel tiles and is first-order only (double backward raises).
    Runs in the dtype of ``landmarks`` and ``middle`` (the work dtype; the caller promotes them and disables
    autocast), except the products when ``products`` is a lower dtype (see :class:`_TileKernels`); q and v may then
    also come in that dtype, and the output takes v's dtype. Device-neutral. Strided inputs are read in place, and
    the output (and the gradients of q and v) keep the memory layout of v (and q).

    Args:
        q: ``(G, N, d)`` scaled queries (G = batch × heads), or ``(B, h, N, d)``.
        landmarks: ``(G, m, d)`` scaled landmarks, or ``(B, h, m, d)``.
        v: ``(G, N, d_v)`` values, or ``(B, h, N, d_v)``.
        middle: ``(G, m, m)`` the inner matrix (``A^+``, or ``D^-1/2 A^+ D^-1/2`` for SOFT-Norm), or ``(B, h, m, m)``.
        tile_size: tokens per tile, an int >= 1.
        products: operand dtype of the products (None: the work dtype, i.e. no mixed precision).

    Returns:
        ``(G, N, d_v)``, or ``(B, h, N, d_v)``.
    """
    if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
        raise ValueError(f'tiled_nystrom_products: tile_size must be an int >= 1, got {tile_size!r}')
    ndims = {q.ndim, landmarks.ndim, v.ndim, middle.ndim}
    if ndims not in ({3}, {4}):
        raise ValueError('tiled_nystrom_products: q, landmarks, v and middle must all be 3-d (G, rows, cols) or all '
                         f'4-d (B, G, rows, cols), got {tuple(q.shape)}, {tuple(landmarks.shape)}, '
                         f'{tuple(v.shape)}, {tuple(middle.shape)}')
    num_landmarks = landmarks.shape[-2]
    groups = q.shape[:-2]
    if middle.shape != (*groups, num_landmarks, num_landmarks):
        raise ValueError(f'tiled_nystrom_products: middle must have shape (..., m, m) = '
                         f'{(*groups, num_landmarks, num_landmarks)}, got {tuple(middle.shape)}')
    if landmarks.dtype != middle.dtype:
        raise ValueError(f'tiled_nystrom_products: landmarks and middle must share the work dtype, got '
                         f'{landmarks.dtype} and {middle.dtype}')
    products = landmarks.dtype if products is None else products
    if products == landmarks.dtype and not q.dtype == v.dtype == products:
        raise ValueError(f'tiled_nystrom_products: without mixed precision q and v must be in the work dtype '
                         f'{products}, got {q.dtype} and {v.dtype}')
    if q.ndim == 3:
        return _tiled_products(q[None], landmarks[None], v[None], middle[None], tile_size, products)[0]
    return _tiled_products(q, landmarks, v, middle, tile_size, products)


def _tiled_attention(q: Tensor, landmarks: Tensor, v: Tensor, middle: Middle, precision: Precision,
                     tile_size: int = DEFAULT_TILE_SIZE) -> Tensor:
    """The backend's run function: :func:`tiled_nystrom_products` (output in the memory layout of v)."""
    return tiled_nystrom_products(q, landmarks, v, middle.matrix().to(landmarks.dtype), tile_size,
                                  products=precision.products)


# CPU only: a Python loop of small kernels per tile and sample is what a GPU must not run; not exported (the loop is
# no ATen graph); preferred above AUTO_TILING_MIN_TOKENS tokens, where its smaller working set pays
TILED = register_backend(Backend(
    name='tiled', priority=10, run=_tiled_attention, devices=('cpu',), min_tokens=AUTO_TILING_MIN_TOKENS,
    compile=True, options=(('tile_size', DEFAULT_TILE_SIZE),)))
