"""SOFT attention: the Nyström approximation of full Gaussian-kernel attention through m landmark tokens."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..compat import dense_grad, eager_without_custom_ops
from ..graph_mode import graph_mode
from ..precision.autocast import autocast_dtype, ieee_float32_matmuls, no_autocast
from ..precision.soft_policy import Precision, precision_policy
from ..route import Route, decided
from . import backends  # noqa: F401  (registers the backends with the dispatcher)
from .dispatch import Backend, decide, decisions_version, select
from .kernel import gaussian_kernel
from .middle import Middle, renamed_soft_norm
from .newton import check_newton_arguments, newton_inverse

__all__ = ['soft_attention']


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
def soft_attention(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int = 20, soft_norm: bool = False,
                   ridge: float = 0.0, backward: str = 'implicit', *, backend: str | None = None,
                   precision: str | Precision | None = None, tile_size: int | None = None,
                   normalize: bool | None = None, route: Route | None = None) -> Tensor:
    """Softmax-free attention ``K1 @ (A^+ @ (K1^T @ v))``, the Nyström approximation of ``K(q, q) @ v``.

    ``K(a, b) = exp(-0.5 * ||a_i - b_j||^2)`` (:func:`gaussian_kernel`, no row normalisation), ``K1 = K(q, landmarks)``
    (N×m), ``A = K(landmarks, landmarks)`` (m×m) and ``A^+`` its :func:`newton_inverse`, in O(N m d + m^2 d) without an
    N×N or N×m×m tensor; with every token a landmark (m = N, converged inverse) it is ``K(q, q) @ v`` exactly. The N×m
    products run on a backend of :mod:`soft_mm.ops.soft.backends`, each step in the dtype that
    :func:`~soft_mm.ops.precision.soft_policy.precision_policy` gives it (docs/advanced/precision_and_backends.md).

    Args:
        q: ``(B, h, N, d)`` queries (= keys), already scaled by ``d ** -0.25`` (SOFT's bandwidth ``sqrt(d)``).
        landmarks: ``(B, h, m, d)`` landmark tokens scaled as ``q`` (usually pooled from it), m >= 1.
        v: ``(B, h, N, d_v)`` values.
        num_iters: Newton–Schulz iterations for ``A^+``, an int >= 0.
        soft_norm: SOFT-Norm, ``D^-1/2 A^+ D^-1/2`` in place of ``A^+`` with ``D = diag(A 1)`` of the un-ridged ``A``.
        ridge: ``ridge * I`` added to ``A`` before inversion, a float >= 0 (:func:`newton_inverse`).
        backward: ``'implicit'`` (the exact inverse's gradient at the final iterate) or ``'unrolled'``.
        backend: None (automatic) or the name of a backend (:func:`soft_mm.ops.soft.dispatch.backends`) to force; one
            that cannot take the call raises :class:`~soft_mm.ops.soft.dispatch.DispatchError` with the reason.
        precision: None (automatic), ``'highest'``, ``'bfloat16'``, ``'float16'`` (the Triton backend only) or a
            :class:`~soft_mm.ops.precision.soft_policy.Precision`.
        tile_size: tokens per tile of the ``'tiled'`` backend (None: its ``DEFAULT_TILE_SIZE``).
        normalize: deprecated alias of ``soft_norm`` (a FutureWarning).
        route: the forward's :class:`~soft_mm.ops.route.Route` (None: the route of ``q``).

    Returns:
        ``(B, h, N, d_v)``, in the inputs' promoted dtype (under autocast, the autocast dtype).
    """
    if normalize is not None:
        soft_norm = renamed_soft_norm('soft_attention', normalize)
    route = decided(route, q)
    if route.plain and type(q) in _PLAIN and type(landmarks) in _PLAIN and type(v) in _PLAIN:
        return _eager_call(q, landmarks, v, num_iters, soft_norm, ridge, backward, backend, precision, tile_size,
                           route)
    ridge = _check_arguments(q, landmarks, v, num_iters, ridge, backward, tile_size)
    landmarks = dense_grad(landmarks)  # its gradient comes back transposed; a GELU usually made it (torch 2.1)
    decision = _decide(q, landmarks, v, precision, backend)
    options = (num_iters, ridge, backward, soft_norm, tile_size)
    if not decision.retried:
        return _attend(q, landmarks, v, *options, decision)
    try:
        return _attend(q, landmarks, v, *options, decision)
    except Exception as error:  # a kernel that could not launch (the backend recorded it, and now refuses the call)
        if not decision.backend.resource_error(error):
            raise
    return _attend(q, landmarks, v, *options, _decide(q, landmarks, v, precision, backend))


_PLAIN = (torch.Tensor, torch.nn.Parameter)
# an eager call's checks and decision per call signature: key -> (decision, ridge, whole-op function or None)
_EAGER_CALLS: dict[tuple, tuple] = {}
_MAX_EAGER_CALLS = 1024


def _eager_call(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int, soft_norm: bool, ridge: float, backward: str,
                backend: str | None, precision: str | Precision | None, tile_size: int | None, route: Route) -> Tensor:
    """An eager call on plain tensors: its arguments checked and its backend decided once per call signature (the
    sizes, dtypes, device, options, whether a backward follows, the forward's route and the dispatcher's
    :func:`~soft_mm.ops.soft.dispatch.decisions_version`), then the backend's whole-op node where it has one."""
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or landmarks.requires_grad or v.requires_grad)
    try:
        key = (q.shape, landmarks.shape, v.shape, q.dtype, landmarks.dtype, v.dtype, q.device, num_iters, soft_norm,
               ridge, backward, backend, precision, tile_size, needs_grad, route, decisions_version())
        kept = _EAGER_CALLS.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: the checks below say what is wrong
        key = kept = None
    if kept is None:
        checked_ridge = _check_arguments(q, landmarks, v, num_iters, ridge, backward, tile_size)
        chosen = _decide(q, landmarks, v, precision, backend)
        whole = (chosen.backend.eager if backward == 'implicit' and chosen.policy.inverse == torch.float32
                 and chosen.backend.middle is not None else None)
        kept = chosen, checked_ridge, whole
        if key is not None:
            if len(_EAGER_CALLS) >= _MAX_EAGER_CALLS:
                _EAGER_CALLS.clear()
            _EAGER_CALLS[key] = kept
    chosen, ridge, whole = kept
    options = (num_iters, ridge, backward, soft_norm, tile_size)
    try:
        if whole is None:
            return _attend(q, dense_grad(landmarks), v, *options, chosen)
        products = chosen.policy.products if chosen.policy.mixed else None
        return whole(q, landmarks, v, num_iters, ridge, soft_norm, products, chosen.out_dtype, route)
    except Exception as error:  # a kernel that could not launch (the backend recorded it, and now refuses the call)
        if not (chosen.retried and chosen.backend.resource_error(error)):
            raise
    return _attend(q, dense_grad(landmarks), v, *options, _decide(q, landmarks, v, precision, backend))


class _Decision(NamedTuple):
    """Where a call runs: the backend, the precision policy it runs (one of the preferred policy's chain) and the
    output dtype; ``retried``: whether a launch that runs out of resources is run again on the next backend (an eager
    automatic choice of a backend that tells such errors, :attr:`~soft_mm.ops.soft.dispatch.Backend.resource_error`).
    """

    backend: Backend
    policy: Precision
    out_dtype: torch.dtype
    retried: bool


def _attend(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int, ridge: float, backward: str, soft_norm: bool,
            tile_size: int | None, decision: _Decision) -> Tensor:
    """The op as ``decision`` says: the m×m part, then the backend's products, in the dtypes of its policy."""
    with no_autocast(q.device), ieee_float32_matmuls():
        q, landmarks, v = _to_work_dtypes(q, landmarks, v, decision.policy)
        middle = _middle(landmarks, num_iters, ridge, backward, soft_norm, decision)
        out = decision.backend.run(q, landmarks, v, middle, decision.policy,
                                   **_backend_options(decision.backend, tile_size))
    return out.to(decision.out_dtype)


def _check_arguments(q: Tensor, landmarks: Tensor, v: Tensor, num_iters: int, ridge: float, backward: str,
                     tile_size: int | None) -> float:
    """Raise for a bad argument (naming it and what is allowed); returns the ridge as a float."""
    _check_attention_inputs(q, landmarks, v)
    ridge = check_newton_arguments(num_iters, ridge, backward, 'soft_attention')
    if tile_size is not None and (isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1):
        raise ValueError(f'soft_attention: tile_size must be None (the backend default) or an int >= 1, '
                         f'got {tile_size!r}')
    return ridge


def _decide(q: Tensor, landmarks: Tensor, v: Tensor, precision: str | Precision | None, backend: str | None,
            ) -> _Decision:
    """The backend and policy of the dispatcher for this call (an eager call's kept per signature,
    :func:`~soft_mm.ops.soft.dispatch.decide`; a traced one's chosen afresh, every step traceable), and the dtype the
    output takes: under autocast the autocast dtype, as a matmul's output (CUDA autocast's float32 LayerNorm makes the
    landmarks float32, which must not turn the output, and the residual stream after it, float32), else the inputs'
    promoted dtype."""
    input_dtype = torch.promote_types(torch.promote_types(q.dtype, landmarks.dtype), v.dtype)
    preferred = precision_policy(q.device.type, input_dtype, precision)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, landmarks, v))
    mode = graph_mode()
    eager = mode == 'eager'
    chosen, policy = (decide if eager else select)(
        q.device.type, input_dtype, preferred, q.shape[2], needs_grad, mode, backend, num_landmarks=landmarks.shape[2],
        head_dim=q.shape[3], value_dim=v.shape[3], device_index=q.device.index)
    autocast = autocast_dtype(q.device.type)
    out_dtype = autocast if autocast is not None and input_dtype != torch.float64 else input_dtype
    retried = eager and backend is None and chosen.resource_error is not None
    return _Decision(chosen, policy, out_dtype, retried)


def _to_work_dtypes(q: Tensor, landmarks: Tensor, v: Tensor, policy: Precision) -> tuple[Tensor, Tensor, Tensor]:
    """The landmarks in the exponent's dtype; q and v too unless the policy runs mixed products (then the backend
    reads them as they are)."""
    landmarks = landmarks.to(policy.exponent)
    if not policy.mixed:
        q, v = q.to(policy.exponent), v.to(policy.exponent)
    return q, landmarks, v


def _middle(landmarks: Tensor, num_iters: int, ridge: float, backward: str, soft_norm: bool, decision: _Decision,
            ) -> Middle:
    """The m×m middle factor: the backend's fused kernel where it has one and the call allows it (implicit backward,
    a float32 inverse), else the landmark kernel and its Newton–Schulz inverse in torch (SOFT-Norm's ``D^-1/2`` kept
    apart)."""
    if decision.backend.middle is not None and backward == 'implicit' and decision.policy.inverse == torch.float32:
        return Middle(decision.backend.middle(landmarks, num_iters, ridge, soft_norm))
    kernel_landmarks = gaussian_kernel(landmarks, landmarks)  # (B, h, m, m)
    kernel_inv = newton_inverse(kernel_landmarks.to(decision.policy.inverse), num_iters=num_iters, ridge=ridge,
                                backward=backward)
    return Middle(kernel_inv, _inv_sqrt_row_sums(kernel_landmarks) if soft_norm else None)


def _backend_options(backend: Backend, tile_size: int | None) -> dict[str, int]:
    """The options the backend takes among those given (``tile_size``, for the backends that tile)."""
    return {} if tile_size is None or 'tile_size' not in dict(backend.options) else {'tile_size': tile_size}


def _inv_sqrt_row_sums(kernel_landmarks: Tensor) -> Tensor:
    """SOFT-Norm's ``D^-1/2`` as ``(B, h, m)``: D the row sums of the un-ridged landmark kernel."""
    return kernel_landmarks.sum(-1).rsqrt()
