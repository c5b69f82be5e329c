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

__all__ = ['GRAPH_MODES', 'eager_cpu_inference', 'exporting', 'graph_mode']

GRAPH_MODES = ('eager', 'compile', 'export')


def exporting() -> bool:
    """True while a graph that must be valid at every input size is recorded (``torch.export``, ONNX, jit trace)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or is_exporting()


def graph_mode() -> str:
    """``'export'``, ``'compile'`` or ``'eager'`` (see the module docstring)."""
    if exporting():
        return 'export'
    return 'compile' if is_compiling() else 'eager'


def eager_cpu_inference(*tensors: torch.Tensor | None) -> bool:
    """True for an eager call (:func:`graph_mode`) on CPU tensors that records no gradient: where a layer may compute
    in place and pick kernels that have no backward (the first tensor decides the device; None entries are skipped)."""
    present = [t for t in tensors if t is not None]
    if present[0].device.type != 'cpu' or graph_mode() != 'eager':
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in present))
