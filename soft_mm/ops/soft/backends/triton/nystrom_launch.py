"""The launches of the SOFT op's Triton kernels (:mod:`.nystrom_kernels`, which says what each computes) and the custom
ops around them, with their backward: ``soft_mm::triton_nystrom_products`` (the N×m products) and
``soft_mm::triton_nystrom_middle`` (the m×m middle matrix), which the ``'triton'`` backend (:mod:`.backend`) runs (CUDA;
on CPU only under ``TRITON_INTERPRET=1``, for tests). Any N, m up to :data:`~.nystrom_config.MAX_LANDMARKS`, head dims
up to :data:`~.nystrom_config.MAX_HEAD_DIM` (which GPUs take which calls: :mod:`.nystrom_limits`), inputs in any
layout (strided views read in place; the output and the gradients of q and v laid out as ``empty_like`` makes them);
where the interpreter runs the kernels, bfloat16 results are written as float32 and cast by torch.

A kernel that cannot launch on the device after all (triton's ``OutOfResources`` at its first launch) is recorded
(:func:`~.nystrom_limits.record_launch_failure`) and the backend refuses such calls from then on: a forward's error
reaches ``soft_attention``, which runs an eager automatic call again on the next backend; a backward's is answered here
by the same gradients in PyTorch (:mod:`.nystrom_reference`), with a
:class:`~soft_mm.ops.soft.dispatch.BackendFallbackWarning` (docs/advanced/precision_and_backends.md).

The kernel module is loaded on first use, and again when ``TRITON_INTERPRET`` has changed since
(:func:`soft_mm.ops.triton_route.load_kernels`); to interpret, set it before triton is first imported
(``tests/conftest.py`` does).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from ....custom_ops import differentiable_op
from ....precision.autocast import ieee_float32_matmuls
from ....route import Route, route_of
from ....triton_launch import interpreter_block, once_differentiable
from ...dispatch import announce_fallback
from ...newton import alpha_floor
from ...products_op import products_op
from .nystrom_config import (
    MAX_HEAD_DIM,
    MAX_LANDMARKS,
    NUM_WARPS,
    PRODUCTS_CODES,
    TOKEN_KERNELS,
    kernel_block,
    kernel_stages,
    middle_warps,
    padded,
    split_count,
)
from .nystrom_limits import out_of_resources, record_launch_failure
from .nystrom_reference import middle_backward_reference, products_backward_reference

__all__ = ['TRITON_NAME', 'triton_nystrom_middle', 'triton_nystrom_products', 'triton_soft_attention']

_CONTEXT, _OUTPUT, _BACKWARD = TOKEN_KERNELS
TRITON_NAME = 'triton'  # the backend's name (soft_attention(..., backend='triton')), which its fallbacks give
_PRODUCTS_NAMES = {code: name for name, code in PRODUCTS_CODES.items()}


def _kernels(route: Route):
    """The kernel module as ``route`` runs it (interpreted or compiled)."""
    return route.kernels(f'{__package__}.nystrom_kernels')


def _tokens(t: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """A token tensor as the kernels take it: ``(tensor, its four strides)``."""
    return t, t.stride()


class _Geometry(NamedTuple):
    """The padded tile sizes and grids of one kernel's launch: ``grid`` one program per block of ``block`` tokens x
    (sample, head) groups; ``split_grid`` ``splits`` programs per group, each summing every ``splits``-th block of its
    group (the reductions over the tokens, one partial sum per program); ``meta`` the token kernels' constexprs and
    options, per products code."""

    mp: int
    dp: int
    dvp: int
    groups: int
    grid: tuple[int, int]
    splits: int
    split_grid: tuple[int, int]
    meta: tuple[dict, ...]
    group_meta: dict


def _interpreter_block(kernel: str, num_tokens: int) -> int:
    """Tokens per block of the token kernel ``kernel`` where triton's interpreter runs it: the whole map, as
    :func:`~soft_mm.ops.triton_launch.interpreter_block` gives it, and at least ``tl.dot``'s 16, for every kernel (the
    tests give the interpreter :func:`~.nystrom_config.kernel_block`'s compiled blocks here too)."""
    return padded(interpreter_block(num_tokens))


@functools.lru_cache(maxsize=1024)
def _geometry(batch: int, heads: int, n: int, m: int, d: int, dv: int, kernel: str, target: int | None) -> _Geometry:
    """The :class:`_Geometry` of ``kernel`` for a call of these sizes on ``target``
    (:func:`~.nystrom_config.kernel_block`, :func:`~.nystrom_config.kernel_stages`; None: triton's interpreter,
    :func:`_interpreter_block`), worked out once per signature."""
    mp, dp, dvp = padded(m), padded(d), padded(dv)
    block = kernel_block(kernel, target) if target is not None else _interpreter_block(kernel, n)
    stages = kernel_stages(kernel, target)
    groups = batch * heads
    splits = split_count(n, block, groups)
    meta = tuple(dict(BLOCK=block, MP=mp, DP=dp, DVP=dvp, PRODUCTS=code, num_warps=NUM_WARPS, num_stages=stages)
                 for code in range(len(PRODUCTS_CODES)))
    return _Geometry(mp, dp, dvp, groups, (-(-n // block), groups), splits, (splits, groups), meta,
                     dict(MP=mp, DVP=dvp, num_warps=middle_warps(m)))


def _geometry_of(q: Tensor, landmarks: Tensor, v: Tensor, kernel: str, route: Route) -> _Geometry:
    batch, heads, n, d = q.shape
    return _geometry(batch, heads, n, landmarks.shape[2], d, v.shape[3], kernel, route.target)


def _launch_forward(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, products: int, route: Route,
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """The forward's three launches: the partial sums of the context ``K1^T v``, their sum with its product by the
    middle matrix, the output. ``landmarks`` and ``middle`` float32 and contiguous."""
    kernels, launch = _kernels(route), route.launch
    batch, heads, n, d = q.shape
    m, dv = landmarks.shape[2], v.shape[3]
    sizes = (heads, n, m, d, dv)
    geometry = _geometry_of(q, landmarks, v, _CONTEXT, route)
    parts = q.new_empty(batch, heads, geometry.splits, geometry.mp, geometry.dvp, dtype=torch.float32)
    launch(kernels.nystrom_fwd_kernel_context, geometry.split_grid, (_tokens(q), _tokens(v), landmarks, parts, sizes),
           geometry.meta[products])
    context, middle_context = (landmarks.new_empty(batch, heads, m, dv) for _ in range(2))
    launch(kernels.nystrom_fwd_kernel_mc, (geometry.groups,),
           (parts, middle, context, middle_context, geometry.splits, m, dv), geometry.group_meta)
    geometry = _geometry_of(q, landmarks, v, _OUTPUT, route)
    out = torch.empty_like(v, dtype=route.store_dtype(v.dtype))
    launch(kernels.nystrom_fwd_kernel_o, geometry.grid, (_tokens(q), _tokens(out), landmarks, middle_context, sizes),
           geometry.meta[products])
    return out.to(v.dtype), context, middle_context


def _launch_backward(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, context: Tensor,
                     middle_context: Tensor, products: int, route: Route) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward's four launches: the partial sums of ``K1^T grad_out``, the m×m and m×d gradients from them, the
    tokens' gradients with the landmarks' partial sums, and the landmarks' gradient from those. ``landmarks``,
    ``middle`` and ``context`` float32 and contiguous; the gradients of q and v in their dtypes, of the landmarks and
    the middle matrix float32."""
    kernels, launch = _kernels(route), route.launch
    grad_out = grad_out.to(v.dtype)
    batch, heads, n, d = q.shape
    m, dv = landmarks.shape[2], v.shape[3]
    sizes = (heads, n, m, d, dv)
    geometry = _geometry_of(q, landmarks, v, _CONTEXT, route)
    parts = q.new_empty(batch, heads, geometry.splits, geometry.mp, geometry.dvp, dtype=torch.float32)
    launch(kernels.nystrom_fwd_kernel_context, geometry.split_grid,
           (_tokens(q), _tokens(grad_out), landmarks, parts, sizes), geometry.meta[products])  # K1^T grad_out
    grad_middle = middle.new_empty(middle.shape)
    grad_context = torch.empty_like(context)  # contiguous (B, h, m, d_v) float32, as the backward kernel reads it
    launch(kernels.nystrom_bwd_kernel_dmid_dctx, (geometry.groups,),
           (parts, middle, context, grad_middle, grad_context, geometry.splits, m, dv), geometry.group_meta)
    geometry = _geometry_of(q, landmarks, v, _BACKWARD, route)
    grad_q = torch.empty_like(q, dtype=route.store_dtype(q.dtype))
    grad_v = torch.empty_like(v, dtype=route.store_dtype(v.dtype))
    lsum = q.new_empty(batch, heads, geometry.splits, geometry.mp, geometry.dp, dtype=torch.float32)
    lcnt = q.new_empty(batch, heads, geometry.splits, geometry.mp, 1, dtype=torch.float32)
    launch(kernels.nystrom_bwd_kernel_dq_dv_dl, geometry.split_grid,
           (_tokens(q), _tokens(v), _tokens(grad_out), _tokens(grad_q), _tokens(grad_v), landmarks,
            (middle_context, grad_context), (lsum, lcnt), sizes), geometry.meta[products])
    grad_landmarks = torch.empty_like(landmarks)
    launch(kernels.nystrom_bwd_kernel_dl_sum, (geometry.groups,),
           (lsum, lcnt, landmarks, grad_landmarks, geometry.splits, m, d),
           dict(MP=geometry.mp, DP=geometry.dp, num_warps=middle_warps(m)))
    return grad_q.to(q.dtype), grad_landmarks, grad_v.to(v.dtype), grad_middle


def _launch_middle(landmarks: Tensor, num_iters: int, ridge: float, soft_norm: bool, route: Route,
                   ) -> tuple[Tensor, Tensor]:
    """``(middle, inverse)`` of every (sample, head), ``(B, h, m, m)`` float32 each: one launch of
    ``nystrom_middle_fwd_kernel_mid_inv``. ``landmarks`` float32 and contiguous."""
    batch, heads, m, d = landmarks.shape
    middle, inverse = landmarks.new_empty(batch, heads, m, m), landmarks.new_empty(batch, heads, m, m)
    route.launch(_kernels(route).nystrom_middle_fwd_kernel_mid_inv, (batch * heads,),
                 (landmarks, middle, inverse, m, d, num_iters, ridge, alpha_floor(torch.float32, ridge)),
                 _middle_meta(m, d, soft_norm))
    return middle, inverse


def _launch_middle_backward(grad_middle: Tensor, landmarks: Tensor, inverse: Tensor, soft_norm: bool, route: Route,
                            ) -> Tensor:
    """The landmarks' gradient through the middle matrix, float32: one launch of ``nystrom_middle_bwd_kernel_dl``
    (where it cannot launch, recorded and announced, the same gradient in PyTorch)."""
    batch, heads, m, d = landmarks.shape
    grad_landmarks = torch.empty_like(landmarks)
    try:
        route.launch(_kernels(route).nystrom_middle_bwd_kernel_dl, (batch * heads,),
                     (grad_middle, landmarks, inverse, grad_landmarks, m, d), _middle_meta(m, d, soft_norm))
    except Exception as error:
        if not out_of_resources(error):
            raise
        _announce_backward_failure(landmarks.device, m, d, None, error)
        with ieee_float32_matmuls():
            grad_landmarks = middle_backward_reference(grad_middle, landmarks, inverse, soft_norm)
    return grad_landmarks


@functools.lru_cache(maxsize=256)
def _middle_meta(m: int, d: int, soft_norm: bool) -> dict:
    return dict(MP=padded(m), DP=padded(d), SOFT_NORM=soft_norm, num_warps=middle_warps(m))


def _recording(device: torch.device, num_landmarks: int, head_dim: int, products: str | None, error: BaseException,
               ) -> None:
    """Record an ``OutOfResources`` ``error`` of a forward launch (:func:`~.nystrom_limits.record_launch_failure`)."""
    if out_of_resources(error):
        record_launch_failure(device, num_landmarks, head_dim, products, False, error)


def _forward(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, products: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, K1^T v, middle K1^T v)``: the custom op's forward kernel (:func:`_launch_forward` on the route of its
    input; a launch that runs out of resources recorded and raised)."""
    try:
        return _launch_forward(q, landmarks.contiguous(), v, middle.float().contiguous(), products, route_of(q))
    except Exception as error:
        _recording(q.device, landmarks.shape[2], max(q.shape[3], v.shape[3]), _PRODUCTS_NAMES[products], error)
        raise


def _backward(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, context: Tensor,
              middle_context: Tensor, products: int, route: Route | None = None,
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of q, landmarks, v and middle: the custom op's backward kernel (:func:`_launch_backward`); where
    a launch runs out of resources, recorded and announced, the same gradients by the tiled backend's PyTorch math
    (float32 products: the float16 kernels' range scaling is theirs alone)."""
    tensors = (grad_out, q, landmarks, v, middle, context, middle_context)
    try:
        grad_q, grad_landmarks, grad_v, grad_middle = _launch_backward(
            grad_out, q, landmarks.contiguous(), v, middle.float().contiguous(), context, middle_context, products,
            route or route_of(q))
        return grad_q, grad_landmarks.to(landmarks.dtype), grad_v, grad_middle.to(middle.dtype)
    except Exception as error:
        if not out_of_resources(error):
            raise
        _announce_backward_failure(q.device, landmarks.shape[2], max(q.shape[3], v.shape[3]),
                                   _PRODUCTS_NAMES[products], error)
    with ieee_float32_matmuls():
        return products_backward_reference(*tensors)


def _announce_backward_failure(device: torch.device, num_landmarks: int, head_dim: int, products: str | None,
                               error: BaseException) -> None:
    reason = record_launch_failure(device, num_landmarks, head_dim, products, True, error)
    announce_fallback(device.type, device.index, TRITON_NAME, reason,
                      'this backward runs the same math in PyTorch, and such calls take the next backend from now on')


class _SoftAttention(torch.autograd.Function):
    """A whole eager SOFT op call on the Triton route, one autograd node: the m×m middle matrix and the N×m products
    forward (four launches), their backward (five launches); see :func:`triton_soft_attention`."""

    @staticmethod
    def forward(ctx, q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int, ridge: float, soft_norm: bool,
                products: torch.dtype | None, out_dtype: torch.dtype, route: Route) -> Tensor:
        lm = landmarks.float().contiguous()
        values = v if products is None else v.to(products)
        code = PRODUCTS_CODES[_products_name(products)]
        try:
            middle, inverse = _launch_middle(lm, num_iters, ridge, soft_norm, route)
        except Exception as error:
            _recording(q.device, lm.shape[2], lm.shape[3], None, error)
            raise
        try:
            out, context, middle_context = _launch_forward(q, lm, values, middle, code, route)
        except Exception as error:
            _recording(q.device, lm.shape[2], max(q.shape[3], v.shape[3]), _PRODUCTS_NAMES[code], error)
            raise
        ctx.save_for_backward(q, lm, values, middle, inverse, context, middle_context)
        ctx.options = code, soft_norm, route, landmarks.dtype, v.dtype
        ctx.set_materialize_grads(False)
        return out.to(out_dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor | None) -> tuple[Tensor | None, ...]:
        if grad_out is None:
            return (None,) * 9
        q, lm, values, middle, inverse, context, middle_context = ctx.saved_tensors
        code, soft_norm, route, landmarks_dtype, v_dtype = ctx.options
        grad_q, grad_landmarks, grad_v, grad_middle = _backward(grad_out, q, lm, values, middle, context,
                                                                middle_context, code, route)
        grad_landmarks = grad_landmarks + _launch_middle_backward(grad_middle, lm, inverse, soft_norm, route)
        return (grad_q, grad_landmarks.to(landmarks_dtype), grad_v.to(v_dtype), None, None, None, None, None,
                None)


def _products_name(products: torch.dtype | None) -> str:
    return 'float32' if products is None else str(products).replace('torch.', '')


def triton_soft_attention(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int, ridge: float, soft_norm: bool,
                          products: torch.dtype | None, out_dtype: torch.dtype, route: Route) -> Tensor:
    """The SOFT op ``K1 @ middle @ (K1^T @ v)`` of an eager call on plain tensors, its middle matrix
    (:func:`triton_nystrom_middle`) and products (:func:`triton_nystrom_products`) as one autograd node: the same
    kernels, launched by ``route``'s launcher, without the custom ops' dispatch. The implicit backward of the
    Newton–Schulz inverse; the output in ``out_dtype``."""
    return _SoftAttention.apply(q, landmarks, v, num_iters, ridge, soft_norm, products, out_dtype, route)


# one custom op pair (soft_mm::triton_nystrom_products and its backward): torch.compile sees one node
# products: the products' dtype as the kernels' PRODUCTS constant (nystrom_config.PRODUCTS_CODES)
_triton_products = products_op('triton_nystrom_products', _forward, _backward, 'int products')


def triton_nystrom_products(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor,
                            products: torch.dtype | None = None) -> Tensor:
    """``K1 @ middle @ (K1^T @ v)`` with ``K1 = gaussian_kernel(q, landmarks)`` in fused Triton kernels.

    Args:
        q: ``(B, h, N, d)`` scaled queries (any strides; float32, or the low dtype under a mixed policy).
        landmarks: ``(B, h, m, d)`` float32 scaled landmarks.
        v: ``(B, h, N, d_v)`` values; the output has v's dtype and memory layout.
        middle: ``(B, h, m, m)`` float32 middle matrix.
        products: ``torch.bfloat16`` or ``torch.float16`` for operands of the products with v in that dtype (float32
            accumulation; v is cast to it), None or ``torch.float32`` for float32 products.
    """
    if landmarks.shape[2] > MAX_LANDMARKS or max(q.shape[3], v.shape[3]) > MAX_HEAD_DIM:
        raise ValueError(f'triton_nystrom_products: m must be <= {MAX_LANDMARKS} and d, d_v <= {MAX_HEAD_DIM} (the '
                         f'kernels\' shared memory on an A100), got m={landmarks.shape[2]}, '
                         f'd={q.shape[3]}, d_v={v.shape[3]}')
    name = str(products or torch.float32).replace('torch.', '')
    if name not in PRODUCTS_CODES:
        allowed = ', '.join(f'torch.{name}' for name in PRODUCTS_CODES)
        raise ValueError(f'triton_nystrom_products: products must be None or one of {allowed}, got {products!r}')
    if products in (torch.bfloat16, torch.float16):
        v = v.to(products)
    return _triton_products(q, landmarks, v, middle, PRODUCTS_CODES[name])


def _middle_forward(landmarks: Tensor, num_iters: int, ridge: float, soft_norm: bool) -> tuple[Tensor, Tensor]:
    """``(middle, inverse)`` of every (sample, head), ``(B, h, m, m)`` float32 each (the real kernel of
    ``soft_mm::triton_nystrom_middle``: :func:`_launch_middle` on its input's route)."""
    lm = landmarks.float().contiguous()
    try:
        return _launch_middle(lm, num_iters, ridge, soft_norm, route_of(lm))
    except Exception as error:
        _recording(lm.device, lm.shape[2], lm.shape[3], None, error)
        raise


def _middle_backward(grad_middle: Tensor, landmarks: Tensor, inverse: Tensor, soft_norm: bool) -> Tensor:
    """The landmarks' gradient through the middle matrix (the real kernel of
    ``soft_mm::triton_nystrom_middle_backward``): :func:`_launch_middle_backward`, IEEE float32. The inverse's gradient
    is the exact inverse's at the final iterate, ``-V^T grad_V V^T``, as the implicit backward of
    :func:`~soft_mm.ops.soft.newton.newton_inverse` (alpha is not differentiated); SOFT-Norm adds the row sums' share;
    ``A = exp(min(E, 0))`` passes it to the exponent where ``E <= 0``, and ``E_ij = l_i . l_j - |l_i|^2 / 2 - |l_j|^2
    / 2`` to the landmarks."""
    lm = landmarks.float().contiguous()
    grad_landmarks = _launch_middle_backward(grad_middle.float().contiguous(), lm, inverse.float().contiguous(),
                                             soft_norm, route_of(lm))
    return grad_landmarks.to(landmarks.dtype)


def _middle_fake(landmarks: Tensor, num_iters: int, ridge: float, soft_norm: bool) -> tuple[Tensor, Tensor]:
    shape = (*landmarks.shape[:-1], landmarks.shape[-2])
    return landmarks.new_empty(shape, dtype=torch.float32), landmarks.new_empty(shape, dtype=torch.float32)


def _middle_save(inputs: tuple, output: tuple[Tensor, Tensor]) -> tuple[tuple, tuple]:
    landmarks, _, _, soft_norm = inputs
    return (landmarks, output[1]), (soft_norm,)


# soft_mm::triton_nystrom_middle and its backward; the inverse is returned for the backward only
_middle_op, _ = differentiable_op(
    'triton_nystrom_middle', _middle_forward,
    '(Tensor landmarks, int num_iters, float ridge, bool soft_norm) -> (Tensor, Tensor)', _middle_fake,
    backward=_middle_backward,
    backward_schema='(Tensor grad_middle, Tensor landmarks, Tensor inverse, bool soft_norm) -> Tensor',
    backward_fake=lambda grad_middle, landmarks, inverse, soft_norm: torch.empty_like(landmarks), save=_middle_save)


def triton_nystrom_middle(landmarks: Tensor, num_iters: int, ridge: float, soft_norm: bool) -> Tensor:
    """The m×m middle matrix of the SOFT op in one kernel launch per call: ``A^+`` by ``num_iters`` Newton–Schulz
    iterations of ``A + ridge I``, or SOFT-Norm's ``D^-1/2 A^+ D^-1/2``, with ``A`` the landmarks' Gaussian kernel;
    one program per (sample, head), everything in registers, IEEE float32. The same iteration as
    :func:`~soft_mm.ops.soft.newton.newton_inverse` (same start, same alpha, same order of products) up to float32
    rounding; differentiable in the landmarks (the implicit backward of ``newton_inverse``).

    Args:
        landmarks: ``(B, h, m, d)`` scaled landmarks, m up to :data:`MAX_LANDMARKS`, d up to :data:`MAX_HEAD_DIM`.
        num_iters: Newton–Schulz iterations, an int >= 0.
        ridge: a float >= 0.
        soft_norm: SOFT-Norm's scaling.

    Returns:
        ``(B, h, m, m)`` float32.
    """
    if landmarks.shape[2] > MAX_LANDMARKS or landmarks.shape[3] > MAX_HEAD_DIM:
        raise ValueError(f'triton_nystrom_middle: m must be <= {MAX_LANDMARKS} and d <= {MAX_HEAD_DIM} (the kernel\'s '
                         f'shared memory on an A100), got m={landmarks.shape[2]}, '
                         f'd={landmarks.shape[3]}')
    return _middle_op(landmarks, int(num_iters), float(ridge), bool(soft_norm))[0]
