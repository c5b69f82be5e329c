"""Precision, the one home of the ops' dtype rules (imports with torch alone).

* :mod:`.autocast` — autocast queries and IEEE float32 matmuls, for every op of soft_mm;
* :mod:`.soft_policy` — which dtype each step of the SOFT op runs in (:func:`precision_policy`, :class:`Precision`);
* :mod:`.error_rule` — the FlashAttention rule a low-precision path of the SOFT op is held to, and the one relative
  error of the tests and the benchmarks (imported on use: it runs the op's naive reference).

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
