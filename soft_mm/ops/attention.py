"""SOFT attention: the Nyström approximation of full Gaussian-kernel attention through m landmark tokens."""
from __future__ import annotations

import torch
from torch import Tensor

from .capture import graph_mode
from .compat import dense_grad, eager_without_custom_ops
from .dispatch import AUTO_TILING_MIN_TOKENS, Backend, register_backend, select
from .kernel import gaussian_kernel
from .newton import check_newton_arguments, newton_inverse
from .precision import Precision, autocast_dtype, ieee_float32_matmuls, ieee_matmul, no_autocast, precision_policy
from .tiled import DEFAULT_TILE_SIZE, tiled_nystrom_products
from .triton_nystrom import MAX_HEAD_DIM as TRITON_MAX_HEAD_DIM
from .triton_nystrom import MAX_LANDMARKS as TRITON_MAX_LANDMARKS
from .triton_nystrom import triton_nystrom_middle, triton_nystrom_products
from .triton_nystrom import unsupported_reason as triton_unsupported_reason

__all__ = ['AUTO_TILING_MIN_TOKENS', 'Middle', 'soft_attention']


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


@eager_without_custom_ops
def soft_attention(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int = 20, normalize: bool = False,
                   ridge: float = 0.0, backward: str = 'implicit', *, backend: str | None = None,
                   precision: str | Precision | None = None, tile_size: int | None = None) -> Tensor:
    """Softmax-free attention ``K1 @ (A^+ @ (K1^T @ v))``, the Nyström approximation of ``S @ v`` with ``S = K(q, q)``.

    ``K(a, b) = exp(-0.5 * ||a_i - b_j||^2)`` is :func:`gaussian_kernel`, ``K1 = K(q, landmarks)`` is N×m and
    ``A = K(landmarks, landmarks)`` is m×m; ``A^+`` is :func:`newton_inverse` of ``A`` (``num_iters``, ``ridge`` and
    ``backward`` are passed on). The product order costs O(N m d + m^2 d) and never forms an N×N or N×m×m tensor.
    The N×m products run in a backend of :mod:`soft_mm.ops.dispatch` (``'reference'``: the plain math, ``K1`` held
    in full, what exported graphs get; ``'tiled'``: CPU, above :data:`AUTO_TILING_MIN_TOKENS` tokens, each
    block of ``K1`` built, used and dropped in cache and rebuilt in the backward, so no N×m tensor is stored). All
    backends give the same result up to rounding. With every token as a landmark (m = N, well-conditioned A,
    converged inverse) the result is exactly ``S @ v``.

    The caller must already have scaled ``q`` and ``landmarks`` by ``d ** -0.25``, which turns the unit bandwidth into
    SOFT's ``exp(-||q_i - q_j||^2 / (2 sqrt(d)))``. There is no row normalisation of the kernel (no softmax).

    ``normalize=True`` is SOFT-Norm: ``A^+`` is replaced by ``D^-1/2 A^+ D^-1/2`` with ``D = diag(A 1)``, the row sums
    of the un-ridged ``A`` (applied to the m×d intermediate, so it costs O(m d)).

    Precision (:func:`~soft_mm.ops.precision.precision_policy`): autocast is disabled inside, and the dtype of each
    step follows the inputs' dtype and the autocast state. float32 inputs run wholly in float32 (float64 in float64);
    bfloat16 inputs, or inputs under bfloat16 autocast, run the N×m products in bfloat16 with float32 accumulation,
    and the kernel exponent, the Newton–Schulz inverse and the SOFT-Norm scaling in float32; float16 inputs, or inputs
    under float16 autocast, likewise in float16 on a backend that stores its sums in float32 (the Triton kernels),
    else wholly in float32 (the module :mod:`soft_mm.ops.precision` gives the measurements behind each choice). The
    result is cast back to the promoted dtype of the inputs, or under autocast to the autocast dtype (as a matmul's
    output), so float16/bfloat16 inputs give finite float16/bfloat16 outputs. float32 means IEEE
    float32: the op's GEMMs, forward and backward, ignore a global ``allow_tf32`` / ``float32_matmul_precision``
    setting (set back to the caller's after each step; eager calls, the compiled graph's custom ops).

    Args:
        q: ``(B, h, N, d)`` scaled queries (= keys: SOFT shares the projection).
        landmarks: ``(B, h, m, d)`` scaled landmark (bottleneck) tokens, usually pooled from ``q``; m >= 1.
        v: ``(B, h, N, d_v)`` values (``d_v`` is usually ``d``).
        num_iters: Newton–Schulz iterations for ``A^+``, an int >= 0.
        normalize: apply SOFT-Norm.
        ridge: ``ridge * I`` added to ``A`` before inversion, a float >= 0 (see :func:`newton_inverse`; 1e-3 to 1e-2
            guards against nearly duplicated landmarks).
        backward: ``'implicit'`` (exact-inverse gradient at the final iterate) or ``'unrolled'``.
        backend: None (automatic) or a backend name of :func:`soft_mm.ops.dispatch.backends` to force; a backend
            that cannot take the call raises :class:`~soft_mm.ops.dispatch.DispatchError` with the reason.
        precision: None (automatic), ``'highest'`` (float32 products even under autocast), ``'bfloat16'``
            (bfloat16 products), ``'float16'`` (float16 products, the Triton backend only) or a
            :class:`~soft_mm.ops.precision.Precision`.
        tile_size: tokens per tile when the ``'tiled'`` backend runs (None: its default, ``DEFAULT_TILE_SIZE``).

    Returns:
        ``(B, h, N, d_v)`` attention output.
    """
    _check_attention_inputs(q, landmarks, v)
    landmarks = dense_grad(landmarks)  # its gradient comes back transposed; a GELU usually made it (torch 2.1)
    ridge = check_newton_arguments(num_iters, ridge, backward, 'soft_attention')
    if tile_size is not None and (isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1):
        raise ValueError(f'soft_attention: tile_size must be None (the backend default) or an int >= 1, '
                         f'got {tile_size!r}')
    input_dtype = torch.promote_types(torch.promote_types(q.dtype, landmarks.dtype), v.dtype)
    preferred = precision_policy(q.device.type, input_dtype, precision)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, landmarks, v))
    chosen, policy = select(q.device.type, input_dtype, preferred, q.shape[2], needs_grad, graph_mode(), backend,
                            num_landmarks=landmarks.shape[2], head_dim=q.shape[3], value_dim=v.shape[3])
    # under autocast the output takes the autocast dtype, as a matmul's does (CUDA autocast's float32 LayerNorm
    # makes the landmarks float32, which must not turn the output, and the residual stream after it, float32)
    autocast = autocast_dtype(q.device.type)
    out_dtype = autocast if autocast is not None and input_dtype != torch.float64 else input_dtype
    options = {} if tile_size is None or 'tile_size' not in dict(chosen.options) else {'tile_size': tile_size}
    work_dtype = policy.exponent
    with no_autocast(q.device), ieee_float32_matmuls():
        landmarks = landmarks.to(work_dtype)
        if not policy.mixed:
            q, v = q.to(work_dtype), v.to(work_dtype)
        if chosen.middle is not None and backward == 'implicit' and policy.inverse == torch.float32:
            middle = Middle(chosen.middle(landmarks, num_iters, ridge, normalize))
        else:
            kernel_landmarks = gaussian_kernel(landmarks, landmarks)  # (B, h, m, m)
            kernel_inv = newton_inverse(kernel_landmarks.to(policy.inverse), num_iters=num_iters, ridge=ridge,
                                        backward=backward)
            middle = Middle(kernel_inv, _inv_sqrt_row_sums(kernel_landmarks) if normalize else None)
        out = chosen.run(q, landmarks, v, middle, policy, **options)
    return out.to(out_dtype)


def _inv_sqrt_row_sums(kernel_landmarks: Tensor) -> Tensor:
    """SOFT-Norm's ``D^-1/2`` as ``(B, h, m)``: D the row sums of the un-ridged landmark kernel."""
    return kernel_landmarks.sum(-1).rsqrt()


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


def _tiled_attention(q: Tensor, landmarks: Tensor, v: Tensor, middle: Middle, precision: Precision,
                     tile_size: int = DEFAULT_TILE_SIZE) -> Tensor:
    """The ``'tiled'`` backend: :func:`tiled_nystrom_products` (output in the memory layout of v)."""
    return tiled_nystrom_products(q, landmarks, v, middle.matrix().to(landmarks.dtype), tile_size,
                                  products=precision.products)


def _triton_attention(q: Tensor, landmarks: Tensor, v: Tensor, middle: Middle, precision: Precision) -> Tensor:
    """The ``'triton'`` backend: :func:`triton_nystrom_products` (fused kernels, float32 exponent)."""
    return triton_nystrom_products(q, landmarks.float(), v, middle.matrix().float(),
                                   products=precision.products if precision.mixed else None)


def _reference_attention(q: Tensor, landmarks: Tensor, v: Tensor, middle: Middle, precision: Precision) -> Tensor:
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
    name='reference', priority=0, run=_reference_attention, devices=('cpu', 'cuda', 'mps', 'xpu', 'meta'),
    compile=True, export=True))
TRITON = register_backend(Backend(
    name='triton', priority=20, run=_triton_attention, devices=('cuda', 'cpu'),
    dtypes=(torch.float16, torch.bfloat16, torch.float32), product_dtypes=(torch.bfloat16, torch.float16),
    compile=True, max_landmarks=TRITON_MAX_LANDMARKS, max_head_dim=TRITON_MAX_HEAD_DIM, check=triton_unsupported_reason,
    middle=triton_nystrom_middle))
TILED = register_backend(Backend(
    name='tiled', priority=10, run=_tiled_attention, devices=('cpu',), min_tokens=AUTO_TILING_MIN_TOKENS,
    compile=True, options=(('tile_size', DEFAULT_TILE_SIZE),)))
