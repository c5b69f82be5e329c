"""``GELU(linear(x))`` as one oneDNN GEMM with the GELU in its epilogue, for CPU inference.

The MLP of every transformer block applies its GELU to the ``4 C``-wide output of its first linear layer, the
largest activation of the block. Written as two ops, the GELU is one more pass over that tensor (read and write);
fused, it runs on the GEMM's float32 accumulator before the result is stored, which costs almost nothing
(docs/benchmarks/layer_kernels.md).

The fused kernel is oneDNN's (``torch.ops.mkldnn._linear_pointwise``, what inductor emits for this pattern on CPU),
GELU's erf form or its tanh approximation. It has no backward and takes float32 and bfloat16 only, so it runs only in
eager CPU inference (no gradient needed, not under ``torch.compile`` or export, which build their own graphs): in
bfloat16 always, in float32 for erf-GELU layers of at most :data:`FUSED_FLOAT32_MAX_IN_FEATURES` inputs (there the GEMM
is bound by writing its wide output and the saved pass pays, while for wider inputs oneDNN's float32 GEMM can be slower
than the BLAS one that ``F.linear`` calls). The tanh approximation in float32 inference (SOFT's stages 1-3) takes
neither: its tanh is the costliest part of the layer after the GEMM, in ``F.gelu`` as in oneDNN's epilogue, so the BLAS
GEMM (without the bias) is followed by :func:`gelu_tanh_`, the bias added and the same function written as
``x * sigmoid(2 u)`` computed in place, chunk by chunk in cache (docs/benchmarks/layer_kernels.md;
``benchmarks/linear_gelu.py`` times it against oneDNN's epilogue and ``F.gelu``). Every other call is
``F.gelu(F.linear(x, weight, bias), approximate)`` itself. All agree to float32 rounding; in bfloat16 the fused result
is rounded once (from the float32 accumulator) where the unfused one is rounded twice, so they may differ by one
bfloat16 step.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..route import Route, decided

__all__ = ['FUSED_DTYPES', 'FUSED_FLOAT32_MAX_IN_FEATURES', 'fused_dtypes', 'fused_linear_gelu_available',
           'gelu_tanh_', 'linear_gelu']

FUSED_DTYPES = (torch.float32, torch.bfloat16)
# float32 erf-GELU layers with more inputs run unfused (BLAS GEMM, then GELU); bfloat16 ones are fused at any width
# (oneDNN is the CPU's bfloat16 GEMM either way)
FUSED_FLOAT32_MAX_IN_FEATURES = 128
GELU_APPROXIMATIONS = ('none', 'tanh')
# gelu_tanh_'s elements per chunk: 4 MB of float32 scratch, held in cache across the chunk's passes (and below glibc's
# mmap threshold, so the scratch is reused heap memory, not page-faulted in afresh)
GELU_CHUNK = 1 << 20
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@functools.cache
def fused_linear_gelu_available() -> bool:
    """Whether this PyTorch build has oneDNN's fused linear (``torch.ops.mkldnn._linear_pointwise``); asked once."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, '_linear_pointwise')


@functools.cache
def fused_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes of :data:`FUSED_DTYPES` in which the fused kernel runs on this CPU and torch (torch 2.1's oneDNN
    refuses bfloat16 where the CPU lacks AMX: "could not create a primitive descriptor"); tried once each."""
    if not fused_linear_gelu_available():
        return ()
    working = []
    for dtype in FUSED_DTYPES:
        x, weight = torch.ones(2, 16, dtype=dtype), torch.ones(16, 16, dtype=dtype)
        try:
            torch.ops.mkldnn._linear_pointwise(x, weight, None, 'gelu', [], 'none')
        except RuntimeError:
            continue
        working.append(dtype)
    return tuple(working)


def _compute_dtype(x: Tensor, autocast: torch.dtype | None) -> torch.dtype | None:
    """The dtype the linear runs in (the CPU autocast dtype ``autocast`` when it is on), or None if the fused kernel
    cannot take it."""
    dtype = autocast
    if dtype is not None:
        return dtype if dtype == torch.bfloat16 and dtype in fused_dtypes() else None
    return x.dtype if x.dtype in fused_dtypes() else None


def _fusable(x: Tensor, weight: Tensor, approximate: str, inference: bool, autocast: torch.dtype | None,
             ) -> torch.dtype | None:
    """The dtype of oneDNN's fused kernel for the call, or None where the rule runs it unfused (``inference``: an eager
    CPU call without gradients, :meth:`~soft_mm.ops.route.Route.cpu_inference`; float32 tanh-GELU layers take
    :func:`gelu_tanh_` instead)."""
    if not inference or not fused_linear_gelu_available():
        return None
    dtype = _compute_dtype(x, autocast)
    if dtype == torch.float32 and (weight.shape[1] > FUSED_FLOAT32_MAX_IN_FEATURES or approximate == 'tanh'):
        return None
    return dtype


def gelu_tanh_(x: Tensor, bias: Tensor | None = None, chunk: int = GELU_CHUNK) -> Tensor:
    """``F.gelu(x + bias, approximate='tanh')`` written into ``x`` (a contiguous tensor without autograd history;
    ``bias`` broadcast over its last dim, e.g. the linear layer's bias of a GEMM run without it).

    ``0.5 y (1 + tanh(u)) = y * sigmoid(2 u)`` with ``u = sqrt(2 / pi) (y + 0.044715 y^3)``: the same function, whose
    exponential costs less than the tanh, and without the cancellation of ``1 + tanh(u)`` for negative ``y``. It runs
    chunk by chunk, whole rows of about ``chunk`` elements held in cache, as four element-wise passes (five with the
    bias): ``s = a + b y^2`` (one ``addcmul``), ``s *= y``, ``sigmoid_(s)``, ``y *= s``, into one scratch buffer of a
    chunk (nothing of ``x``'s size is allocated). Within float32 rounding of ``F.gelu``: against float64, the same
    error.
    """
    if not x.is_contiguous():
        raise ValueError(f'gelu_tanh_: x must be contiguous, got shape {tuple(x.shape)} with strides {x.stride()}')
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f'gelu_tanh_: chunk must be an int >= 1, got {chunk!r}')
    width = 1  # chunks of whole rows where a bias runs along them, of single elements otherwise
    if bias is not None:
        width = x.shape[-1] if x.ndim else 1
        if tuple(bias.shape) != (width,):
            raise ValueError(f'gelu_tanh_: bias must have shape ({width},) (the last dim of x), got '
                             f'{tuple(bias.shape)}')
    rows = x.view(-1, width)
    step = max(1, chunk // width)
    scratch = torch.empty(min(step, rows.shape[0]), width, dtype=x.dtype, device=x.device)
    # s = 2u / y = a + b y^2
    a = torch.tensor(2 * _SQRT_2_OVER_PI, dtype=x.dtype, device=x.device)
    b = 2 * _SQRT_2_OVER_PI * 0.044715
    for start in range(0, rows.shape[0], step):
        part = rows[start:start + step]
        s = scratch[:part.shape[0]]
        if bias is not None:
            part.add_(bias)
        torch.addcmul(a, part, part, value=b, out=s)
        part.mul_(s.mul_(part).sigmoid_())
    return x


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor | None = None, approximate: str = 'none',
                route: Route | None = None) -> Tensor:
    """``F.gelu(F.linear(x, weight, bias), approximate=approximate)``, one fused oneDNN GEMM in CPU inference (float32
    tanh-GELU: the GEMM, then :func:`gelu_tanh_` in place; see the module's docstring for the rule).

    Args:
        x: ``(..., in_features)``.
        weight: ``(out_features, in_features)``.
        bias: ``(out_features,)`` or None.
        approximate: ``'none'`` (erf GELU) or ``'tanh'``, as for :func:`torch.nn.functional.gelu`.
        route: the forward's :class:`~soft_mm.ops.route.Route` (None: the route of ``x``).
    """
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"linear_gelu: approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    route = decided(route, x)
    inference = route.cpu_inference(x, weight, bias)
    dtype = _fusable(x, weight, approximate, inference, route.autocast)
    if dtype is None:
        if inference and approximate == 'tanh' and x.dtype == torch.float32 and route.autocast is None:
            # the GEMM without the bias (no pass that copies it into the output first); the bias joins in cache
            return gelu_tanh_(F.linear(x, weight), bias)
        return F.gelu(F.linear(x, weight, bias), approximate=approximate)
    if bias is not None:
        bias = bias.to(dtype)
    return torch.ops.mkldnn._linear_pointwise(x.to(dtype), weight.to(dtype), bias, 'gelu', [], approximate)
