"""The one place that tells how the SOFT code is being run: eagerly, under ``torch.compile``, or being exported.

* ``'export'`` — ``torch.export`` (also inside ``torch.onnx.export(dynamo=True)``), the legacy ONNX exporter or
  ``torch.jit.trace``: the graph is kept and replayed at other input sizes, so it must hold plain ATen operators
  (an ONNX translation exists for each) with no Python branch on a size. Only here do the model's layers take their
  export forms (see :func:`exporting`), and only backends that declare ``export`` run.
* ``'compile'`` — ``torch.compile`` outside export: dynamo guards every size it reads and recompiles for a new one,
  and a ``torch.library`` custom op is one opaque node run by its own kernel, so the eager code runs unchanged and a
  compiled model takes the kernels of the eager one.
* ``'eager'`` — anything else.
"""
from __future__ import annotations

import torch

from .compat import is_compiling, is_exporting

__all__ = ['GRAPH_MODES', 'eager_tensors', 'exporting', 'graph_mode', 'tracing_dispatch']

GRAPH_MODES = ('eager', 'compile', 'export')


def exporting() -> bool:
    """True while a graph that must be valid at every input size is recorded (``torch.export``, ONNX, jit trace)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or is_exporting()


def graph_mode() -> str:
    """``'export'``, ``'compile'`` or ``'eager'`` (see the module docstring)."""
    if exporting():
        return 'export'
    return 'compile' if is_compiling() else 'eager'


def tracing_dispatch() -> bool:
    """Whether a dispatch mode that records or replaces operators is active (fake tensors, a tracer such as
    ``make_fx``): eager caches and eager-only paths then stand aside. A mode that only watches declares
    ``observes_only = True`` (the launch counters of ``benchmarks/launch_counts.py``)."""
    if not torch._C._len_torch_dispatch_stack():
        return False
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    return not all(getattr(mode, 'observes_only', False) for mode in _get_current_dispatch_mode_stack())


def eager_tensors(*tensors: torch.Tensor) -> bool:
    """True for an eager call (:func:`graph_mode`, no tracing dispatch mode) on plain tensors or parameters (no fake or
    functional tensor subclass): where Python may run the real kernels directly instead of through a traceable op."""
    return graph_mode() == 'eager' and not tracing_dispatch() and all(type(t) in _PLAIN for t in tensors)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
