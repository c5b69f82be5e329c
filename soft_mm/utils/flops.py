"""Parameters and multiply-accumulates of any model (mmengine's ``FlopAnalyzer``, which counts one multiply-add as one
"flop"), with a handle for ``scaled_dot_product_attention``, which a JIT trace cannot see into, and soft_mm's
Newton–Schulz inverse shown as its own operator. Used by ``tools/analysis_tools/get_flops.py`` and
``benchmarks/backbones.py``."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
from mmengine.analysis import FlopAnalyzer, parameter_count
from mmengine.analysis.jit_handles import get_shape
from torch import nn

from ..ops import NEWTON_OP, newton_inverse_macs
from ..ops.custom_ops import recorded_calls

__all__ = ['SDPA_OP', 'analyze', 'newton_macs', 'sdpa_flop_jit']

SDPA_OP = 'aten::scaled_dot_product_attention'


def sdpa_flop_jit(inputs: list[Any], outputs: list[Any]) -> Counter:
    """``softmax(q k^T) v`` with q (..., N, d), k (..., S, d), v (..., S, d_v): N S d + N S d_v MACs."""
    q_shape, k_shape, v_shape = (get_shape(v) for v in inputs[:3])
    rows = math.prod(q_shape[:-1])
    return Counter({'scaled_dot_product_attention': rows * k_shape[-2] * (q_shape[-1] + v_shape[-1])})


def newton_macs(model: nn.Module, inputs: tuple) -> int:
    """MACs of the implicit-backward Newton–Schulz inverses (``soft_mm::newton_inverse``) in one eager
    ``model(*inputs)`` (no grad): :func:`~soft_mm.ops.newton_inverse_macs` of every call. An exported or traced graph
    holds them as plain matmuls, which the trace counts under ``matmul``; this tells how many of those are the
    iterations'."""
    with torch.no_grad(), recorded_calls(NEWTON_OP) as calls:
        model(*inputs)
    return sum(newton_inverse_macs(tuple(args[0].shape), args[1]) for args in calls)


def analyze(model: nn.Module, inputs: tuple) -> dict[str, Any]:
    """Params and FLOPs of ``model(*inputs)``: total, by operator, and the operators left uncounted."""
    analyzer = FlopAnalyzer(model, inputs).set_op_handle(**{SDPA_OP: sdpa_flop_jit})
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    with torch.no_grad():
        total = analyzer.total()
    skipped = analyzer.unsupported_ops()
    # an autograd Function (the trace's prim::PythonOp, e.g. ops.precision's exact matmul), a soft_mm custom op or
    # a matmul-heavy op that the counter cannot see would leave the count silently low
    missed = sorted(op for op in skipped if op.startswith(('prim::PythonOp.', 'soft_mm::')) or op == SDPA_OP)
    if missed:
        raise RuntimeError(f'FLOP counter has no handle for {missed}; add one in soft_mm/utils/flops.py')
    by_operator = dict(analyzer.by_operator())
    newton = newton_macs(model, inputs)
    if newton:  # the trace counted the iterations as matmuls: show them as their own operator
        if by_operator.get('matmul', 0) < newton:
            raise RuntimeError(f'the trace counted {by_operator.get("matmul", 0)} matmul MACs, fewer than the '
                               f'{newton} of the Newton-Schulz iterations alone')
        by_operator['matmul'] -= newton
        by_operator['newton_inverse'] = newton
    return {'params': parameter_count(model)[''], 'flops': total, 'by_operator': by_operator,
            'skipped': sorted(skipped)}
