"""The one precision policy of the SOFT op: which dtype each step runs in, from device, input dtype and autocast.

The SOFT op has four kinds of arithmetic, with different needs. Errors against float64 and times below are one run
of ``python benchmarks/precision.py`` on the 2-core CPU (SOFT-Norm, m = 49 landmarks near some of the queries,
d = 32, 2 heads; output / grad q errors):

* the N×m **products with v** — ``K1^T v`` and ``K1 (M c)`` — run in bfloat16 with float32 accumulation: at 65k
  tokens 3.2e-3 / 3.2e-3 against 9.6e-3 / 1.1e-2 for the same math written wholly in bfloat16; the tiled forward
  takes 17 ms against 29 ms in float32 (forward+backward 59 against 57 ms: the backward's exponent gradients stay
  float32);
* the **exponent** ``q . l - |q|^2 / 2 - |l|^2 / 2`` and the ``exp`` stay float32, its dot products included: the
  norm terms cancel against the dot product, so a bfloat16 dot (a bfloat16 GEMM rounds its output to bfloat16)
  raises the grad q error to 8.3e-3 at 16k tokens (4.7e-3 / 8.3e-3 with the bfloat16 products, against 2.8e-3 /
  3.0e-3 without), and it grows with ``|q|^2``;
* the **Newton–Schulz** inverse of the m×m kernel and the SOFT-Norm scaling ``D^-1/2`` stay at least float32: the
  inverse amplifies input error by up to cond(A + ridge I) (~5e3 at the ridge floor); they cost O(m^3) and O(m d);
* the **accumulation** of ``K1^T v`` over N tokens is float32 (an unnormalised sum of up to N terms of size ``|v|``).

float16 (inputs, or float16 autocast as mmdet's ``--amp`` on a GPU) gets float16 products with float32 accumulation
where the backend accumulates *and stores* the N-token sums in float32 (the Triton kernels: ``K1^T v`` is summed in
registers and written as float32 partial sums, and each kernel scales its float16 operand tiles by a power of two so
that the m×d factors, which the inverse can make large, stay in float16's range). Elsewhere float16 falls back to
float32 products: ``K1^T v`` can exceed float16's range at detection resolutions, and a GEMM's float16 output
overflows even when it accumulates in float32. float64 runs everything in float64.

"float32" means IEEE float32 whatever the process-wide setting: a training script that sets
``torch.backends.cuda.matmul.allow_tf32 = True`` or ``torch.set_float32_matmul_precision('high')`` would have cuBLAS
round the operands of every float32 GEMM to TF32's 10-bit mantissa (and oneDNN to TF32 or bfloat16 where the CPU
has them) — the exponent's cancellation and the inverse's amplification above. :func:`ieee_float32_matmuls` sets
IEEE float32 for the op's own GEMMs and restores the caller's setting; :func:`ieee_matmul` keeps a product's
backward GEMMs in IEEE float32 too.
"""
from __future__ import annotations

import contextlib
import dataclasses
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from .capture import graph_mode
from .compat import autocast_available, autocast_dtype_of, autocast_enabled, float32_precision_switches, matmul

__all__ = ['PRECISIONS', 'Precision', 'autocast_cast', 'autocast_dtype', 'compute_dtype', 'float32_matmul_precision',
           'float32_matmul_settings', 'ieee_float32_matmuls', 'ieee_matmul', 'no_autocast', 'precision_policy']


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32: float16/bfloat16/float32 -> float32, float64 -> float64."""
    return torch.promote_types(dtype, torch.float32)


def no_autocast(device: torch.device) -> AbstractContextManager:
    """Context that disables autocast for ``device``'s type (a no-op where that type has no autocast)."""
    if not autocast_available(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype active for ``device_type``, or None when autocast is off there."""
    if not autocast_enabled(device_type):
        return None
    return autocast_dtype_of(device_type)


def autocast_cast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` cast to the autocast dtype of their device when autocast is on there, as autocast casts a conv's
    or a matmul's operands (unchanged otherwise).

    A ``torch.library`` custom op is not autocast-aware: its fake kernel (what ``torch.compile`` traces) runs with
    autocast off, so a float32 weight meets bfloat16 activations there even though the eager kernel, run under the
    caller's autocast, would have cast it. Casting at the op's entry gives both the same operands.
    """
    dtype = autocast_dtype(tensors[0].device.type)
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


def float32_matmul_settings() -> dict[str, str]:
    """The current float32 matmul precision of cuBLAS and oneDNN, e.g. ``{'cuda': 'tf32', 'mkldnn': 'none'}``
    (``{'legacy': torch.get_float32_matmul_precision()}`` on torch < 2.9)."""
    switches = float32_precision_switches()
    if not switches:
        return {'legacy': torch.get_float32_matmul_precision()}
    return {label: owner.fp32_precision for label, owner in switches.items()}


class float32_matmul_precision(contextlib.AbstractContextManager):  # a context, named as used
    """Context that sets cuBLAS's and oneDNN's float32 matmul precision to ``value`` (``'ieee'``, or ``'tf32'`` as a
    training script's ``allow_tf32 = True`` does) and restores exactly what was set on exit.

    torch >= 2.9 keeps one switch per backend, which its legacy setters (``allow_tf32``,
    ``set_float32_matmul_precision``) write too; saving and restoring those switches leaves a caller's setting as it
    was, whichever API set it (restoring through the legacy API instead would change oneDNN's switch as well). On
    older torch, ``set_float32_matmul_precision('highest' | 'high')``."""

    VALUES = ('ieee', 'tf32')

    def __init__(self, value: str) -> None:
        if value not in self.VALUES:
            raise ValueError(f'float32_matmul_precision: value must be one of {self.VALUES}, got {value!r}')
        self.value = value

    def __enter__(self) -> None:
        self.switches = list(float32_precision_switches().values())
        if self.switches:
            self.saved = [owner.fp32_precision for owner in self.switches]
            for owner in self.switches:
                owner.fp32_precision = self.value
        else:
            self.saved = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision('highest' if self.value == 'ieee' else 'high')

    def __exit__(self, *exc) -> None:
        if self.switches:
            for owner, value in zip(self.switches, self.saved):
                owner.fp32_precision = value
        else:
            torch.set_float32_matmul_precision(self.saved)


def ieee_float32_matmuls() -> AbstractContextManager:
    """Context in which float32 matmuls run in IEEE float32 (no TF32, no bfloat16 passes), whatever the global
    ``allow_tf32`` / ``float32_matmul_precision`` setting; the caller's setting is restored on exit. Eager only (a
    no-op while a graph is compiled or exported: a traced function cannot set process-wide switches)."""
    if graph_mode() != 'eager':
        return contextlib.nullcontext()
    return float32_matmul_precision('ieee')


class _IEEEMatmul(torch.autograd.Function):
    """``a @ b`` whose forward and backward GEMMs both run in IEEE float32 (see :func:`ieee_matmul`)."""

    @staticmethod
    def forward(a: Tensor, b: Tensor) -> Tensor:
        with float32_matmul_precision('ieee'):
            return a @ b

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        with float32_matmul_precision('ieee'):  # differentiable ops: a double backward goes through them
            if ctx.needs_input_grad[0]:
                grad_a = (grad @ b.transpose(-2, -1)).sum_to_size(a.shape)
            if ctx.needs_input_grad[1]:
                grad_b = (a.transpose(-2, -1) @ grad).sum_to_size(b.shape)
        return grad_a, grad_b


def ieee_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` (batched, broadcasting) with its forward and backward GEMMs in IEEE float32 whatever the global TF32
    setting, where autograd records it (float32 operands, eager); otherwise the plain product, whose forward the
    caller's :func:`ieee_float32_matmuls` covers. For the products with cancellation or amplification (the kernel's
    exponent, Newton–Schulz), whose gradients autograd computes after the op has returned."""
    if (a.dtype == torch.float32 and b.dtype == torch.float32 and torch.is_grad_enabled()
            and (a.requires_grad or b.requires_grad) and graph_mode() == 'eager'):
        return _IEEEMatmul.apply(a, b)
    return matmul(a, b)


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
