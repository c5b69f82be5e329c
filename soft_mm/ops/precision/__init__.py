"""Precision, the one home of the ops' dtype rules (imports with torch alone).

* :mod:`.autocast` — autocast queries and IEEE float32 matmuls, for every op of soft_mm;
* :mod:`.soft_policy` — which dtype each step of the SOFT op runs in (:func:`precision_policy`, :class:`Precision`).

The FlashAttention rule that a low-precision path is held to is a test utility above the op layer,
:mod:`soft_mm.testing.error_rule`.

bfloat16 training and testing on CPU through mmengine (the optim wrapper, the float32 fallbacks of mmcv's ops) is
:mod:`soft_mm.engine.amp`.
"""
from .autocast import (
    autocast_cast,
    autocast_dtype,
    compute_dtype,
    float32_matmul_precision,
    float32_matmul_settings,
    ieee_float32_matmuls,
    ieee_matmul,
    no_autocast,
)
from .soft_policy import PRECISIONS, Precision, precision_policy

__all__ = ['PRECISIONS', 'Precision', 'autocast_cast', 'autocast_dtype', 'compute_dtype', 'float32_matmul_precision',
           'float32_matmul_settings', 'ieee_float32_matmuls', 'ieee_matmul', 'no_autocast', 'precision_policy']
