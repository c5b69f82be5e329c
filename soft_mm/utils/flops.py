"""Parameters and multiply-accumulates of any model (mmengine's ``FlopAnalyzer``, which counts one multiply-add as one
"flop"), with handles for the ops a JIT trace cannot see into: ``scaled_dot_product_attention`` and soft_mm's
Newton–Schulz inverse (an autograd Function, recorded as one opaque node). Used by ``tools/get_flops.py`` and
``tools/benchmark_backbone.py``."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
from mmengine.analysis import FlopAnalyzer, parameter_count
from mmengine.analysis.jit_handles import get_shape
from torch import nn

from ..ops import NewtonInverse, newton_inverse_macs

__all__ = ['NEWTON_OP', 'OPAQUE_PREFIX', 'SDPA_OP', 'analyze', 'newton_flop_jit', 'sdpa_flop_jit']

SDPA_OP = 'aten::scaled_dot_product_attention'
OPAQUE_PREFIX = 'prim::PythonOp.'  # how a JIT trace records a torch.autograd.Function
# The implicit-backward Newton-Schulz inverse is a torch.autograd.Function: the trace sees one PythonOp named after it.
NEWTON_OP = OPAQUE_PREFIX + NewtonInverse.__name__
def sdpa_flop_jit(inputs: list[Any], outputs: list[Any]) -> Counter:
    """``softmax(q k^T) v`` with q (..., N, d), k (..., S, d), v (..., S, d_v): N S d + N S d_v MACs."""
    q_shape, k_shape, v_shape = (get_shape(v) for v in inputs[:3])
    rows = math.prod(q_shape[:-1])
    return Counter({'scaled_dot_product_attention': rows * k_shape[-2] * (q_shape[-1] + v_shape[-1])})


def newton_flop_jit(inputs: list[Any], outputs: list[Any]) -> Counter:
    """Newton-Schulz on (..., m, m): ``soft_mm.ops.newton_inverse_macs`` of the traced shape and iteration count."""
    iters = [a for a in outputs[0].node().scalar_args() if isinstance(a, int) and not isinstance(a, bool)]
    if len(iters) != 1:
        raise RuntimeError(f'cannot read num_iters from the Newton-Schulz op (scalar args '
                           f'{outputs[0].node().scalar_args()})')
    return Counter({'newton_inverse': newton_inverse_macs(tuple(get_shape(inputs[0])), iters[0])})


def analyze(model: nn.Module, inputs: tuple) -> dict[str, Any]:
    """Params and FLOPs of ``model(*inputs)``: total, by operator, and the operators left uncounted."""
    analyzer = FlopAnalyzer(model, inputs).set_op_handle(**{SDPA_OP: sdpa_flop_jit, NEWTON_OP: newton_flop_jit})
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    with torch.no_grad():
        total = analyzer.total()
    skipped = analyzer.unsupported_ops()
    missed = sorted(op for op in skipped if op.startswith(OPAQUE_PREFIX) or op == SDPA_OP)
    if missed:  # opaque (autograd Function) or matmul-heavy ops the counter cannot see: the total would be silently low
        raise RuntimeError(f'FLOP counter has no handle for {missed}; add one in soft_mm/utils/flops.py')
    return {'params': parameter_count(model)[''], 'flops': total, 'by_operator': dict(analyzer.by_operator()),
            'skipped': sorted(skipped)}
