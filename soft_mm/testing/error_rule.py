"""The FlashAttention rule for the low-precision paths of the SOFT op, and the one relative error of the tests and
the benchmarks.

A fast path run in bfloat16 or float16 is measured against float64 and compared with the SOFT math written plainly in
the same low precision (:func:`~soft_mm.ops.naive_soft_attention`): its error in the output and in every gradient
must be at most :data:`RULE_FRACTION` of the plain math's, both measured against float64 on the same rounded inputs
(as FlashAttention is held to a multiple of the error of standard attention in the same precision), or at most
:data:`ROUNDING_MULTIPLE` times the error of the exact result rounded once to the low dtype, the least error any
result stored in it can have (the bound that applies where the plain math is itself within a few roundings of
exact, as at one landmark of 16 channels). The op's tests apply it to every backend (``tests/ops``),
``benchmarks/device_check.py`` on a GPU, and a user to a low-precision run of their own.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..ops import naive_soft_attention

__all__ = ['ROUNDING_MULTIPLE', 'RULE_FRACTION', 'RuleErrors', 'outputs_and_grads', 'relative_error', 'rule_errors',
           'rule_inputs']

RULE_FRACTION = 0.5  # each error of a fast path at most this fraction of the plain math's in the same precision ...
ROUNDING_MULTIPLE = 2.0  # ... or at most this multiple of the exact result's own rounding error in that precision


def relative_error(a: Tensor, b: Tensor) -> float:
    """``||a - b|| / ||b||`` (Frobenius norms, computed in float64): the error of ``a`` against the reference ``b``."""
    b = b.double()
    return ((a.double() - b).norm() / b.norm()).item()


def outputs_and_grads(fn: Callable[..., Tensor], inputs: Sequence[Tensor], grad_out: Tensor) -> tuple[Tensor, ...]:
    """``fn(*inputs)`` on fresh leaf copies of ``inputs``, then its output and the gradients of every input for the
    output gradient ``grad_out`` (cast to the output's dtype): ``(out, grad_inputs[0], ...)``, all detached."""
    leaves = tuple(t.detach().clone().requires_grad_() for t in inputs)
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return (out.detach(), *grads)


def rule_inputs(num_tokens: int, num_landmarks: int, head_dim: int = 32, batch: int = 2, heads: int = 2,
                value_dim: int | None = None, seed: int = 0, dtype: torch.dtype = torch.float32,
                ) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
    """``((q, landmarks, v), grad_out)`` that imitate a trained layer: scaled queries of std 0.42, ``num_landmarks``
    landmarks near as many of the queries, unit values of ``value_dim`` (default ``head_dim``) channels and a unit
    output gradient, drawn in ``dtype`` on the CPU from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    q = 0.42 * torch.randn(batch, heads, num_tokens, head_dim, generator=gen, dtype=dtype)
    picks = torch.randint(num_tokens, (num_landmarks,), generator=gen)
    landmarks = q[:, :, picks] + 0.05 * torch.randn(batch, heads, num_landmarks, head_dim, generator=gen, dtype=dtype)
    v = torch.randn(batch, heads, num_tokens, value_dim or head_dim, generator=gen, dtype=dtype)
    grad_out = torch.randn(v.shape, generator=gen, dtype=dtype)
    return (q, landmarks, v), grad_out


class RuleErrors(NamedTuple):
    """Relative errors against float64 (:func:`rule_errors`), each list the output's, then each input's gradient's."""

    fast: list[float]  # the fast path's
    plain: list[float]  # the plain math's in the low dtype
    rounded: list[float]  # the exact results rounded once to the low dtype: the least error a result there can have

    def bounds(self) -> list[float]:
        """Each error's bound: :data:`RULE_FRACTION` of the plain math's, or :data:`ROUNDING_MULTIPLE` times the
        rounding's, whichever is larger."""
        return [max(RULE_FRACTION * plain, ROUNDING_MULTIPLE * rounded)
                for plain, rounded in zip(self.plain, self.rounded)]

    def holds(self) -> bool:
        """Whether every error of the fast path is within its bound."""
        return all(fast <= bound for fast, bound in zip(self.fast, self.bounds()))

    def worst(self) -> float:
        """The largest of the fast path's errors over its bound (at most 1 where the rule holds)."""
        return max(fast / bound for fast, bound in zip(self.fast, self.bounds()))


def rule_errors(fast: Callable[..., Tensor], inputs: Sequence[Tensor], low_dtype: torch.dtype, grad_out: Tensor,
                **kwargs) -> RuleErrors:
    """The relative errors of the output and of the gradients of q, landmarks and v against
    :func:`~soft_mm.ops.naive_soft_attention` in float64 on the inputs as given: ``fast(*inputs)``'s on the inputs as
    given, the plain math's on them rounded to ``low_dtype``, and those of the float64 results rounded to
    ``low_dtype`` (``kwargs`` go to the naive reference: the settings ``fast`` uses, e.g. ``soft_norm=True,
    ridge=0.01``). The rule holds when :meth:`RuleErrors.holds`."""
    def naive(*tensors: Tensor) -> Tensor:
        return naive_soft_attention(*tensors, **kwargs)

    reference = outputs_and_grads(naive, [t.double() for t in inputs], grad_out.double())
    results = outputs_and_grads(fast, inputs, grad_out)
    plain = outputs_and_grads(naive, [t.to(low_dtype) for t in inputs], grad_out.to(low_dtype))
    for tensors in (results, plain):
        dtypes = {t.dtype for t in tensors}
        if not dtypes <= {low_dtype, inputs[0].dtype}:
            raise AssertionError(f'outputs and gradients in {dtypes}, not in {low_dtype} or the inputs\' dtype')
    return RuleErrors(fast=[relative_error(a, b) for a, b in zip(results, reference)],
                      plain=[relative_error(a, b) for a, b in zip(plain, reference)],
                      rounded=[relative_error(b.to(low_dtype), b) for b in reference])
