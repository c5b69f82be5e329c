"""What checks a run of soft_mm's ops, for the tests, the benchmarks and users validating a low-precision run of
their own (as ``torch.testing`` is to torch): above the op layer, which it measures, and imported by no library module
(torch alone, so ``benchmarks/device_check.py`` imports it on a bare GPU machine).

* :mod:`.error_rule` — the FlashAttention rule a low-precision path of the SOFT op is held to (its output and every
  gradient against float64, beside the plain math in the same precision), the inputs it is measured on, and the one
  relative error of the tests and the benchmarks.
"""
from .error_rule import (
    ROUNDING_MULTIPLE,
    RULE_FRACTION,
    RuleErrors,
    outputs_and_grads,
    relative_error,
    rule_errors,
    rule_inputs,
)

__all__ = ['ROUNDING_MULTIPLE', 'RULE_FRACTION', 'RuleErrors', 'outputs_and_grads', 'relative_error', 'rule_errors',
           'rule_inputs']
