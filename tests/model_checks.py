"""Helpers shared by the drop-in tests (tests/ is on sys.path: pyproject's pythonpath)."""
from __future__ import annotations

from typing import Any

import torch


def without_scope(node: Any) -> Any:
    """A config tree without the ``_scope_`` keys that inheriting through ``mmdet::`` / ``mmseg::`` adds."""
    if isinstance(node, dict):
        return {k: without_scope(v) for k, v in node.items() if k != '_scope_'}
    if isinstance(node, (list, tuple)):
        return [without_scope(v) for v in node]
    return node


def record_gradients(module: torch.nn.Module) -> dict[str, list[tuple[bool, float]]]:
    """``{name: [(finite, max |grad|) of each backward pass]}`` for every trainable parameter of ``module``."""
    records = {}
    for name, param in module.named_parameters():
        if param.requires_grad:
            steps = records[name] = []
            param.register_hook(lambda grad, steps=steps: steps.append((bool(grad.isfinite().all()),
                                                                        float(grad.abs().max()))))
    return records
