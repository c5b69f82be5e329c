"""The pyramid's stages compiled one by one (``compile_stages=``), the way a detection user compiles a backbone:
each stage its own ``torch.compile`` graph, forward and backward, the neck, the heads and the losses eager.

mmengine's ``cfg.compile`` compiles the whole ``train_step``, where mmdet's varying image sizes, its Python-side
target assignment and its losses break or recompile the graph; a stage takes one tensor in and gives one out, so
``dynamic=True`` makes one graph for every input size (mmdet pads each batch to a multiple of 32: the sizes vary from
batch to batch). ``mode='reduce-overhead'`` records a CUDA graph per size on top, for a GPU step that waits for
Python.

The compiled stages are built on a stage's first eager forward and belong to that model object: a copy of the model
(``copy.deepcopy``, as mmengine's EMA hook makes one; pickling) starts without them and compiles its own on its first
forward. Where a graph is already being traced, compiled or exported around the model, the stages run as they are.
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..ops.graph_mode import graph_mode

__all__ = ['COMPILE_KEYWORDS', 'CompiledStages', 'check_compile_stages']

# the torch.compile keywords compile_stages takes
COMPILE_KEYWORDS = ('dynamic', 'mode', 'backend', 'fullgraph', 'options')


def check_compile_stages(value: bool | dict | None) -> dict[str, Any] | None:
    """``compile_stages`` as the keywords of ``torch.compile`` (None: off).

    Raises:
        ValueError: ``value`` is not None, a bool or a dict of :data:`COMPILE_KEYWORDS`.
    """
    if value is None or value is False:
        return None
    if value is True:
        return dict(dynamic=True)
    if isinstance(value, dict) and set(value) <= set(COMPILE_KEYWORDS):
        return dict(value)
    raise ValueError(f'compile_stages must be None, True (dict(dynamic=True)) or a dict of torch.compile keywords '
                     f'{COMPILE_KEYWORDS}, got {value!r}')


def _log(message: str) -> None:
    """``message`` in mmengine's log where mmengine is installed (the pyramid itself needs torch alone)."""
    try:
        from mmengine.logging import print_log
    except ImportError:
        return
    print_log(message, logger='current')


def _own_forward(stage: nn.Module) -> Callable:
    """``stage.forward`` bound to ``stage`` with a code object of its own: dynamo keeps its graphs, and its limit of
    recompilations, per code object, and the four stages share one class (each would otherwise count against the
    others' eight graphs: two modes, train and eval, and a size or two are enough to reach it). Forward hooks on the
    stage module itself are not called (those on its blocks are)."""
    forward = type(stage).forward
    own = types.FunctionType(forward.__code__.replace(), forward.__globals__, forward.__name__, forward.__defaults__,
                             forward.__closure__)
    return types.MethodType(own, stage)


class CompiledStages:
    """The compiled callables of one pyramid's stages, built on first use (:meth:`runner`); copies and pickles of the
    pyramid start empty (a compiled callable holds the stage it was built for)."""

    def __init__(self) -> None:
        self.runners: dict[int, Callable] = {}

    def runner(self, stage: nn.Module, options: dict[str, Any]) -> Callable:
        """``stage`` compiled with ``options`` (built on the first call), or ``stage`` itself while a graph is being
        traced, compiled or exported around it."""
        if graph_mode() != 'eager':
            return stage
        compiled = self.runners.get(id(stage))
        if compiled is None:
            compiled = self.runners[id(stage)] = torch.compile(_own_forward(stage), **options)
            _log(f'soft_mm: a backbone stage ({type(stage).__name__} of {sum(1 for _ in stage.parameters())} '
                 f'parameter tensors) runs under torch.compile({", ".join(f"{k}={v!r}" for k, v in options.items())})')
        return compiled

    def __deepcopy__(self, memo: dict) -> CompiledStages:
        return CompiledStages()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.runners = {}
