"""soft_mm.testing.error_rule: the FlashAttention rule's two bounds, half the plain math's error or twice the
exact result's own rounding to the low dtype, whichever is larger."""
from __future__ import annotations

import pytest
import torch

from soft_mm.ops import naive_soft_attention
from soft_mm.testing import ROUNDING_MULTIPLE, RULE_FRACTION, RuleErrors, rule_errors, rule_inputs

SETTINGS = dict(soft_norm=True, ridge=0.01)


def test_each_bound_is_the_larger_of_half_the_plain_math_and_twice_the_rounding():
    errors = RuleErrors(fast=[3e-4, 3e-4], plain=[5e-4, 2e-3], rounded=[2e-4, 2e-4])
    assert errors.bounds() == pytest.approx([ROUNDING_MULTIPLE * 2e-4, RULE_FRACTION * 2e-3])
    assert errors.holds() and errors.worst() == pytest.approx(0.75)
    assert not RuleErrors(fast=[5e-4], plain=[5e-4], rounded=[2e-4]).holds()  # the plain math's own error


@pytest.mark.parametrize('low_dtype', [torch.bfloat16, torch.float16])
def test_the_exact_result_rounded_once_holds_the_rule_and_the_plain_math_does_not(low_dtype):
    (q, landmarks, v), grad_out = rule_inputs(300, 49, dtype=torch.float64)
    inputs = [t.to(low_dtype) for t in (q, landmarks, v)]

    def rounded_once(*tensors):  # float64 inside; the output and (through the casts) every gradient rounded once
        return naive_soft_attention(*(t.double() for t in tensors), **SETTINGS).to(low_dtype)

    errors = rule_errors(rounded_once, inputs, low_dtype, grad_out.to(low_dtype), **SETTINGS)
    assert errors.fast == pytest.approx(errors.rounded, rel=1e-12) and errors.holds()
    assert errors.worst() <= 1 / ROUNDING_MULTIPLE + 1e-12
    # the plain math in the low dtype is far from its own bound: the rule has teeth
    plain = RuleErrors(fast=errors.plain, plain=errors.plain, rounded=errors.rounded)
    assert not plain.holds() and plain.worst() > 1.5
    unit = torch.finfo(low_dtype).eps / 2  # the unit roundoff: the rounding's relative error is below it
    assert all(0.2 * unit < r < unit for r in errors.rounded), errors.rounded
